"""The object store contract, run against all three stores of zone/store.py: a local directory, S3 on the
moto server (over HTTP on 127.0.0.1) and memory. Whatever a caller (the sink's fencing, the transform's
commit, the audit's index) relies on is asserted here once, for every store."""
from __future__ import annotations

import os
import shutil
import stat
import threading
import time
import uuid

import pytest

from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.zone.errors import LandingError, ZoneNotFoundError
from kcl_pipeline.zone.store import MemoryZoneStore, open_store

from .helpers import run_unprivileged, shared_tmpdir


def kind(zone) -> str:
    return "s3" if zone.uri.startswith("s3://") else "memory" if zone.uri.startswith("memory://") else "local"


# -- writes ---------------------------------------------------------------------------------------------------

def test_put_if_absent_writes_once_and_never_replaces(every_store):
    store = every_store.store
    assert store.put_if_absent("s/a/b.parquet", b"first") is True
    assert store.put_if_absent("s/a/b.parquet", b"second") is False
    assert store.get("s/a/b.parquet") == b"first"


def test_of_writers_racing_for_one_key_exactly_one_wins_and_its_object_is_whole(every_store):
    store = every_store.store
    bodies = [f"writer-{i}:".encode() * (1000 + i) for i in range(6)]
    won: list[bytes] = []
    start = threading.Barrier(len(bodies))

    def write(body: bytes) -> None:
        start.wait()
        if store.put_if_absent("s/race/link", body):
            won.append(body)

    threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and store.get("s/race/link") == won[0]


def test_put_replaces_whole_and_delete_leaves_no_trace(every_store):
    store = every_store.store
    store.put("c/window.json", b"old")
    store.put("c/window.json", b"new, longer")
    assert store.get("c/window.json") == b"new, longer"
    store.delete(["c/window.json", "c/never-there.json"])  # a missing object is fine
    assert store.get_optional("c/window.json") is None and not store.exists("c/window.json")
    assert list(store.list_keys("c/")) == [] and store.list_dirs("") == []


def test_delete_prefix_removes_a_directory_or_a_name_stem(every_store):
    store = every_store.store
    for key in ["p/run=1/a", "p/run=1/b", "p/run=10/c", "p/run=2/d", "q/e"]:
        store.put_if_absent(key, b"x")
    store.delete_prefix("p/run=1/")
    assert list(store.list_keys("")) == ["p/run=10/c", "p/run=2/d", "q/e"]
    store.delete_prefix("p/run=")
    assert list(store.list_keys("")) == ["q/e"]


def test_an_upload_appears_whole_on_close_and_an_aborted_one_never(every_store):
    store = every_store.store
    with store.upload("o/big.bin") as out:
        out.write(b"a" * 1000)
        assert not store.exists("o/big.bin")  # nothing under the key before close
        out.write(memoryview(b"b" * 24))
    assert store.get("o/big.bin") == b"a" * 1000 + b"b" * 24
    aborted = store.upload("o/aborted.bin")
    aborted.write(b"partial")
    aborted.abort()
    aborted.close()  # a writer closed late (on garbage collection) publishes nothing
    assert not store.exists("o/aborted.bin")
    with pytest.raises(RuntimeError, match="boom"), store.upload("o/failed.bin") as out:
        out.write(b"x")
        raise RuntimeError("boom")
    assert list(store.list_keys("o/")) == ["o/big.bin"]
    done = store.upload("o/done.bin")
    done.close()
    with pytest.raises(ValueError, match="closed upload"):
        done.write(b"late")


# -- reads ----------------------------------------------------------------------------------------------------

def test_listings_are_in_key_order_and_a_prefix_is_a_string_prefix(every_store):
    store = every_store.store
    keys = ["s/mm=02/x/2", "s/mm=01/x/1", "s/mm=01/y/1", "s/mm=010/x/9", "t/mm=01/x/1"]
    for key in keys:
        store.put_if_absent(key, key.encode())
    assert list(store.list_keys("s/mm=01/")) == ["s/mm=01/x/1", "s/mm=01/y/1"]
    assert list(store.list_keys("s/mm=01")) == ["s/mm=01/x/1", "s/mm=01/y/1", "s/mm=010/x/9"]
    assert list(store.list_objects("t/")) == [("t/mm=01/x/1", len("t/mm=01/x/1"))]
    assert list(store.list_keys("nothing/")) == []
    assert store.list_dirs("") == ["s", "t"] and store.list_dirs("s/") == ["mm=01", "mm=010", "mm=02"]
    assert [v.key for v in store.list_versions("")] == sorted(keys)


