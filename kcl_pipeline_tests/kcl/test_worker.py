"""The lease worker in-process against kinesis-local + dynalite over HTTP: every way a lease's life ends."""
from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import threading
import time

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.core.lease.effects import Spawn
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.processor import RecordProcessor
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import (
    WORKER_PROCESS_NAME,
    LeaseWorker,
    ProcessorSpec,
    WorkerResult,
    worker_main,
)

pytestmark = pytest.mark.emulator


class Recorder(RecordProcessor):
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
                                lease_expiry_seconds=1.0, validity_margin_seconds=0.2, polling_interval_seconds=0.2,
                                idle_interval_seconds=0.3, aws=emulators.aws_settings())
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


def take(table: LeaseTable, shard: str, thief: str) -> Lease:
    """Take the lease as a peer would: conditioned on the owner and counter it observed (retried while the
    holder's heartbeats keep moving the counter)."""
    for _ in range(50):
        seen = table.get(shard)
        taken = table.acquire(shard, thief, seen.lease_owner, seen.lease_counter)
        if taken is not None:
            return taken
    raise AssertionError(f"could not take {shard}")


def _wait(pred, timeout=60.0):
    # Generous: a worker's first reads over the emulators took longer than 20 s on CI's shared two cores.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_delivers_checkpoints_and_releases_on_shutdown(setup):
    config, table, (shard,) = setup(records=30)
    proc = Recorder()
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 30)
    _wait(lambda: getattr(proc, "polls", 0) > 1)  # empty (idle) polls reach the processor too
    worker.stop.set()
    t.join(10)
    assert out[0].outcome is LifeOutcome.SHUTDOWN
    assert [r.data for r in proc.records] == [f"r{i}".encode() for i in range(30)]
    lease = table.get(shard)
    assert lease.lease_owner is None and lease.lease_counter > 1  # released: the counter moved on, never reset
    assert lease.checkpoint == proc.records[-1].checkpoint
    assert ("shutdown_requested",) in proc.calls


def test_not_acquired_when_someone_else_holds_it(setup):
    config, table, (shard,) = setup(records=1)
    observed = table.get(shard)
    assert table.acquire(shard, "other", None, 0)
    result = LeaseWorker(config, Spawn(observed), Recorder()).run()
    assert result.outcome is LifeOutcome.NOT_ACQUIRED
    assert table.get(shard).lease_owner == "other"


def test_stolen_lease_stops_delivery_and_tells_the_processor(setup, kinesis_client):
    config, table, (shard,) = setup(records=5)
    proc = Recorder()
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 5)
    take(table, shard, "thief")
    t.join(10)
    assert out[0].outcome is LifeOutcome.LEASE_LOST
    assert ("lease_lost",) in proc.calls
    kinesis_client.put_records(StreamName=config.stream, Records=[{"Data": b"late", "PartitionKey": "x"}])
    time.sleep(0.5)
    assert len(proc.records) == 5  # nothing delivered after the loss
    assert table.get(shard).lease_owner == "thief"


def test_heartbeat_errors_past_the_expiry_lose_the_lease(setup):
    config, table, (shard,) = setup(records=3)
    proc = Recorder(checkpoint=False)  # a synchronous checkpoint is a heartbeat too: it would raise to the processor
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)

    def broken(*_a, **_k):
        raise RuntimeError("DynamoDB unreachable")

    worker.table.heartbeat = broken
    t, out = _start(worker)
    t.join(15)
    assert out and out[0].outcome is LifeOutcome.LEASE_LOST
    assert "expiry" in out[0].detail


def test_stops_itself_when_the_keepalive_goes_stale(setup):
    config, table, (shard,) = setup(records=3)
    proc = Recorder()
    stale = time.time() - 100
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc, keepalive=lambda: stale, keepalive_timeout=5)
    result = worker.run()
    assert result.outcome is LifeOutcome.SHUTDOWN
    assert table.get(shard).lease_owner is None


