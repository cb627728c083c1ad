"""A multi-stream Dagster deployment end to end, against the emulators over HTTP, a real Dagster instance and a
real SparkSession: two streams in one application (one lease table, one hosted lease manager), each with its
own assets and window partitions. The sensor reports each stream's windows once, the window runs it requests
transform each stream's records into its own output, and each stream's checkpoints reach its own last landed
record, never another stream's."""
from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner
from dagster import AssetKey, AssetMaterialization, DagsterInstance, RunsFilter, build_sensor_context
from dagster_aws.s3 import S3Resource

from kcl_pipeline.cli import main
from kcl_pipeline.defs.kinesis import definitions as definitions_module
from kcl_pipeline.defs.kinesis.definitions import build_definitions
from kcl_pipeline.defs.kinesis.resources import AwsResource, KinesisConsumerResource, SparkResource, spark_config
from kcl_pipeline.deployment.fleet_hosting import CONSUMER_SENSOR, shutdown_hosted
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.deployment.streams import stream_prefix
from kcl_pipeline.kcl.core.model import SHARD_END, Checkpoint
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, stream_scope, wait_stream_active
from kcl_pipeline.local.producer import produce
from kcl_pipeline.transform.job import read_partition
from kcl_pipeline.windows.keys import partition_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import landing_directory
from kcl_pipeline.zone.progress import progress_from_leases
from kcl_pipeline.zone.store import open_store

pytestmark = pytest.mark.slow
W = 60_000


@pytest.fixture
def deployment(emulators, aws_settings, unique_name, tmp_path, monkeypatch, spark):
    kinesis = client("kinesis", aws_settings)
    orders, clicks = unique_name("orders"), unique_name("clicks")
    before = int(time.time() * 1000)
    produce(kinesis, orders, 60, aggregate=3, create_shards=2, seed=1)
    produce(kinesis, clicks, 40, aggregate=1, create_shards=1, first_id=1000, seed=2)
    after = int(time.time() * 1000)
    start = datetime.fromtimestamp((before - before % W) / 1000 - 3600, tz=timezone.utc)
    settings = PipelineSettings(
        stream=orders, more_streams=(clicks,), application=unique_name("app"), window_minutes=1,
        partitions_start=start, landing_uri=str(tmp_path / "zone"), output_uri=str(tmp_path / "out"),
        create_zones=True, host_workers=True, sensor_interval_seconds=5, heartbeat_seconds=1.0,
        lease_expiry_seconds=3.0, grace_seconds=1.0)
    consumer = KinesisConsumerResource.from_settings(settings)
    resources = {
        "consumer": KinesisConsumerResource(**{**consumer.model_dump(), "leases_to_acquire": 3}),
        "aws": AwsResource(region=emulators.region, kinesis_endpoint_url=emulators.kinesis,
                           dynamodb_endpoint_url=emulators.dynamodb, s3_endpoint_url=emulators.s3,
                           cloudwatch_endpoint_url=emulators.cloudwatch),
        "s3": S3Resource(endpoint_url=emulators.s3, region_name=emulators.region),
        "pyspark": SparkResource(spark_config=spark_config(settings)),
    }
    monkeypatch.setattr(definitions_module, "build_resources", lambda _settings, env=None: resources)
    defs = build_definitions(settings)
    yield dict(defs=defs, resources=resources, settings=settings, kinesis=kinesis, aws=aws_settings,
               env=emulators.env(),
               streams={orders: 100, clicks: 40},  # orders: 60 now, 40 more after its split
               first=before - before % W, last=after - after % W,
               instance=DagsterInstance.ephemeral(), table=LeaseTable(settings.application,
                                                                      client("dynamodb", aws_settings)))
    shutdown_hosted(timeout=15)


def _landed_last(store, directory: str, first: int, last: int) -> dict[str, object]:
    """Per shard id, the last record landed in the stream's directory."""
    out = {}
    for batch in sorted(list_batches(store, directory, first, last + W), key=lambda b: b.last.key()):
        out[batch.shard_id] = batch.last
    return out


