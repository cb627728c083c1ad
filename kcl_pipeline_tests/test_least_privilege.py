"""Least privilege, proven: the consumer host's AWS calls in a real `kcl-pipeline consume` run on the emulators
are all allowed by the policy docs/deployment.md gives it (read from the page), and the checker itself refuses
what a policy does not allow. The code location's and Spark executors' runs: defs/test_least_privilege_runs.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kcl_pipeline.kcl.aws_settings import AWS_CALL_LOG_ENV, S3_EXPECTED_BUCKET_OWNER_ENV, S3_SSE_KMS_KEY_ID_ENV
from kcl_pipeline.kcl.shells.shards import wait_stream_active
from kcl_pipeline.local.producer import produce
from kcl_pipeline.zone.chain import read_batches
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.fanout_endpoint import FanOutEndpoint
from kcl_pipeline_tests.iam_policies import EMULATOR_ACCOUNT, ROLES, denied, documented_policies, read_calls

OWNER = "111122223333"


def kms_key(region: str) -> str:
    return f"arn:aws:kms:{region}:{EMULATOR_ACCOUNT}:key/0b1c2d3e-0000-4000-8000-00000000abcd"


def test_every_role_has_one_documented_policy_of_allow_statements():
    policies = documented_policies()
    assert sorted(policies) == sorted(ROLES)
    for role, policy in policies.items():
        assert policy["Version"] == "2012-10-17" and policy["Statement"], role
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow" and "*" not in str(statement["Action"]), (role, statement)


def test_the_checker_refuses_what_the_policy_does_not_allow():
    policy = documented_policies()["consumer-host"]
    values = {"region": "eu-west-1", "account": EMULATOR_ACCOUNT, "stream": "orders", "application": "app",
              "lease-table": "app", "landing-bucket": "zone", "landing-prefix": "landing",
              "metrics-namespace": "Orders", "kms-key-arn": kms_key("eu-west-1")}
    allowed = [{"call": "dynamodb:UpdateItem", "region": "eu-west-1", "TableName": "app"},
               {"call": "s3:PutObject", "region": "eu-west-1", "Bucket": "zone", "Key": "landing/orders/x"},
               {"call": "cloudwatch:PutMetricData", "region": "eu-west-1", "Namespace": "Orders"}]
    assert denied(policy, allowed, values) == []
    refused = [{"call": "dynamodb:DeleteTable", "region": "eu-west-1", "TableName": "app"},
               {"call": "dynamodb:UpdateItem", "region": "eu-west-1", "TableName": "another-app"},
               {"call": "s3:PutObject", "region": "eu-west-1", "Bucket": "zone", "Key": "elsewhere/x"},
               {"call": "s3:PutObject", "region": "eu-west-1", "Bucket": "zone", "Key": "landing/orders/x",
                "SSEKMSKeyId": "arn:aws:kms:eu-west-1:000000000000:key/another"},
               {"call": "cloudwatch:PutMetricData", "region": "eu-west-1", "Namespace": "Other"},
               {"call": "kinesis:PutRecords", "region": "eu-west-1", "StreamName": "orders"},
               {"call": "sqs:SendMessage", "region": "eu-west-1"}]
    lines = denied(policy, refused, values, kms_key_arn=None)
    assert len(lines) == len(refused), lines
    assert any("no IAM mapping" in line for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("retrieval", ["polling", "fanout"])
def test_the_consumer_hosts_calls_are_all_in_its_documented_policy(retrieval, emulators, kinesis_client, s3_client,
                                                                     unique_name, tmp_path):
    """`consume --landing s3://… --checkpoint-by dagster` with CloudWatch metrics, KCL 3.x worker metrics each
    second (items of the lease table in the one-table layout it starts in) and SSE-KMS, reading by GetRecords or
    by enhanced fan-out (SubscribeToShard through the test's fan-out endpoint, kinesis-local having none): every
    call of the consumer and of its worker processes is recorded, and allowed."""
    stream, app, bucket = unique_name("iam"), unique_name("iamapp"), unique_name("zone")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    s3_client.create_bucket(Bucket=bucket)
    wait_stream_active(kinesis_client, stream)
    produce(kinesis_client, stream, 40, aggregate=2, seed=3)
    calls_file = tmp_path / "calls.jsonl"
    key = kms_key(emulators.region)
    env = {**os.environ, **emulators.env(), AWS_CALL_LOG_ENV: str(calls_file), S3_SSE_KMS_KEY_ID_ENV: key,
           S3_EXPECTED_BUCKET_OWNER_ENV: OWNER}
    endpoint = None
    if retrieval == "fanout":
        endpoint = FanOutEndpoint(emulators.kinesis, heartbeat_seconds=0.2, in_use_seconds=0.3).start()
        env["AWS_ENDPOINT_URL_KINESIS"] = endpoint.url
    zone = f"s3://{bucket}/landing"
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
           "--worker-id", "iam", "--landing", zone, "--checkpoint-by", "dagster", "--heartbeat-seconds", "1",
           "--lease-expiry-seconds", "3", "--cycle-seconds", "1", "--batch-seconds", "0.5",
           "--metrics-namespace", "KclPipelineIam", "--worker-metrics-period-seconds", "1", "--retrieval", retrieval]
    log = tmp_path / "consume.log"
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    store = open_store(zone, emulators.aws_settings())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and read_batches(store, stream).num_rows < 40:
            time.sleep(0.5)
        assert read_batches(store, stream).num_rows == 40, log.read_text()[-3000:]
        time.sleep(2)  # another heartbeat and metrics flush of the workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(40)
        if endpoint is not None:
            endpoint.stop()
    assert code == 0, log.read_text()[-3000:]

    calls = read_calls(calls_file)
    made = {c["call"] for c in calls}
    # The recording reached the consumer and its worker processes: the lease manager's table calls, the
    # workers' reads, landing and metrics.
    reads = {"kinesis:GetRecords"} if retrieval == "polling" else {"kinesis:RegisterStreamConsumer",
                                                                   "kinesis:SubscribeToShard"}
    assert {"dynamodb:Scan", "kinesis:ListShards", "dynamodb:UpdateItem", "s3:PutObject",
            "cloudwatch:PutMetricData", *reads} <= made, sorted(made)
    assert len({c["pid"] for c in calls}) >= 3, "the consumer and its two workers"
    s3_calls = [c for c in calls if c["call"].startswith("s3:")]
    assert all(c.get("ExpectedBucketOwner") == OWNER for c in s3_calls), "every S3 request fences the owner"
    assert all(c.get("SSEKMSKeyId") == key for c in s3_calls if c["call"] in ("s3:PutObject",
                                                                              "s3:CreateMultipartUpload"))
    values = {"region": emulators.region, "account": EMULATOR_ACCOUNT, "stream": stream, "application": app,
              "lease-table": app, "landing-bucket": bucket, "landing-prefix": "landing",
              "metrics-namespace": "KclPipelineIam", "kms-key-arn": key}
    assert denied(documented_policies()["consumer-host"], calls, values, kms_key_arn=key) == []
