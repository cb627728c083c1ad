"""ZoneStore: the same semantics on a local directory and on S3 (moto server over HTTP), plus error mapping."""
from __future__ import annotations

import os
import shutil
import stat

import pytest
from botocore.stub import Stubber

from kcl_pipeline.kcl.aws import AwsSettings, client
from kcl_pipeline.landing.errors import (
    LandingError,
    ZoneAccessError,
    ZoneNotFoundError,
)
from kcl_pipeline.landing.layout import Zone
from kcl_pipeline.landing.store import LocalZoneStore, S3ZoneStore, open_store

from .helpers import run_unprivileged, shared_tmpdir


# -- both stores ------------------------------------------------------------------------------------------

def test_put_if_absent_never_replaces(any_zone):
    _, store = any_zone
    assert store.put_if_absent("s/a/b.parquet", b"first") is True
    assert store.put_if_absent("s/a/b.parquet", b"second") is False
    assert store.get("s/a/b.parquet") == b"first"


def test_listing_is_sorted_and_prefix_exact(any_zone):
    _, store = any_zone
    for key in ["s/mm=02/x/2.parquet", "s/mm=01/x/1.parquet", "s/mm=01/y/1.parquet", "s/mm=010/x/9.parquet",
                "t/mm=01/x/1.parquet"]:
        assert store.put_if_absent(key, b"k")
    assert list(store.list_keys("s/mm=01/")) == ["s/mm=01/x/1.parquet", "s/mm=01/y/1.parquet"]
    # A string prefix, as S3 means it: "mm=01" also matches "mm=010".
    assert list(store.list_keys("s/mm=01")) == ["s/mm=01/x/1.parquet", "s/mm=01/y/1.parquet", "s/mm=010/x/9.parquet"]
    assert list(store.list_keys("s/")) == sorted(["s/mm=02/x/2.parquet", "s/mm=01/x/1.parquet", "s/mm=01/y/1.parquet",
                                                  "s/mm=010/x/9.parquet"])
    assert list(store.list_keys("nothing/")) == []
    assert store.list_dirs("") == ["s", "t"]
    assert store.list_dirs("s/") == ["mm=01", "mm=010", "mm=02"]


def test_get_tail(any_zone):
    _, store = any_zone
    store.put_if_absent("k", b"0123456789")
    assert store.get_tail("k", 4) == (b"6789", 10)
    assert store.get_tail("k", 100) == (b"0123456789", 10)


def test_missing_object_is_a_landing_error(any_zone):
    uri, store = any_zone
    with pytest.raises(LandingError, match="read nope"):
        store.get("nope")


# -- local directory --------------------------------------------------------------------------------------

def test_local_partial_write_is_never_visible(local_zone):
    uri, store = local_zone
    # A writer that died mid-write leaves only its temporary file, which no listing shows.
    d = os.path.join(uri, "s", "m")
    os.makedirs(d)
    with open(os.path.join(d, ".b.parquet.deadbeef.tmp"), "wb") as f:
        f.write(b"half")
    assert list(store.list_keys("s/")) == []
    assert store.put_if_absent("s/m/b.parquet", b"whole") is True
    assert list(store.list_keys("s/")) == ["s/m/b.parquet"]
    # and a successful put leaves no temporary behind
    assert sorted(os.listdir(d)) == [".b.parquet.deadbeef.tmp", "b.parquet"]


def test_local_missing_directory(tmp_path):
    store = open_store(str(tmp_path / "absent"))
    with pytest.raises(ZoneNotFoundError, match=str(tmp_path / "absent")):
        store.ensure_zone()
    # a write must not create the zone as a side effect
    with pytest.raises(ZoneNotFoundError):
        store.put_if_absent("s/k", b"x")
    assert not (tmp_path / "absent").exists()
    assert store.ensure_zone(create=True) is True
    assert store.ensure_zone() is False
    assert store.put_if_absent("s/k", b"x")


def test_local_zone_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ZoneNotFoundError, match="not a directory"):
        open_store(str(tmp_path / "f")).ensure_zone(create=True)


def test_local_keys_cannot_escape_the_zone(local_zone):
    _, store = local_zone
    for bad in ["../x", "a/../../x", "/etc/passwd", ""]:
        with pytest.raises(ValueError):
            store.put_if_absent(bad, b"x")


