"""Exactly once with enhanced fan-out: lease workers reading by SubscribeToShard (through the loopback
event-stream endpoint over kinesis-local) land every record once, through the same landing sink and
checkpoints as polling, when subscriptions end mid-stream, fail mid-subscription, a worker crashes and
another restarts from the lease's checkpoint and the zone, and a shard splits. The slow test does it with
`kcl-pipeline consume --retrieval fanout` processes, one of them SIGKILLed."""
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
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.config import FANOUT, ConsumerConfig
from kcl_pipeline.kcl.core.lease.effects import Spawn
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker
from kcl_pipeline.local.producer import produce
from kcl_pipeline.zone.chain import read_batches
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.fanout_endpoint import FanOutEndpoint, SubscriptionFault

pytestmark = pytest.mark.emulator


@pytest.fixture
def fanout(emulators):
    endpoint = FanOutEndpoint(emulators.kinesis, heartbeat_seconds=0.2, in_use_seconds=0.3).start()
    yield endpoint
    endpoint.stop()


class Pipeline:
    """A stream, its application's lease table and a local landing zone, read through the fan-out endpoint."""

    def __init__(self, emulators, fanout: FanOutEndpoint, kinesis_client, dynamodb_client, unique_name, tmp_path,
                 shards: int = 1):
        self.kinesis = kinesis_client
        self.stream, self.app = unique_name("fl"), unique_name("flapp")
        kinesis_client.create_stream(StreamName=self.stream, ShardCount=shards)
        wait_stream_active(kinesis_client, self.stream)
        self.aws = AwsSettings(region=emulators.region, endpoint_urls={**emulators.endpoint_urls(),
                                                                        "kinesis": fanout.url})
        self.config = ConsumerConfig(stream=self.stream, application=self.app, worker_id="me", heartbeat_seconds=0.3,
                                     lease_expiry_seconds=1.5, validity_margin_seconds=0.2,
                                     idle_interval_seconds=0.3, retrieval=FANOUT, aws=self.aws)
        self.table = LeaseTable(self.app, dynamodb_client)
        self.table.ensure_table()
        for shard in list_shards(kinesis_client, self.stream):
            self.table.create(Lease(shard.shard_id, Checkpoint(TRIM_HORIZON), parent_shard_ids=shard.parent_ids))
        self.zone = str(tmp_path / "zone")
        os.makedirs(self.zone)
        self.store = open_store(self.zone)
        self.produced: list[int] = []

    def produce(self, count: int, aggregate: int = 1) -> None:
        first = len(self.produced)
        produce(self.kinesis, self.stream, count=count, aggregate=aggregate, first_id=first)
        self.produced.extend(range(first, first + count))

    def landed(self) -> list[int]:
        if not os.listdir(self.zone):
            return []
        return [json.loads(d)["id"] for d in read_batches(self.store, self.stream).column("data").to_pylist()]

    def worker(self, shard: str, processor_class=LandingProcessor, **settings) -> LeaseWorker:
        processor = processor_class(self.zone, self.stream, checkpoint_after_flush=True, max_batch_records=7,
                                    max_batch_age_seconds=0.3, **settings)
        return LeaseWorker(self.config, Spawn(self.table.get(shard)), processor)

    def assert_exactly_once(self) -> None:
        landed = self.landed()
        assert len(landed) == len(self.produced) and sorted(landed) == sorted(self.produced), "each record once"
        report = verify_zone(self.zone, stream=self.stream, deep=True)
        assert report.ok, "\n".join(report.lines())


@pytest.fixture
def pipeline(emulators, fanout, kinesis_client, dynamodb_client, unique_name, tmp_path):
    def make(shards: int = 1) -> Pipeline:
        return Pipeline(emulators, fanout, kinesis_client, dynamodb_client, unique_name, tmp_path, shards)
    return make


def _start(worker: LeaseWorker) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(worker.run()), daemon=True)
    thread.start()
    return thread, out


