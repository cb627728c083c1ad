"""What the process-level fleet tests share: a lease-table poller, a consumer process, a wait, and what the
consumers delivered."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from kcl_pipeline.kcl.core.model import Lease
from kcl_pipeline.kcl.shells.lease_table import LeaseTable


class TablePoller(threading.Thread):
    """Scans the lease table every 0.1 s and hands each scan to `observe` (a failed scan is skipped)."""

    clock = staticmethod(time.monotonic)

    def __init__(self, table: LeaseTable):
        super().__init__(daemon=True)
        self.table = table
        self.stop = threading.Event()

    def observe(self, leases: Sequence[Lease], now: float) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                leases = self.table.scan()
            except Exception:
                time.sleep(0.1)
                continue
            self.observe(leases, self.clock())
            time.sleep(0.1)


def consume_process(env: dict, stream: str | Sequence[str], app: str, worker_id: str, out: Path, log: Path, *,
                    heartbeat: float, expiry: float, cycle: float, extra: Sequence[str] = ()) -> subprocess.Popen:
    """`kcl-pipeline consume` with a JSONL sink, in its own session (a test may signal its whole group).
    Several streams: a multi-stream application."""
    streams = [stream] if isinstance(stream, str) else list(stream)
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", *(a for s in streams for a in ("--stream", s)),
           "--application", app,
           "--worker-id", worker_id, "--sink", f"jsonl:{out}", "--heartbeat-seconds", str(heartbeat),
           "--lease-expiry-seconds", str(expiry), "--cycle-seconds", str(cycle), "--leases-to-acquire", "2", *extra]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_processes(procs: Iterable[subprocess.Popen], timeout: float) -> None:
    """SIGTERM each process group still running (SIGCONT first: a frozen one must see it), wait up to
    `timeout` for each, SIGKILL what is left."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    """The first truthy value of `predicate()`, polled every `interval`; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def json_lines(path: Path) -> list[dict]:
    """The lines of a JSONL file a live process appends to: a torn last line (being written, or cut by a kill -9)
    is left out; a torn line anywhere else is an error."""
    if not path.exists():
        return []
    *lines, last = path.read_text().split("\n")
    records = [json.loads(line) for line in lines if line]
    try:
        return records + ([json.loads(last)] if last else [])
    except json.JSONDecodeError:
        return records


def sink_lines(out_dirs) -> list[dict]:
    """Every complete line the consumers' JSONL sinks (one directory each) wrote so far."""
    return [r for d in out_dirs for f in sorted(Path(d).glob("*.jsonl")) for r in json_lines(f)]


def delivered_records(out_dirs) -> dict[tuple[str, str, int], dict]:
    """Every record the consumers' JSONL sinks wrote, by (shard, sequence, sub-sequence)."""
    return {(r["shard_id"], r["sequence_number"], r["sub_sequence_number"]): r for r in sink_lines(out_dirs)}


def record_ids(records) -> set[int]:
    """The producer's ids in these delivered records."""
    return {json.loads(base64.b64decode(r["data_base64"]))["id"] for r in records}
