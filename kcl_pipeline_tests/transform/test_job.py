from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.transform.decoders import json_object_decoder
from kcl_pipeline.transform.job import (
    OutputNotFoundError,
    ShardRange,
    read_output,
    spark_session_conf,
    transform_window,
    window_partition,
)
from kcl_pipeline.windows.manifest import commit_key
from kcl_pipeline.zone.errors import ZoneNotFoundError
from kcl_pipeline.zone.store import S3Options

from .landing_batches import MINUTE, SHARD0, SHARD1, T0, Rec, seq, write_local, write_s3

WINDOW = (T0, T0 + 2 * MINUTE)
BASE_SCHEMA = [("shard_id", "string"), ("sequence_number", "string"), ("sub_sequence_number", "bigint"),
               ("partition_key", "string"), ("approximate_arrival_timestamp", "timestamp"),
               ("window_start", "timestamp"), ("payload", "string")]


def run(spark, zone, out, window=WINDOW, **kw):
    return transform_window(spark, zone=str(zone), stream="s1", window_start_ms=window[0],
                            window_end_ms=window[1], output_uri=str(out), **kw)


def keys(table) -> list[tuple[str, str, int]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("shard_id", "sequence_number", "sub_sequence_number")),
                      strict=True))


def good(i: int) -> bytes:
    return b'{"i":%d,"text":"record %d"}' % (i, i)


