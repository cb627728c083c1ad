from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from kcl_pipeline.transform.datasource import (
    LANDING_ARROW_SCHEMA,
    LANDING_FORMAT,
    LANDING_SCHEMA_DDL,
    MANIFEST,
    OUTPUT_FORMAT,
    WindowBatch,
    WindowRead,
    check_window,
    plan_partitions,
    register,
    select_window_batches,
)
from kcl_pipeline.zone.batch import SCHEMA, conform
from kcl_pipeline.zone.errors import CorruptBatchError
from kcl_pipeline.zone.layout import minute_prefix

from .landing_batches import MINUTE, SHARD0, SHARD1, T0, Rec, batch_key, batch_table, seq, write_local


def key_at(minute_ms: int, stream: str = "s1", shard: str = SHARD0, i: int = 1) -> str:
    return batch_key(stream, [Rec(shard, seq(i), b"{}", minute_ms)])


# ------------------------------------------------------------------ planning (pure)

def test_select_window_batches_keeps_the_window_minutes_of_the_stream():
    inside = [key_at(T0), key_at(T0 + MINUTE, shard=SHARD1), key_at(T0 + 2 * MINUTE - 1)]
    listing = [(k, 10) for k in inside] + [
        (key_at(T0 - MINUTE), 10),                      # the minute before
        (key_at(T0 + 2 * MINUTE), 10),                  # the end minute (exclusive)
        (key_at(T0, stream="other"), 10),               # another stream
        (minute_prefix("s1", T0) + f"{SHARD0}/.tmp-upload", 10),  # not a batch key
        (inside[0], 10),                                # listed twice (two prefixes)
    ]
    got = select_window_batches(listing, "s1", T0, T0 + 2 * MINUTE)
    assert got == sorted({WindowBatch(k, 10) for k in inside}, key=lambda b: b.key)


@pytest.mark.parametrize("sizes,max_bytes,expected", [
    ([10, 10, 10], 25, [[10, 10], [10]]),
    ([10, 10, 10], 30, [[10, 10, 10]]),
    ([30, 5, 5], 25, [[30], [5, 5]]),
    ([5, 30, 5], 25, [[5], [30], [5]]),
    ([], 25, []),
])
def test_plan_partitions_bounds_bytes(sizes, max_bytes, expected):
    batches = [WindowBatch(f"k{i}", s) for i, s in enumerate(sizes)]
    groups = plan_partitions(batches, max_bytes)
    assert [[b.size for b in g] for g in groups] == expected
    assert [b for g in groups for b in g] == batches  # order kept, nothing lost


def test_plan_partitions_rejects_a_non_positive_bound():
    with pytest.raises(ValueError, match="max_partition_bytes must be > 0"):
        plan_partitions([], 0)


@pytest.mark.parametrize("start,end,message", [
    (T0, T0, "must be after its start"),
    (T0 + MINUTE, T0, "must be after its start"),
    (T0 + 1, T0 + MINUTE, "not whole minutes"),
    (T0, T0 + 90_000, "not whole minutes"),
])
def test_check_window(start, end, message):
    with pytest.raises(ValueError, match=message):
        check_window(start, end)


def test_window_read_options():
    read = WindowRead.from_options({"ZONE": "/z", "stream": "s", "window_start_ms": str(T0),
                                    "window_end_ms": str(T0 + MINUTE), "s3_endpoint_url": "http://x"})
    assert (read.zone, read.stream, read.start_ms, read.end_ms, read.s3.endpoint_url) == (
        "/z", "s", T0, T0 + MINUTE, "http://x")
    with pytest.raises(ValueError, match="missing option\\(s\\) stream, window_end_ms"):
        WindowRead.from_options({"zone": "/z", "window_start_ms": "1"})
    with pytest.raises(ValueError, match="are integers"):
        WindowRead.from_options({"zone": "/z", "stream": "s", "window_start_ms": "x", "window_end_ms": "1"})


# ------------------------------------------------------------------ conforming batches (pure)

def test_one_decoder_conforms_a_batch_to_the_landing_schema():
    records = [Rec(SHARD0, seq(1), b"{}", T0 + 1234, sub_sequence_number=3)]
    table = batch_table("s1", records)
    table = table.drop_columns(["stream", "explicit_hash_key"])
    table = table.set_column(table.schema.get_field_index("shard_id"), "shard_id",
                             pa.array([SHARD0]).dictionary_encode())
    table = table.set_column(table.schema.get_field_index("sequence_number"), "sequence_number",
                             pa.array([seq(1)], pa.large_string()))
    out = conform(table.select(list(reversed(table.column_names))), "k", "s1")
    assert out.schema == SCHEMA and out.cast(LANDING_ARROW_SCHEMA).schema == LANDING_ARROW_SCHEMA
    row = out.to_pylist()[0]
    assert (row["stream"], row["shard_id"], row["sequence_number"], row["sub_sequence_number"],
            row["explicit_hash_key"]) == ("s1", SHARD0, seq(1), 3, None)
    assert row["approximate_arrival_timestamp"].timestamp() * 1000 == T0 + 1234


