"""ZoneStore, the one object store (landing zone, transform output): the same semantics on a local directory and
on S3 (moto server over HTTP), streamed uploads, picklable S3 settings for Spark executors, and error mapping."""
from __future__ import annotations

import os
import pickle
import shutil
import stat
import time

import pytest
from botocore.stub import Stubber

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.zone.errors import (
    LandingError,
    ZoneAccessError,
    ZoneNotFoundError,
)
from kcl_pipeline.zone.layout import Zone
from kcl_pipeline.zone.store import LocalZoneStore, S3Options, S3ZoneStore, Upload, open_store

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


def test_put_replaces_and_deletes_leave_no_trace(any_zone):
    _, store = any_zone
    store.put("a/b/one.parquet", b"1")
    store.put("a/b/one.parquet", b"11")
    store.put("a/b/two.parquet", b"22")
    store.put("a/bc/three", b"333")
    assert list(store.list_objects("a/b/")) == [("a/b/one.parquet", 2), ("a/b/two.parquet", 2)]
    assert list(store.list_objects("a/b")) == [("a/b/one.parquet", 2), ("a/b/two.parquet", 2), ("a/bc/three", 3)]
    assert store.get_optional("a/b/one.parquet") == b"11" and store.get_optional("a/b/nope") is None
    store.delete(["a/b/two.parquet", "not/there"])
    store.delete_prefix("a/b/")
    assert list(store.list_keys("")) == ["a/bc/three"]
    assert store.list_dirs("a/") == ["bc"]  # a directory emptied of its objects goes with them, as on S3


def test_an_upload_streams_its_object_in_parts_and_appears_whole_on_close(any_zone):
    _, store = any_zone
    part = 5 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)
    with store.upload("out/big.parquet", part_bytes=part) as upload:
        for _ in range(11):  # 11 MiB: two full parts and a last one
            upload.write(chunk)
            assert list(store.list_keys("out/")) == []  # nothing visible under the key before close
        assert upload.tell() == 11 * len(chunk)
        if hasattr(upload, "parts"):
            assert len(upload.parts) == 2 and len(upload.buffer) < part  # only the unsent tail is held
    assert store.get("out/big.parquet") == chunk * 11
    with store.upload("out/small") as upload:  # smaller than a part: one plain write
        upload.write(b"tiny")
    assert store.get("out/small") == b"tiny"


def test_an_aborted_upload_leaves_nothing_and_cannot_be_published_late(any_zone):
    uri, store = any_zone
    with pytest.raises(RuntimeError, match="task failed"):
        with store.upload("out/x.parquet", part_bytes=5 * 1024 * 1024) as upload:
            upload.write(os.urandom(6 * 1024 * 1024))  # a part is already sent
            raise RuntimeError("task failed")
    upload.close()  # pyarrow closes its sink when collected: that must not publish the partial object
    assert list(store.list_keys("")) == []
    if uri.startswith("s3://"):
        assert store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    else:
        assert [name for _, _, names in os.walk(uri) for name in names] == []  # not even a temporary


def test_an_upload_is_a_file_pyarrow_writes_parquet_into(any_zone):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, store = any_zone
    table = pa.table({"x": list(range(1000))})
    upload = store.upload("t.parquet")
    assert isinstance(upload, Upload)
    with pq.ParquetWriter(upload, table.schema) as writer:
        writer.write_table(table)
    upload.close()
    assert pq.read_table(pa.BufferReader(store.get("t.parquet"))).equals(table)


def test_upload_parts_below_the_s3_minimum_are_refused(s3_zone):
    _, store = s3_zone
    with pytest.raises(ValueError, match="at least 5 MiB"):
        store.upload("k", part_bytes=1024)


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
    monkeypatch.setattr("kcl_pipeline.zone.store.s3.time.sleep", lambda s: None)
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


class _TimeRecordingSleeps:
    """The `time` module, except that `sleep` records its argument instead of sleeping."""

    def __init__(self, pauses: list[float]) -> None:
        self.sleep = pauses.append

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_two_writers_that_conflicted_do_not_retry_in_lockstep(monkeypatch):
    """Two writers of one key answered 409 together would, after equal pauses, conflict again: the pauses are
    drawn at random (full jitter), each below its doubling ceiling."""
    pauses: list[float] = []
    # Only the store's own pauses: patching `time.sleep` itself would also record every sleep of the threads other
    # tests left running (the CI saw 16,789 one-second pauses here).
    monkeypatch.setattr("kcl_pipeline.zone.store.s3.time", _TimeRecordingSleeps(pauses))
    writers = [_stubbed("put_object", "ConditionalRequestConflict", 409, times=3, then_ok=True) for _ in range(2)]
    schedules = []
    for store, stub in writers:
        pauses.clear()
        assert store.put_if_absent("s/k", b"x") is True
        stub.assert_no_pending_responses()
        schedules.append(list(pauses))
    assert schedules[0] != schedules[1]
    for schedule in schedules:
        assert len(schedule) == 3
        assert all(0 <= pause <= 0.05 * 2 ** attempt for attempt, pause in enumerate(schedule))


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


# -- S3 settings that travel to Spark executors --------------------------------------------------------------

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


def test_a_store_built_from_s3_options_pickles_without_its_client_and_reconnects(s3_zone, aws_settings):
    uri, zone_store = s3_zone
    zone_store.put("k", b"v")
    store = open_store(uri, s3=S3Options.from_aws_settings(aws_settings, env_credentials=True),
                       what="transform output")
    assert store.get("k") == b"v"  # the client is built and used ...
    copy = pickle.loads(pickle.dumps(store))  # ... yet the store travels to an executor without it
    assert copy._client is None and copy.get("k") == b"v"


def test_s3_deletes_in_chunks_of_1000_and_reports_failures():
    s3 = client("s3", AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9"))
    store = S3ZoneStore(Zone.parse("s3://bkt/root"), s3, what="transform output")
    keys = [f"k{i:04d}" for i in range(1500)]
    with Stubber(s3) as stub:
        stub.add_response("delete_objects", {}, {"Bucket": "bkt", "Delete": {
            "Objects": [{"Key": f"root/{k}"} for k in keys[:1000]], "Quiet": True}})
        stub.add_response("delete_objects", {"Errors": [{"Key": "root/k1499", "Code": "AccessDenied"}]},
                          {"Bucket": "bkt", "Delete": {"Objects": [{"Key": f"root/{k}"} for k in keys[1000:]],
                                                       "Quiet": True}})
        with pytest.raises(LandingError, match="transform output s3://bkt/root: could not delete 1 objects"):
            store.delete(keys)
        stub.assert_no_pending_responses()