def test_two_streams_are_reported_transformed_and_checkpointed_each_in_its_own_partitions(deployment):
    d = deployment
    defs, instance = d["defs"], d["instance"]
    sensor = defs.get_sensor_def(CONSUMER_SENSOR)
    scopes = {stream: stream_scope(d["kinesis"], stream) for stream in d["streams"]}
    directories = {stream: landing_directory(stream, scope.identifier) for stream, scope in scopes.items()}
    store = open_store(d["settings"].landing_uri)
    orders = next(iter(d["streams"]))
    parent = "shardId-000000000000"

    reported: Counter = Counter()
    cursor = None
    split = False

    def stream_leases(stream):
        scope = scopes[stream]
        return {scope.shard_id(lease.lease_key): lease for lease in d["table"].scan() if scope.owns(lease.lease_key)}

    def checkpoints_reached() -> bool:
        """Each stream's checkpoints at its own last landed records; the split parent ended (its lease may
        be gone already: a finished lease is deleted once its children have moved on)."""
        for stream in d["streams"]:
            landed = _landed_last(store, directories[stream], d["first"], int(time.time() * 1000) // W * W)
            listed = list_shards(d["kinesis"], stream)
            closed = {s.shard_id for s in listed if s.ending_sequence_number}
            leases = stream_leases(stream)
            if not landed or not {s.shard_id for s in listed} - closed <= set(leases):  # children have leases
                return False
            for shard, last in landed.items():
                lease = leases.get(shard)
                if shard in closed:
                    if lease is not None and lease.checkpoint != Checkpoint(SHARD_END):
                        return False
                elif lease is None or lease.checkpoint != last:
                    return False
        return split

    def split_orders() -> None:
        """Split the orders stream's first shard once it has landed, and produce into its children."""
        shard = next(x for x in list_shards(d["kinesis"], orders) if x.shard_id == parent)
        lo, hi = int(shard.hash_key_range.starting_hash_key), int(shard.hash_key_range.ending_hash_key)
        d["kinesis"].split_shard(StreamName=orders, ShardToSplit=parent, NewStartingHashKey=str((lo + hi) // 2))
        wait_stream_active(d["kinesis"], orders)
        produce(d["kinesis"], orders, 40, aggregate=1, first_id=60, seed=3)

    deadline = time.monotonic() + 360
    while time.monotonic() < deadline:
        with build_sensor_context(cursor=cursor, resources=d["resources"], instance=instance) as context:
            result = sensor(context)
        cursor = result.cursor
        for event in result.asset_events or []:
            if isinstance(event, AssetMaterialization):
                reported[(event.asset_key.path[0], event.partition)] += 1
        for request in result.run_requests or []:
            job = defs.resolve_job_def(request.job_name)
            assert job.execute_in_process(partition_key=request.partition_key, instance=instance,
                                          tags=request.tags).success
        progress = progress_from_leases(stream_leases(orders).values())
        if not split and len(progress) == 2 and all(p.landed is not None for p in progress.values()):
            split_orders()
            split = True
        if checkpoints_reached():
            break
        time.sleep(2)
    assert checkpoints_reached(), "the checkpoints of both streams never reached their last landed records"
    children = {k for k, lease in stream_leases(orders).items()
                if scopes[orders].lease_key(parent) in lease.parent_shard_ids}
    assert len(children) == 2  # the split's children, leased under the orders stream's multi-stream keys
    # The last window holding a record of either stream (every window up to it has materialised).
    d["last"] = max(b.minute_ms for stream in d["streams"]
                    for b in list_batches(store, directories[stream], d["first"],
                                          int(time.time() * 1000) // W * W + W)) // W * W

    # One cursor section per stream; each stream's windows were reported once, under its own asset keys.
    assert set(Cursor.parse(cursor).streams) == {stream_prefix(s) for s in d["streams"]}
    assert reported and set(reported.values()) == {1}
    for stream, count in d["streams"].items():
        prefix = stream_prefix(stream)
        done = instance.get_materialized_partitions(AssetKey([prefix, "transformed_records"]))
        # The windows holding a batch of this stream: a window of the other stream's only (a setup crossing a
        # minute boundary) may hold nothing of this one, and the checkpoint plan steps over such a window.
        windows = {partition_key(b.minute_ms // W * W)
                   for b in list_batches(store, directories[stream], d["first"], d["last"] + W)}
        assert windows and windows <= done and {p for (s, p) in reported if s == prefix} <= done
        window_runs = instance.get_runs(RunsFilter(job_name=f"kinesis_window_job__{prefix}"))
        assert len(window_runs) == len({r.tags["dagster/partition"] for r in window_runs})  # one per window

        # Every record of the stream in its own output, and nothing of the other stream.
        ids = []
        for window in range(d["first"], d["last"] + W, W):
            table, _ = read_partition(f"{d['settings'].output_uri}/{stream}", "transformed", window)
            ids += [json.loads(p)["id"] for p in table.column("payload").to_pylist()]
        first_id = 0 if stream == orders else 1000
        assert sorted(ids) == list(range(first_id, first_id + count))

    # A backfill of one stream's windows re-reads that stream and finds every record landed already, in the
    # stream's incarnation directory (it never lands a second copy elsewhere).
    backfill = defs.resolve_job_def(f"kinesis_backfill_job__{stream_prefix(orders)}")
    result = backfill.execute_in_process(instance=instance, tags={
        "dagster/asset_partition_range_start": partition_key(d["first"]),
        "dagster/asset_partition_range_end": partition_key(d["last"])})
    assert result.success
    landed = next(e for e in result.get_asset_materialization_events()
                  if e.asset_key == AssetKey([stream_prefix(orders), "landed_records"])).materialization.metadata
    assert landed["records_already_landed"].value == 100 and landed["records_relanded"].value == 0

    # The audit CLI audits each stream in its own directory and output; losing one stream's output fails
    # that stream's windows only.
    env = {**d["env"], "KCL_PIPELINE_STREAM": ",".join(d["streams"]), "KCL_PIPELINE_WINDOW_MINUTES": "1",
           "KCL_PIPELINE_APPLICATION": d["settings"].application,
           "KCL_PIPELINE_LANDING_URI": d["settings"].landing_uri, "KCL_PIPELINE_OUTPUT_URI": d["settings"].output_uri}
    span = f"{datetime.fromtimestamp(d['first'] / 1000, tz=timezone.utc):%Y-%m-%dT%H:%M}Z/" \
           f"{datetime.fromtimestamp((d['last'] + W) / 1000, tz=timezone.utc):%Y-%m-%dT%H:%M}Z"
    audited = CliRunner().invoke(main, ["audit", "--window", span], env=env)
    assert audited.exit_code == 0, audited.output
    for stream in d["streams"]:
        assert f"{stream} " in audited.output
    clicks = list(d["streams"])[1]
    shutil.rmtree(f"{d['settings'].output_uri}/{clicks}/transformed")
    broken = CliRunner().invoke(main, ["audit", "--window", span], env=env)
    failed = [line for line in broken.output.splitlines() if "FAILED:" in line and not line.startswith("FAILED")]
    assert broken.exit_code == 1 and failed and all(line.startswith(f"{clicks} ") for line in failed), broken.output

    # Each stream landed in its incarnation's directory; its leases carry KCL's multi-stream keys.
    assert sorted(store.list_dirs("")) == sorted(directories.values())
    for lease in d["table"].scan():
        assert lease.extra.get("streamName") in {scope.identifier for scope in scopes.values()}


def test_an_observer_names_the_unfinished_leases_of_a_re_created_streams_earlier_incarnation(deployment):
    """The stream's windows follow its current incarnation; what an earlier one landed after its last complete
    window is in no window, and the sensor says so on every tick until an operator removes those leases."""
    from kcl_pipeline.kcl.core.model import Checkpoint, Lease
    from kcl_pipeline.kcl.core.streams import identifier_parts, multi_stream_key

    d = deployment
    orders = next(iter(d["streams"]))
    current = stream_scope(d["kinesis"], orders).identifier
    account, name, epoch = identifier_parts(current)
    earlier = f"{account}:{name}:{epoch - 3600}"
    d["table"].ensure_table()
    assert d["table"].create(Lease(multi_stream_key(earlier, "shardId-000000000000"), Checkpoint("TRIM_HORIZON")))
    observer = KinesisConsumerResource(**{**d["resources"]["consumer"].model_dump(), "host_workers": False})
    sensor = d["defs"].get_sensor_def(CONSUMER_SENSOR)
    with build_sensor_context(resources={**d["resources"], "consumer": observer}, instance=d["instance"]) as context:
        result = sensor(context)
    message = result.skip_reason.skip_message
    assert f"the stream was re-created: unfinished leases of its earlier incarnation {earlier} remain" in message
    assert f"{name}@{epoch - 3600}" in message and not result.run_requests
    assert message.count("re-created") == 1  # only the re-created stream


def test_a_missing_stream_waits_while_the_others_are_observed(deployment, unique_name, monkeypatch):
    """One stream of several deleted (or not created yet): the tick says so and goes on with the others."""
    from dataclasses import replace

    d = deployment
    ghost = unique_name("ghost")
    settings = replace(d["settings"], more_streams=(*d["settings"].more_streams, ghost))
    consumer = KinesisConsumerResource(**{**d["resources"]["consumer"].model_dump(),
                                          "more_streams": list(settings.more_streams), "host_workers": False})
    resources = {**d["resources"], "consumer": consumer}
    monkeypatch.setattr(definitions_module, "build_resources", lambda _settings, env=None: resources)
    d["table"].ensure_table()
    sensor = build_definitions(settings).get_sensor_def(CONSUMER_SENSOR)
    with build_sensor_context(resources=resources, instance=d["instance"]) as context:
        result = sensor(context)
    message = result.skip_reason.skip_message
    assert f"{ghost}: Kinesis stream {ghost} does not exist" in message and "its windows wait" in message
    streams = Cursor.parse(result.cursor).streams
    assert set(streams) == {stream_prefix(s) for s in d["streams"]}  # the others were looked at
