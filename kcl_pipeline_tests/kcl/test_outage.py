"""An outage is visible and bounded, against the emulators: a headless consumer whose lease table is gone exits 2
with one line; a lease whose sink fails is held through a back-off, retried,
and its next worker resumes after what was landed, not from the shard's start."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec
from kcl_pipeline.local.producer import produce
from kcl_pipeline.zone.chain import read_batches
from kcl_pipeline.zone.store import open_store

from .fleet_support import wait_until

pytestmark = pytest.mark.emulator

SHARD = "shardId-000000000000"


def test_a_consumer_whose_lease_table_is_gone_exits_2_with_one_line(
        emulators, kinesis_client, dynamodb_client, unique_name, tmp_path):
    """The outage found by the issue: with its lease table deleted, `consume` logged an error every cycle, landed
    nothing, and exited 0 on SIGTERM: an orchestrator saw a healthy process."""
    stream, app = unique_name("outage"), unique_name("app")
    produce(kinesis_client, stream, 5, create_shards=1, seed=1)
    health = tmp_path / "healthy"
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
           "--sink", f"jsonl:{tmp_path / 'out'}", "--heartbeat-seconds", "1", "--lease-expiry-seconds", "3",
           "--cycle-seconds", "1", "--stall-seconds", "4", "--health-file", str(health)]
    proc = subprocess.Popen(cmd, env={**os.environ, **emulators.env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(health.exists, 90, "the first successful cycle's health file")
        dynamodb_client.delete_table(TableName=app)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert errors[0].startswith("error: no lease-manager cycle succeeded for ") and app in errors[0], errors


def test_a_failing_sink_is_held_through_its_back_off_and_its_next_worker_resumes_after_what_was_landed(
        emulators, aws_settings, kinesis_client, dynamodb_client, unique_name, tmp_path):
    """With the zone refusing writes, the lease was spawned again every cycle and each worker read the shard again;
    now the lease stays ours (renewed by the manager, so no peer takes it to fail too) while it backs off, and once
    the zone accepts writes the next worker reads on after the last landed record — although nothing was
    checkpointed (pipeline mode), so a read from the lease's checkpoint would start at the shard's start."""
    stream, app = unique_name("retry"), unique_name("app")
    produce(kinesis_client, stream, 20, create_shards=1, seed=1)
    zone, refuse, firsts = tmp_path / "zone", tmp_path / "refuse", tmp_path / "firsts"
    spec = ProcessorSpec("kcl_pipeline_tests.kcl.flaky_landing:FlakyLanding", {
        "zone": str(zone), "stream": stream, "create_zone": True, "max_batch_age_seconds": 0.5,
        "refuse_while": str(refuse), "firsts": str(firsts)})
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=1.0,
                            lease_expiry_seconds=3.0, cycle_seconds=1.0, aws=aws_settings)
    manager = LeaseManager(config, spec, keepalive_timeout=30.0)
    table = LeaseTable(app, dynamodb_client)
    store = open_store(str(zone))

    def landed() -> int:
        return read_batches(store, stream).num_rows if zone.exists() else 0

    def cycle_until(predicate, what: str):
        def step():
            manager.run_cycle()
            return predicate()
        return wait_until(step, 120, what, interval=0.5)

    try:
        manager.start()
        cycle_until(lambda: landed() == 20, "the first 20 records landed")
        last_landed = max(read_batches(store, stream).column("sequence_number").to_pylist(), key=int)
        refuse.touch()
        produce(kinesis_client, stream, 20, first_id=20, seed=2)
        # Failing again and again: held here all along, each retry after a longer back-off.
        cycle_until(lambda: manager.state.backoffs.get(SHARD) is not None
                    and manager.state.backoffs[SHARD].failures >= 2, "two failures in a row")
        assert table.get(SHARD).lease_owner == "me"
        assert manager.metrics.snapshot()["counters"]["worker_failures"] >= 2
        refuse.unlink()
        cycle_until(lambda: landed() == 40, "the other 20 records landed once the zone took writes")
    finally:
        manager.shutdown(timeout=20)
    rows = read_batches(store, stream)
    assert rows.num_rows == 40 and len(set(rows.column("sequence_number").to_pylist())) == 40
    assert table.get(SHARD).checkpoint.sequence_number == "TRIM_HORIZON", "pipeline mode never checkpoints"
    resumed = [int(line.split()[1]) for line in firsts.read_text().splitlines()[1:]]
    assert resumed and all(first > int(last_landed) for first in resumed), (last_landed, resumed)
