"""The landed batch: one Parquet object holding consecutive user records of one shard and one arrival minute.

Columns (in this order): stream, shard_id, sequence_number (string), sub_sequence_number (int64),
partition_key (string), explicit_hash_key (string, the only nullable column),
approximate_arrival_timestamp (timestamp[ms, UTC]), data (binary). Sequence numbers stay strings.

Parquet key-value metadata (all values are strings; positions are written `<sequence>_<sub-sequence>`,
as in the key):

    kcl_pipeline.batch_format  "1"
    kcl_pipeline.stream / kcl_pipeline.shard_id
    kcl_pipeline.stream_arn    the stream's ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME): which of the streams
                               of that name the records are of ("" when the writer did not know it, and in
                               batches landed before stream identity); consumers and `landing verify` refuse
                               a chain holding another stream's batches (layout.foreign_stream)
    kcl_pipeline.prev          the position delivered just before the first record ("" when unknown);
                               a starting sentinel (e.g. "TRIM_HORIZON_0") when the batch starts the shard's
                               consumption — the link that makes batches a verifiable chain
    kcl_pipeline.first / kcl_pipeline.last / kcl_pipeline.rows
    kcl_pipeline.minute        the arrival minute (epoch millis) the batch belongs to
    kcl_pipeline.first_arrival_ms / kcl_pipeline.last_arrival_ms

Within a batch the records are consecutive in the shard (every record between first and last is in
it), so a key's range alone says which records it holds (the sequence-range exclusion, exclusion.py).

Two encodings, one codec (`LandingSettings.batch_format`, `encode_batch(batch_format=...)`):

* "parquet", the default and production's format: the one Spark's native Parquet reader (`landing_reader`
  "native", or "auto" on a directory zone) reads, and what every tool outside this project can read;
* "rows", for the deterministic simulation (kcl_pipeline/sim/) and tests: the same columns and the same
  metadata, as JSON behind a footer and the magic `KCLROWS1` (layout at `_encode_rows`). Parquet's fixed cost
  per batch (~3 ms to encode, ~1 ms to decode, whatever its size) dominated a simulated seed, which lands
  thousands of tiny batches; a rows batch costs tens of microseconds. It is not a storage format: nothing
  compresses it, and only this module reads it (Spark's native reader does not; the Python data source does,
  through `decode_batch`).

Every reader here takes either encoding: `decode_batch` and `read_batch_info` tell them apart by the object's
last bytes (`PAR1` or `KCLROWS1`), and a damaged object of either kind is a CorruptBatchError naming it.
"""
from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..kcl.core.model import Checkpoint, UserRecord
from ..kcl.records.record_batch import UserRecordBatch, arrow_schema
from .errors import CorruptBatchError
from .layout import BatchKey, minute_of

FORMAT_VERSION = "1"
PARQUET_FORMAT = "parquet"
ROWS_FORMAT = "rows"  # the cheap encoding behind the same interface (see `_encode_rows`)
BATCH_FORMATS = (PARQUET_FORMAT, ROWS_FORMAT)
ROWS_MAGIC = b"KCLROWS1"
_META = "kcl_pipeline."
COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")

SCHEMA = arrow_schema()  # declared once, in kcl/records/record_batch.py

# Arrow's default pool (mimalloc/jemalloc) keeps freed memory for reuse: after a few 8 MB flushes a worker
# holds ~40 MB it does not use. The system allocator returns large blocks to the OS at once; encoding
# speed is the same (benchmarks/bench_landing.py measures both speed and peak RSS).
_POOL = pa.system_memory_pool()
# One row group's Arrow copy and Parquet pages exist at once while a batch is encoded (benchmarks/bench_memory.py:
# 1 MiB groups peak ~1.5 MiB lower than 2 MiB ones for an 8 MiB batch, at the same encoding speed).
ROW_GROUP_BYTES = 1024 * 1024

# A footer larger than this is read with a second ranged GET (row groups x columns x stats; ours are small).
TAIL_BYTES = 64 * 1024


def format_position(cp: Checkpoint | None) -> str:
    return "" if cp is None else f"{cp.sequence_number}_{cp.sub_sequence_number}"


def parse_position(text: str) -> Checkpoint | None:
    if not text:
        return None
    seq, sep, sub = text.rpartition("_")
    if not sep or not sub.isdigit():
        raise ValueError(f"not a position: {text!r}")
    return Checkpoint(seq, int(sub))


