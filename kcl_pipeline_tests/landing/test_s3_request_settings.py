"""SSE-KMS and ExpectedBucketOwner: when configured (KCL_PIPELINE_S3_SSE_KMS_KEY_ID,
KCL_PIPELINE_S3_EXPECTED_BUCKET_OWNER, or AwsSettings), every S3 request of the zone's store carries the owner
and every object it creates the key, whichever way its client was made (the consumer's `client`, the executors'
S3Options). On moto over HTTP: the headers sent, and the objects' encryption as S3 reports it. moto does not
enforce an expected owner, so the refusal of a bucket of another account is S3's answer given by a Stubber."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from botocore.stub import Stubber

from kcl_pipeline.kcl.aws_settings import (
    S3_EXPECTED_BUCKET_OWNER_ENV,
    S3_SSE_KMS_KEY_ID_ENV,
    AwsSettings,
    S3RequestSettings,
)
from kcl_pipeline.kcl.config import ConfigError, ConsumerConfig
from kcl_pipeline.kcl.shells.aws import client, s3_requests_of
from kcl_pipeline.zone.errors import ZoneAccessError
from kcl_pipeline.zone.layout import Zone
from kcl_pipeline.zone.store import S3Options, S3ZoneStore, open_store

KEY = "arn:aws:kms:us-east-1:111122223333:key/0b1c2d3e-0000-4000-8000-00000000abcd"
OWNER = "111122223333"
MiB = 1024 * 1024


def _sent(store) -> list[tuple[str, str, dict[str, str]]]:
    """(operation, URL, headers) of every request the store's client sends from now on."""
    sent: list[tuple[str, str, dict[str, str]]] = []

    def record(request, **kwargs):
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        sent.append((kwargs["event_name"].rsplit(".", 1)[-1], request.url, headers))

    store.client.meta.events.register("before-send.s3", record)
    return sent


def _exercise(store) -> None:
    """Every kind of request the store makes: writes of each kind, reads, listings, deletes, the sweep."""
    store.ensure_zone()
    assert store.put_if_absent("a/conditional", b"x")
    store.put("a/replaced", b"y")
    with store.upload("a/multipart", part_bytes=5 * MiB) as out:
        out.write(b"z" * (6 * MiB))
    assert store.get("a/conditional") == b"x" and store.exists("a/replaced")
    assert store.get_tail("a/multipart", 3)[0] == b"zzz"
    assert [k for k, _ in store.list_objects("a/")] == ["a/conditional", "a/multipart", "a/replaced"]
    store.sweep_temporaries("a/")
    store.delete(["a/replaced"])