@pytest.fixture
def landed(tmp_path):
    """Two shards over two minutes of the window; shard 0's second batch overlaps its first by 2 records (a
    re-landed range), with a KPL-style sub-sequence; one poison record per kind; records just outside."""
    zone = tmp_path / "zone"
    write_local(zone, "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(1, 6)])
    write_local(zone, "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(4, 8)]
                + [Rec(SHARD0, seq(7), good(70), T0 + 7, sub_sequence_number=1)])
    write_local(zone, "s1", [Rec(SHARD1, seq(10), good(10), T0 + MINUTE + 1),
                             Rec(SHARD1, seq(11), b"\xff\xfe", T0 + MINUTE + 2),
                             Rec(SHARD1, seq(12), b'{"i":12', T0 + MINUTE + 3),
                             Rec(SHARD1, seq(13), b"[12]", T0 + MINUTE + 4),
                             Rec(SHARD1, seq(14), good(14), T0 + MINUTE + 5)])
    write_local(zone, "s1", [Rec(SHARD1, seq(20), good(20), T0 + 2 * MINUTE)])  # the next window
    write_local(zone, "s1", [Rec(SHARD1, seq(0), good(0), T0 - 1)])  # the previous window
    write_local(zone, "other", [Rec(SHARD0, seq(1), good(1), T0 + 1)])  # another stream
    return zone


def test_transform_local_window(spark, landed, tmp_path):
    out = tmp_path / "out"
    report = run(spark, landed, out)
    assert (report.rows_in, report.rows_out, report.duplicates_dropped, report.quarantined) == (15, 10, 2, 3)
    assert report.schema == BASE_SCHEMA
    assert report.per_shard == {
        SHARD0: ShardRange(Checkpoint(seq(1)), Checkpoint(seq(7), 1), 8),
        SHARD1: ShardRange(Checkpoint(seq(10)), Checkpoint(seq(14)), 5),
    }
    output = read_output(None, str(out), T0)
    rows = sorted(output.transformed.to_pylist(), key=lambda r: (r["shard_id"], r["sequence_number"],
                                                                   r["sub_sequence_number"]))
    expected = [(SHARD0, seq(i), 0, good(i).decode()) for i in range(1, 8)] + [(SHARD0, seq(7), 1, good(70).decode())] \
        + [(SHARD1, seq(10), 0, good(10).decode()), (SHARD1, seq(14), 0, good(14).decode())]
    assert [(r["shard_id"], r["sequence_number"], r["sub_sequence_number"], r["payload"]) for r in rows] == expected
    assert all(len(r["sequence_number"]) == 56 for r in rows)  # exact, as strings
    assert {r["window_start"].timestamp() * 1000 for r in rows} == {T0}
    assert rows[0]["approximate_arrival_timestamp"].timestamp() * 1000 == T0 + 1
    schema = output.transformed.schema
    assert [(c, str(t)) for c, t in zip(schema.names, schema.types, strict=True)][:3] == [
        ("shard_id", "string"), ("sequence_number", "string"), ("sub_sequence_number", "int64")]

    poison = {r["sequence_number"]: r for r in output.quarantine.to_pylist()}
    assert sorted(poison) == [seq(11), seq(12), seq(13)]
    assert poison[seq(11)]["reason"].startswith("invalid_utf8:") and poison[seq(11)]["data"] == b"\xff\xfe"
    assert poison[seq(12)]["reason"].startswith("invalid_json:") and poison[seq(12)]["data"] == b'{"i":12'
    assert poison[seq(13)]["reason"] == "not_a_json_object: top-level value is an array"
    assert report.output_path == f"{out}/transformed/{window_partition(T0)}/"
    assert report.quarantine_path == f"{out}/quarantine/{window_partition(T0)}/"


@pytest.mark.parametrize("thread_state", ["another session active", "no session active"])
def test_a_window_transforms_when_the_jvm_thread_has_another_active_session_or_none(spark, landed, tmp_path,
                                                                                     thread_state):
    """Spark finds a Python data source in the calling thread's active JVM session: a py4j thread pinned anew (its
    connection reset) has another or none, and the window's write failed with DATA_SOURCE_NOT_FOUND."""
    jvm_session = spark._jvm.org.apache.spark.sql.SparkSession
    try:
        if thread_state == "another session active":
            jvm_session.setActiveSession(spark._jsparkSession.newSession())
        else:
            jvm_session.clearActiveSession()
        report = run(spark, landed, tmp_path / "out")
    finally:
        jvm_session.setActiveSession(spark._jsparkSession)
    assert (report.rows_in, report.rows_out) == (15, 10)
    assert read_output(None, str(tmp_path / "out"), T0).transformed.num_rows == 10


def test_rerun_replaces_the_window_never_duplicates(spark, landed, tmp_path):
    out = tmp_path / "out"
    first = run(spark, landed, out)
    files_before = set(read_output(None, str(out), T0).manifests["transformed"]["files"])
    second = run(spark, landed, out)
    after = read_output(None, str(out), T0)
    assert second == first
    assert after.transformed.num_rows == 10 and after.quarantine.num_rows == 3
    assert not files_before & set(after.manifests["transformed"]["files"])
    partition = out / "transformed" / window_partition(T0)
    on_disk = {p.relative_to(partition).as_posix() for p in partition.rglob("*") if p.is_file()}
    assert on_disk == set(after.manifests["transformed"]["files"]) | {"_manifest.json"}
    # Each run writes its own run directory; the switch leaves only the current one.
    assert [p.name for p in partition.iterdir() if p.is_dir()] == [after.manifests["transformed"]["run"]]
    transformed = after.manifests["transformed"]
    assert all(f.startswith(transformed["run"] + "/") for f in transformed["files"])


def test_windows_are_separate_partitions(spark, landed, tmp_path):
    out = tmp_path / "out"
    run(spark, landed, out)
    report = run(spark, landed, out, window=(T0 + 2 * MINUTE, T0 + 3 * MINUTE))
    assert (report.rows_in, report.rows_out) == (1, 1)
    assert keys(read_output(None, str(out), T0 + 2 * MINUTE).transformed) == [(SHARD1, seq(20), 0)]
    assert read_output(None, str(out), T0).transformed.num_rows == 10  # untouched


def test_empty_window_writes_empty_partitions(spark, landed, tmp_path):
    out = tmp_path / "out"
    report = run(spark, landed, out, window=(T0 + 60 * MINUTE, T0 + 120 * MINUTE))
    assert (report.rows_in, report.rows_out, report.duplicates_dropped, report.quarantined, report.per_shard) \
        == (0, 0, 0, 0, {})
    output = read_output(None, str(out), T0 + 60 * MINUTE)
    assert output.transformed.num_rows == 0 and output.quarantine.num_rows == 0
    assert output.transformed.column_names == [name for name, _ in BASE_SCHEMA]
    assert output.quarantine.column_names[-2:] == ["reason", "data"]


def test_decoder_schema_adds_columns(spark, landed, tmp_path):
    out = tmp_path / "out"
    report = run(spark, landed, out, decoder=json_object_decoder("i BIGINT, text STRING"))
    assert report.schema == BASE_SCHEMA + [("i", "bigint"), ("text", "string")]
    table = read_output(spark, str(out), T0).transformed
    assert sorted(r["i"] for r in table.select("i").collect()) == [1, 2, 3, 4, 5, 6, 7, 10, 14, 70]


@pytest.mark.parametrize("decoder,error,message", [
    ("nope", ValueError, "unknown decoder 'nope'"),
    (lambda data: data, TypeError, "a decoder returns STRUCT<payload STRING, reason STRING"),
    (lambda data: __import__("pyspark.sql.functions").sql.functions.struct(
        data.alias("payload"), data.alias("reason")), TypeError, "payload must be STRING"),
    (lambda data: __import__("pyspark.sql.functions").sql.functions.struct(
        data.cast("string").alias("payload"), data.cast("string").alias("reason"),
        data.alias("shard_id")), ValueError, "clash with the output's own columns"),
    (lambda data: __import__("pyspark.sql.functions").sql.functions.struct(
        data.cast("string").alias("payload"), data.cast("string").alias("reason"),
        data.cast("string").alias("payload")), ValueError, "clash with the output's own columns"),
])
def test_bad_decoders_are_refused(spark, landed, tmp_path, decoder, error, message):
    with pytest.raises(error, match=message):
        run(spark, landed, tmp_path / "out", decoder=decoder)
    assert not (tmp_path / "out" / "transformed").exists()


def test_bad_windows_and_locations(spark, landed, tmp_path):
    with pytest.raises(ValueError, match="not whole minutes"):
        run(spark, landed, tmp_path / "out", window=(T0, T0 + 1000))
    with pytest.raises(ZoneNotFoundError, match="does not exist"):
        run(spark, tmp_path / "no-zone", tmp_path / "out")
    with pytest.raises(OutputNotFoundError, match="no committed output"):
        read_output(None, str(tmp_path / "out"), T0)


def test_session_conf():
    conf = spark_session_conf("/opt/py/bin/python")
    assert conf["spark.pyspark.python"] == "/opt/py/bin/python"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"


def test_session_conf_does_not_force_an_interpreter_on_a_cluster():
    conf = spark_session_conf()
    assert not {"spark.pyspark.python", "spark.pyspark.driver.python"} & set(conf)


# ------------------------------------------------------------------ S3 on the emulator (moto over HTTP)

@pytest.fixture
def s3(emulators) -> S3Options:
    return S3Options.from_aws_settings(emulators.aws_settings(), env_credentials=True)


def test_transform_s3_window(spark, s3_client, s3, unique_name):
    bucket = unique_name("landing")
    s3_client.create_bucket(Bucket=bucket)
    write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(1, 4)])
    write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(3, 5)])
    write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD1, seq(9), b"nope", T0 + MINUTE)])
    write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD1, seq(8), good(8), T0 - MINUTE)])  # outside
    out = f"s3://{bucket}/out"
    for _ in range(2):  # the second run replaces the first
        report = run(spark, f"s3://{bucket}/zone", out, s3_options=s3)
        assert (report.rows_in, report.rows_out, report.duplicates_dropped, report.quarantined) == (6, 4, 1, 1)
    output = read_output(None, out, T0, s3)
    assert keys(output.transformed) == [(SHARD0, seq(i), 0) for i in range(1, 5)]
    assert output.quarantine.column("reason").to_pylist()[0].startswith("invalid_json:")
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]
    names = sorted(o["Key"] for o in listed)
    assert names == sorted(
        [f"out/transformed/{window_partition(T0)}/{f}" for f in output.manifests["transformed"]["files"]]
        + [f"out/quarantine/{window_partition(T0)}/{f}" for f in output.manifests["quarantine"]["files"]]
        + [f"out/transformed/{window_partition(T0)}/_manifest.json",
           f"out/quarantine/{window_partition(T0)}/_manifest.json",
           f"out/{commit_key(T0)}"])  # staging is gone; the window's commit is in