@dataclass(frozen=True)
class EncodedBatch:
    key: BatchKey
    body: bytes
    rows: int
    prev: Checkpoint | None
    last_arrival_ms: int


@dataclass(frozen=True)
class BatchInfo:
    """What a landed batch says about itself (its Parquet footer), checked against its key."""

    key: BatchKey
    prev: Checkpoint | None
    rows: int
    first_arrival_ms: int
    last_arrival_ms: int
    size: int
    prev_key: str | None = None  # the key of the batch ending at `prev` (None: a starting position, or unknown)
    stream_arn: str | None = None  # the stream the records are of (None: not recorded by its writer)

    @property
    def starts_consumption(self) -> bool:
        """The batch's predecessor is a starting sentinel: nothing before it was read by this consumer."""
        return self.prev is not None and self.prev.is_starting_sentinel


def encode_batch(stream: str, shard_id: str, records: Sequence[UserRecord], prev: Checkpoint | None,
                 compression: str = "zstd", prev_key: str | None = None,
                 batch_format: str = "parquet", stream_arn: str | None = None) -> EncodedBatch:
    """One batch object. `records` are consecutive records of `shard_id`, in shard order, of one minute —
    a columnar UserRecordBatch (what the reader delivers: it goes to Arrow without a Python object per
    record) or any sequence of UserRecords; `prev_key` is the key of the batch ending at `prev`, so the
    chain can be followed back directly; `stream_arn` is recorded so that a reader can tell this stream's batches
    from those of another stream of the same name."""
    batch = records if isinstance(records, UserRecordBatch) else UserRecordBatch.from_records(shard_id, records)
    last = batch.last
    if last is None:
        raise ValueError("a batch needs at least one record")
    arrivals = batch.run_arrival_ms
    minute = minute_of(arrivals[0])
    if minute_of(arrivals[-1]) != minute:
        # Cheap guard on the caller (the sink flushes at every minute change); a full scan would cost more.
        raise ValueError(f"batch spans two arrival minutes ({arrivals[0]} .. {arrivals[-1]})")
    n = len(batch)
    first = batch[0].checkpoint
    key = BatchKey(stream, shard_id, minute, first, last)
    meta = {
        "batch_format": FORMAT_VERSION, "stream": stream, "shard_id": shard_id,
        "prev": format_position(prev), "first": format_position(key.first), "last": format_position(key.last),
        "rows": str(n), "minute": str(minute), "prev_key": prev_key or "",
        "first_arrival_ms": str(min(arrivals)), "last_arrival_ms": str(max(arrivals)),
        "stream_arn": stream_arn or "",
    }
    if batch_format == ROWS_FORMAT:
        return EncodedBatch(key, _encode_rows(batch, meta), n, prev, max(arrivals))
    if batch_format != PARQUET_FORMAT:
        raise ValueError(f"batch format must be one of {', '.join(BATCH_FORMATS)}, got {batch_format!r}")
    # Row groups of about ROW_GROUP_BYTES of data, converted one at a time: only one group's Arrow copy of
    # the records exists at once (a worker's peak memory is budgeted on that).
    data_bytes = sum(map(len, batch.data))
    group = max(1, min(n, n * ROW_GROUP_BYTES // max(1, data_bytes)))
    # Written straight into a Python buffer, which becomes the body without a copy (an Arrow output stream's
    # buffer had to be copied out: the encoded batch twice in memory at the end of every flush).
    sink = io.BytesIO()
    # store_schema=False: the Parquet types already say everything (UTC millis); a smaller footer.
    with pq.ParquetWriter(sink, SCHEMA, compression=None if compression == "none" else compression,
                          use_dictionary=["stream", "shard_id", "partition_key", "explicit_hash_key"],
                          write_statistics=["sequence_number", "approximate_arrival_timestamp"],
                          store_schema=False, memory_pool=_POOL) as writer:
        for i in range(0, n, group):
            writer.write_table(batch[i:i + group].to_arrow(stream, memory_pool=_POOL), row_group_size=group)
        writer.add_key_value_metadata({f"{_META}{k}": v for k, v in meta.items()})
    return EncodedBatch(key, sink.getvalue(), n, prev, max(arrivals))


def rewrite_batch(body: bytes, info: BatchInfo, directory: str, prev_key: str | None,
                  stream_arn: str | None) -> EncodedBatch:
    """The batch `body` (its footer `info`) as landed under `directory` (`kcl-pipeline landing migrate`): the same
    records after the same predecessor, its key, footer and rows' `stream` column naming `directory`, its
    `prev_key` and `stream_arn` as given; in its own encoding (and compression, for Parquet)."""
    where = info.key.key()
    table = decode_batch(body, where, info.key.stream)
    arrivals = table.column("approximate_arrival_timestamp").cast(pa.int64()).to_pylist()
    records = [UserRecord(info.key.shard_id, seq, sub, pk, ehk, ms, data)
               for seq, sub, pk, ehk, ms, data in zip(
                   table.column("sequence_number").to_pylist(), table.column("sub_sequence_number").to_pylist(),
                   table.column("partition_key").to_pylist(), table.column("explicit_hash_key").to_pylist(),
                   arrivals, table.column("data").to_pylist(), strict=True)]
    if body[-len(ROWS_MAGIC):] == ROWS_MAGIC:
        return encode_batch(directory, info.key.shard_id, records, info.prev, prev_key=prev_key,
                            batch_format=ROWS_FORMAT, stream_arn=stream_arn)
    written = pq.read_metadata(pa.BufferReader(body)).row_group(0).column(0).compression.lower()
    compression = "none" if written == "uncompressed" else written if written in COMPRESSIONS else "zstd"
    return encode_batch(directory, info.key.shard_id, records, info.prev, compression=compression,
                        prev_key=prev_key, stream_arn=stream_arn)


_OPTIONAL_COLUMNS = frozenset({"stream", "explicit_hash_key"})
_REQUIRED_VALUES = ("shard_id", "sequence_number", "sub_sequence_number", "data")


def read_parquet(source: bytes | str) -> pa.Table:
    """A whole Parquet file (its bytes, or a local file path), read on the calling thread. Arrow's threaded
    readers start native pool threads, and one of those alive at the process's exit aborts it (SIGABRT,
    "terminate called without an active exception"): a command that printed its whole report then failed. A
    batch is small enough that one thread reads it as fast (measured: a 10 MB zstd file, 85 ms against 97 ms)."""
    with (pa.OSFile(source) if isinstance(source, str) else pa.BufferReader(source)) as file:
        return pq.ParquetFile(file, pre_buffer=False).read(use_threads=False)


def decode_batch(body: bytes | str, key: str = "?", stream: str | None = None) -> pa.Table:
    """The rows of a batch object (its bytes, or a local file path), in SCHEMA: the one batch decoder
    (`landing verify`, the audit, the Spark reader). CorruptBatchError if it is not readable Parquet."""
    if isinstance(body, str):  # a local file: a rows batch is read whole (Parquet reads the path itself)
        try:
            with open(body, "rb") as file:
                file.seek(max(0, file.seek(0, 2) - len(ROWS_MAGIC)))
                if file.read() == ROWS_MAGIC:
                    file.seek(0)
                    body = file.read()
        except OSError:
            pass  # Parquet's reader says why
    if not isinstance(body, str) and body[-len(ROWS_MAGIC):] == ROWS_MAGIC:
        return conform(_decode_rows(body, key), key, stream)
    if not isinstance(body, str) and body[:len(_ROWS_START)] == _ROWS_START:
        raise CorruptBatchError(f"landed batch {key}: a truncated rows batch ({len(body)} bytes, its end is "
                                f"missing: no {ROWS_MAGIC.decode()} magic)")
    try:
        table = read_parquet(body)
    except Exception as exc:
        raise CorruptBatchError(f"landed batch {key} is not readable Parquet: {exc}") from exc
    return conform(table, key, stream)


def conform(table: pa.Table, key: str, stream: str | None = None) -> pa.Table:
    """`table` in SCHEMA: columns selected and ordered, types cast (large or dictionary strings, other
    timestamp units), an absent `explicit_hash_key` (and `stream`, when the reader knows it) filled in.
    A missing column, an impossible cast or a null in a required column is a CorruptBatchError naming `key`."""
    if table.schema.remove_metadata() == SCHEMA.remove_metadata():
        columns = table.columns
    else:
        columns = []
        for field in SCHEMA:
            if field.name in table.column_names:
                column = table.column(field.name)
                try:
                    columns.append(column if column.type == field.type else column.cast(field.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise CorruptBatchError(f"landed batch {key}: column {field.name} of type {column.type} "
                                            f"cannot be read as {field.type}: {exc}") from exc
            elif field.name in _OPTIONAL_COLUMNS and (field.name != "stream" or stream is not None):
                fill = stream if field.name == "stream" else None
                columns.append(pa.array([fill] * table.num_rows, field.type))
            else:
                raise CorruptBatchError(f"landed batch {key}: column {field.name} is missing "
                                        f"(has {', '.join(table.column_names)})")
    for name in _REQUIRED_VALUES:
        column = columns[SCHEMA.get_field_index(name)]
        if column.null_count:
            raise CorruptBatchError(f"landed batch {key}: column {name} has {column.null_count} null values")
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def info_from_metadata(metadata: pq.FileMetaData, key: BatchKey, size: int, where: str) -> BatchInfo:
    """Check a footer against its key: CorruptBatchError naming `where` if they disagree."""
    kv = {k.decode(): v.decode() for k, v in (metadata.metadata or {}).items() if k.startswith(_META.encode())}
    return info_from_meta({k[len(_META):]: v for k, v in kv.items()}, metadata.num_rows, key, size, where)


def info_from_meta(meta: dict[str, str], num_rows: int, key: BatchKey, size: int, where: str) -> BatchInfo:
    """Check a batch's metadata (either format's footer) against its key and its row count."""
    if meta.get("batch_format") != FORMAT_VERSION:
        raise CorruptBatchError(f"{where}: not a landed batch (batch_format {meta.get('batch_format')!r})")
    try:
        prev = parse_position(meta.get("prev", ""))
        first = parse_position(meta["first"])
        last = parse_position(meta["last"])
        rows = int(meta["rows"])
        info = BatchInfo(key, prev, rows, int(meta["first_arrival_ms"]), int(meta["last_arrival_ms"]), size,
                         meta.get("prev_key") or None, meta.get("stream_arn") or None)
    except (KeyError, ValueError) as exc:
        raise CorruptBatchError(f"{where}: batch metadata unreadable ({exc})") from exc
    problems = []
    if (first, last) != (key.first, key.last):
        problems.append(f"holds {first}..{last}, its key says {key.first}..{key.last}")
    if meta.get("shard_id") != key.shard_id or meta.get("stream") != key.stream:
        problems.append(f"holds {meta.get('stream')}/{meta.get('shard_id')}, its key says {key.stream}/{key.shard_id}")
    if rows != num_rows:
        problems.append(f"metadata says {rows} rows, the file has {num_rows}")
    if str(key.minute_ms) != meta.get("minute"):
        problems.append(f"minute {meta.get('minute')} is not the key's {key.minute_ms}")
    if problems:
        raise CorruptBatchError(f"{where}: " + "; ".join(problems))
    return info


def read_batch_info(store, key: BatchKey) -> BatchInfo:
    """The footer of a landed batch, fetched with one ranged read (two for a large footer)."""
    rel = key.key()
    where = f"landing zone {store.uri}: object {rel}"
    tail, size = store.get_tail(rel, TAIL_BYTES)
    if tail[-len(ROWS_MAGIC):] == ROWS_MAGIC:
        return _rows_info(store, rel, tail, size, key, where)
    if size < 12 or tail[-4:] != b"PAR1":
        if len(tail) == size and tail[:len(_ROWS_START)] == _ROWS_START:
            raise CorruptBatchError(f"{where}: a truncated rows batch ({size} bytes, its end is missing: "
                                    f"no {ROWS_MAGIC.decode()} magic)")
        raise CorruptBatchError(f"{where} is not a Parquet file ({size} bytes, no footer magic)")
    footer_len = struct.unpack("<I", tail[-8:-4])[0]
    if footer_len + 8 > size - 4:
        raise CorruptBatchError(f"{where} has a truncated footer ({footer_len} bytes claimed, file {size})")
    if footer_len + 8 > len(tail):
        tail, size = store.get_tail(rel, footer_len + 8)
    try:
        metadata = pq.read_metadata(pa.PythonFile(_Tail(tail, size), mode="r"))
    except Exception as exc:
        raise CorruptBatchError(f"{where}: unreadable Parquet footer ({exc})") from exc
    return info_from_metadata(metadata, key, size, where)


# -- the rows format: the landing codec's cheap encoding (LandingSettings.batch_format="rows") ------------------
#
# The same columns and the same metadata as the Parquet batch, for the simulation and tests, where an encoder's
# fixed cost per batch (Parquet: a few milliseconds) outweighs everything else: the columns as one JSON object
# (data as latin-1 text), then the metadata as JSON, then the two lengths (4 bytes each, little-endian) and the
# magic. Every reader of the landing zone takes either format (`decode_batch`, `read_batch_info`, which tell
# them apart by the last bytes); Spark's native Parquet reader does not (a zone of rows batches is read with
# `landing_reader="datasource"`).

_ROWS_START = b'{"sequence_number":'  # how a rows batch begins (its columns' JSON, in `_encode_rows`'s order)


def _encode_rows(batch: UserRecordBatch, meta: dict[str, str]) -> bytes:
    columns = {
        "sequence_number": batch.sequence_numbers, "sub_sequence_number": batch.sub_sequence_numbers,
        "partition_key": list(batch.partition_keys), "explicit_hash_key": list(batch.explicit_hash_keys),
        "approximate_arrival_timestamp": batch.arrival_ms,
        "data": [bytes(d).decode("latin-1") for d in batch.data],
    }
    body = json.dumps(columns, separators=(",", ":")).encode()
    footer = json.dumps(meta, separators=(",", ":")).encode()
    return body + footer + struct.pack("<II", len(footer), len(body)) + ROWS_MAGIC


def _rows_parts(raw: bytes, where: str) -> tuple[dict, bytes]:
    """(the metadata, the columns' bytes) of a whole rows-format object."""
    tail = len(ROWS_MAGIC) + 8
    if len(raw) < tail:
        raise CorruptBatchError(f"{where}: a truncated rows batch ({len(raw)} bytes)")
    footer_len, body_len = struct.unpack("<II", raw[-tail:-len(ROWS_MAGIC)])
    if footer_len + body_len + tail != len(raw):
        raise CorruptBatchError(f"{where}: a truncated rows batch ({len(raw)} bytes, "
                                f"{footer_len + body_len + tail} claimed)")
    try:
        meta = json.loads(raw[body_len:body_len + footer_len])
    except ValueError as exc:
        raise CorruptBatchError(f"{where}: unreadable rows batch metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise CorruptBatchError(f"{where}: unreadable rows batch metadata")
    return {str(k): str(v) for k, v in meta.items()}, raw[:body_len]


def _rows_info(store, rel: str, tail: bytes, size: int, key: BatchKey, where: str) -> BatchInfo:
    raw = tail if len(tail) == size else store.get(rel)
    meta, _ = _rows_parts(raw, where)
    try:
        rows = int(meta.get("rows", ""))
    except ValueError as exc:
        raise CorruptBatchError(f"{where}: batch metadata unreadable ({exc})") from exc
    return info_from_meta(meta, rows, key, size, where)


def _decode_rows(raw: bytes, key: str) -> pa.Table:
    meta, body = _rows_parts(raw, f"landed batch {key}")
    try:
        cols = json.loads(body)
        n = len(cols["sequence_number"])
        if int(meta["rows"]) != n:
            raise ValueError(f"metadata says {meta['rows']} rows, the columns hold {n}")
        return pa.Table.from_arrays([
            pa.array([meta.get("stream")] * n, pa.string()),
            pa.array([meta.get("shard_id")] * n, pa.string()),
            pa.array(cols["sequence_number"], pa.string()),
            pa.array(cols["sub_sequence_number"], pa.int64()),
            pa.array(cols["partition_key"], pa.string()),
            pa.array(cols["explicit_hash_key"], pa.string()),
            pa.array(cols["approximate_arrival_timestamp"], pa.timestamp("ms", tz="UTC")),  # epoch millis
            pa.array([d.encode("latin-1") for d in cols["data"]], pa.binary()),
        ], schema=SCHEMA)
    except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        raise CorruptBatchError(f"landed batch {key}: unreadable rows batch ({exc})") from exc


class _Tail(io.RawIOBase):
    """A read-only file of `size` bytes of which only the tail is known (enough for a Parquet footer)."""

    def __init__(self, tail: bytes, size: int):
        self._tail = tail
        self._size = size
        self._start = size - len(tail)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if self._pos < self._start:
            raise OSError("read outside the fetched footer")
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        out = self._tail[self._pos - self._start:end - self._start]
        self._pos = end
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)
