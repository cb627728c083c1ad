"""Least privilege, proven for the Dagster code location and the Spark executors: their AWS calls in real runs
on the emulators are all allowed by the policies docs/deployment.md gives them (kcl_pipeline_tests/iam_policies.py
reads them from the page).

One test, two parts, each recording into its own file (KCL_PIPELINE_AWS_CALL_LOG):
- the `kinesis_consumer` sensor hosting the fleet (build_sensor_context, as defs/test_sensor.py): ticks until its
  workers, forked from the test process, are reading, then stops them: they land what they read and release;
- the window run on another stream (materialize, as defs/test_assets.py): the backfill lands the windows,
  Spark transforms them into an S3 output (the driver's calls, and the executors' — the data sources' Python
  workers, given the recording variable through the SparkContext's executor environment), the checkpoints are
  committed and the asset checks (the audit) run.
Both with SSE-KMS and an expected bucket owner configured: every S3 request, the executors' too, carries them.
"""
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
    build_sensor_context,
    define_asset_job,
    materialize,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from dagster_aws.s3 import S3Resource

from kcl_pipeline.defs.kinesis.assets import build_assets, kinesis_stream
from kcl_pipeline.defs.kinesis.checks import build_checks
from kcl_pipeline.defs.kinesis.jobs import CHECKPOINTS_JOB, WINDOW_JOB
from kcl_pipeline.defs.kinesis.resources import (
    SPARK_RUN_TAG,
    AwsResource,
    KinesisConsumerResource,
    SparkResource,
    spark_config,
)
from kcl_pipeline.defs.kinesis.sensors import build_consumer_sensor
from kcl_pipeline.deployment.fleet_hosting import shutdown_hosted
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.kcl.aws_settings import AWS_CALL_LOG_ENV, S3_EXPECTED_BUCKET_OWNER_ENV, S3_SSE_KMS_KEY_ID_ENV
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import PARTITION_FMT, partition_key
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.iam_policies import EMULATOR_ACCOUNT, denied, documented_policies, read_calls

pytestmark = pytest.mark.slow
W = 60_000
INTERVAL = 2
OWNER = "111122223333"
NAMESPACE = "KclPipelineIam"


