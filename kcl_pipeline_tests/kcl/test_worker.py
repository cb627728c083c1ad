"""The lease worker in-process against kinesis-local + dynalite over HTTP: every way a lease's life ends."""
from __future__ import annotations

import threading
import time

import pytest

from kcl_pipeline.kcl.aws import client
from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.lease_table import LeaseTable
from kcl_pipeline.kcl.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.worker import LeaseWorker, ProcessorSpec, WorkerResult, worker_main

pytestmark = pytest.mark.emulator


class Recorder:
    """A processor that records every call; checkpoints each batch; ends the shard when told to."""

    def __init__(self, end_shard: bool = True, checkpoint: bool = True):
        self.end_shard = end_shard
        self.do_checkpoint = checkpoint
        self.records = []
        self.calls = []
        self.got_records = threading.Event()

    def initialize(self, init):
        self.calls.append(("initialize", init.checkpoint))

    def process_records(self, batch):
        self.records.extend(batch.records)
        self.polls = getattr(self, "polls", 0) + 1
        if self.do_checkpoint and batch.records:
            assert batch.checkpointer.checkpoint()
        self.got_records.set()

    def lease_lost(self):
        self.calls.append(("lease_lost",))

    def shard_ended(self, checkpointer):
        self.calls.append(("shard_ended",))
        if self.end_shard:
            checkpointer.end_shard()

    def shutdown_requested(self, checkpointer):
        self.calls.append(("shutdown_requested",))


@pytest.fixture
def setup(emulators, kinesis_client, dynamodb_client, unique_name):
    def make(shards: int = 1, records: int = 30):
        stream, app = unique_name("w"), unique_name("wapp")
        kinesis_client.create_stream(StreamName=stream, ShardCount=shards)
        wait_stream_active(kinesis_client, stream)
        if records:
            kinesis_client.put_records(StreamName=stream, Records=[
                {"Data": f"r{i}".encode(), "PartitionKey": f"k{i}"} for i in range(records)])
        config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=0.3,
                                lease_expiry_seconds=1.0, polling_interval_seconds=0.2, idle_interval_seconds=0.3,
                                aws=emulators.aws_settings())
        table = LeaseTable(app, dynamodb_client)
        table.ensure_table()
        for shard in list_shards(kinesis_client, stream):
            table.create(Lease(shard.shard_id, Checkpoint(TRIM_HORIZON), parent_shard_ids=shard.parent_ids))
        return config, table, [s.shard_id for s in list_shards(kinesis_client, stream)]
    return make


def _start(worker: LeaseWorker) -> tuple[threading.Thread, list[WorkerResult]]:
    out: list[WorkerResult] = []
    t = threading.Thread(target=lambda: out.append(worker.run()), daemon=True)
    t.start()
    return t, out


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_delivers_checkpoints_and_releases_on_shutdown(setup):
    config, table, (shard,) = setup(records=30)
    proc = Recorder()
    worker = LeaseWorker(config, shard, None, proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 30)
    _wait(lambda: getattr(proc, "polls", 0) > 1)  # empty (idle) polls reach the processor too
    worker.stop.set()
    t.join(10)
    assert out[0].outcome == "shutdown"
    assert [r.data for r in proc.records] == [f"r{i}".encode() for i in range(30)]
    lease = table.get(shard)
    assert lease.lease_owner is None and lease.lease_counter == 0
    assert lease.checkpoint == proc.records[-1].checkpoint
    assert ("shutdown_requested",) in proc.calls


def test_not_acquired_when_someone_else_holds_it(setup):
    config, table, (shard,) = setup(records=1)
    assert table.acquire(shard, "other", None)
    result = LeaseWorker(config, shard, None, Recorder()).run()
    assert result.outcome == "not_acquired"
    assert table.get(shard).lease_owner == "other"


def test_stolen_lease_stops_delivery_and_tells_the_processor(setup, kinesis_client):
    config, table, (shard,) = setup(records=5)
    proc = Recorder()
    worker = LeaseWorker(config, shard, None, proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 5)
    assert table.acquire(shard, "thief", "me")
    t.join(10)
    assert out[0].outcome == "lease_lost"
    assert ("lease_lost",) in proc.calls
    kinesis_client.put_records(StreamName=config.stream, Records=[{"Data": b"late", "PartitionKey": "x"}])
    time.sleep(0.5)
    assert len(proc.records) == 5  # nothing delivered after the loss
    assert table.get(shard).lease_owner == "thief"


def test_heartbeat_errors_past_the_expiry_lose_the_lease(setup):
    config, table, (shard,) = setup(records=3)
    proc = Recorder()
    worker = LeaseWorker(config, shard, None, proc)

    def broken(*_a, **_k):
        raise RuntimeError("DynamoDB unreachable")

    worker.table.heartbeat = broken
    t, out = _start(worker)
    t.join(15)
    assert out and out[0].outcome == "lease_lost"
    assert "expiry" in out[0].detail