def test_shard_end_ends_the_lease_and_creates_children(setup, kinesis_client):
    config, table, (shard,) = setup(records=10)
    kinesis_client.split_shard(StreamName=config.stream, ShardToSplit=shard, NewStartingHashKey=str(2 ** 127))
    wait_stream_active(kinesis_client, config.stream)
    proc = Recorder()
    result = LeaseWorker(config, Spawn(table.get(shard)), proc).run()
    assert result.outcome is LifeOutcome.SHARD_ENDED
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
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: ("shard_ended",) in proc.calls)
    time.sleep(1.5)  # longer than the expiry: the idle worker keeps its lease alive
    assert not out and table.get(shard).lease_owner == "me"
    assert table.end(shard)  # the pipeline's checkpoint step ends it
    t.join(10)
    assert out[0].outcome is LifeOutcome.SHARD_ENDED and len(out[0].children_created) == 2


@pytest.fixture
def in_process_worker_main(monkeypatch):
    """`worker_main` is a process entry point: run in the test runner, it would rename the runner and take
    its SIGTERM. Keep both as they were."""
    import signal

    from kcl_pipeline.kcl.shells.workers import worker

    monkeypatch.setattr(worker, "name_process", lambda name: None)
    handler = signal.getsignal(signal.SIGTERM)
    yield worker_main
    signal.signal(signal.SIGTERM, handler)


def test_worker_main_reports_a_processor_that_cannot_be_built(setup, in_process_worker_main):
    config, _, (shard,) = setup(records=0)

    class Q(list):
        put = list.append

    results = Q()
    in_process_worker_main(config, Spawn(Lease(shard, Checkpoint(TRIM_HORIZON))),
                           ProcessorSpec("kcl_pipeline.no_such_module:Nope"), results)
    assert results[0].outcome is LifeOutcome.FAILED and "no_such_module" in results[0].detail


def test_processor_spec_rejects_a_target_without_attribute():
    with pytest.raises(ValueError, match="package.module:Factory"):
        ProcessorSpec("kcl_pipeline.kcl.jsonl_sink").build()


def test_processor_failure_is_reported_not_raised(setup):
    config, table, (shard,) = setup(records=2)

    class Boom(Recorder):
        def process_records(self, batch):
            raise ValueError("poison")

    result = LeaseWorker(config, Spawn(table.get(shard)), Boom()).run()
    assert result.outcome is LifeOutcome.FAILED and "poison" in result.detail
    # Kept for its manager's back-off, at the counter the lease stands at once the heartbeats stopped (one may
    # have been sent after the failure): the manager renews it there.
    lease = table.get(shard)
    assert result.kept and (lease.lease_owner, lease.lease_counter) == ("me", result.left_at), (result, lease)


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
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 12)
    # Still owned, and the checkpoint arrived with a heartbeat (no separate checkpoint write).
    _wait(lambda: table.get(shard).checkpoint == proc.records[-1].checkpoint)
    assert table.get(shard).lease_owner == "me"
    worker.stop.set()
    t.join(10)
    assert out[0].outcome is LifeOutcome.SHUTDOWN and worker.checkpointed == proc.records[-1].checkpoint


@pytest.mark.parametrize("thief_keeps_it", [False, True])
def test_pending_checkpoint_is_flushed_after_a_loss_only_while_nobody_else_holds_the_lease(setup, thief_keeps_it):
    """The records were processed: their checkpoint is written although the lease moved on — but only while
    the lease is free. Under another holder the flush could be undone by a Java holder's next checkpoint
    (fenced by its counter alone): a checkpoint going back (found by the simulation)."""
    config, table, (shard,) = setup(records=6)
    proc = LazyRecorder()
    worker = LeaseWorker(config.with_(heartbeat_seconds=5.0, lease_expiry_seconds=10.0, validity_margin_seconds=1.0),
                         Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 6)
    before = table.get(shard).checkpoint
    taken = take(table, shard, "thief")
    if not thief_keeps_it:
        assert table.release(shard, "thief", taken.lease_counter)
    t.join(20)
    assert out[0].outcome is LifeOutcome.LEASE_LOST
    assert table.get(shard).checkpoint == (before if thief_keeps_it else proc.records[-1].checkpoint)


