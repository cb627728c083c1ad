"""Exactly once, for real: `kcl-pipeline consume --landing` processes on kinesis-local + dynalite + moto S3.

A consumer is SIGKILLed (its whole process group) while records flow and batches are being written, is
restarted, then a second consumer takes its leases over; a shard is split while landing. The zone must
hold every produced record exactly once, with every shard's chain verified, and the parent's batches
complete before its children's.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.local.producer import produce
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.store import open_store

pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def _consume(env, stream, app, worker, zone, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
           "--worker-id", worker, "--landing", zone, "--heartbeat-seconds", "1", "--lease-expiry-seconds", "3",
           "--cycle-seconds", "1", "--leases-to-acquire", "4", "--batch-seconds", "0.5"]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        return proc.wait(40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _ids(store, stream) -> list[int]:
    table = read_batches(store, stream)
    return [json.loads(d)["id"] for d in table.column("data").to_pylist()]


@pytest.fixture(params=["s3", "local"])
def zone(request, s3_client, unique_name, tmp_path):
    if request.param == "s3":
        bucket = unique_name("zone")
        s3_client.create_bucket(Bucket=bucket)
        return f"s3://{bucket}/landing"
    (tmp_path / "zone").mkdir()
    return str(tmp_path / "zone")


def test_sigkill_restart_handover_and_split_land_exactly_once(emulators, kinesis_client, unique_name, zone,
                                                              tmp_path):
    stream, app = unique_name("land"), unique_name("landapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    env = {**os.environ, **emulators.env()}
    store = open_store(zone, emulators.aws_settings())
    produced: list[int] = []
    stop_producing = threading.Event()

    def producer():
        n = 0
        while not stop_producing.is_set():
            aggregate = 10 if n % 2 else 1
            produce(kinesis_client, stream, count=40, rate=None, aggregate=aggregate, payload=None,
                    poison_every=None, create_shards=None, first_id=n * 40)
            produced.extend(range(n * 40, n * 40 + 40))
            n += 1
            time.sleep(0.1)

    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    a = _consume(env, stream, app, "a", zone, tmp_path / "a.log")
    b = None
    try:
        _wait(lambda: len(list_batches(store, stream)) >= 4, 60, "the first batches to land")
        # Crash mid-stream: batches are flushed every 0.5 s, so writes are in flight.
        _stop(a, signal.SIGKILL)
        a = _consume(env, stream, app, "a", zone, tmp_path / "a.log")
        _wait(lambda: len(list_batches(store, stream)) >= 10, 60, "landing to resume after the restart")
        b = _consume(env, stream, app, "b", zone, tmp_path / "b.log")
        parent = list_shards(kinesis_client, stream)[0]
        kinesis_client.split_shard(StreamName=stream, ShardToSplit=parent.shard_id,
                                   NewStartingHashKey=str(int(parent.hash_key_range.ending_hash_key) // 2))
        wait_stream_active(kinesis_client, stream)
        time.sleep(2)
        assert _stop(a) == 0  # b takes every lease over
        time.sleep(3)
        stop_producing.set()
        feeder.join(30)
        _wait(lambda: sorted(set(_ids(store, stream))) == sorted(produced), 90, "every record landed")
    finally:
        stop_producing.set()
        _stop(a)
        if b is not None:
            assert _stop(b) == 0, (tmp_path / "b.log").read_text()[-3000:]

    ids = _ids(store, stream)
    assert len(ids) == len(produced) and sorted(ids) == sorted(produced), "every record exactly once"
    report = verify_zone(zone, stream=stream, aws=emulators.aws_settings(), deep=True)
    assert report.ok, "\n".join(report.lines())
    # The parent's batches are complete before its children's first batch was written.
    children = [s.shard_id for s in list_shards(kinesis_client, stream) if s.parent_shard_id == parent.shard_id]
    parent_keys = [k.key() for k in list_batches(store, stream, shard=parent.shard_id)]
    child_keys = [k.key() for c in children for k in list_batches(store, stream, shard=c)]
    assert parent_keys and child_keys
    assert max(_written_at(store, k) for k in parent_keys) <= min(_written_at(store, k) for k in child_keys)


def _written_at(store, key: str) -> float:
    if store.zone.scheme == "file":
        return os.stat(os.path.join(store.zone.root, key)).st_mtime
    return store.client.head_object(Bucket=store.zone.bucket, Key=store.zone.full_key(key))["LastModified"].timestamp()
