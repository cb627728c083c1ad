"""The process boundary: the manager's spawn decision (`Spawn`) reaches its worker unchanged. The simulation's
transport replaces production's `start_worker`, so what production's mapping onto the worker process loses
would meet no simulated check: here the very object crosses, pickled whole, and a real worker process reports
what it received."""
from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import pickle
import sys
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.core.lease.effects import Spawn
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput, RecordProcessor
from kcl_pipeline.kcl.shells.fleet.manager import Processes
from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker, ProcessorSpec, worker_main

# A spawn whose every field is off its default: a field a mapping dropped or defaulted shows.
SENT = Spawn(Lease("shardId-000000000001", Checkpoint("49590338271490256608559692538361571095921575989136588818", 3),
                   lease_owner="peer", lease_counter=7, owner_switches_since_checkpoint=2,
                   parent_shard_ids=("shardId-000000000000",), starting_hash_key="0", ending_hash_key="99",
                   extra={"throughputKBps": 12.5}),
             stolen=True, handoff=True)
# A plain spawn (another lease, free): no field of it equal to SENT's.
PLAIN = Spawn(Lease("shardId-000000000002", Checkpoint(TRIM_HORIZON)))


def assert_arrives_unchanged(sent: Spawn, received: Any) -> None:
    assert type(received) is Spawn, f"the worker received a {type(received).__name__}, not the spawn"
    for f in dataclasses.fields(Spawn):
        assert getattr(received, f.name) == getattr(sent, f.name), \
            f"{f.name}: sent {getattr(sent, f.name)!r}, received {getattr(received, f.name)!r}"


class _Capture:
    """A multiprocessing context that records the process it is asked to start instead of starting it."""

    def __init__(self) -> None:
        self.started: list[dict[str, Any]] = []

    def Process(self, **kwargs: Any) -> Any:  # noqa: N802 - multiprocessing's name
        self.started.append(kwargs)
        return self

    def start(self) -> None:
        pass


def _production_mapping(monkeypatch) -> Any:
    """`start_worker` of production's transport, its process captured: the arguments `worker_main` would
    receive, by parameter name."""
    config = ConsumerConfig("stream", "app", worker_id="me", aws=AwsSettings(region="eu-west-1"))
    transport = Processes(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink", {"directory": "/x"}),
                          keepalive_timeout=60.0, worker_log_level=logging.INFO)
    capture = _Capture()
    monkeypatch.setattr(transport.worker_processes, "context", lambda: capture)

    def mapped(spawn: Spawn) -> dict[str, Any]:
        transport.start_worker(spawn)
        started = capture.started.pop()
        assert started["target"] is worker_main
        return dict(inspect.signature(worker_main).bind(*started["args"], **started["kwargs"]).arguments)
    return mapped


def test_the_sample_spawns_differ_in_every_field():
    """A field added to Spawn must be set off its default here, or the round trips below cannot see it lost."""
    for f in dataclasses.fields(Spawn):
        assert getattr(SENT, f.name) != getattr(PLAIN, f.name), f"SENT and PLAIN agree on {f.name}"
        if f.default is not dataclasses.MISSING:
            assert getattr(SENT, f.name) != f.default, f"SENT leaves {f.name} at its default"


def test_production_hands_the_worker_process_the_spawn_whole_and_it_survives_the_pickling(monkeypatch):
    mapped = _production_mapping(monkeypatch)
    arguments = mapped(SENT)
    assert arguments["spawn"] is SENT
    # What multiprocessing does to a process's arguments on its way into a forkserver or spawned child.
    assert_arrives_unchanged(SENT, ForkingPickler.loads(ForkingPickler.dumps(arguments["spawn"])))


def test_the_decision_reaches_the_worker_process_through_the_spawn_alone(monkeypatch):
    """Every other argument of the worker process is the transport's own: the same whatever the decision."""
    mapped = _production_mapping(monkeypatch)
    sent, plain = mapped(SENT), mapped(PLAIN)
    assert sent.keys() == plain.keys()
    differing = {name for name in sent if sent[name] is not plain[name]}
    assert differing == {"spawn"}