# -- lease safety: fencing, zombies, ended leases, parents, hooks ------------------------------------------

def test_zombie_with_the_same_worker_id_delivers_nothing_after_a_new_incarnation_took_its_lease(setup, kinesis_client):
    """A whole worker freezes (its delivery and its heartbeat) for longer than the expiry; a new process under
    the SAME worker id takes the lease; on thaw the zombie delivers nothing more, its fenced heartbeat fails,
    and its release cannot free the new holder's lease."""
    config, table, (shard,) = setup(records=5)
    # The worker's clock runs (a frozen one stalls its reader for good whenever the emulator answers the first
    # poll with fewer than the five records: its next call is never due), with an expiry long enough for the
    # first reads of a loaded machine; the freeze's length is then a jump of that clock.
    config = config.with_(lease_expiry_seconds=30.0)
    thaw = threading.Event()
    jumped = [0.0]

    class Freezes(Recorder):
        def process_records(self, batch):
            super().process_records(batch)
            if len(self.records) == 5 and not thaw.is_set():
                thaw.wait()  # frozen mid-delivery

    proc = Freezes(checkpoint=False)
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc, monotonic=lambda: time.monotonic() + jumped[0])
    real_heartbeat = worker.table.heartbeat
    worker.table.heartbeat = lambda *a, **k: (thaw.wait(), real_heartbeat(*a, **k))[1]
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 5)
    take(table, shard, "me")  # the new incarnation, same id, after the lease looked expired
    new_counter = table.get(shard).lease_counter
    kinesis_client.put_records(StreamName=config.stream, Records=[{"Data": b"after", "PartitionKey": "x"}])
    jumped[0] += config.lease_expiry_seconds * 2.5  # the freeze lasted 2.5 expiries
    thaw.set()
    t.join(15)
    assert out[0].outcome is LifeOutcome.LEASE_LOST
    assert [r.data for r in proc.records] == [f"r{i}".encode() for i in range(5)]
    assert table.release(shard, "me", worker.lease.hold.counter) is False
    after = table.get(shard)
    assert (after.lease_owner, after.lease_counter) == ("me", new_counter)


def test_zombie_heartbeat_with_the_same_worker_id_is_fenced_out(setup):
    """Without the validity check (the clock did not move), the counter alone fences the zombie out."""
    config, table, (shard,) = setup(records=2)
    proc = Recorder(checkpoint=False)
    worker = LeaseWorker(config.with_(heartbeat_seconds=100.0, lease_expiry_seconds=300.0), Spawn(table.get(shard)),
                         proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 2)
    take(table, shard, "me")
    worker._heartbeat_once()
    assert worker.lease.hold.lost is not None
    t.join(10)
    assert out[0].outcome is LifeOutcome.LEASE_LOST
    assert table.get(shard).lease_owner == "me"


def test_frozen_worker_stops_delivering_when_its_validity_passes(setup):
    """Validity counts from when the last successful write was SENT, minus the margin: a worker whose clock
    jumps past send + expiry - margin without a heartbeat stops before delivering the next poll."""
    config, table, (shard,) = setup(records=3)
    proc = Recorder(checkpoint=False)
    now = [1000.0]
    worker = LeaseWorker(config.with_(heartbeat_seconds=100.0, lease_expiry_seconds=300.0,
                                      validity_margin_seconds=10.0),
                         Spawn(table.get(shard)), proc, monotonic=lambda: now[0])
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 3)
    now[0] += 300.0 - 10.0  # exactly send + expiry - margin: no longer valid
    t.join(10)
    assert out[0].outcome is LifeOutcome.LEASE_LOST and "expiry" in out[0].detail


