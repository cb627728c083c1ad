"""What the process-level fleet tests share: a lease-table poller and a consumer process."""
from __future__ import annotations

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
