"""The hosting sensor's tick fails once its lease manager has made no progress for the stall time (against the
emulators): before, it says so in its status line; from then on the tick raises the consumer's one line."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from dagster import (
    DagsterInstance,
    SensorResult,
    TimeWindowPartitionsDefinition,
    build_sensor_context,
)

from kcl_pipeline.defs.kinesis.assets import build_assets
from kcl_pipeline.defs.kinesis.resources import AwsResource, KinesisConsumerResource
from kcl_pipeline.defs.kinesis.sensors import build_consumer_sensor
from kcl_pipeline.deployment.fleet_hosting import shutdown_hosted
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import PARTITION_FMT
from kcl_pipeline_tests.defs.support import pipeline_jobs, sensor_resources

pytestmark = [pytest.mark.emulator, pytest.mark.slow]
W = 60_000
INTERVAL = 2


def test_the_hosting_sensors_tick_fails_once_no_cycle_succeeded_for_the_stall_time(emulators, aws_settings,
                                                                                 unique_name, tmp_path):
    """A hosted manager whose lease table is gone made each tick a failure with the raw error, or nothing at all
    that said the consumer had stopped making progress; now the tick fails with the line `consume` exits with."""
    kinesis = client("kinesis", aws_settings)
    stream, app = unique_name("stalled"), unique_name("app")
    now = int(time.time() * 1000)
    produce(kinesis, stream, 5, create_shards=1, seed=1)
    partitions = TimeWindowPartitionsDefinition(
        start=datetime.fromtimestamp((now - now % W) / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC")
    _, transformed, checkpoints = build_assets(partitions, W)
    jobs = pipeline_jobs(transformed, checkpoints)
    consumer = KinesisConsumerResource(
        stream=stream, application=app, window_minutes=1, landing_uri=str(tmp_path / "zone"),
        output_uri=str(tmp_path / "out"), create_zones=True, heartbeat_seconds=1.0, lease_expiry_seconds=3.0,
        grace_seconds=1.0, stall_seconds=4.0)
    resources = sensor_resources(emulators, consumer)
    sensor = build_consumer_sensor(partitions, jobs, INTERVAL)
    instance = DagsterInstance.ephemeral()

    def tick(cursor: str | None) -> SensorResult:
        with build_sensor_context(cursor=cursor, resources=resources, instance=instance) as context:
            result = sensor(context)
        assert isinstance(result, SensorResult)
        return result

    try:
        first = tick(None)
        assert "cycle: leases=1" in first.skip_reason.skip_message
        client("dynamodb", aws_settings).delete_table(TableName=app)
        said: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                result = tick(first.cursor)
            except Exception as exc:  # the stall: the tick fails
                failure = str(exc)
                break
            said.append(result.skip_reason.skip_message)  # before the stall time: a failed cycle, said as such
            time.sleep(0.5)
        else:
            raise AssertionError(f"no tick failed within 120 s; they said {said[-3:]}")
    finally:
        shutdown_hosted(timeout=15)
    assert all("lease-manager cycle failed" in line for line in said if "cycle: leases" not in line), said
    assert "no lease-manager cycle succeeded for " in failure and app in failure, failure


def test_a_fleet_members_tick_says_a_failed_cycle_then_fails_once_the_member_stalled(monkeypatch):
    """The `kinesis_fleet_member` sensor hosts a manager too: the same status line, then the same failure."""
    from kcl_pipeline.defs.kinesis import tick as ticks
    from kcl_pipeline.deployment.fleet_hosting import FleetCycle
    from kcl_pipeline.kcl.core.fleet.cycle import CycleReport
    from kcl_pipeline.kcl.shells.fleet.manager import ManagerStalled

    answers = [FleetCycle("dagster-h-member#1", CycleReport(), [], [],
                          failure="lease-manager cycle failed (none succeeded for 40 s; the ticks fail from 300 s): "
                                  "EndpointConnectionError: could not connect"),
               ManagerStalled("no lease-manager cycle succeeded for 302 s (15 failed): EndpointConnectionError: "
                              "could not connect")]

    def hosted_cycle(*_args, **_kwargs):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ticks, "hosted_cycle", hosted_cycle)
    consumer = KinesisConsumerResource(stream="orders", application="app", landing_uri="/tmp/zone",
                                       output_uri="/tmp/out", host_workers=True)
    aws = AwsResource(region="eu-west-1")
    with build_sensor_context() as context:
        said = ticks.member_tick(context, consumer, aws, 5.0)
    assert "lease-manager cycle failed" in said.skip_reason.skip_message and not said.run_requests
    with build_sensor_context() as context, pytest.raises(ManagerStalled, match="no lease-manager cycle succeeded"):
        ticks.member_tick(context, consumer, aws, 5.0)