def test_ended_lease_observed_free_is_not_acquired(setup):
    config, table, (shard,) = setup(records=1)
    observed = table.get(shard)
    assert table.end(shard)  # ended between the manager's scan and the worker's acquire
    result = LeaseWorker(config, Spawn(observed), Recorder()).run()
    assert result.outcome is LifeOutcome.NOT_ACQUIRED
    assert table.get(shard).lease_owner is None


def test_child_is_not_read_while_a_parent_is_in_progress(setup, kinesis_client):
    """Java peers create a merged child early; the worker checks the parents before its first GetRecords."""
    config, table, shards = setup(shards=2, records=0)
    kinesis_client.merge_shards(StreamName=config.stream, ShardToMerge=shards[0], AdjacentShardToMerge=shards[1])
    wait_stream_active(kinesis_client, config.stream)
    child = next(s for s in list_shards(kinesis_client, config.stream) if s.parent_shard_id)
    assert table.end(shards[0])  # one parent finished, the other still in progress
    table.create(Lease(child.shard_id, Checkpoint(TRIM_HORIZON), parent_shard_ids=child.parent_ids))
    proc = Recorder()
    result = LeaseWorker(config, Spawn(table.get(child.shard_id)), proc).run()
    assert result.outcome is LifeOutcome.BLOCKED_ON_PARENTS and shards[1] in result.detail
    assert proc.calls == []  # never initialised, never read
    assert table.get(child.shard_id).lease_owner is None  # given back at once


class BadHook(Recorder):
    def __init__(self, attrs):
        super().__init__(checkpoint=False)
        self.attrs = attrs

    def heartbeat_attributes(self):
        if isinstance(self.attrs, Exception):
            raise self.attrs
        return self.attrs


@pytest.mark.parametrize("attrs", [RuntimeError("progress bug"), {"landingThing": object()},
                                   {"landingBlob": "x" * 410_000}, {"landingCount": 10 ** 130}],
                         ids=["hook raises", "unencodable", "item over 400 KB", "number the table rejects"])
def test_heartbeat_hook_failures_fall_back_to_a_plain_heartbeat(setup, attrs):
    config, table, (shard,) = setup(records=2)
    # A refused attempt and its plain retry are two round trips per heartbeat: a 1 s expiry left too little
    # room on a loaded machine (the lease lapsed under Python 3.13 beside other work).
    config = dataclasses.replace(config, heartbeat_seconds=0.4, lease_expiry_seconds=2.5, validity_margin_seconds=0.3)
    proc = BadHook(attrs)
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 2)
    first = table.get(shard).lease_counter
    time.sleep(config.lease_expiry_seconds * 2)  # several expiries: the lease must stay alive
    assert not out, out
    assert table.get(shard).lease_counter > first and table.get(shard).lease_owner == "me"
    assert worker.heartbeat_attribute_errors > 0
    worker.stop.set()
    t.join(10)