@pytest.mark.parametrize("mutate,message", [
    (lambda t: t.drop_columns(["data"]), "column data is missing"),
    (lambda t: t.set_column(1, "shard_id", pa.array([None], pa.string())), "column shard_id has 1 null values"),
    (lambda t: t.set_column(7, "data", pa.array([[1]], pa.list_(pa.int8()))), "column data of type list"),
])
def test_one_decoder_rejects_what_is_not_a_landing_batch(mutate, message):
    table = mutate(batch_table("s1", [Rec(SHARD0, seq(1), b"{}", T0)]))
    with pytest.raises(CorruptBatchError, match=f"landed batch some/key: {message}"):
        conform(table, "some/key", "s1")
    if "data" in table.column_names and "stream" in table.column_names:
        return
    with pytest.raises(CorruptBatchError, match="column (data|stream) is missing"):
        conform(table.drop_columns(["stream"]), "some/key")  # without the reader's stream, stream is required


# ------------------------------------------------------------------ the reader in Spark

def _read(spark, zone, start=T0, end=T0 + 2 * MINUTE, **extra):
    register(spark)
    return (spark.read.format(LANDING_FORMAT)
            .options(zone=str(zone), stream="s1", window_start_ms=str(start), window_end_ms=str(end), **extra)
            .load())


def test_reader_reads_the_window_in_bounded_partitions(spark, tmp_path):
    write_local(tmp_path, "s1", [Rec(SHARD0, seq(i), b'{"i":%d}' % i, T0 + i) for i in range(1, 4)])
    write_local(tmp_path, "s1", [Rec(SHARD1, seq(5), b"{}", T0 + MINUTE + 5)])
    write_local(tmp_path, "s1", [Rec(SHARD1, seq(6), b"{}", T0 + 2 * MINUTE)])  # outside
    df = _read(spark, tmp_path, max_partition_bytes="1")
    assert df.schema.simpleString() == spark.createDataFrame([], LANDING_SCHEMA_DDL).schema.simpleString()
    assert df.rdd.getNumPartitions() == 2
    rows = sorted((r.shard_id, r.sequence_number, r.data) for r in df.collect())
    assert rows == [(SHARD0, seq(1), b'{"i":1}'), (SHARD0, seq(2), b'{"i":2}'), (SHARD0, seq(3), b'{"i":3}'),
                    (SHARD1, seq(5), b"{}")]
    assert _read(spark, tmp_path).rdd.getNumPartitions() == 1


def test_reader_names_an_unreadable_batch(spark, tmp_path):
    key = key_at(T0)
    (tmp_path / key).parent.mkdir(parents=True)
    (tmp_path / key).write_bytes(b"not parquet")
    with pytest.raises(Exception, match=f"landed batch {key} in .* is not readable Parquet"):
        _read(spark, tmp_path).collect()


