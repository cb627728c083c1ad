"""The landing codec's "rows" encoding (the simulation's): the same columns and metadata as a Parquet batch,
told apart from Parquet by its last bytes, read by the same decoder and footer reader, and a damaged one is a
CorruptBatchError naming the object, as a damaged Parquet batch is."""
from __future__ import annotations

import json
import struct
from dataclasses import replace

import pyarrow as pa
import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, UserRecord
from kcl_pipeline.zone.batch import (
    ROWS_FORMAT,
    ROWS_MAGIC,
    SCHEMA,
    decode_batch,
    encode_batch,
    read_batch_info,
)
from kcl_pipeline.zone.errors import CorruptBatchError
from kcl_pipeline.zone.layout import BatchKey
from kcl_pipeline.zone.store import MemoryZoneStore

from .helpers import SHARD, STREAM, T0, make_records, seq


def _awkward_records() -> list[UserRecord]:
    """Every column at its edges: all 256 byte values and empty data, a non-ASCII partition key, explicit hash
    keys present and absent, sub-sequences above 0 (a KPL aggregate), arrivals to the millisecond."""
    data = [bytes(range(256)), b"", b"\x00", "é€😀".encode(), b'{"not": "json"}\\"', b"\xff" * 3]
    return [UserRecord(SHARD, seq(10 * (i // 2) + 3), i % 2, f"pk-é-{i}", None if i % 3 else str(2**127 + i),
                       T0 + 17 * i + 1, payload, aggregated=True) for i, payload in enumerate(data)]


PREV = Checkpoint(seq(1), 2)


def _both(records, prev=PREV, prev_key="s/dt=2026-11-25/hh=00/mm=00/sh/1_0-1_2.parquet"):
    parquet = encode_batch(STREAM, SHARD, records, prev, prev_key=prev_key)
    rows = encode_batch(STREAM, SHARD, records, prev, prev_key=prev_key, batch_format=ROWS_FORMAT)
    return parquet, rows


def test_every_column_round_trips_as_parquets_does():
    records = _awkward_records()
    parquet, rows = _both(records)
    table = decode_batch(rows.body, "rows", STREAM)
    assert table.schema == SCHEMA
    assert table.equals(decode_batch(parquet.body, "parquet", STREAM))
    assert table.column("data").to_pylist() == [r.data for r in records]
    assert table.column("sequence_number").to_pylist() == [r.sequence_number for r in records]
    assert table.column("sub_sequence_number").to_pylist() == [r.sub_sequence_number for r in records]
    assert table.column("partition_key").to_pylist() == [r.partition_key for r in records]
    assert table.column("explicit_hash_key").to_pylist() == [r.explicit_hash_key for r in records]
    assert table.column("approximate_arrival_timestamp").cast(pa.int64()).to_pylist() == \
        [r.approximate_arrival_timestamp_ms for r in records]
    assert set(table.column("stream").to_pylist()) == {STREAM} and set(table.column("shard_id").to_pylist()) == {SHARD}
    assert (rows.key, rows.rows, rows.prev, rows.last_arrival_ms) == \
        (parquet.key, parquet.rows, parquet.prev, parquet.last_arrival_ms)


@pytest.mark.parametrize("prev", [PREV, Checkpoint("TRIM_HORIZON"), None])
def test_the_metadata_reads_back_as_parquets(memory_zone, prev):
    _, store = memory_zone
    records = make_records(30)
    parquet, rows = _both(records, prev=prev, prev_key=None if prev is None else "s/p/1_0-1_2.parquet")
    assert store.put_if_absent(rows.key.key(), rows.body)
    info = read_batch_info(store, rows.key)
    other = MemoryZoneStore(f"{store.name}-parquet")
    other.ensure_zone(create=True)
    try:
        assert other.put_if_absent(parquet.key.key(), parquet.body)
        assert read_batch_info(other, parquet.key) == replace(info, size=len(parquet.body))
    finally:
        other.drop()
    assert (info.key, info.prev, info.rows, info.size, info.prev_key) == \
        (rows.key, prev, 30, len(rows.body), None if prev is None else "s/p/1_0-1_2.parquet")
    assert (info.first_arrival_ms, info.last_arrival_ms) == \
        (records[0].approximate_arrival_timestamp_ms, records[-1].approximate_arrival_timestamp_ms)
    assert info.starts_consumption == (prev is not None and prev.is_starting_sentinel)
    meta = json.loads(rows.body[struct.unpack("<II", rows.body[-16:-8])[1]:-16])
    assert meta == {"batch_format": "1", "stream": STREAM, "shard_id": SHARD, "prev": "" if prev is None else
                    f"{prev.sequence_number}_{prev.sub_sequence_number}",
                    "first": f"{records[0].sequence_number}_0",
                    "last": f"{records[-1].sequence_number}_{records[-1].sub_sequence_number}", "rows": "30",
                    "minute": str(T0), "prev_key": info.prev_key or "",
                    "first_arrival_ms": str(info.first_arrival_ms), "last_arrival_ms": str(info.last_arrival_ms),
                    "stream_arn": ""}


def test_told_apart_from_parquet_by_the_last_bytes_and_read_by_the_same_readers(local_zone):
    """One zone holding both encodings (a zone switched from one to the other): each reader reads both, from bytes
    or from a local file's path."""
    _, store = local_zone
    records = make_records(12)
    parquet, rows = _both(records[:6])
    _, later = _both(records[6:], prev=records[5].checkpoint)
    assert rows.body.endswith(ROWS_MAGIC) and parquet.body.endswith(b"PAR1") and not rows.body.endswith(b"PAR1")
    assert store.put_if_absent(parquet.key.key(), parquet.body)
    assert store.put_if_absent(later.key.key(), later.body)
    for batch in (parquet, later):
        info = read_batch_info(store, batch.key)
        assert (info.key, info.rows, info.size) == (batch.key, 6, len(batch.body))
        from_bytes = decode_batch(store.get(batch.key.key()), batch.key.key())
        from_path = decode_batch(store.local_path(batch.key.key()), batch.key.key())
        assert from_bytes.equals(from_path) and from_bytes.num_rows == 6
    assert read_batch_info(store, later.key).prev == records[5].checkpoint


def test_a_large_rows_batch_is_read_whole_for_its_footer(memory_zone):
    """A rows batch's metadata sits before its footer: one bigger than the first ranged read is read whole."""
    _, store = memory_zone
    records = make_records(200, data_size=1000)
    rows = encode_batch(STREAM, SHARD, records, None, batch_format=ROWS_FORMAT)
    assert len(rows.body) > 64 * 1024
    store.put_if_absent(rows.key.key(), rows.body)
    assert read_batch_info(store, rows.key).rows == 200
    assert decode_batch(rows.body).column("data").to_pylist() == [r.data for r in records]


def _damaged(body: bytes) -> dict[str, tuple[bytes, str]]:
    """Damaged copies of a rows batch, each with what its error must say."""
    body_len = struct.unpack("<II", body[-16:-8])[1]
    columns = json.loads(body[:body_len])
    footer = body[body_len:-16]

    def rebuilt(cols, meta_bytes=footer):
        enc = json.dumps(cols, separators=(",", ":")).encode()
        return enc + meta_bytes + struct.pack("<II", len(meta_bytes), len(enc)) + ROWS_MAGIC

    return {
        "cut at the end": (body[:len(body) // 2], "a truncated rows batch"),
        "cut at the start": (body[len(body) // 3:], "a truncated rows batch"),
        "only the magic": (ROWS_MAGIC, "a truncated rows batch"),
        "columns garbled": (b"{" + b"x" * (body_len - 1) + body[body_len:], "unreadable rows batch"),
        "metadata garbled": (body[:body_len] + b"!" * len(footer) + body[-16:], "unreadable rows batch metadata"),
        "metadata not an object": (rebuilt(columns, b"[1,2,3,4]"), "unreadable rows batch metadata"),
        "a column missing": (rebuilt({k: v for k, v in columns.items() if k != "data"}), "unreadable rows batch"),
        "a column short": (rebuilt({**columns, "data": columns["data"][:-1]}), "unreadable rows batch"),
        "a row more than the metadata": (rebuilt({k: v + v[:1] for k, v in columns.items()}), "rows batch"),
        "a wrong type": (rebuilt({**columns, "sub_sequence_number": ["x"] * len(columns["data"])}),
                         "unreadable rows batch"),
        "data beyond latin-1": (rebuilt({**columns, "data": ["€"] * len(columns["data"])}), "unreadable rows batch"),
        "a null sequence number": (rebuilt({**columns, "sequence_number": [None] * len(columns["data"])}),
                                   "column sequence_number has"),
    }


@pytest.mark.parametrize("case", list(_damaged(encode_batch(STREAM, SHARD, make_records(5), None,
                                                            batch_format=ROWS_FORMAT).body)))
def test_a_damaged_rows_batch_is_a_corrupt_batch_error_naming_it(memory_zone, case):
    uri, store = memory_zone
    records = make_records(5)
    good = encode_batch(STREAM, SHARD, records, None, batch_format=ROWS_FORMAT)
    body, says = _damaged(good.body)[case]
    with pytest.raises(CorruptBatchError, match=f"landed batch {good.key.key()}.*{says}"):
        decode_batch(body, good.key.key(), STREAM)
    store.put_if_absent(good.key.key(), body)
    if case in ("cut at the start", "only the magic", "cut at the end", "metadata garbled",
                "metadata not an object"):  # what the footer alone shows
        with pytest.raises(CorruptBatchError, match=f"landing zone {uri}: object {good.key.key()}.*{says}"):
            read_batch_info(store, good.key)


def test_metadata_that_contradicts_the_key_is_refused_as_parquets_is(memory_zone):
    _, store = memory_zone
    records = make_records(8)
    rows = encode_batch(STREAM, SHARD, records, None, batch_format=ROWS_FORMAT)
    lying = BatchKey(STREAM, SHARD, T0, records[0].checkpoint, records[-2].checkpoint)
    store.put_if_absent(lying.key(), rows.body)
    with pytest.raises(CorruptBatchError, match="its key says"):
        read_batch_info(store, lying)
    elsewhere = BatchKey(STREAM, "shardId-000000000042", T0, records[0].checkpoint, records[-1].checkpoint)
    store.put_if_absent(elsewhere.key(), rows.body)
    with pytest.raises(CorruptBatchError, match="its key says"):
        read_batch_info(store, elsewhere)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="batch format must be one of parquet, rows"):
        encode_batch(STREAM, SHARD, make_records(2), None, batch_format="csv")