def _encryption(s3, bucket: str, key: str) -> tuple[str | None, str | None]:
    head = s3.head_object(Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")


def test_every_request_carries_the_owner_and_every_new_object_the_key(aws_settings, unique_name):
    bucket = unique_name("sse")
    plain = client("s3", aws_settings)
    plain.create_bucket(Bucket=bucket)
    settings = replace(aws_settings, s3_sse_kms_key_id=KEY, s3_expected_bucket_owner=OWNER)
    store = open_store(f"s3://{bucket}/zone", settings)
    sent = _sent(store)
    _exercise(store)

    operations = {operation for operation, _, _ in sent}
    assert {"HeadBucket", "PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
            "GetObject", "HeadObject", "ListObjectsV2", "ListMultipartUploads", "DeleteObjects"} <= operations
    assert all(headers.get("x-amz-expected-bucket-owner") == OWNER for _, _, headers in sent), \
        [op for op, _, headers in sent if headers.get("x-amz-expected-bucket-owner") != OWNER]
    creating = [headers for op, _, headers in sent if op in ("PutObject", "CreateMultipartUpload")]
    assert len(creating) == 3 and all(h.get("x-amz-server-side-encryption") == "aws:kms" and
                                      h.get("x-amz-server-side-encryption-aws-kms-key-id") == KEY for h in creating)
    # S3 (moto) stored each object encrypted with the key, the multipart one too.
    for key in ("zone/a/conditional", "zone/a/multipart"):
        assert _encryption(plain, bucket, key) == ("aws:kms", KEY)


def test_unconfigured_requests_carry_neither(aws_settings, unique_name, monkeypatch):
    monkeypatch.delenv(S3_SSE_KMS_KEY_ID_ENV, raising=False)
    monkeypatch.delenv(S3_EXPECTED_BUCKET_OWNER_ENV, raising=False)
    bucket = unique_name("plain")
    client("s3", aws_settings).create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/zone", aws_settings)
    sent = _sent(store)
    store.put("k", b"v")
    assert sent and not any("x-amz-expected-bucket-owner" in h or "x-amz-server-side-encryption" in h
                            for _, _, h in sent)


def test_the_variables_reach_the_consumers_clients_and_travel_to_executors(aws_settings, unique_name, monkeypatch):
    """The variables configure `client("s3")` in any process; S3Options carries the driver's values to executors
    (a pickled store rebuilds its client there), where they win over the executor's own environment."""
    bucket = unique_name("env")
    plain = client("s3", aws_settings)
    plain.create_bucket(Bucket=bucket)
    monkeypatch.setenv(S3_SSE_KMS_KEY_ID_ENV, KEY)
    monkeypatch.setenv(S3_EXPECTED_BUCKET_OWNER_ENV, OWNER)
    open_store(f"s3://{bucket}/consumer", aws_settings).put("k", b"v")
    assert _encryption(plain, bucket, "consumer/k") == ("aws:kms", KEY)

    options = S3Options.from_aws_settings(aws_settings).to_options()
    assert (options["s3_sse_kms_key_id"], options["s3_expected_bucket_owner"]) == (KEY, OWNER)
    monkeypatch.setenv(S3_SSE_KMS_KEY_ID_ENV, "alias/an-executors-own")
    executor = S3ZoneStore(Zone.parse(f"s3://{bucket}/executor"), options=S3Options.from_options(options))
    sent = _sent(executor)
    executor.put("k", b"v")
    assert _encryption(plain, bucket, "executor/k") == ("aws:kms", KEY)
    assert all(h.get("x-amz-expected-bucket-owner") == OWNER for _, _, h in sent)


def test_a_bucket_owned_by_another_account_is_refused_naming_the_expected_owner(aws_settings):
    settings = replace(aws_settings, s3_expected_bucket_owner=OWNER)
    store = open_store("s3://theirs/zone", settings)
    with Stubber(store.client) as stub:
        # S3's answer to a request whose ExpectedBucketOwner is not the bucket's owner: a bare 403.
        # (The Stubber checks parameters before the client adds the owner: the tests above show it sent.)
        stub.add_client_error("put_object", service_error_code="AccessDenied", service_message="Access Denied",
                              http_status_code=403)
        with pytest.raises(ZoneAccessError) as refused:
            store.put("k", b"v")
    message = str(refused.value)
    assert "access denied to write k" in message
    assert f"not owned by account {OWNER}" in message and S3_EXPECTED_BUCKET_OWNER_ENV in message


@pytest.mark.parametrize("field, value, variable", [
    ("s3_expected_bucket_owner", "12345", S3_EXPECTED_BUCKET_OWNER_ENV),
    ("s3_expected_bucket_owner", "1111-2222-3333", S3_EXPECTED_BUCKET_OWNER_ENV),
    ("s3_sse_kms_key_id", "my key", S3_SSE_KMS_KEY_ID_ENV),
])
def test_a_malformed_value_stops_the_consumer_before_anything_is_written(field, value, variable, monkeypatch):
    with pytest.raises(ConfigError, match=variable):
        ConsumerConfig(stream="s", application="app", aws=AwsSettings(**{field: value}))
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        ConsumerConfig(stream="s", application="app")


def test_consume_with_a_malformed_owner_exits_2_with_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "AWS_REGION": "us-east-1", S3_EXPECTED_BUCKET_OWNER_ENV: "not-an-account"}
    proc = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", "s", "--application",
                           "a", "--landing", str(tmp_path / "zone")], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert S3_EXPECTED_BUCKET_OWNER_ENV in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "zone").exists()



def test_what_a_client_carries_is_nothing_for_one_not_instrumented_or_not_made():
    assert s3_requests_of(None) == S3RequestSettings()  # a store's error before its client exists
    assert s3_requests_of(object()) == S3RequestSettings()