def test_reader_on_a_missing_zone_says_so(spark, tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        _read(spark, tmp_path / "nope").collect()


# ------------------------------------------------------------------ the writer in Spark

def _write(df, root: Path, partition="window=20240501T120000Z", mode="overwrite"):
    register(df.sparkSession)
    df.write.format(OUTPUT_FORMAT).mode(mode).options(path=str(root), partition=partition).save()


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_writer_replaces_the_partition_and_keeps_others(spark, tmp_path):
    df = spark.range(10).repartition(2)
    _write(df, tmp_path)
    _write(df, tmp_path, partition="window=20240501T130000Z")
    first = _files(tmp_path / "window=20240501T120000Z")
    _write(spark.range(3).repartition(1), tmp_path)
    second = _files(tmp_path / "window=20240501T120000Z")
    assert not (set(first) & set(second)) - {MANIFEST}  # every old file is gone
    assert len(second) == 2  # one part, one manifest
    manifest = json.loads((tmp_path / "window=20240501T120000Z" / MANIFEST).read_text())
    assert manifest["rows"] == 3 and manifest["schema"] == [["id", "bigint"]]
    assert pq.read_table(tmp_path / "window=20240501T120000Z" / manifest["files"][0]).column("id").to_pylist() \
        == [0, 1, 2]
    assert len(_files(tmp_path / "window=20240501T130000Z")) == 3  # untouched


def test_writer_publishes_an_empty_partition_with_its_schema(spark, tmp_path):
    _write(spark.range(5).where("id < 0"), tmp_path)
    manifest = json.loads((tmp_path / "window=20240501T120000Z" / MANIFEST).read_text())
    table = pq.read_table(tmp_path / "window=20240501T120000Z" / manifest["files"][0])
    assert (table.num_rows, table.column_names, manifest["rows"]) == (0, ["id"], 0)


def test_failed_write_leaves_the_previous_partition_and_no_staging(spark, tmp_path):
    _write(spark.range(4), tmp_path)
    before = _files(tmp_path / "window=20240501T120000Z")
    boom = F.udf(lambda i: 1 // (i - 7), "int", useArrow=False)
    with pytest.raises(Exception, match="ZeroDivisionError"):
        _write(spark.range(10).repartition(3).select(boom("id").alias("x")), tmp_path)
    assert _files(tmp_path / "window=20240501T120000Z") == before  # the failed run's directory is gone too


@pytest.mark.parametrize("mode,options,message", [
    ("append", {"partition": "window=x"}, "replaces one partition; use mode\\('overwrite'\\)"),
    ("overwrite", {}, "options path \\(the dataset root\\) and partition"),
    ("overwrite", {"partition": "a/b"}, "must be one visible directory name"),
    ("overwrite", {"partition": "_staging"}, "must be one visible directory name"),
])
def test_writer_rejects_bad_use(spark, tmp_path, mode, options, message):
    register(spark)
    with pytest.raises(Exception, match=message):
        spark.range(1).write.format(OUTPUT_FORMAT).mode(mode).options(path=str(tmp_path), **options).save()


def test_a_malformed_batch_key_is_reported_not_silently_skipped():
    """The transform once skipped a `.parquet` object that is not a batch key (its rows never transformed,
    the checkpoint moving past them); it now fails naming it, as the sink and verify do."""
    listing = [(key_at(T0), 10), (minute_prefix("s1", T0) + f"{SHARD0}/part-0001.parquet", 10)]
    with pytest.raises(ValueError, match="part-0001.parquet"):
        select_window_batches(listing, "s1", T0, T0 + MINUTE)


def test_one_listing_rule_for_sink_verify_and_transform():
    from kcl_pipeline.zone.layout import split_batch_keys

    good = key_at(T0)
    listing = split_batch_keys([good, minute_prefix("s1", T0) + f"{SHARD0}/after=1_0",
                                minute_prefix("s1", T0) + f"{SHARD0}/junk.parquet"])
    assert [b.key() for b in listing.batches] == [good]
    assert listing.malformed == [minute_prefix("s1", T0) + f"{SHARD0}/junk.parquet"]


# ------------------------------------------------------------------ streamed writes, run directories

def test_a_write_task_streams_its_file_in_parts_straight_to_its_run_directory(emulators, s3_client, unique_name,
                                                                                monkeypatch):
    """Before: each task held its whole Parquet output in memory, PUT it to a staging key (one PutObject,
    5 GiB cap) and the commit copied it into place."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from kcl_pipeline.transform.datasource import PartitionTarget, PartitionWriter
    from kcl_pipeline.zone.store import S3Options, S3ZoneStore

    bucket = unique_name("out")
    s3_client.create_bucket(Bucket=bucket)
    s3 = S3Options.from_aws_settings(emulators.aws_settings(), env_credentials=True)
    target = PartitionTarget(f"s3://{bucket}/transformed", "window=20240501T120000Z", s3)
    writer = PartitionWriter(target, StructType([StructField("data", BinaryType())]))
    uploads = []
    real_upload = S3ZoneStore.upload
    monkeypatch.setattr(S3ZoneStore, "upload", lambda self, key, part_bytes=5 * 1024 * 1024:
                        uploads.append(real_upload(self, key, part_bytes)) or uploads[-1])
    held = []

    def batches():
        for _ in range(12):  # 12 MiB of incompressible rows, 1 MiB per Arrow batch
            if uploads:
                held.append(len(uploads[0].buffer))
            yield pa.record_batch([pa.array([os.urandom(1024) for _ in range(1024)], pa.binary())], names=["data"])

    message = writer.write(batches())
    assert message.key == f"window=20240501T120000Z/{writer.run}/part-00000-0.parquet" and message.rows == 12 * 1024
    assert len(uploads) == 1 and len(uploads[0].parts) >= 2  # multipart, sent as it filled
    assert max(held) < 5 * 1024 * 1024 + 1024 * 1024  # never more than about one part in memory
    writer.commit([message])
    manifest = json.loads(s3_client.get_object(Bucket=bucket, Key=f"transformed/window=20240501T120000Z/{MANIFEST}")
                          ["Body"].read())
    assert manifest["run"] == writer.run and manifest["files"] == [f"{writer.run}/part-00000-0.parquet"]
    body = s3_client.get_object(Bucket=bucket, Key=f"transformed/window=20240501T120000Z/{manifest['files'][0]}")
    assert pq.read_table(pa.BufferReader(body["Body"].read())).num_rows == 12 * 1024


def test_a_failed_write_task_publishes_nothing(emulators, s3_client, unique_name):
    from pyspark.sql.types import BinaryType, StructField, StructType

    from kcl_pipeline.transform.datasource import PartitionTarget, PartitionWriter
    from kcl_pipeline.zone.store import S3Options

    bucket = unique_name("out")
    s3_client.create_bucket(Bucket=bucket)
    s3 = S3Options.from_aws_settings(emulators.aws_settings(), env_credentials=True)
    writer = PartitionWriter(PartitionTarget(f"s3://{bucket}/t", "window=20240501T120000Z", s3),
                             StructType([StructField("data", BinaryType())]))

    def batches():
        for _ in range(7):
            yield pa.record_batch([pa.array([os.urandom(1024) for _ in range(1024)], pa.binary())], names=["data"])
        raise RuntimeError("executor lost its input")

    with pytest.raises(RuntimeError, match="executor lost its input"):
        writer.write(batches())
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
