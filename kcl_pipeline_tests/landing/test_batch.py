"""The Parquet batch format: exact schema, metadata that chains, footer checks against the key."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.batch import (
    SCHEMA,
    decode_batch,
    encode_batch,
    format_position,
    parse_position,
    read_batch_info,
)
from kcl_pipeline.zone.errors import CorruptBatchError
from kcl_pipeline.zone.layout import BatchKey, parse_batch_key

from .helpers import SHARD, STREAM, T0, make_records, seq

EXPECTED_COLUMNS = [
    ("stream", pa.string()), ("shard_id", pa.string()), ("sequence_number", pa.string()),
    ("sub_sequence_number", pa.int64()), ("partition_key", pa.string()), ("explicit_hash_key", pa.string()),
    ("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC")), ("data", pa.binary()),
]


@pytest.mark.parametrize("compression", ["zstd", "snappy"])
def test_round_trip_with_exact_schema(compression):
    records = make_records(50)
    batch = encode_batch(STREAM, SHARD, records, Checkpoint(seq(1), 2), compression)
    table = decode_batch(batch.body)
    assert [(f.name, f.type) for f in table.schema] == EXPECTED_COLUMNS
    assert [f.name for f in table.schema if f.nullable] == ["explicit_hash_key"]
    assert table.column("sequence_number").to_pylist() == [r.sequence_number for r in records]
    assert table.column("sub_sequence_number").to_pylist() == [r.sub_sequence_number for r in records]
    assert table.column("data").to_pylist() == [r.data for r in records]
    assert table.column("explicit_hash_key").to_pylist() == [r.explicit_hash_key for r in records]
    assert table.column("partition_key").to_pylist() == [r.partition_key for r in records]
    assert [int(t.timestamp() * 1000) for t in table.column("approximate_arrival_timestamp").to_pylist()] == \
        [r.approximate_arrival_timestamp_ms for r in records]
    assert set(table.column("stream").to_pylist()) == {STREAM}
    codec = pq.read_metadata(pa.BufferReader(batch.body)).row_group(0).column(7).compression
    assert codec.lower() == compression


def test_key_and_metadata_chain():
    records = make_records(10)
    batch = encode_batch(STREAM, SHARD, records, Checkpoint("TRIM_HORIZON"))
    assert batch.key == BatchKey(STREAM, SHARD, T0, records[0].checkpoint, records[-1].checkpoint)
    assert parse_batch_key(batch.key.key()) == batch.key
    meta = {k.decode(): v.decode() for k, v in pq.read_metadata(pa.BufferReader(batch.body)).metadata.items()}
    assert meta["kcl_pipeline.prev"] == "TRIM_HORIZON_0"
    assert meta["kcl_pipeline.first"] == f"{records[0].sequence_number}_0"
    assert meta["kcl_pipeline.last"] == f"{records[-1].sequence_number}_{records[-1].sub_sequence_number}"
    assert meta["kcl_pipeline.rows"] == "10"
    assert meta["kcl_pipeline.minute"] == str(T0)


def test_a_batch_never_spans_two_minutes():
    records = make_records(10, per_minute=5)
    with pytest.raises(ValueError, match="two arrival minutes"):
        encode_batch(STREAM, SHARD, records, None)
    with pytest.raises(ValueError, match="at least one"):
        encode_batch(STREAM, SHARD, [], None)


@pytest.mark.parametrize("text,cp", [("", None), ("5_0", Checkpoint("5", 0)), (f"{seq(9)}_12", Checkpoint(seq(9), 12)),
                                     ("TRIM_HORIZON_0", Checkpoint("TRIM_HORIZON")),
                                     ("AT_TIMESTAMP_1795316400000", Checkpoint("AT_TIMESTAMP", T0))])
def test_positions(text, cp):
    assert parse_position(text) == cp
    assert format_position(cp) == text


@pytest.mark.parametrize("bad", ["5", "5_x", "_3", "05_1"])
def test_bad_positions(bad):
    with pytest.raises(ValueError):
        parse_position(bad)


def test_footer_info(local_zone):
    _, store = local_zone
    records = make_records(20)
    batch = encode_batch(STREAM, SHARD, records, Checkpoint(seq(1), 0))
    store.put_if_absent(batch.key.key(), batch.body)
    info = read_batch_info(store, batch.key)
    assert (info.key, info.prev, info.rows, info.size) == (batch.key, Checkpoint(seq(1), 0), 20, len(batch.body))
    assert info.last_arrival_ms == records[-1].approximate_arrival_timestamp_ms
    assert not info.starts_consumption


def _put(store, key: BatchKey, body: bytes) -> None:
    assert store.put_if_absent(key.key(), body)


def test_corrupt_objects_are_named(local_zone):
    uri, store = local_zone
    records = make_records(8)
    good = encode_batch(STREAM, SHARD, records, None)
    cases = {
        "garbage": b"this is not parquet at all",
        "truncated": good.body[: len(good.body) // 2],
        "empty": b"",
    }
    for i, body in enumerate(cases.values()):
        key = BatchKey(STREAM, f"shardId-{i:012d}", T0, records[0].checkpoint, records[-1].checkpoint)
        _put(store, key, body)
        with pytest.raises(CorruptBatchError, match=f"landing zone {uri}: object {key.key()}"):
            read_batch_info(store, key)
    # A good Parquet file under a key that claims another range.
    lying = BatchKey(STREAM, SHARD, T0, records[0].checkpoint, records[-2].checkpoint)
    _put(store, lying, good.body)
    with pytest.raises(CorruptBatchError, match="its key says"):
        read_batch_info(store, lying)
    # Parquet, but not ours (no batch metadata).
    foreign = BatchKey(STREAM, "shardId-000000000099", T0, records[0].checkpoint, records[-1].checkpoint)
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1]}), buf)
    _put(store, foreign, buf.getvalue())
    with pytest.raises(CorruptBatchError, match="not a landed batch"):
        read_batch_info(store, foreign)
    with pytest.raises(CorruptBatchError, match="not readable Parquet"):
        decode_batch(b"nope", "k")


def test_large_footer_needs_a_second_read(local_zone):
    """A footer bigger than the first ranged read is fetched whole."""
    _, store = local_zone
    records = make_records(4)
    batch = encode_batch(STREAM, SHARD, records, None)
    table = decode_batch(batch.body)
    meta = dict(pq.read_metadata(pa.BufferReader(batch.body)).metadata)
    meta[b"padding"] = b"x" * 100_000
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), buf)
    _put(store, batch.key, buf.getvalue())
    assert read_batch_info(store, batch.key).rows == 4


def test_schema_is_the_one_documented():
    assert [(f.name, f.type) for f in SCHEMA] == EXPECTED_COLUMNS


def test_big_batches_are_written_in_row_groups():
    records = make_records(3000, data_size=1000)  # ~3 MB: three row groups of <= 1 MiB
    batch = encode_batch(STREAM, SHARD, records, None)
    md = pq.read_metadata(pa.BufferReader(batch.body))
    assert md.num_row_groups == 3 and md.num_rows == 3000
    assert decode_batch(batch.body).column("data").to_pylist() == [r.data for r in records]


def test_the_encoded_body_is_written_once_and_arrow_holds_one_row_group_at_a_time(monkeypatch):
    """The body is the buffer Parquet was written into (bytes, not a copy out of an Arrow stream), and Arrow's
    memory during the encoding is about one row group's, not the whole body's."""
    import kcl_pipeline.zone.batch as batch_module

    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    monkeypatch.setattr(batch_module, "_POOL", pool)
    records = make_records(8000, data_size=1000)  # ~8 MB: eight row groups of <= 1 MiB
    batch = encode_batch(STREAM, SHARD, records, None)
    assert type(batch.body) is bytes
    assert pq.read_metadata(pa.BufferReader(batch.body)).num_row_groups == 8
    assert pool.max_memory() < len(batch.body) / 2
    assert decode_batch(batch.body).column("data").to_pylist() == [r.data for r in records]


_THREADS_AFTER_DECODING = """
import os, sys
from kcl_pipeline.zone.batch import decode_batch

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
path = sys.argv[1]
decode_batch(path, "k")
with open(path, "rb") as file:
    decode_batch(file.read(), "k")
print(before, threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_decoding_a_batch_starts_no_native_thread_that_aborts_the_command_at_its_exit(tmp_path):
    """`landing verify --deep` printed its whole, correct report and then died of SIGABRT ("terminate called
    without an active exception"): Arrow's threaded Parquet reader had started pool threads, and one of those
    alive at the interpreter's exit aborts the process (a few runs in a hundred on a loaded host). A batch is
    decoded on the calling thread: no native thread is left to abort anything."""
    batch = encode_batch(STREAM, SHARD, make_records(500), Checkpoint(seq(1), 2), "zstd")
    path = tmp_path / "batch.parquet"
    path.write_bytes(batch.body)
    out = subprocess.run([sys.executable, "-c", _THREADS_AFTER_DECODING, str(path)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after == before, f"decoding a batch left {after - before} more threads in the process"
