from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from kcl_pipeline.kcl.aws import AwsSettings
from kcl_pipeline.landing.layout import Zone
from kcl_pipeline.transform.storage import (
    LocalStore,
    S3Options,
    S3Store,
    StorageNotFoundError,
    open_store,
)


def test_s3_options_round_trip_through_spark_options():
    opts = S3Options(endpoint_url="http://127.0.0.1:1", region="eu-west-1", aws_access_key_id="AK",
                     aws_secret_access_key="SK")
    flat = opts.to_options()
    assert flat == {"s3_endpoint_url": "http://127.0.0.1:1", "s3_region": "eu-west-1",
                    "s3_aws_access_key_id": "AK", "s3_aws_secret_access_key": "SK"}
    assert S3Options.from_options({k.upper(): v for k, v in flat.items()}) == opts  # Spark may change case
    assert S3Options.from_options({}) == S3Options()


def test_s3_options_from_aws_settings(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    settings = AwsSettings(region="us-west-2", endpoint_urls={"s3": "http://s3.local"})
    assert S3Options.from_aws_settings(settings) == S3Options("http://s3.local", "us-west-2")
    assert S3Options.from_aws_settings(settings, env_credentials=True) == S3Options(
        "http://s3.local", "us-west-2", "env-key", "env-secret", None)


def test_local_store(tmp_path):
    store = open_store(str(tmp_path))
    assert isinstance(store, LocalStore)
    store.check_exists()
    store.put("a/b/one.parquet", b"1")
    store.put("a/b/two.parquet", b"22")
    store.put("a/bc/three", b"333")
    assert list(store.list("a/b/")) == [("a/b/one.parquet", 1), ("a/b/two.parquet", 2)]
    assert list(store.list("a/b")) == [("a/b/one.parquet", 1), ("a/b/two.parquet", 2), ("a/bc/three", 3)]
    assert list(store.list("a/b/t")) == [("a/b/two.parquet", 2)]
    assert list(store.list("missing/")) == []
    store.move("a/b/one.parquet", "c/one.parquet")
    assert store.get("c/one.parquet") == b"1" and store.get_optional("a/b/one.parquet") is None
    store.delete(["a/b/two.parquet", "not/there"])
    store.delete_prefix("a/")
    assert [k for k, _ in store.list("")] == ["c/one.parquet"]
    assert not (tmp_path / "a").exists()
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        open_store(str(tmp_path / "nope")).check_exists()


def _stubbed_store(prefix: str = "root") -> tuple[S3Store, Stubber]:
    store = S3Store(Zone.parse(f"s3://bkt/{prefix}"), S3Options(region="us-east-1"))
    store._client = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s").client(
        "s3", region_name="us-east-1")
    return store, Stubber(store._client)


def test_s3_store_lists_every_page_relative_to_the_root():
    store, stub = _stubbed_store()
    stub.add_response("list_objects_v2", {"Contents": [{"Key": "root/p/a", "Size": 1}], "IsTruncated": True,
                                          "NextContinuationToken": "t"}, {"Bucket": "bkt", "Prefix": "root/p/"})
    stub.add_response("list_objects_v2", {"Contents": [{"Key": "root/p/b", "Size": 2}], "IsTruncated": False},
                      {"Bucket": "bkt", "Prefix": "root/p/", "ContinuationToken": "t"})
    with stub:
        assert list(store.list("p/")) == [("p/a", 1), ("p/b", 2)]
    stub.assert_no_pending_responses()


def test_s3_store_deletes_in_chunks_of_1000_and_reports_failures():
    store, stub = _stubbed_store()
    keys = [f"k{i:04d}" for i in range(1500)]
    stub.add_response("delete_objects", {}, {"Bucket": "bkt", "Delete": {
        "Objects": [{"Key": f"root/{k}"} for k in keys[:1000]], "Quiet": True}})
    stub.add_response("delete_objects", {"Errors": [{"Key": "root/k1499", "Code": "AccessDenied"}]},
                      {"Bucket": "bkt", "Delete": {"Objects": [{"Key": f"root/{k}"} for k in keys[1000:]],
                                                   "Quiet": True}})
    with stub, pytest.raises(OSError, match="could not delete 1 objects"):
        store.delete(keys)
    stub.assert_no_pending_responses()


def test_s3_store_missing_bucket():
    store, stub = _stubbed_store()
    stub.add_client_error("head_bucket", "404", http_status_code=404)
    stub.add_client_error("list_objects_v2", "NoSuchBucket", http_status_code=404)
    with stub:
        with pytest.raises(StorageNotFoundError, match="bucket 'bkt' does not exist"):
            store.check_exists()
        with pytest.raises(StorageNotFoundError, match="bucket 'bkt' does not exist"):
            list(store.list("p/"))


def test_s3_store_other_errors_pass_through():
    from botocore.exceptions import ClientError

    store, stub = _stubbed_store()
    stub.add_client_error("head_bucket", "403", http_status_code=403)
    stub.add_client_error("list_objects_v2", "AccessDenied", http_status_code=403)
    with stub:
        with pytest.raises(ClientError, match="403"):
            store.check_exists()
        with pytest.raises(ClientError, match="AccessDenied"):
            list(store.list("p/"))


def test_s3_store_against_the_emulator(emulators, s3_client, unique_name):
    bucket = unique_name("store")
    s3_client.create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/base", S3Options.from_aws_settings(emulators.aws_settings(),
                                                                          env_credentials=True))
    store.check_exists()
    store.put("x/1", b"one")
    store.put("x/2", b"two")
    store.move("x/2", "y/2")
    assert list(store.list("")) == [("x/1", 3), ("y/2", 3)]
    assert store.get("y/2") == b"two" and store.get_optional("x/2") is None
    store.delete_prefix("x/")
    assert [k for k, _ in store.list("")] == ["y/2"]
    assert s3_client.list_objects_v2(Bucket=bucket)["Contents"][0]["Key"] == "base/y/2"