@pytest.mark.skipif(not os.path.exists("/proc/self/comm"), reason="process names are a Linux /proc feature")
def test_lease_workers_are_told_apart_from_other_spawned_processes(emulators, kinesis_client, unique_name,
                                                                   tmp_path):
    """A code server spawns Dagster's run workers the same way it spawns lease workers: an operator (or a
    chaos test) killing "a lease worker" by its command line could hit a Spark run instead."""
    from .fleet_support import consume_process

    stream, app = unique_name("named"), unique_name("namedapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis_client, stream)
    env = {**os.environ, **emulators.env()}
    proc = consume_process(env, stream, app, "named", tmp_path / "out", tmp_path / "consume.log",
                           heartbeat=1.0, expiry=3.0, cycle=1.0)
    try:
        def named_children() -> list[str]:
            # Under the consumer: its children, or (forkserver, the default start method) its server's.
            out = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
            rows = [line.split(None, 2) for line in out.splitlines() if line.strip()]
            tree = {proc.pid}
            for _ in range(3):
                tree |= {int(pid) for pid, ppid, _comm in rows if int(ppid) in tree}
            return [comm.strip() for pid, ppid, comm in rows if int(ppid) in tree]

        _wait(lambda: WORKER_PROCESS_NAME in named_children(), timeout=60)
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_lease_of_a_deleted_and_recreated_stream_is_not_read_from_the_new_stream(
        emulators, kinesis_client, dynamodb_client, unique_name):
    """Multi-stream: the new stream repeats the old one's shard ids; a lease carrying the old creation time must
    never resume its old checkpoint on the new stream's shard."""
    from kcl_pipeline.kcl.shells.shards import stream_scope

    a, b, app = unique_name("wma"), unique_name("wmb"), unique_name("wmapp")
    for stream in (a, b):
        kinesis_client.create_stream(StreamName=stream, ShardCount=1)
        wait_stream_active(kinesis_client, stream)
    old = stream_scope(kinesis_client, b)
    kinesis_client.delete_stream(StreamName=b)
    time.sleep(1.2)  # the creation time in the identifier is in seconds
    kinesis_client.create_stream(StreamName=b, ShardCount=1)
    wait_stream_active(kinesis_client, b)
    kinesis_client.put_record(StreamName=b, Data=b"new", PartitionKey="k")
    assert stream_scope(kinesis_client, b) != old
    config = ConsumerConfig(stream=a, more_streams=(b,), application=app, worker_id="me", heartbeat_seconds=0.3,
                            lease_expiry_seconds=1.0, validity_margin_seconds=0.2, aws=emulators.aws_settings())
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    key = old.lease_key("shardId-000000000000")
    table.create(Lease(key, Checkpoint(TRIM_HORIZON)))
    proc = Recorder()
    worker = LeaseWorker(config, Spawn(table.get(key)), proc)
    t, out = _start(worker)
    t.join(30)
    if t.is_alive():  # it is reading the new stream: stop it, and fail below rather than hang
        worker.stop.set()
        t.join(10)
    result = out[0]
    assert result.outcome is LifeOutcome.FAILED and "re-created" in result.detail, result
    # Nothing read; the lease kept in our name for the manager to hold through its back-off.
    assert proc.records == [] and result.kept and table.get(key).lease_owner == "me"


class SlowToLand(Recorder):
    """Checkpoints at the next heartbeat and takes `seconds` to land what it has when asked to stop."""

    def __init__(self, seconds: float):
        super().__init__(checkpoint=False)
        self.seconds = seconds

    def process_records(self, batch):
        super().process_records(batch)
        if batch.records:
            batch.checkpointer.checkpoint_at_next_heartbeat()

    def shutdown_requested(self, checkpointer):
        super().shutdown_requested(checkpointer)
        time.sleep(self.seconds)


def java_leader_hands_off(table: LeaseTable, shard: str, holder: str, to: str) -> None:
    """KCL 3.x's LeaseAssignmentManager → DynamoDBLeaseRefresher.initiateLeaseHandoff: leaseOwner = the next
    owner, checkpointOwner = the holder, the counter untouched; expected: the holder, no checkpointOwner."""
    table.client.update_item(
        TableName=table.table_name, Key={"leaseKey": {"S": shard}},
        UpdateExpression="SET leaseOwner = :new, checkpointOwner = :holder",
        ConditionExpression="leaseOwner = :holder AND attribute_not_exists(checkpointOwner) "
                            "AND attribute_exists(leaseKey)",
        ExpressionAttributeValues={":new": {"S": to}, ":holder": {"S": holder}})


def test_a_holder_asked_to_hand_off_by_a_java_leader_renews_until_its_last_write(setup):
    """The holder lands for three expiries after the ask. A KCL 3.x leader judges a lease whose counter stands
    still for its failover time expired and reassigns it (assignLease), refusing the hand-off's checkpoint, so
    the new owner re-reads what was landed; the holder renews as checkpointOwner meanwhile, as Java's does."""
    config, table, (shard,) = setup(records=20)
    proc = SlowToLand(seconds=3 * config.lease_expiry_seconds)
    worker = LeaseWorker(config, Spawn(table.get(shard)), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 20)
    time.sleep(3 * config.heartbeat_seconds)
    java_leader_hands_off(table, shard, "me", "java-worker-2")
    asked_at = table.get(shard).lease_counter
    counters = []
    while t.is_alive() and len(counters) < 400:
        lease = table.get(shard)
        counters.append((time.monotonic(), lease.lease_counter, lease.extra.get("checkpointOwner")))
        time.sleep(0.05)
    t.join(10)
    assert out[0].outcome is LifeOutcome.HANDED_OFF, out[0]
    # While it was checkpointOwner, the counter never stood still for an expiry (minus the margin).
    while_asked = [(at, counter) for at, counter, owner in counters if owner == "me"]
    changes = [at for (_, before), (at, counter) in itertools.pairwise(while_asked) if counter != before]
    marks = [while_asked[0][0], *changes, while_asked[-1][0]]
    longest_still = max(b - a for a, b in itertools.pairwise(marks))
    assert longest_still < config.lease_expiry_seconds - config.validity_margin_seconds
    assert while_asked[-1][1] > asked_at
    lease = table.get(shard)
    assert lease.lease_owner == "java-worker-2" and "checkpointOwner" not in lease.extra
    assert lease.checkpoint == proc.records[-1].checkpoint  # the hand-off's last write carried it
    assert ("shutdown_requested",) in proc.calls and ("lease_lost",) not in proc.calls


@pytest.mark.parametrize("handoff", [False, True], ids=["cold-steal", "hand-off"])
def test_a_steal_whose_holder_renewed_since_the_scan_still_takes_the_lease(setup, handoff):
    """The steal was decided on a scan; the spawn and the worker's start took longer than a heartbeat (a busy
    host), and the holder renewed meanwhile. The take, or the hand-off's ask, was conditioned on the scan's
    counter and failed every time: on a slow host the fleet never balanced (the simulation's slow spawns). The
    worker now re-reads the lease and steals from the same holder at its current counter."""
    config, table, (shard,) = setup(records=5)
    held = table.acquire(shard, "peer", None, 0)
    observed = table.get(shard)
    assert held is not None and table.heartbeat(shard, "peer", held.lease_counter)  # renewed after the scan
    proc = Recorder()
    worker = LeaseWorker(config, Spawn(observed, stolen=True, handoff=handoff), proc)
    t, out = _start(worker)
    _wait(lambda: len(proc.records) == 5)  # the peer never answers: a hand-off is taken cold at its timeout
    worker.stop.set()
    t.join(10)
    assert out[0].outcome is LifeOutcome.SHUTDOWN


@pytest.mark.parametrize("moved", ["released", "taken-by-another"])
def test_a_steal_whose_holder_let_go_since_the_scan_takes_nothing(setup, moved):
    """Re-targeting follows the same holder only: a lease released or taken by a third consumer since the
    scan is a new situation for the next cycle to judge, not this steal's."""
    config, table, (shard,) = setup(records=1)
    held = table.acquire(shard, "peer", None, 0)
    observed = table.get(shard)
    if moved == "released":
        assert table.release(shard, "peer", held.lease_counter)
    else:
        assert table.acquire(shard, "third", "peer", held.lease_counter)
    result = LeaseWorker(config, Spawn(observed, stolen=True), Recorder()).run()
    assert result.outcome is LifeOutcome.NOT_ACQUIRED and "moved on since the steal" in result.detail
    assert table.get(shard).lease_owner == (None if moved == "released" else "third")
