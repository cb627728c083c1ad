"""Records, checkpointers and drivers for the landing tests."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kcl_pipeline.kcl.core.model import Checkpoint, UserRecord
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.store import UPLOAD_PART_BYTES, ZoneStore

T0 = 1_795_316_400_000  # 2026-11-22T03:00:00Z, a whole hour
SHARD = "shardId-000000000000"
STREAM = "orders"


def seq(i: int) -> str:
    """A 56-digit, AWS-like sequence number (string comparison bugs show up with these)."""
    return f"4959{i:052d}"


def make_records(n: int, *, shard: str = SHARD, start_ms: int = T0, per_minute: int | None = None,
                 aggregate_every: int = 4, data_size: int = 64, seed: int = 7) -> list[UserRecord]:
    """`n` consecutive user records of one shard: KPL aggregates of `aggregate_every` user records
    (sub-sequences 0..k-1 under one sequence number), `per_minute` records per arrival minute."""
    rng = random.Random(seed)
    per_minute = per_minute or n
    out = []
    for i in range(n):
        kinesis_index, sub = divmod(i, aggregate_every)
        arrival = start_ms + (i // per_minute) * MINUTE_MS + (i % per_minute) * (MINUTE_MS // (per_minute + 1))
        out.append(UserRecord(shard, seq(10 * kinesis_index + 3), sub, f"pk-{i % 7}",
                              None if i % 3 else str(rng.getrandbits(100)), arrival,
                              bytes(rng.getrandbits(8) for _ in range(data_size)) + f"#{i}".encode(),
                              aggregated=aggregate_every > 1))
    return out


@dataclass
class RecordingCheckpointer:
    """Stands in for the worker's checkpointer (no lease table): records what the processor asked."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    ended: bool = False

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> bool:
        self.checkpoints.append(Checkpoint(sequence_number, sub_sequence_number))
        return True

    def end_shard(self) -> None:
        self.ended = True


def init(processor, checkpoint: Checkpoint = Checkpoint("TRIM_HORIZON"), shard: str = SHARD, **extra) -> None:
    processor.initialize(InitializationInput(shard, "worker-1", checkpoint))


def after(records: list[UserRecord], position: Checkpoint | None) -> list[UserRecord]:
    """What a reader started after `position` delivers."""
    if position is None or position.is_starting_sentinel:
        return list(records)
    return [r for r in records if r.position() > position.key()]


def deliver(processor, records: list[UserRecord], chunk: int, checkpointer=None, millis_behind: int | None = 1000):
    checkpointer = checkpointer or RecordingCheckpointer()
    for i in range(0, len(records), chunk):
        processor.process_records(ProcessRecordsInput(records[i:i + chunk], millis_behind, checkpointer))
    return checkpointer


class Clock:
    """A settable wall clock (seconds) and monotonic clock for the sink."""

    def __init__(self, ms: int):
        self.ms = ms
        self.mono = 1000.0

    def time(self) -> float:
        return self.ms / 1000

    def monotonic(self) -> float:
        return self.mono


def run_unprivileged(fn):
    """Run `fn()` where file permissions apply: as is for a normal user; as root (who ignores them), in
    a forked child that switched to the `nobody` user. Returns fn's result or raises what it raised
    (re-created from its type and message)."""
    import os
    import pickle
    import traceback

    if os.geteuid() != 0:
        return fn()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            os.setgid(65534)
            os.setuid(65534)
            payload = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            payload = ("err", (type(exc), str(exc), traceback.format_exc()))
        try:
            data = pickle.dumps(payload)
        except Exception as exc:  # an unpicklable result
            data = pickle.dumps(("err", (RuntimeError, f"unpicklable result: {exc}", "")))
        with os.fdopen(write_fd, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "ok":
        return value
    exc_type, message, tb = value
    raise exc_type(message)


def shared_tmpdir():
    """A directory every user can traverse (pytest's own tmp dirs are private to root)."""
    import os
    import tempfile

    path = tempfile.mkdtemp(prefix="landing-perm-", dir="/tmp")
    os.chmod(path, 0o755)
    return path


class ForwardingStore(ZoneStore):
    """A ZoneStore passing every call to the real one, `inner`; a test overrides the calls it intercepts."""

    inner: ZoneStore

    def put_if_absent(self, key, body):
        return self.inner.put_if_absent(key, body)

    def ensure_zone(self, create=False):
        return self.inner.ensure_zone(create)

    def list_objects(self, prefix):
        return self.inner.list_objects(prefix)

    def list_keys(self, prefix):
        return self.inner.list_keys(prefix)

    def put(self, key, body):
        return self.inner.put(key, body)

    def upload(self, key, part_bytes=UPLOAD_PART_BYTES):
        return self.inner.upload(key, part_bytes)

    def get_optional(self, key):
        return self.inner.get_optional(key)

    def delete(self, keys):
        return self.inner.delete(keys)

    def list_dirs(self, prefix):
        return self.inner.list_dirs(prefix)

    def exists(self, key):
        return self.inner.exists(key)

    def get(self, key):
        return self.inner.get(key)

    def get_tail(self, key, nbytes):
        return self.inner.get_tail(key, nbytes)


def write_commit(output: ZoneStore, start_ms: int, end_ms: int, batches, transformed: int, quarantined: int,
                 *, manifests: bool = True) -> None:
    """What a transform run leaves for a window: each dataset's file and `_manifest.json`, then (last) the
    window's commit naming `batches` (keys or BatchKeys), both datasets' rows and files
    (docs/transform-commits.md)."""
    import json
    from datetime import datetime, timezone

    from kcl_pipeline.windows.manifest import WindowCommit, commit_key

    partition = f"window={datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc):%Y%m%dT%H%M%SZ}"
    datasets = {}
    for dataset, rows in (("transformed", transformed), ("quarantine", quarantined)):
        manifest = {"job_id": "job-1", "run": "run=job-1", "files": ["run=job-1/part-0.parquet"], "rows": rows}
        output.put(f"{dataset}/{partition}/run=job-1/part-0.parquet", b"PAR1 rows PAR1")
        if manifests:
            output.put(f"{dataset}/{partition}/_manifest.json", json.dumps(manifest).encode())
        datasets[dataset] = manifest
    keys = frozenset(b if isinstance(b, str) else b.key() for b in batches)
    output.put(commit_key(start_ms), WindowCommit(start_ms, end_ms, "job-1", keys, datasets).to_json())


class RecordingLeaseTable:
    """The lease table's writes a checkpoint plan makes, in memory: the checkpoints set and the leases ended."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, Checkpoint] = {}
        self.ended: list[str] = []

    def checkpoint(self, key: str, checkpoint: Checkpoint) -> bool:
        self.checkpoints[key] = checkpoint
        return True

    def end(self, key: str) -> bool:
        self.ended.append(key)
        return True


def stop_consumer(proc: subprocess.Popen) -> int:
    """SIGTERM a `kcl-pipeline consume` process group; SIGKILL it after 40 s. Its exit code."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def wait_logged(pred, timeout: float, what: str, log: Path) -> None:
    """Wait for `pred`; on a timeout, fail with the consumer's log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; the consumer's log ends:\n"
                         f"{log.read_text(errors='replace')[-4000:]}")