def _wait(predicate, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _stop(worker: LeaseWorker, thread: threading.Thread, out: list) -> LifeOutcome:
    worker.stop.set()
    thread.join(30)
    assert out, "the worker did not stop"
    return out[0].outcome


def test_resubscriptions_and_errors_mid_subscription_land_every_record_once(pipeline, fanout):
    p = pipeline()
    shard = list_shards(p.kinesis, p.stream)[0].shard_id
    fanout.records_per_event, fanout.events_per_subscription = 3, 2
    fanout.faults.extend([SubscriptionFault(1, "exception", "InternalFailureException"), SubscriptionFault(2, "drop"),
                          SubscriptionFault(1, "reset"), SubscriptionFault(0, "exception", "ResourceInUseException")])
    p.produce(60, aggregate=5)
    worker = p.worker(shard)
    thread, out = _start(worker)
    p.produce(40)  # while the worker reads
    p.produce(30, aggregate=3)
    _wait(lambda: sorted(set(p.landed())) == p.produced, "every record to land")
    assert _stop(worker, thread, out) is LifeOutcome.SHUTDOWN
    p.assert_exactly_once()
    subs = fanout.subscriptions_of(shard)
    assert {s.ended for s in subs} >= {"limit", "fault:exception", "fault:drop", "fault:reset"}
    assert all(s.starting_position["Type"] == "AFTER_SEQUENCE_NUMBER" for s in subs[1:])
    # The lease's checkpoint is a landed user record's (sequence, sub-sequence), never a continuation.
    assert p.table.get(shard).checkpoint == worker.processor.progress.landed


class CrashingLanding(LandingProcessor):
    """Fails at its next delivery once `crash` is set (the worker fails; what it buffered is lost)."""

    crash = threading.Event()

    def process_records(self, batch) -> None:
        if self.crash.is_set():
            raise RuntimeError("simulated crash")
        super().process_records(batch)


def test_a_worker_restarted_from_the_checkpoint_lands_the_rest_once(pipeline, fanout):
    p = pipeline()
    shard = list_shards(p.kinesis, p.stream)[0].shard_id
    fanout.records_per_event = 4
    p.produce(100, aggregate=10)  # batches of 7 records cut aggregates: checkpoints fall inside them
    CrashingLanding.crash.clear()
    crashing = p.worker(shard, CrashingLanding)
    thread, out = _start(crashing)
    _wait(lambda: not p.table.get(shard).checkpoint.is_sentinel, "a checkpoint written by the first worker")
    CrashingLanding.crash.set()
    p.produce(10, aggregate=5)  # it may be caught up: a delivery of these makes it crash
    thread.join(30)
    assert out and out[0].outcome is LifeOutcome.FAILED  # released; what it buffered never landed
    first = sorted(p.landed())
    assert first == list(range(len(first))) and len(first) < len(p.produced)
    p.produce(20)
    worker = p.worker(shard)
    thread, out = _start(worker)
    _wait(lambda: sorted(set(p.landed())) == p.produced, "the rest to land after the restart")
    assert _stop(worker, thread, out) is LifeOutcome.SHUTDOWN
    p.assert_exactly_once()
    restart = [s for s in fanout.subscriptions_of(shard) if s.starting_position["Type"] == "AT_SEQUENCE_NUMBER"]
    assert restart, "the restarted worker subscribes AT_SEQUENCE_NUMBER of where it resumes (then filters)"


def test_a_split_shard_ends_by_fanout_and_its_children_land_once(pipeline, fanout):
    p = pipeline()
    parent = list_shards(p.kinesis, p.stream)[0]
    p.produce(30, aggregate=3)
    p.kinesis.split_shard(StreamName=p.stream, ShardToSplit=parent.shard_id, NewStartingHashKey=str(2 ** 127))
    wait_stream_active(p.kinesis, p.stream)
    p.produce(40)  # into the children
    result = p.worker(parent.shard_id).run()
    assert result.outcome is LifeOutcome.SHARD_ENDED
    children = sorted(result.children_created)
    assert len(children) == 2 and p.table.get(parent.shard_id).is_ended
    assert fanout.subscriptions_of(parent.shard_id)[-1].ended == "shard_end"
    workers = [p.worker(child) for child in children]
    running = [_start(worker) for worker in workers]
    _wait(lambda: sorted(set(p.landed())) == p.produced, "the children's records to land")
    for worker, (thread, out) in zip(workers, running, strict=True):
        assert _stop(worker, thread, out) is LifeOutcome.SHUTDOWN
    p.assert_exactly_once()
    assert all(fanout.subscriptions_of(child) for child in children)


# -- the consume command, SIGKILLed -------------------------------------------------------------------------

def _consume(env, stream, app, worker, zone, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
           "--worker-id", worker, "--landing", zone, "--heartbeat-seconds", "1", "--lease-expiry-seconds", "3",
           "--cycle-seconds", "1", "--leases-to-acquire", "4", "--batch-seconds", "0.5", "--retrieval", "fanout"]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen, sig=signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        return proc.wait(40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@pytest.mark.slow
def test_consume_with_fanout_sigkilled_and_restarted_lands_exactly_once(emulators, fanout, kinesis_client,
                                                                         unique_name, tmp_path):
    stream, app = unique_name("flc"), unique_name("flcapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    zone = str(tmp_path / "zone")
    os.makedirs(zone)
    store = open_store(zone)
    fanout.events_per_subscription = 5  # resubscriptions all along
    env = {**os.environ, **emulators.env(), "AWS_ENDPOINT_URL_KINESIS": fanout.url}
    env.pop("KCL_PIPELINE_RETRIEVAL", None)
    produced: list[int] = []
    stop_producing = threading.Event()

    killed = threading.Event()

    def producer():  # 480 records (kinesis-local slows down as a shard grows), half of them after the kill
        for n in range(12):
            if n == 6:
                killed.wait(120)
            if stop_producing.is_set():
                return
            produce(kinesis_client, stream, count=40, aggregate=10 if n % 2 else 1, first_id=n * 40)
            produced.extend(range(n * 40, n * 40 + 40))
            time.sleep(0.1)

    def landed() -> list[int]:
        if not os.listdir(zone):
            return []
        return [json.loads(d)["id"] for d in read_batches(store, stream).column("data").to_pylist()]

    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    a = _consume(env, stream, app, "a", zone, tmp_path / "a.log")
    try:
        _wait(lambda: len(landed()) >= 120, "the first records to land", 120)
        assert _kill(a, signal.SIGKILL) == -signal.SIGKILL  # mid-stream: batches and subscriptions open
        killed.set()  # the second half comes after the kill: only the restarted consumer can land it
        a = _consume(env, stream, app, "a", zone, tmp_path / "a.log")
        feeder.join(120)
        _wait(lambda: sorted(set(landed())) == sorted(produced), "every record to land after the restart", 120)
    finally:
        stop_producing.set()
        code = _kill(a)
    assert code == 0, (tmp_path / "a.log").read_text()[-3000:]
    ids = landed()
    assert len(ids) == len(produced) and sorted(ids) == sorted(produced), "every record exactly once"
    report = verify_zone(zone, stream=stream, deep=True)
    assert report.ok, "\n".join(report.lines())
    assert fanout.counts["GetRecords"] == 0  # every record came by SubscribeToShard
    assert kinesis_client.list_stream_consumers(StreamARN=kinesis_client.describe_stream_summary(
        StreamName=stream)["StreamDescriptionSummary"]["StreamARN"])["Consumers"][0]["ConsumerName"] == app