def test_reads_of_present_and_missing_objects(every_store):
    store = every_store.store
    store.put_if_absent("k", b"0123456789")
    assert store.get("k") == store.get_optional("k") == b"0123456789" and store.exists("k")
    assert store.get_tail("k", 4) == (b"6789", 10) and store.get_tail("k", 100) == (b"0123456789", 10)
    assert store.get_optional("nope") is None and not store.exists("nope")
    with pytest.raises(LandingError, match="read nope"):
        store.get("nope")
    with pytest.raises(LandingError, match="read nope"):
        store.get_tail("nope", 8)


def test_a_version_tag_is_stable_until_the_object_is_replaced(every_store):
    store = every_store.store
    store.put("v/a", b"one")
    store.put_if_absent("v/b", b"two")
    first = {v.key: v for v in store.list_versions("v/")}
    assert {v.key: v for v in store.list_versions("v/")} == first  # listed again, unchanged
    assert all(v.tag for v in first.values()) and first["v/a"].size == 3
    if kind(every_store) == "local":
        time.sleep(0.01)  # a file's tag holds its modification time: let the clock move
    store.put("v/a", b"three")
    again = {v.key: v for v in store.list_versions("v/")}
    assert again["v/a"].tag != first["v/a"].tag and again["v/b"] == first["v/b"]


def test_a_read_says_the_tag_of_the_bytes_it_read(every_store):
    """The audit files what it learnt from an object under the tag of what it read (the object may have been
    replaced since it was listed): each store's reads give the tag its listing gives."""
    store = every_store.store
    store.put("v/a", b"0123456789")
    listed, = store.list_versions("v/")
    assert store.get_version("v/a") == (b"0123456789", listed.tag)
    assert store.get_tail_version("v/a", 4) == (b"6789", 10, listed.tag)
    if kind(every_store) == "local":
        time.sleep(0.01)  # a file's tag holds its modification time: let the clock move
    store.put("v/a", b"replaced")
    again, = store.list_versions("v/")
    assert again.tag != listed.tag and store.get_tail_version("v/a", 100) == (b"replaced", 8, again.tag)
    with pytest.raises(LandingError, match="read v/nope"):
        store.get_version("v/nope")
    with pytest.raises(LandingError, match="read v/nope"):
        store.get_tail_version("v/nope", 8)


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "", "a//b", "a/./b"])
def test_keys_never_escape_the_zone(every_store, bad):
    store = every_store.store
    with pytest.raises(ValueError, match="invalid key"):
        store.put_if_absent(bad, b"x")
    with pytest.raises(ValueError, match="invalid key"):
        store.get_optional(bad)


def _missing_uri(zone) -> str:
    name = f"absent-{uuid.uuid4().hex[:10]}"
    return {"s3": f"s3://{name}/p", "memory": f"memory://{name}", "local": os.path.join(
        os.path.dirname(zone.uri), name)}[kind(zone)]


def test_a_missing_zone_is_found_missing_and_created_only_when_asked(every_store):
    uri = _missing_uri(every_store)
    store = open_store(uri, every_store.aws)
    with pytest.raises(ZoneNotFoundError, match=uri.replace("/", ".")):
        store.ensure_zone()
    with pytest.raises(ZoneNotFoundError):
        store.put_if_absent("s/k", b"x")  # a write never creates the zone as a side effect
    try:
        assert store.ensure_zone(create=True) is True and store.ensure_zone() is False
        assert store.put_if_absent("s/k", b"x") and store.get("s/k") == b"x"
    finally:
        if isinstance(store, MemoryZoneStore):
            store.drop()


# -- leftovers of killed writers ------------------------------------------------------------------------------

def test_a_sweep_leaves_a_writer_at_work_alone(every_store):
    store = every_store.store
    out = store.upload("w/part-0.parquet", part_bytes=5 * 1024 * 1024)
    out.write(b"x" * (5 * 1024 * 1024 + 1))  # on S3, a part is sent: an incomplete multipart upload exists
    assert store.sweep_temporaries("", older_than_seconds=3600) == []
    out.close()
    assert store.get_tail("w/part-0.parquet", 1) == (b"x", 5 * 1024 * 1024 + 1)