def test_missing_bucket_is_a_clear_error(spark, s3_client, s3, unique_name, tmp_path):
    missing = unique_name("missing")
    with pytest.raises(ZoneNotFoundError, match=f"bucket '{missing}' does not exist"):
        run(spark, f"s3://{missing}/zone", tmp_path / "out", s3_options=s3)
    bucket = unique_name("landing")
    s3_client.create_bucket(Bucket=bucket)
    with pytest.raises(ZoneNotFoundError, match=f"bucket '{missing}' does not exist"):
        run(spark, f"s3://{bucket}/zone", f"s3://{missing}/out", s3_options=s3)


# ------------------------------------------------------------------ dedupe without a shuffle

def _plan(df) -> str:
    return df.sparkSession._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "simple")


def test_overlapping_shards_are_the_ones_whose_batch_ranges_meet():
    from kcl_pipeline.transform.datasource import WindowBatch, overlapping_shards

    from .landing_batches import batch_key

    def b(shard, lo, hi):
        return WindowBatch(batch_key("s1", [Rec(shard, seq(i), b"x", T0 + i) for i in range(lo, hi + 1)]), 1)

    assert overlapping_shards([b(SHARD0, 1, 5), b(SHARD0, 6, 9), b(SHARD1, 1, 3)]) == set()
    assert overlapping_shards([b(SHARD0, 1, 5), b(SHARD0, 5, 9), b(SHARD1, 1, 3)]) == {SHARD0}
    assert overlapping_shards([b(SHARD1, 1, 9), b(SHARD1, 3, 4)]) == {SHARD1}  # one inside another