def test_stops_itself_when_the_keepalive_goes_stale(setup):
    config, table, (shard,) = setup(records=3)
    proc = Recorder()
    stale = time.time() - 100
    worker = LeaseWorker(config, shard, None, proc, keepalive=lambda: stale, keepalive_timeout=5)
    result = worker.run()
    assert result.outcome == "shutdown"
    assert table.get(shard).lease_owner is None


def test_shard_end_ends_the_lease_and_creates_children(setup, kinesis_client):
    config, table, (shard,) = setup(records=10)
    kinesis_client.split_shard(StreamName=config.stream, ShardToSplit=shard, NewStartingHashKey=str(2 ** 127))
    wait_stream_active(kinesis_client, config.stream)
    proc = Recorder()
    result = LeaseWorker(config, shard, None, proc).run()
    assert result.outcome == "shard_ended"
    assert len(proc.records) == 10
    assert table.get(shard).is_ended
    children = {s.shard_id for s in list_shards(kinesis_client, config.stream) if s.parent_shard_id == shard}
    assert set(result.children_created) == children
    for child in children:
        lease = table.get(child)
        assert lease.checkpoint == Checkpoint(TRIM_HORIZON) and lease.parent_shard_ids == (shard,)


def test_shard_end_left_to_someone_else_waits_for_it(setup, kinesis_client):
    config, table, (shard,) = setup(records=4)
    kinesis_client.split_shard(StreamName=config.stream, ShardToSplit=shard, NewStartingHashKey=str(2 ** 127))
    wait_stream_active(kinesis_client, config.stream)
    proc = Recorder(end_shard=False)
    worker = LeaseWorker(config, shard, None, proc)
    t, out = _start(worker)
    _wait(lambda: ("shard_ended",) in proc.calls)
    time.sleep(1.5)  # longer than the expiry: the idle worker keeps its lease alive
    assert not out and table.get(shard).lease_owner == "me"
    assert table.end(shard)  # the pipeline's checkpoint step ends it
    t.join(10)
    assert out[0].outcome == "shard_ended" and len(out[0].children_created) == 2


def test_worker_main_reports_a_processor_that_cannot_be_built(setup):
    config, _, (shard,) = setup(records=0)

    class Q(list):
        put = list.append

    results = Q()
    worker_main(config, shard, None, ProcessorSpec("kcl_pipeline.no_such_module:Nope"), results)
    assert results[0].outcome == "failed" and "no_such_module" in results[0].detail


def test_processor_spec_rejects_a_target_without_attribute():
    with pytest.raises(ValueError, match="package.module:Factory"):
        ProcessorSpec("kcl_pipeline.kcl.jsonl_sink").build()


def test_processor_failure_is_reported_not_raised(setup):
    config, table, (shard,) = setup(records=2)

    class Boom(Recorder):
        def process_records(self, batch):
            raise ValueError("poison")

    result = LeaseWorker(config, shard, None, Boom()).run()
    assert result.outcome == "failed" and "poison" in result.detail


def test_clients_honour_settings(emulators):
    assert client("kinesis", emulators.aws_settings()).meta.endpoint_url == emulators.kinesis


class LazyRecorder(Recorder):
    def process_records(self, batch):
        self.records.extend(batch.records)
        if batch.records:
            batch.checkpointer.checkpoint_at_next_heartbeat()
        self.got_records.set()


def test_checkpoint_rides_on_the_next_heartbeat(setup):
    config, table, (shard,) = setup(records=12)
    proc = LazyRecorder()
    worker = LeaseWorker(config, shard, None, proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 12)
    # Still owned, and the checkpoint arrived with a heartbeat (no separate checkpoint write).
    _wait(lambda: table.get(shard).checkpoint == proc.records[-1].checkpoint)
    assert table.get(shard).lease_owner == "me"
    worker.stop.set()
    t.join(10)
    assert out[0].outcome == "shutdown" and worker.checkpointed == proc.records[-1].checkpoint


def test_pending_checkpoint_is_flushed_when_the_lease_is_lost(setup):
    config, table, (shard,) = setup(records=6)
    proc = LazyRecorder()
    worker = LeaseWorker(config.with_(heartbeat_seconds=5.0, lease_expiry_seconds=10.0), shard, None, proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 6)
    assert table.acquire(shard, "thief", "me")
    t.join(20)
    assert out[0].outcome == "lease_lost"
    # The records were processed: their checkpoint is written even though the lease moved on.
    assert table.get(shard).checkpoint == proc.records[-1].checkpoint