def test_a_killed_writers_leftovers_are_swept_and_a_swept_writer_cannot_publish(every_store):
    store = every_store.store
    out = store.upload("w/part-1.parquet", part_bytes=5 * 1024 * 1024)
    out.write(b"y" * (5 * 1024 * 1024 + 1))
    if kind(every_store) == "memory":  # a memory writer keeps its bytes in its own buffer: nothing is left over
        assert store.sweep_temporaries("", older_than_seconds=0) == []
        return
    if kind(every_store) == "local":  # the writer was killed an hour ago
        tmp, = [p for p in (os.path.join(d, f) for d, _, fs in os.walk(every_store.uri) for f in fs)]
        os.utime(tmp, (time.time() - 3600, time.time() - 3600))
        swept = store.sweep_temporaries("w/", older_than_seconds=600)
    else:
        time.sleep(1.1)  # S3 gives the upload's start to the second
        swept = store.sweep_temporaries("w/", older_than_seconds=1)
    assert len(swept) == 1 and "part-1.parquet" in swept[0]
    assert store.sweep_temporaries("", older_than_seconds=0) == []
    with pytest.raises(LandingError, match="w/part-1.parquet"):
        out.close()  # the writer was not dead after all: it fails rather than publish a partial object
    assert not store.exists("w/part-1.parquet")


def test_a_local_sweep_removes_only_this_stores_temporaries(local_zone):
    uri, store = local_zone
    os.makedirs(os.path.join(uri, "s", "m"))
    mine = os.path.join(uri, "s", "m", f".b.parquet.{uuid.uuid4().hex}.tmp")
    other = os.path.join(uri, "s", "m", ".keep")
    for path in (mine, other):
        with open(path, "wb") as f:
            f.write(b"half")
        os.utime(path, (0, 0))
    assert store.sweep_temporaries("t/") == []  # another prefix
    assert store.sweep_temporaries() == [f"s/m/{os.path.basename(mine)}"]
    assert not os.path.exists(mine) and os.path.exists(other)


def test_a_local_delete_prefix_that_cannot_remove_an_object_names_it():
    """It used to ignore every error (rmtree(ignore_errors=True)): the caller believed the run's old files gone."""
    base = shared_tmpdir()
    try:
        zone = os.path.join(base, "zone")
        os.makedirs(os.path.join(zone, "out", "run=1"))
        with open(os.path.join(zone, "out", "run=1", "part-0.parquet"), "wb") as f:
            f.write(b"x")
        for path in (zone, os.path.join(zone, "out")):
            os.chmod(path, 0o777)
        os.chmod(os.path.join(zone, "out", "run=1"), stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP
                 | stat.S_IROTH | stat.S_IXOTH)

        def delete():
            open_store(zone).delete_prefix("out/")

        with pytest.raises(LandingError, match=r"cannot delete out/run=1/part-0.parquet \(deleting 'out/'\)"):
            run_unprivileged(delete)
        assert os.path.exists(os.path.join(zone, "out", "run=1", "part-0.parquet"))
    finally:
        shutil.rmtree(base)


def test_an_s3_sweep_says_which_zone_it_could_not_sweep(s3_zone, aws_settings, unique_name):
    store = open_store(f"s3://{unique_name('absent')}/p", aws_settings)
    with pytest.raises(ZoneNotFoundError, match="sweep the incomplete uploads"):
        store.sweep_temporaries()
    assert client("s3", aws_settings).list_multipart_uploads(Bucket=s3_zone.uri[5:].split("/")[0]).get(
        "Uploads") is None


def test_a_memory_store_never_leaves_its_process():
    import pickle

    store = MemoryZoneStore("pickled")
    with pytest.raises(TypeError, match="cannot be sent to another"):
        pickle.dumps(store)


# -- failure paths of the sweep and the memory store ----------------------------------------------------------

