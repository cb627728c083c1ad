"""The assets with `materialize` on a real SparkSession, against the emulators over HTTP: a backfill lands a window,
Spark transforms it, checkpoints are committed for it, and the asset checks pass — then fail on purpose."""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    TimeWindowPartitionsDefinition,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_aws.s3 import S3Resource

from kcl_pipeline.defs.kinesis.assets import build_assets, kinesis_stream
from kcl_pipeline.defs.kinesis.checks import build_checks
from kcl_pipeline.defs.kinesis.resources import AwsResource, KinesisConsumerResource, SparkResource, spark_config
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.kcl.core.model import Checkpoint, Lease, checkpoint_advances
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import PARTITION_FMT, partition_key
from kcl_pipeline.windows.manifest import commit_key
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.store import open_store

pytestmark = pytest.mark.slow
W = 60_000  # 1-minute windows: the records produced now fall in one or two of them


@pytest.fixture
def pipeline(emulators, aws_settings, unique_name, tmp_path):
    """A 2-shard stream with 120 user records (KPL and plain, 10 poison), an S3 landing zone, a local output,
    and the assets over 1-minute partitions that include the current minute."""
    kinesis = client("kinesis", aws_settings)
    stream, bucket = unique_name("assets"), unique_name("zone")
    client("s3", aws_settings).create_bucket(Bucket=bucket)
    before = int(time.time() * 1000)
    produce(kinesis, stream, 60, aggregate=3, create_shards=2, poison_every=12, seed=1)
    produce(kinesis, stream, 60, aggregate=1, poison_every=12, first_id=60, seed=2)
    after = int(time.time() * 1000)
    partitions = TimeWindowPartitionsDefinition(
        start=datetime.fromtimestamp((before - before % W) / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC", end_offset=1)
    landed, transformed, checkpoints = build_assets(partitions, W)
    checks = build_checks(partitions, W)
    settings = PipelineSettings.from_env({"KCL_PIPELINE_WINDOW_MINUTES": "1",
                                          "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
    consumer = KinesisConsumerResource(stream=stream, application=unique_name("app"), window_minutes=1,
                                       landing_uri=f"s3://{bucket}/landing", output_uri=str(tmp_path / "out"),
                                       create_zones=True, grace_seconds=1.0)
    resources = {
        "consumer": consumer,
        "aws": AwsResource(region=emulators.region, kinesis_endpoint_url=emulators.kinesis,
                           dynamodb_endpoint_url=emulators.dynamodb, s3_endpoint_url=emulators.s3,
                           cloudwatch_endpoint_url=emulators.cloudwatch),
        "s3": S3Resource(endpoint_url=emulators.s3, region_name=emulators.region),
        "pyspark": SparkResource(spark_config=spark_config(settings)),
    }
    first, last = before - before % W, after - after % W
    return dict(stream=stream, consumer=consumer, resources=resources, assets=[kinesis_stream, landed, transformed,
                checkpoints], checks=list(checks), first=first, last=last, aws=aws_settings, partitions=partitions,
                instance=DagsterInstance.ephemeral(), windows=list(range(first, last + W, W)))


def run(p, selection, checks=()):
    keys = {"range": (partition_key(p["first"]), partition_key(p["last"]))}
    chosen = AssetSelection.assets(*selection).without_checks() | AssetSelection.checks(*checks)
    return materialize([*p["assets"], *p["checks"]], selection=chosen, resources=p["resources"],
                       instance=p["instance"], raise_on_error=False,
                       tags={ASSET_PARTITION_RANGE_START_TAG: keys["range"][0],
                             ASSET_PARTITION_RANGE_END_TAG: keys["range"][1]})


def materialization(result, key: str):
    (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(key)][:1]
    return event.step_materialization_data.materialization.metadata


def evaluations(result) -> dict[str, bool]:
    return {ev.check_name: ev.passed for ev in result.get_asset_check_evaluations()}


def test_backfill_transform_checkpoint_and_audit(spark, pipeline, aws_settings):
    p = pipeline
    landed = run(p, [AssetKey("landed_records")], [AssetCheckKey(AssetKey("landed_records"), "chain_unbroken")])
    assert landed.success
    meta = materialization(landed, "landed_records")
    assert meta["rows"].value == 120 and meta["records_relanded"].value == 120 and meta["bytes"].value > 0
    assert set(meta["per_shard"].value) == {"shardId-000000000000", "shardId-000000000001"}
    assert evaluations(landed) == {"chain_unbroken": True}

    # Re-running the backfill lands nothing twice.
    again = run(p, [AssetKey("landed_records")])
    assert materialization(again, "landed_records")["records_already_landed"].value == 120
    store = open_store(p["consumer"].landing_uri, aws_settings)
    table = read_batches(store, p["stream"], p["first"], p["last"] + W)
    positions = list(zip(table.column("sequence_number").to_pylist(), table.column("sub_sequence_number").to_pylist(),
                         strict=True))
    assert len(positions) == len(set(positions)) == 120

    # The live consumer's lease table: every shard landed its last record (progress from its heartbeats). Its
    # leases start AT_TIMESTAMP where the backfill began, so the plan proves each shard's first batch by the
    # start link the backfill claimed (a TRIM_HORIZON lease waits until a live writer saw where it begins).
    table_client = LeaseTable(p["consumer"].application, client("dynamodb", aws_settings))
    table_client.ensure_table()
    last_of = {}
    for shard_id in ("shardId-000000000000", "shardId-000000000001"):
        listed = list_batches(store, p["stream"], p["first"], p["last"] + W)
        mine = sorted((b for b in listed if b.shard_id == shard_id), key=lambda b: b.last.key())
        last_of[shard_id] = mine[-1].last
        progress = ShardProgress(shard_id, mine[-1].last, p["last"] + 1, last_batch_key=mine[-1].key())
        attrs = {k: v for k, v in progress.to_attributes().items() if v is not None}
        assert table_client.create(Lease(shard_id, Checkpoint("AT_TIMESTAMP", p["first"]), lease_owner="live",
                                         extra={**attrs, CLAIM_OWNER_ATTRIBUTE: "live"}))  # held by this protocol

    done = run(p, [AssetKey("transformed_records"), AssetKey("kinesis_checkpoints")],
               [AssetCheckKey(AssetKey("transformed_records"), "rows_reconcile"),
                AssetCheckKey(AssetKey("kinesis_checkpoints"), "checkpoint_within_materialised")])
    assert done.success
    t = materialization(done, "transformed_records")
    assert (t["rows_in"].value, t["rows_out"].value, t["duplicates_dropped"].value, t["quarantined"].value) == \
        (120, 110, 0, 10)
    assert t["windows"].value == len(p["windows"]) and [c.name for c in t["schema"].value.columns][:3] == \
        ["shard_id", "sequence_number", "sub_sequence_number"]
    c = materialization(done, "kinesis_checkpoints")
    committed = {row["shard_id"]: (row["sequence_number"], row["sub_sequence_number"]) for row in c["committed"].value}
    assert committed == {k: (v.sequence_number, v.sub_sequence_number) for k, v in last_of.items()}
    assert {lease.lease_key: lease.checkpoint for lease in table_client.scan()} == last_of
    assert evaluations(done) == {"rows_reconcile": True, "checkpoint_within_materialised": True}

    # Tampering: an unreadable batch breaks the chain and the counts; a lost window commit (what makes a window
    # materialised) leaves the committed checkpoints beyond what materialised.
    victim = list_batches(store, p["stream"], p["first"], p["last"] + W)[0]
    bucket = p["consumer"].landing_uri[len("s3://"):].split("/")[0]
    client("s3", aws_settings).put_object(Bucket=bucket, Key=f"landing/{victim.key()}", Body=b"not parquet")
    broken = run(p, [], [AssetCheckKey(AssetKey("landed_records"), "chain_unbroken"),
                         AssetCheckKey(AssetKey("transformed_records"), "rows_reconcile")])
    assert evaluations(broken) == {"chain_unbroken": False, "rows_reconcile": False}
    for window in p["windows"]:
        os.unlink(f"{p['consumer'].output_uri}/{commit_key(window)}")
    lost = run(p, [], [AssetCheckKey(AssetKey("kinesis_checkpoints"), "checkpoint_within_materialised")])
    assert evaluations(lost) == {"checkpoint_within_materialised": False}


def test_backfill_refuses_to_land_ahead_of_the_live_consumer(spark, pipeline, aws_settings):
    p = pipeline
    table = LeaseTable(p["consumer"].application, client("dynamodb", aws_settings))
    table.ensure_table()
    assert table.create(Lease("shardId-000000000000", Checkpoint("TRIM_HORIZON"), lease_owner="live"))
    past = ShardProgress("shardId-000000000001", None, None, p["last"] + W + 60_000, 0)  # caught up after the end
    assert table.create(Lease("shardId-000000000001", Checkpoint("TRIM_HORIZON"), lease_owner="live",
                              extra={k: v for k, v in past.to_attributes().items() if v is not None}))
    result = run(p, [AssetKey("landed_records")])
    assert not result.success
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0].event_specific_data
    assert "has not finished landing this range for shardId-000000000000" in failure.user_failure_data.description
    store = open_store(p["consumer"].landing_uri, aws_settings)
    assert {b.shard_id for b in list_batches(store, p["stream"], p["first"], p["last"] + W)} == {"shardId-000000000001"}
    assert {lease.lease_key: (lease.checkpoint, lease.lease_owner, lease.lease_counter) for lease in table.scan()} \
        == {s: (Checkpoint("TRIM_HORIZON"), "live", 0) for s in ("shardId-000000000000", "shardId-000000000001")}


def test_a_backfill_cut_by_its_deadline_fails_instead_of_materialising_part_of_a_window(spark, pipeline):
    """Before: a backfill stopped by its deadline still materialised landed_records, as if the window were
    whole. Now the run fails, names the shards it did not finish, and keeps what it landed."""
    p = pipeline
    p["resources"]["consumer"] = KinesisConsumerResource(**{**p["consumer"].model_dump(),
                                                            "backfill_deadline_seconds": 0.0})
    result = run(p, [AssetKey("landed_records")])
    assert not result.success and not result.get_asset_materialization_events()
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0].event_specific_data
    assert "reached its deadline" in failure.user_failure_data.description
    assert "shardId-000000000000, shardId-000000000001" in failure.user_failure_data.description


def test_a_window_that_received_a_batch_after_its_run_is_requested_again(spark, pipeline, aws_settings):
    """Before: a batch landing in a materialised window after its run listed the zone (here a backfill's
    refill of a lost batch) held the shard's checkpoint before it for ever, and nothing asked for the window
    again. Now the checkpoint run names it and the sensor requests the window's run once more (and follows it:
    test_window_tracking_instance.py)."""
    from kcl_pipeline.windows.checkpoints.record import read_checkpoint_record
    from kcl_pipeline.windows.followup import reopen_run_key, track_reports

    p = pipeline
    assert run(p, [AssetKey("landed_records")]).success
    store = open_store(p["consumer"].landing_uri, aws_settings)
    table = LeaseTable(p["consumer"].application, client("dynamodb", aws_settings))
    table.ensure_table()
    for shard_id in ("shardId-000000000000", "shardId-000000000001"):
        mine = [b for b in list_batches(store, p["stream"], p["first"], p["last"] + W) if b.shard_id == shard_id]
        # landed past the range: the live consumer is done with it, so the refill below may run
        progress = ShardProgress(shard_id, mine[-1].last, p["last"] + W, last_batch_key=mine[-1].key())
        assert table.create(Lease(shard_id, Checkpoint("TRIM_HORIZON"), lease_owner="live",
                                  extra={k: v for k, v in progress.to_attributes().items() if v is not None}))
    lost = [b for b in list_batches(store, p["stream"], p["first"], p["last"] + W)
            if b.shard_id == "shardId-000000000000"][-1]
    bucket, prefix = p["consumer"].landing_uri[len("s3://"):].split("/", 1)
    client("s3", aws_settings).delete_object(Bucket=bucket, Key=f"{prefix}/{lost.key()}")
    # its manifest cannot name the lost batch; its check publishes its commit
    assert run(p, [AssetKey("transformed_records")], [AssetCheckKey(AssetKey("transformed_records"),
                                                                    "rows_reconcile")]).success
    refill = run(p, [AssetKey("landed_records")])
    assert materialization(refill, "landed_records")["records_relanded"].value > 0  # the lost batch is back

    checkpoints = run(p, [AssetKey("kinesis_checkpoints")])
    assert checkpoints.success
    window = partition_key(lost.minute_ms - lost.minute_ms % W)
    assert materialization(checkpoints, "kinesis_checkpoints")["reopened_windows"].value == {window: [lost.key()]}
    checkpoint = {lease.lease_key: lease.checkpoint for lease in table.scan()}["shardId-000000000000"]
    assert checkpoint_advances(checkpoint, lost.first)  # never past a batch no run transformed
    # what the sensor reads: the checkpoint record the run stored beside the commits (not the metadata)
    report = read_checkpoint_record(open_store(p["consumer"].output_uri))
    assert report is not None and report.new_since(None)
    assert report.late == {lost.minute_ms - lost.minute_ms % W: (lost.key(),)}
    assert report.requested_for == (p["first"], p["last"] + W)  # the run's partition range
    tracked = track_reports({}, report.late, report.uncommitted, report=str(report.report),
                            reported_before_ms=None, now_ms=int(time.time() * 1000), partition=partition_key)
    (start,) = tracked.request
    assert (partition_key(start), tracked.outstanding[start].run_key(window)) == \
        (window, reopen_run_key(window, [lost.key()]))


def test_a_stop_during_the_transform_cancels_the_run_instead_of_failing_it(spark, pipeline, monkeypatch):
    """Before: Ctrl-C on the demo or `dagster dev` while a window's transform ran reached the run worker (same
    process group) and Dagster recorded the run as failed ("interrupted unexpectedly"): a failed run on the Runs
    page after every such stop. Now the run ends CANCELED, which the sensor requests again on the next start."""
    import signal

    from dagster import DagsterRunStatus

    from kcl_pipeline.transform import job

    transform = job.transform_window

    def stopped_while_transforming(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # what a terminal's Ctrl-C sends the run worker
        return transform(*args, **kwargs)

    monkeypatch.setattr(job, "transform_window", stopped_while_transforming)
    p = pipeline
    before = signal.getsignal(signal.SIGINT)
    result = run(p, [AssetKey("transformed_records")])
    assert not result.get_asset_materialization_events()
    status = p["instance"].get_run_by_id(result.run_id).status
    assert status == DagsterRunStatus.CANCELED, status
    # the handler the step replaced is back: a later Ctrl-C is this process's own again
    assert signal.getsignal(signal.SIGINT) is before