@pytest.mark.parametrize("dropped", [f.name for f in dataclasses.fields(Spawn)])
def test_a_mapping_that_drops_a_field_fails_the_round_trip(dropped):
    """The round-trip check can fail: a mapping that rebuilt the spawn without one field (as a mapping onto
    separate arguments could, forgetting one) is caught, whichever field it is."""
    lossy = dataclasses.replace(SENT, **{dropped: getattr(PLAIN, dropped)})
    with pytest.raises(AssertionError, match=f"^{dropped}: "):
        assert_arrives_unchanged(SENT, lossy)


@pytest.mark.parametrize("spawn", [SENT, dataclasses.replace(SENT, handoff=False),
                                   dataclasses.replace(SENT, stolen=False, handoff=False)])
def test_the_worker_takes_its_lease_steal_and_handoff_from_the_spawn(spawn):
    config = ConsumerConfig("stream", "app", worker_id="me", aws=AwsSettings(region="eu-west-1"))
    worker = LeaseWorker(config, spawn, _Witness(""))
    assert worker.spawn is spawn and worker.observed is spawn.lease and worker.lease_key == spawn.lease.lease_key
    assert worker.settings.stolen is spawn.stolen
    assert worker.settings.handoff_from == (spawn.lease.lease_owner if spawn.handoff else None)


# -- a real worker process -----------------------------------------------------------------------------------------

class _Witness(RecordProcessor):
    """Built in the worker process: on initialize it writes down what the worker calling it was spawned with and
    what it made of it. The processor API knows nothing of the spawn, so it looks up its caller on the stack."""

    def __init__(self, out: str):
        self.out = out

    def initialize(self, init: InitializationInput) -> None:
        frame = sys._getframe(1)
        while frame is not None and not isinstance(frame.f_locals.get("self"), LeaseWorker):
            frame = frame.f_back
        assert frame is not None, "initialize was not called by a LeaseWorker"
        worker = frame.f_locals["self"]
        seen = {"spawn": worker.spawn, "stolen": worker.settings.stolen,
                "handoff_from": worker.settings.handoff_from, "pid": os.getpid()}
        Path(self.out + ".part").write_bytes(pickle.dumps(seen))
        os.replace(self.out + ".part", self.out)

    def process_records(self, batch: ProcessRecordsInput) -> None:
        pass


@pytest.mark.emulator
def test_a_real_worker_process_receives_the_spawn_unchanged(emulators, kinesis_client, dynamodb_client, unique_name,
                                                            tmp_path):
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable
    from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active

    stream, app = unique_name("sp"), unique_name("spapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis_client, stream)
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=0.3,
                            lease_expiry_seconds=1.0, validity_margin_seconds=0.2, polling_interval_seconds=0.2,
                            idle_interval_seconds=0.3, worker_start_method="forkserver",
                            aws=emulators.aws_settings())
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    (shard,) = list_shards(kinesis_client, stream)
    table.create(Lease(shard.shard_id, Checkpoint(TRIM_HORIZON)))
    table.acquire(shard.shard_id, "peer", None, 0)  # a holder that will never answer: asked, then stolen from
    observed = table.get(shard.shard_id)
    assert observed is not None and observed.lease_owner == "peer"
    spawn = Spawn(observed, stolen=True, handoff=True)

    out = tmp_path / "seen.pickle"
    transport = Processes(config, ProcessorSpec(f"{__name__}:_Witness", {"out": str(out)}), keepalive_timeout=60.0,
                          worker_log_level=logging.INFO)
    proc = transport.start_worker(spawn)
    try:
        deadline = time.monotonic() + 90
        while not out.exists() and proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.exists(), f"the worker never initialized its processor (exit code {proc.exitcode}, " \
                             f"results {transport.collect_results()})"
    finally:
        proc.terminate()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    assert transport.worker_processes.start_method is not None
    assert transport.worker_processes.start_method.method == "forkserver"
    seen = pickle.loads(out.read_bytes())
    assert seen["pid"] == proc.pid != os.getpid()
    assert_arrives_unchanged(spawn, seen["spawn"])
    assert seen["stolen"] is True and seen["handoff_from"] == "peer"