def test_an_s3_sweep_skips_uploads_that_finish_or_vanish_while_it_looks():
    """Another sweeper (or the writer's own completion) can end an upload between the listing and the abort:
    that upload is nobody's leftover any more, not an error."""
    from datetime import datetime, timezone

    import boto3
    from botocore.stub import Stubber

    from kcl_pipeline.zone.layout import Zone
    from kcl_pipeline.zone.store import S3ZoneStore

    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    old = datetime(2020, 1, 1, tzinfo=timezone.utc)
    stub = Stubber(s3)
    uploads = [{"Key": f"p/w/{name}", "UploadId": name, "Initiated": old} for name in ("gone", "done", "left")]
    stub.add_response("list_multipart_uploads", {"Uploads": uploads})
    stub.add_client_error("list_parts", service_error_code="NoSuchUpload", http_status_code=404)  # gone
    stub.add_response("list_parts", {"Parts": [{"PartNumber": 1, "LastModified": old, "ETag": "e", "Size": 5}]})
    stub.add_client_error("abort_multipart_upload", service_error_code="NoSuchUpload", http_status_code=404)
    stub.add_response("list_parts", {"Parts": []})
    stub.add_response("abort_multipart_upload", {})
    stub.activate()
    store = S3ZoneStore(Zone.parse("s3://b/p"), s3)
    assert store.sweep_temporaries("w/", older_than_seconds=60) == ["w/left (upload left)"]
    stub.assert_no_pending_responses()


def test_a_local_sweep_that_cannot_remove_a_temporary_names_it(local_zone, monkeypatch):
    uri, store = local_zone
    os.makedirs(os.path.join(uri, "s"))
    temp = os.path.join(uri, "s", f".b.parquet.{uuid.uuid4().hex}.tmp")
    with open(temp, "wb") as f:
        f.write(b"half")
    os.utime(temp, (0, 0))
    real_unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if str(path) == temp:
            raise PermissionError(13, "Permission denied", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    with pytest.raises(LandingError, match=f"cannot remove the temporary s/{os.path.basename(temp)}"):
        store.sweep_temporaries()


@pytest.mark.parametrize("name", ["", "a/b"])
def test_a_memory_zone_name_is_one_segment(name):
    with pytest.raises(ValueError, match="memory zone name"):
        MemoryZoneStore(name)


def test_a_dropped_memory_zone_is_gone_for_every_store_on_it():
    first = open_store("memory://dropped-zone")
    first.ensure_zone(create=True)
    first.put("k", b"v")
    second = open_store("memory://dropped-zone")
    assert second.get("k") == b"v"  # one zone, shared by name
    first.drop()
    with pytest.raises(ZoneNotFoundError, match="memory://dropped-zone"):
        second.get("k")


def test_a_memory_zones_ordered_index_follows_every_write_replacement_and_deletion():
    """The memory store lists from a sorted key index kept beside its objects (no sort per listing): after any
    mix of writes, replacements, uploads and deletions its listings are exactly a sort of what is stored."""
    import random

    store = open_store("memory://ordered-index")
    store.ensure_zone(create=True)
    try:
        rng = random.Random(3)
        MAX = chr(0x10FFFF)  # a prefix ending in the last code point has no successor to bound its range
        stored: dict[str, bytes] = {}
        for step in range(3000):
            middle = rng.choice(["mm=01", "mm=010", "mm=02", "z", MAX, MAX + "x"])
            key = f"{rng.choice('abc')}/{middle}/{rng.randrange(40)}"
            action = rng.random()
            if action < 0.4:
                if store.put_if_absent(key, b"x" * (step % 7)):
                    stored[key] = b"x" * (step % 7)
                else:
                    assert key in stored
            elif action < 0.55:
                store.put(key, b"r" * (step % 5))
                stored[key] = b"r" * (step % 5)
            elif action < 0.6:
                with store.upload(key) as upload:
                    upload.write(b"u" * (step % 3))
                stored[key] = b"u" * (step % 3)
            else:
                gone = [key, f"{key}-never-stored"]
                store.delete(gone)
                stored.pop(key, None)
            if step % 100 == 0:
                for prefix in ["", "a", "a/", "b/mm=01", "b/mm=01/", "c/z/1", "c/z/1/", "zzz", f"a/{MAX}", MAX * 2]:
                    expected = sorted(k for k in stored if k.startswith(prefix))
                    assert list(store.list_objects(prefix)) == [(k, len(stored[k])) for k in expected]
                    assert [v.key for v in store.list_versions(prefix)] == expected
                    dirs = sorted({k[len(prefix):].split("/", 1)[0] for k in expected if "/" in k[len(prefix):]})
                    assert store.list_dirs(prefix) == dirs
        listing = store.list_keys("")  # a listing is what was stored when it was asked for
        store.delete(list(stored))
        assert list(listing) == sorted(stored) and list(store.list_keys("")) == []
    finally:
        store.drop()