def test_the_code_location_and_the_executors_call_only_what_their_policies_allow(
        spark, emulators, aws_settings, unique_name, tmp_path, monkeypatch):
    kinesis, s3 = client("kinesis", aws_settings), client("s3", aws_settings)
    landing_bucket, output_bucket = unique_name("landing"), unique_name("output")
    s3.create_bucket(Bucket=landing_bucket)
    s3.create_bucket(Bucket=output_bucket)
    hosted_stream, run_stream = unique_name("iamhost"), unique_name("iamrun")
    hosted_app, run_app = unique_name("hostapp"), unique_name("runapp")
    before = int(time.time() * 1000)
    produce(kinesis, hosted_stream, 40, aggregate=2, create_shards=2, seed=1)
    produce(kinesis, run_stream, 60, aggregate=3, create_shards=2, poison_every=12, seed=2)
    after = int(time.time() * 1000)
    first, last = before - before % W, after - after % W
    partitions = TimeWindowPartitionsDefinition(
        start=datetime.fromtimestamp(first / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC", end_offset=1)
    key = f"arn:aws:kms:{emulators.region}:{EMULATOR_ACCOUNT}:key/0b1c2d3e-0000-4000-8000-00000000abcd"
    monkeypatch.setenv(S3_SSE_KMS_KEY_ID_ENV, key)
    monkeypatch.setenv(S3_EXPECTED_BUCKET_OWNER_ENV, OWNER)

    def consumer(stream: str, app: str) -> KinesisConsumerResource:
        return KinesisConsumerResource(
            stream=stream, application=app, window_minutes=1, landing_uri=f"s3://{landing_bucket}/landing",
            output_uri=f"s3://{output_bucket}/output", grace_seconds=1.0, heartbeat_seconds=1.0,
            lease_expiry_seconds=3.0, leases_to_acquire=2, metrics_namespace=NAMESPACE)

    aws = AwsResource(region=emulators.region, kinesis_endpoint_url=emulators.kinesis,
                      dynamodb_endpoint_url=emulators.dynamodb, s3_endpoint_url=emulators.s3,
                      cloudwatch_endpoint_url=emulators.cloudwatch)
    s3_resource = S3Resource(endpoint_url=emulators.s3, region_name=emulators.region)

    # The sensor hosting the fleet, until both its workers are reading.
    # The test's own clients are made before the recording starts (a client records when made with it on).
    run = consumer(run_stream, run_app)
    hosted = consumer(hosted_stream, hosted_app)
    landing = open_store(hosted.landing_uri, aws_settings)
    run_table = LeaseTable(run_app, client("dynamodb", aws_settings))
    hosting_calls = tmp_path / "sensor.jsonl"
    monkeypatch.setenv(AWS_CALL_LOG_ENV, str(hosting_calls))
    landed, transformed, checkpoints = build_assets(partitions, W)
    jobs = [define_asset_job(WINDOW_JOB, selection=AssetSelection.assets(transformed, checkpoints),
                             partitions_def=partitions, tags={SPARK_RUN_TAG: "true"}),
            define_asset_job(CHECKPOINTS_JOB, selection=AssetSelection.assets(checkpoints), partitions_def=partitions)]
    sensor = build_consumer_sensor(partitions, jobs, INTERVAL)
    instance = DagsterInstance.ephemeral()
    def workers_reading() -> set[int]:
        return {c["pid"] for c in read_calls(hosting_calls) if c["call"] == "kinesis:GetRecords"} - {os.getpid()}

    cursor, ticked = None, 0.0
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and len(workers_reading()) < 2:
            if time.monotonic() - ticked >= INTERVAL:
                ticked = time.monotonic()
                with build_sensor_context(cursor=cursor, instance=instance,
                                          resources={"consumer": hosted, "aws": aws, "s3": s3_resource}) as context:
                    cursor = sensor(context).cursor
            time.sleep(0.3)
        assert len(workers_reading()) == 2
    finally:
        # Stopping, the workers land what they read (a batch flushes by age only after 30 s) and release their
        # leases: those calls are in the file too.
        shutdown_hosted(timeout=15)
    assert read_batches(landing, hosted_stream).num_rows > 0

    # The window run on the other stream: backfill, transform, checkpoints, checks.
    run_calls, executor_calls = tmp_path / "run.jsonl", tmp_path / "executors.jsonl"
    monkeypatch.setenv(AWS_CALL_LOG_ENV, str(run_calls))
    # The data sources carry the executor environment of their registration, which every window run makes
    # (transform/datasource.py): this run's with the recording variable, the next one's without it.
    environment = spark.sparkContext.environment
    environment[AWS_CALL_LOG_ENV] = str(executor_calls)
    try:
        settings = PipelineSettings.from_env({"KCL_PIPELINE_WINDOW_MINUTES": "1",
                                              "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
        resources = {"consumer": run, "aws": aws, "s3": s3_resource,
                     "pyspark": SparkResource(spark_config=spark_config(settings))}
        assets, checks = [kinesis_stream, landed, transformed, checkpoints], list(build_checks(partitions, W))
        tags = {ASSET_PARTITION_RANGE_START_TAG: partition_key(first),
                ASSET_PARTITION_RANGE_END_TAG: partition_key(last)}

        def materialise(selection, check_names):
            chosen = AssetSelection.assets(*map(AssetKey, selection)).without_checks() | AssetSelection.checks(
                *(AssetCheckKey(AssetKey(asset), name) for asset, name in check_names))
            result = materialize([*assets, *checks], selection=chosen, resources=resources, instance=instance,
                                 raise_on_error=False, tags=tags)
            assert result.success
            return result

        materialise(["landed_records"], [("landed_records", "chain_unbroken")])
        # The live fleet's leases, as test_assets makes them: every shard landed its last record.
        run_table.ensure_table()
        for shard_id in ("shardId-000000000000", "shardId-000000000001"):
            mine = sorted((b for b in list_batches(landing, run_stream, first, last + W) if b.shard_id == shard_id),
                          key=lambda b: b.last.key())
            progress = ShardProgress(shard_id, mine[-1].last, last + 1, last_batch_key=mine[-1].key())
            attrs = {k: v for k, v in progress.to_attributes().items() if v is not None}
            assert run_table.create(Lease(shard_id, Checkpoint("AT_TIMESTAMP", first), lease_owner="live",
                                      extra={**attrs, CLAIM_OWNER_ATTRIBUTE: "live"}))
        done = materialise(["transformed_records", "kinesis_checkpoints"],
                           [("transformed_records", "rows_reconcile"),
                            ("kinesis_checkpoints", "checkpoint_within_materialised")])
        assert all(e.passed for e in done.get_asset_check_evaluations())
    finally:
        del environment[AWS_CALL_LOG_ENV]

    values = {"region": emulators.region, "account": EMULATOR_ACCOUNT, "application": hosted_app,
              "lease-table": hosted_app, "stream": hosted_stream, "landing-bucket": landing_bucket,
              "landing-prefix": "landing", "output-bucket": output_bucket, "output-prefix": "output",
              "metrics-namespace": NAMESPACE, "kms-key-arn": key}
    policies = documented_policies()
    sensor_calls = read_calls(hosting_calls)
    window_calls = read_calls(run_calls)
    spark_calls = read_calls(executor_calls)
    # Each part recorded what it is there for (a part that recorded nothing would prove nothing).
    assert {"dynamodb:CreateTable", "dynamodb:UpdateItem", "kinesis:GetRecords", "s3:PutObject",
            "cloudwatch:PutMetricData"} <= {c["call"] for c in sensor_calls}
    assert len({c["pid"] for c in sensor_calls}) >= 3, "the code server and its two hosted workers"
    assert any(c["call"] == "s3:PutObject" and c["pid"] != os.getpid() and "/_start/" not in c["Key"]
               for c in sensor_calls), "a hosted worker landed a batch"
    assert any(c["pid"] == os.getpid() and c.get("Bucket") == output_bucket for c in sensor_calls), \
        "the tick's reads of the output, through dagster-aws's S3 client"
    assert {"kinesis:GetRecords", "dynamodb:UpdateItem", "s3:PutObject", "s3:GetObject", "s3:ListObjectsV2"} <= \
        {c["call"] for c in window_calls}
    assert {"s3:GetObject"} <= {c["call"] for c in spark_calls} and \
        any(c["Bucket"] == output_bucket for c in spark_calls), "the executors read the zone and wrote the output"
    for c in sensor_calls + window_calls + spark_calls:
        if c["call"].startswith("s3:"):
            assert c.get("ExpectedBucketOwner") == OWNER, c
            if c["call"] in ("s3:PutObject", "s3:CreateMultipartUpload"):
                assert c.get("SSEKMSKeyId") == key, c

    problems = denied(policies["code-location"], sensor_calls, values, kms_key_arn=key)
    run_values = {**values, "application": run_app, "lease-table": run_app, "stream": run_stream}
    problems += denied(policies["code-location"], window_calls, run_values, kms_key_arn=key)
    problems += [f"executors: {p}" for p in denied(policies["spark-executors"], spark_calls, run_values,
                                                   kms_key_arn=key)]
    assert problems == []
