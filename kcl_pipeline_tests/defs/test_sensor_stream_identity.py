"""The hosting sensor refuses a landing directory whose chains are another stream's of the same name, as
`kcl-pipeline consume --landing` does (against the emulators): the tick fails with the consumer's one line, and
nothing is spawned (no lease table, no worker) or written (the zone as it was)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from dagster import DagsterInstance, TimeWindowPartitionsDefinition, build_sensor_context

from kcl_pipeline.defs.kinesis.assets import build_assets
from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
from kcl_pipeline.defs.kinesis.sensors import build_consumer_sensor
from kcl_pipeline.deployment.fleet_hosting import shutdown_hosted
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.shards import resolve_stream_arn
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import PARTITION_FMT
from kcl_pipeline.zone.errors import ForeignStreamError
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.defs.support import pipeline_jobs, sensor_resources
from kcl_pipeline_tests.landing.helpers import T0, Clock, deliver, init, make_records

pytestmark = [pytest.mark.emulator]
W = 60_000
INTERVAL = 2


def test_the_hosting_sensors_tick_fails_on_another_streams_chain_before_any_worker_starts(
        emulators, aws_settings, unique_name, tmp_path):
    """Before, the hosted workers followed the other stream's chain lease after lease and the tick looked
    healthy; now the first tick fails with the line `consume` exits 2 with."""
    kinesis = client("kinesis", aws_settings)
    stream, app = unique_name("orders"), unique_name("app")
    produce(kinesis, stream, 5, create_shards=1, seed=1)
    ours = resolve_stream_arn(kinesis, stream)
    theirs = ours.replace(f":{ours.split(':')[4]}:", ":999999999999:")  # the same name in another account
    zone = tmp_path / "zone"
    zone.mkdir()
    store = open_store(str(zone))
    clock = Clock(T0 + 120_000)
    other = LandingProcessor(store, stream, stream_arn=theirs, max_batch_records=10, clock=clock.time,
                             monotonic=clock.monotonic)
    init(other)
    deliver(other, make_records(20), 7)
    other.flush()
    landed = sorted(store.list_keys(""))
    assert landed

    now = int(time.time() * 1000)
    partitions = TimeWindowPartitionsDefinition(
        start=datetime.fromtimestamp((now - now % W) / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC")
    _, transformed, checkpoints = build_assets(partitions, W)
    consumer = KinesisConsumerResource(
        stream=stream, application=app, window_minutes=1, landing_uri=str(zone), output_uri=str(tmp_path / "out"),
        create_zones=True, heartbeat_seconds=1.0, lease_expiry_seconds=3.0, grace_seconds=1.0)
    sensor = build_consumer_sensor(partitions, pipeline_jobs(transformed, checkpoints), INTERVAL)
    try:
        for _ in range(2):  # every tick looks again until the zone is put right
            with build_sensor_context(cursor=None, resources=sensor_resources(emulators, consumer),
                                      instance=DagsterInstance.ephemeral()) as context:
                with pytest.raises(ForeignStreamError) as failed:
                    sensor(context)
            line = str(failed.value)
            assert "\n" not in line and ours in line and theirs in line, line
    finally:
        shutdown_hosted(timeout=15)
    assert app not in client("dynamodb", aws_settings).list_tables()["TableNames"]  # no manager started
    assert sorted(store.list_keys("")) == landed
    assert not (tmp_path / "out").exists()