def test_a_window_whose_batches_do_not_overlap_is_not_shuffled_to_deduplicate(spark, tmp_path):
    """Before: every payload byte of every window went through a shuffle to drop duplicates that fenced
    landing makes impossible."""
    from kcl_pipeline.transform.datasource import LANDING_FORMAT, WindowRead, batches_option, register
    from kcl_pipeline.transform.job import distinct_records

    zone = tmp_path / "zone"
    write_local(zone, "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(1, 6)])
    write_local(zone, "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(6, 9)])
    write_local(zone, "s1", [Rec(SHARD1, seq(i), good(i), T0 + i) for i in range(1, 4)])
    register(spark)
    options = {"zone": str(zone), "stream": "s1", "window_start_ms": str(WINDOW[0]), "window_end_ms": str(WINDOW[1])}
    batches = WindowRead.from_options(options).list_batches()
    raw = spark.read.format(LANDING_FORMAT).options(**options, batches=batches_option(batches)).load()
    distinct = distinct_records(raw, batches, 64 * 1024 * 1024)
    assert "Exchange" not in _plan(distinct)
    assert distinct.count() == 11 and distinct.where("_copies != 1").count() == 0


def test_only_the_shards_with_overlapping_batches_are_shuffled_and_their_copies_counted(spark, landed, tmp_path):
    from kcl_pipeline.transform.datasource import LANDING_FORMAT, WindowRead, batches_option, register
    from kcl_pipeline.transform.job import distinct_records

    register(spark)
    options = {"zone": str(landed), "stream": "s1", "window_start_ms": str(WINDOW[0]),
               "window_end_ms": str(WINDOW[1])}
    batches = WindowRead.from_options(options).list_batches()
    raw = spark.read.format(LANDING_FORMAT).options(**options, batches=batches_option(batches)).load()
    distinct = distinct_records(raw, batches, 64 * 1024 * 1024)
    plan = _plan(distinct)
    exchanged = plan[plan.index("Exchange "):]
    assert plan.count("Exchange ") == 1 and f"= {SHARD0})" in exchanged and SHARD1 not in plan  # shard 0 only
    copies = {(r["shard_id"], r["sequence_number"], r["sub_sequence_number"]): r["_copies"] for r in distinct.collect()}
    assert copies[(SHARD0, seq(4), 0)] == 2 and copies[(SHARD0, seq(5), 0)] == 2  # the re-landed range
    assert all(n == 1 for k, n in copies.items() if k[0] == SHARD1) and len(copies) == 13


# ------------------------------------------------------------------ the native read path

def _sorted_rows(table):
    return sorted(table.to_pylist(), key=lambda r: (r["shard_id"], len(r["sequence_number"]), r["sequence_number"],
                                                    r["sub_sequence_number"]))


def test_the_native_parquet_reader_and_the_data_source_transform_a_window_identically(spark, landed, tmp_path):
    native = run(spark, landed, tmp_path / "native", landing_reader="native")
    source = run(spark, landed, tmp_path / "source", landing_reader="datasource")
    assert native == source.__class__(**{**source.__dict__, "output_path": native.output_path,
                                         "quarantine_path": native.quarantine_path})
    a, b = read_output(None, str(tmp_path / "native"), T0), read_output(None, str(tmp_path / "source"), T0)
    assert a.transformed.schema == b.transformed.schema
    assert _sorted_rows(a.transformed) == _sorted_rows(b.transformed)
    assert _sorted_rows(a.quarantine) == _sorted_rows(b.quarantine)


def test_the_landing_reader_is_chosen_by_zone_and_setting():
    from kcl_pipeline.transform.datasource import WindowBatch, native_paths, use_native_reader

    assert use_native_reader("/data/zone", "auto") and not use_native_reader("s3://b/z", "auto")
    assert use_native_reader("s3://b/z", "native") and not use_native_reader("/data/zone", "datasource")
    with pytest.raises(ValueError, match="landing reader 'fast': expected one of auto, native, datasource"):
        use_native_reader("/z", "fast")
    assert native_paths("s3://b/z", [WindowBatch("s/dt=x/k.parquet", 1)]) == ["s3a://b/z/s/dt=x/k.parquet"]
    assert native_paths("/data/zone", [WindowBatch("s/k.parquet", 1)]) == ["file:///data/zone/s/k.parquet"]