def test_local_read_only_directory_is_a_clear_error():
    base = shared_tmpdir()
    try:
        zone = os.path.join(base, "zone")
        os.mkdir(zone)
        os.chmod(zone, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)

        def ensure():
            LocalZoneStore(Zone.parse(zone)).ensure_zone()

        def put():
            LocalZoneStore(Zone.parse(zone)).put_if_absent("s/k.parquet", b"x")

        with pytest.raises(ZoneAccessError, match=f"landing zone {zone}.*not writable"):
            run_unprivileged(ensure)
        with pytest.raises(ZoneAccessError, match=f"landing zone {zone}: cannot write s/k.parquet"):
            run_unprivileged(put)
        assert os.listdir(zone) == []
    finally:
        shutil.rmtree(base)


# -- S3 -----------------------------------------------------------------------------------------------------

def test_s3_missing_bucket(aws_settings, unique_name):
    bucket = unique_name("absent")
    store = open_store(f"s3://{bucket}/p", aws_settings)
    with pytest.raises(ZoneNotFoundError, match=f"s3://{bucket}/p: bucket '{bucket}' does not exist"):
        store.ensure_zone()
    with pytest.raises(ZoneNotFoundError, match=f"s3://{bucket}/p"):
        list(store.list_keys("s/"))
    with pytest.raises(ZoneNotFoundError, match=f"s3://{bucket}/p"):
        store.put_if_absent("s/k", b"x")
    assert store.ensure_zone(create=True) is True
    assert store.ensure_zone(create=True) is False
    assert store.put_if_absent("s/k", b"x") is True
    assert list(store.list_keys("")) == ["s/k"]
    assert client("s3", aws_settings).get_object(Bucket=bucket, Key="p/s/k")["Body"].read() == b"x"


def test_s3_listing_pages(s3_zone, aws_settings):
    uri, _ = s3_zone
    store = S3ZoneStore(Zone.parse(uri), client("s3", aws_settings), page_size=2)
    keys = [f"s/m/{i:02d}.parquet" for i in range(7)]
    for key in reversed(keys):
        store.put_if_absent(key, b"x")
    assert list(store.list_keys("s/")) == keys
    assert store.list_dirs("s/") == ["m"]


def _stubbed(operation: str, code: str, status: int, times: int = 1, then_ok: bool = False):
    s3 = client("s3", AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9"))
    stub = Stubber(s3)
    for _ in range(times):
        stub.add_client_error(operation, service_error_code=code, http_status_code=status)
    if then_ok:
        stub.add_response(operation, {})
    stub.activate()
    return S3ZoneStore(Zone.parse("s3://b/p"), s3), stub


@pytest.mark.parametrize("code,status", [("AccessDenied", 403), ("InvalidAccessKeyId", 403)])
def test_s3_access_denied_is_a_clear_error(code, status):
    store, _ = _stubbed("put_object", code, status)
    with pytest.raises(ZoneAccessError, match=f"landing zone s3://b/p: access denied to write s/k \\({code}"):
        store.put_if_absent("s/k", b"x")


def test_s3_access_denied_on_head_bucket():
    store, _ = _stubbed("head_bucket", "403", 403)
    with pytest.raises(ZoneAccessError, match="s3://b/p"):
        store.ensure_zone(create=True)


def test_s3_conditional_conflict_is_retried_then_answered(monkeypatch):
    monkeypatch.setattr("kcl_pipeline.landing.store.time.sleep", lambda s: None)
    # 409 while another conditional write of the key is in flight; then ours goes through ...
    store, stub = _stubbed("put_object", "ConditionalRequestConflict", 409, times=2, then_ok=True)
    assert store.put_if_absent("s/k", b"x") is True
    stub.assert_no_pending_responses()
    # ... or the other write won: 412, already landed.
    store, stub = _stubbed("put_object", "ConditionalRequestConflict", 409, times=1)
    stub.add_client_error("put_object", service_error_code="PreconditionFailed", http_status_code=412)
    assert store.put_if_absent("s/k", b"x") is False
    stub.assert_no_pending_responses()
    # ... and a conflict that never clears is an error, not a silent success.
    store, _ = _stubbed("put_object", "ConditionalRequestConflict", 409, times=6)
    with pytest.raises(LandingError, match="ConditionalRequestConflict"):
        store.put_if_absent("s/k", b"x")


def test_s3_other_errors_name_the_zone():
    store, _ = _stubbed("get_object", "InternalError", 500)
    with pytest.raises(LandingError, match="landing zone s3://b/p: read s/k failed: InternalError"):
        store.get("s/k")


def test_zone_uri_errors():
    with pytest.raises(ValueError, match="no bucket"):
        open_store("s3:///x")
    with pytest.raises(ValueError, match="not supported"):
        open_store("gs://b/x")
    assert isinstance(open_store("file:///tmp/zone"), LocalZoneStore)
