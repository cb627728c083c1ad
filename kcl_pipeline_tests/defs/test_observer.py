"""The sensor as an observer: the fleet is `kcl-pipeline consume --checkpoint-by dagster` members outside the
code server; the sensor hosts no worker, reports each complete window once and requests its transform, and the
members never checkpoint (the pipeline does, after the transform)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from dagster import AssetMaterialization

from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
from kcl_pipeline.deployment import fleet_hosting
from kcl_pipeline.kcl.core.model import TRIM_HORIZON
from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableMissing
from kcl_pipeline.windows.keys import partition_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline_tests.defs import test_sensor
from kcl_pipeline_tests.defs.test_sensor import INTERVAL, owners, tick, wait_until

setup = test_sensor.setup  # the sensor tests' fixture

pytestmark = pytest.mark.slow


def _observer(s) -> None:
    s["resources"]["consumer"] = KinesisConsumerResource(**{**s["consumer"].model_dump(), "host_workers": False})


def test_observer_before_any_member_waits_for_the_lease_table(setup):
    s = setup
    _observer(s)
    result = tick(s, None)
    assert "does not exist yet" in result.skip_reason.skip_message and not result.run_requests
    assert not fleet_hosting._REGISTRY  # no lease manager was started


def test_observer_reports_windows_landed_by_a_consume_fleet_member(setup, emulators, tmp_path):
    s = setup
    _observer(s)
    consumer = s["consumer"]
    env = {**os.environ, **emulators.env()}
    member = subprocess.Popen(
        [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", consumer.stream, "--application",
         consumer.application, "--landing", consumer.landing_uri, "--checkpoint-by", "dagster",
         "--worker-id", "ecs-task-1", "--heartbeat-seconds", "1", "--lease-expiry-seconds", "3",
         "--cycle-seconds", "1", "--leases-to-acquire", "2", "--batch-seconds", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def member_holds_every_lease():
            try:
                return set(owners(s["table"]).values()) == {"ecs-task-1"}
            except LeaseTableMissing:  # the member has not created it yet
                return False

        assert wait_until(member_holds_every_lease, 60)
        reported: list[str] = []
        requests = []
        text = None
        deadline = time.monotonic() + 150
        expected = {partition_key(w) for w in s["windows"]}
        while not expected <= set(reported) and time.monotonic() < deadline:
            result = tick(s, text)
            text = result.cursor
            reported += [e.partition for e in result.asset_events if isinstance(e, AssetMaterialization)]
            requests += result.run_requests
            assert not fleet_hosting._REGISTRY  # the observer never hosts a worker
            time.sleep(INTERVAL)
        assert expected <= set(reported), f"windows reported: {sorted(reported)}"
        assert len(reported) == len(set(reported))  # once each
        assert [r.partition_key for r in requests] == reported
        assert Cursor.parse(text).worker_id is None
        # The member landed but left every checkpoint to the pipeline.
        assert {lease.checkpoint.sequence_number for lease in s["table"].scan()} == {TRIM_HORIZON}
        assert set(owners(s["table"]).values()) == {"ecs-task-1"}
    finally:
        member.send_signal(signal.SIGTERM)
        output = member.communicate(timeout=60)[0].decode()
    assert member.returncode == 0, output


def test_fleet_observation_has_fixed_keys_and_the_lease_table(setup):
    """Plot keys do not multiply with shards or owners; the leases are one table (lease, owner, counter, ...)."""
    from dagster import AssetObservation, TableMetadataValue

    s = setup
    _observer(s)
    s["table"].ensure_table()
    result = tick(s, None)
    (observation,) = [e for e in result.asset_events if isinstance(e, AssetObservation)]
    meta = observation.metadata
    assert set(meta) == {"total_leases", "total_shards", "unclaimed_leases", "worker_leases", "leases_held",
                         "consumers", "max_lag_ms", "leases", "lease_workers_on_host", "lease_workers_pss_mib",
                         "lease_worker_pss_max_mib", "lease_worker_uss_max_mib", "worker_start_method"}
    assert isinstance(meta["leases"], TableMetadataValue)
    assert [c.name for c in meta["leases"].schema.columns] == ["lease", "owner", "counter", "checkpoint", "lag_ms"]
    assert meta["total_shards"].value == 2 and meta["leases_held"].value == 0
