"""KPL record aggregation and deaggregation (the Kinesis Producer Library's aggregated record format).

An aggregated Kinesis record is ``MAGIC + AggregatedRecord + MD5(AggregatedRecord)``; the protobuf
schema is ``kpl.proto`` beside this module, and user record *i* of an aggregate has sub-sequence
number *i*. Anything that does not verify (magic present but too short, MD5 mismatch, protobuf that
does not decode, a table index out of range, an aggregate without records) is delivered whole as ONE
plain user record and counted in :class:`KplStats` — never raised, never dropped.

``kpl_pb2.py`` and ``kpl_columns_pb2.py`` are generated and checked in; regenerate both from the
repository root with::

    .venv/bin/python -m grpc_tools.protoc -I. --python_out=. kcl_pipeline/kcl/records/kpl*.proto

(kcl_pipeline_tests/kcl/test_kpl.py checks the checked-in modules against a fresh generation.) Generated
code refuses a protobuf runtime older than the protoc that generated it (``# Protobuf Python Version``
in its header): pyproject's protobuf lower bound follows it (a test checks that too).

Speed: MD5 (OpenSSL) and the upb parser do the byte work. A second parse with the columnar schema
(kpl_columns.proto) hands over every record's fields as flat lists, so no Python object is made per
protobuf record (see ``_columns`` for when that is provably exact), and ``deaggregate_batch`` only
extends the columns of a :class:`~kcl_pipeline.kcl.records.record_batch.UserRecordBatch`: no UserRecord is
built unless a consumer asks for one. benchmarks/bench_kpl.py measures it against aws-kinesis-agg.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import repeat
from operator import attrgetter
from typing import Any, Iterable, Iterator, Mapping, Sequence

from google.protobuf.message import DecodeError

from ..core.model import STARTING_SENTINELS, Checkpoint, UserRecord
from . import kpl_columns_pb2, kpl_pb2
from .record_batch import BatchBuilder, UserRecordBatch

log = logging.getLogger(__name__)

MAGIC = b"\xf3\x89\x9a\xc2"
DIGEST_SIZE = 16  # MD5
# Kinesis limit: data blob plus partition key of one record (PutRecords counts both).
MAX_RECORD_BYTES = 1024 * 1024
MAX_PARTITION_KEY_CHARS = 256
MAX_HASH_KEY = 2**128 - 1

# Reasons an aggregate is delivered as a plain record (KplStats.bad_reasons keys).
TOO_SHORT = "too_short"
MD5_MISMATCH = "md5_mismatch"
PROTOBUF_DECODE_ERROR = "protobuf_decode_error"
MISSING_REQUIRED_FIELD = "missing_required_field"
NO_USER_RECORDS = "no_user_records"
INVALID_UTF8_KEY = "invalid_utf8_key"
PARTITION_KEY_INDEX_OUT_OF_RANGE = "partition_key_index_out_of_range"
EXPLICIT_HASH_KEY_INDEX_OUT_OF_RANGE = "explicit_hash_key_index_out_of_range"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)


@dataclass
class KplStats:
    """Deaggregation counters; one instance per lease worker, reported as metrics and reset per period.

    `kinesis_records` = `aggregates` + `plain_records` + `bad_aggregates`; a bad aggregate is still
    delivered (as one plain user record), so `user_records` counts every record handed on.
    """

    kinesis_records: int = 0
    user_records: int = 0
    aggregates: int = 0
    plain_records: int = 0
    bad_aggregates: int = 0
    bad_reasons: Counter = field(default_factory=Counter)

    def as_metrics(self) -> dict[str, int]:
        """Flat name -> value, e.g. for CloudWatch / Dagster metadata (`kpl_bad_aggregates_md5_mismatch`)."""
        metrics = {
            "kpl_kinesis_records": self.kinesis_records,
            "kpl_user_records": self.user_records,
            "kpl_aggregates": self.aggregates,
            "kpl_plain_records": self.plain_records,
            "kpl_bad_aggregates": self.bad_aggregates,
        }
        for reason, n in sorted(self.bad_reasons.items()):
            metrics[f"kpl_bad_aggregates_{reason}"] = n
        return metrics

    def add(self, other: "KplStats") -> None:
        self.kinesis_records += other.kinesis_records
        self.user_records += other.user_records
        self.aggregates += other.aggregates
        self.plain_records += other.plain_records
        self.bad_aggregates += other.bad_aggregates
        self.bad_reasons.update(other.bad_reasons)

    def take(self) -> "KplStats":
        """Return the counts so far and reset to zero (one metrics period)."""
        snapshot = dataclasses.replace(self, bad_reasons=Counter(self.bad_reasons))
        self.kinesis_records = self.user_records = self.aggregates = 0
        self.plain_records = self.bad_aggregates = 0
        self.bad_reasons.clear()
        return snapshot


class _BadAggregate(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# --- deaggregation --------------------------------------------------------------------------------

_get_data = attrgetter("data")
_get_pk_index = attrgetter("partition_key_index")
# The generated modules build their message classes at import (protobuf's builder) and ship no stubs, so
# mypy cannot see the classes.
_AggregatedRecord = kpl_pb2.AggregatedRecord  # type: ignore[attr-defined]
_KeyedAggregatedRecord = kpl_columns_pb2.KeyedAggregatedRecord  # type: ignore[attr-defined]
_Columns = kpl_columns_pb2.AggregatedRecordColumns  # type: ignore[attr-defined]
_md5 = hashlib.md5
_join = "".join
_RANGE: list[int] = []


def _identity(n: int) -> list[int]:
    """[0, 1, ..., n-1], from a list kept between calls."""
    if len(_RANGE) < n:
        _RANGE.extend(range(len(_RANGE), n))
    return _RANGE[:n]


def arrival_millis(value: Any) -> int:
    """ApproximateArrivalTimestamp (datetime as boto3 returns it, or epoch seconds) as epoch millis.

    Exact integer arithmetic: float seconds * 1000 truncates .123 to 122. Naive datetimes are UTC.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return (value - _EPOCH) // _ONE_MS
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(value * 1000)
    raise ValueError(f"ApproximateArrivalTimestamp must be a datetime or epoch seconds, got {value!r}")


def _fields(record: Mapping) -> tuple[str, int, bytes, str]:
    try:
        seq = record["SequenceNumber"]
        data = record["Data"]
        pk = record["PartitionKey"]
        ts = record["ApproximateArrivalTimestamp"]
    except KeyError as e:
        raise ValueError(f"not a GetRecords record (missing {e.args[0]}): keys {sorted(record)}") from None
    if not isinstance(seq, str):
        raise ValueError(f"SequenceNumber must be a string, got {type(seq).__name__}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"Data must be bytes, got {type(data).__name__}")
    return seq, arrival_millis(ts), bytes(data), pk


def _decode_aggregate(data: bytes) -> tuple[list, list | None, Sequence[bytes]]:
    """(partition keys, explicit hash keys or None, data) per user record; raises _BadAggregate."""
    if len(data) <= len(MAGIC) + DIGEST_SIZE:
        raise _BadAggregate(TOO_SHORT, f"{len(data)} bytes")
    body = data[4:-DIGEST_SIZE]  # bytes: upb copies a memoryview before parsing it
    if _md5(body).digest() != data[-DIGEST_SIZE:]:
        raise _BadAggregate(MD5_MISMATCH)
    cols = _Columns()
    try:
        cols.ParseFromString(body)
        c = cols.records
    except DecodeError:  # e.g. a stray length-delimited field 1 that kpl.proto keeps as unknown
        c = None
    # Records carrying explicit hash keys: read with the schema that requires one in every record (see
    # _columns); if it does not hold, read again as the format says.
    keyed = c is not None and len(c.explicit_hash_key_index) > 0
    agg = _parse(_KeyedAggregatedRecord if keyed else _AggregatedRecord, body)
    if keyed and not agg.IsInitialized():
        agg, keyed = _parse(_AggregatedRecord, body), False
        initialized = agg.IsInitialized()
    else:
        initialized = keyed or agg.IsInitialized()
    # upb does not enforce proto2 `required` while parsing; the KPL's own readers do.
    if not initialized:
        raise _BadAggregate(MISSING_REQUIRED_FIELD, ", ".join(agg.FindInitializationErrors()))
    n = len(agg.records)
    if not n:
        raise _BadAggregate(NO_USER_RECORDS)
    pk_table = list(agg.partition_key_table)
    ehk_table = list(agg.explicit_hash_key_table)
    # upb hands back bytes (not str) for a proto2 string that is not UTF-8; join refuses bytes.
    try:
        _join(pk_table)
        _join(ehk_table)
    except TypeError:
        raise _BadAggregate(INVALID_UTF8_KEY) from None
    pk_indexes, ehk_indexes, datas = _columns(agg, c, n, keyed)
    if len(pk_table) == n and pk_indexes == _identity(n):
        pks = pk_table  # every record its own key, in table order (the KPL's layout for distinct keys)
    else:
        try:
            pks = list(map(pk_table.__getitem__, pk_indexes))
        except IndexError:
            raise _BadAggregate(PARTITION_KEY_INDEX_OUT_OF_RANGE, f"table has {len(pk_table)}") from None
    ehks: list | None = None
    if ehk_indexes is not None and len(ehk_table) == n and ehk_indexes == _identity(n):
        ehks = ehk_table
    elif ehk_indexes is not None:
        get = ehk_table.__getitem__
        try:
            if isinstance(ehk_indexes, list):  # the per-record reading: None where a record has none
                ehks = [None if i is None else get(i) for i in ehk_indexes]
            else:  # the columnar one: an index for every record
                ehks = list(map(get, ehk_indexes))
        except IndexError:
            raise _BadAggregate(EXPLICIT_HASH_KEY_INDEX_OUT_OF_RANGE, f"table has {len(ehk_table)}") from None
    return pks, ehks, datas


def bad_aggregate_reason(data: bytes) -> str | None:
    """Why `data`, a record delivered as one plain record, is a bad KPL aggregate ("md5_mismatch",
    "too_short: 20 bytes", …); None when it does not start with the KPL's magic or is a good aggregate.
    The transform quarantines it with this reason rather than as bytes that are not UTF-8."""
    if data[:4] != MAGIC:
        return None
    try:
        _decode_aggregate(data)
    except _BadAggregate as bad:
        return f"{bad.reason}: {bad.detail}" if bad.detail else bad.reason
    return None


def _parse(message_type: Any, body: bytes) -> Any:
    agg = message_type()
    try:
        agg.ParseFromString(body)
    except DecodeError as e:
        raise _BadAggregate(PROTOBUF_DECODE_ERROR, str(e)) from None
    return agg


def _columns(agg: Any, c: Any, n: int, keyed: bool) -> tuple[Sequence[int], Sequence[int] | list[int | None] | None,
                                                              Sequence[bytes]]:
    """Per-record partition key index, explicit hash key index (None: no record has one), data.

    Fast path: `c` is the aggregate read with the columnar schema (kpl_columns.proto), which yields each
    field of every record as one flat list without a Python object per record. Its lists line up with
    the records only if every record holds exactly one occurrence. `agg` is initialised, so every record
    holds at least one partition key index and one data, and when `keyed` (read with the schema that
    requires it) at least one explicit hash key index; totals equal to the record count then prove
    exactly one. Anything irregular (repeated fields, packed or stray encodings, hash keys on some
    records only) takes the per-record path, which reads the fields exactly as kpl.proto defines them
    (the last occurrence wins).

    The explicit hash key indexes come back as the columnar container (an index for every record) or,
    from the per-record path, a list holding None for a record without one.
    """
    if c is not None:
        pk_indexes, datas, ehk_count = c.partition_key_index, c.data, len(c.explicit_hash_key_index)
        if len(pk_indexes) == n and len(datas) == n:
            # The containers themselves: the caller copies them once, into the batch's columns.
            if not ehk_count:
                return pk_indexes, None, datas
            if keyed and ehk_count == n:
                return pk_indexes, c.explicit_hash_key_index, datas
    records = list(agg.records)
    has = [r.HasField("explicit_hash_key_index") for r in records]
    ehk_indexes = None
    if any(has):
        ehk_indexes = [r.explicit_hash_key_index if h else None for r, h in zip(records, has, strict=True)]
    return list(map(_get_pk_index, records)), ehk_indexes, list(map(_get_data, records))


def _deaggregate_into(out: BatchBuilder, record: Mapping, shard_id: str, stats: KplStats | None,
                      min_sub: int) -> None:
    """Add the user records of one Kinesis record whose sub-sequence is >= min_sub (as one run)."""
    seq, ms, data, pk = _fields(record)
    if data[:4] == MAGIC:
        try:
            pks, ehks, datas = _decode_aggregate(data)
        except _BadAggregate as bad:
            log.warning("shard %s record %s: bad KPL aggregate (%s%s); delivered as one plain record",
                        shard_id, seq, bad.reason, f": {bad.detail}" if bad.detail else "")
            if stats is not None:
                stats.bad_aggregates += 1
                stats.bad_reasons[bad.reason] += 1
        else:
            if min_sub:
                pks, datas = pks[min_sub:], datas[min_sub:]
                ehks = ehks[min_sub:] if ehks is not None else None
            n = len(datas)
            if n:
                out.seqs.append(seq)
                out.ms.append(ms)
                out.agg.append(True)
                out.first.append(min_sub)
                out.lens.append(n)
                out.pks.extend(pks)
                if ehks is not None:
                    out.add_explicit_hash_keys(ehks)
                elif out.ehks is not None:
                    out.ehks.extend(repeat(None, n))
                out.data.extend(datas)
            if stats is not None:
                stats.kinesis_records += 1
                stats.aggregates += 1
                stats.user_records += n
            return
    elif stats is not None:
        stats.plain_records += 1
    if stats is not None:
        stats.kinesis_records += 1
    if min_sub == 0:
        out.seqs.append(seq)
        out.ms.append(ms)
        out.agg.append(False)
        out.first.append(0)
        out.lens.append(1)
        out.pks.append(pk)
        ehk = record.get("ExplicitHashKey")
        if ehk is not None:
            out.add_explicit_hash_keys((ehk,))
        elif out.ehks is not None:
            out.ehks.append(None)
        out.data.append(data)
        if stats is not None:
            stats.user_records += 1


def deaggregate(record: Mapping, shard_id: str, stats: KplStats | None = None) -> list[UserRecord]:
    """The user records of one Kinesis record as boto3 GetRecords returns it.

    An aggregate yields one UserRecord per user record (sub-sequence = index, aggregated=True);
    anything else yields exactly one plain record (sub-sequence 0). Raises ValueError only when
    `record` is not a GetRecords record at all (a missing key or a wrongly typed field).
    """
    out = BatchBuilder(shard_id)
    _deaggregate_into(out, record, shard_id, stats, 0)
    return list(out.build())


def deaggregate_batch(records: Iterable[Mapping], shard_id: str, after: Checkpoint | None = None,
                      stats: KplStats | None = None) -> UserRecordBatch:
    """Deaggregate a GetRecords batch, dropping user records at or below `after`.

    `after` is the resume point (a checkpoint or the last record landed): reading restarts
    AT_SEQUENCE_NUMBER of a partly processed aggregate, and only its later user records are kept.
    None or a starting sentinel keeps everything; SHARD_END has nothing after it (ValueError).
    The result is a columnar UserRecordBatch: a Sequence[UserRecord] that builds no UserRecord
    until one is asked for, with the columns and `to_arrow` for consumers that need none.
    """
    out = BatchBuilder(shard_id)
    if after is None or after.sequence_number in STARTING_SENTINELS:
        for record in records:
            _deaggregate_into(out, record, shard_id, stats, 0)
        return out.build()
    if after.is_shard_end:
        raise ValueError(f"shard {shard_id}: nothing can be read after SHARD_END")
    after_key = (len(after.sequence_number), after.sequence_number)
    after_sub = after.sub_sequence_number
    for record in records:
        seq = record.get("SequenceNumber")
        if isinstance(seq, str):
            key = (len(seq), seq)
            if key < after_key:
                continue  # wholly at or below the resume point: not even decoded
            if key == after_key:
                _deaggregate_into(out, record, shard_id, stats, after_sub + 1)
                continue
        _deaggregate_into(out, record, shard_id, stats, 0)
    return out.build()


# --- aggregation -------------------------------------------------------------------------------

def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _check_user_record(partition_key: str, explicit_hash_key: str | None, data: bytes) -> None:
    if not isinstance(partition_key, str) or not 1 <= len(partition_key) <= MAX_PARTITION_KEY_CHARS:
        raise ValueError(f"partition key must be 1..{MAX_PARTITION_KEY_CHARS} characters, got {partition_key!r}")
    if explicit_hash_key is not None:
        if not (isinstance(explicit_hash_key, str) and explicit_hash_key.isdigit()
                and explicit_hash_key.isascii() and int(explicit_hash_key) <= MAX_HASH_KEY):
            raise ValueError(f"explicit hash key must be a decimal in 0..2^128-1, got {explicit_hash_key!r}")
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"user record data must be bytes, got {type(data).__name__}")


def _encode(pk_table: Sequence[str], ehk_table: Sequence[str],
            entries: Sequence[tuple[int, int | None, bytes]]) -> bytes:
    agg = _AggregatedRecord()
    agg.partition_key_table.extend(pk_table)
    agg.explicit_hash_key_table.extend(ehk_table)
    add = agg.records.add
    for pk_index, ehk_index, data in entries:
        if ehk_index is None:
            add(partition_key_index=pk_index, data=data)
        else:
            add(partition_key_index=pk_index, explicit_hash_key_index=ehk_index, data=data)
    body = agg.SerializeToString()
    return MAGIC + body + _md5(body).digest()


def aggregate(user_records: Sequence[tuple[str, str | None, bytes]]) -> bytes:
    """One aggregated record holding `user_records` ((partition key, explicit hash key or None, data))."""
    if not user_records:
        raise ValueError("an aggregate needs at least one user record")
    agg = Aggregator(max_bytes=None)
    for pk, ehk, data in user_records:
        agg.add(pk, ehk, data)
    done = agg.flush()
    assert done is not None
    return done.data


@dataclass(frozen=True)
class Aggregate:
    """A finished aggregated record, ready for PutRecord(s)."""

    partition_key: str  # the first user record's (routes the whole aggregate)
    explicit_hash_key: str | None  # the first user record's, if it had one
    data: bytes
    user_records: int


class Aggregator:
    """Packs a stream of user records into aggregates within the Kinesis record limit.

    `add` returns the finished aggregate when the new record does not fit into the current one (or
    `max_records` is reached), and starts the next with it; `flush` returns the rest. The size is
    tracked exactly as the protobuf encodes it, so `len(aggregate.data)` plus the outer partition
    key's UTF-8 length never exceeds `max_bytes` (None: unbounded).
    """

    def __init__(self, max_bytes: int | None = MAX_RECORD_BYTES, max_records: int | None = None) -> None:
        if max_bytes is not None and max_bytes > MAX_RECORD_BYTES:
            raise ValueError(f"max_bytes {max_bytes} exceeds the Kinesis record limit {MAX_RECORD_BYTES}")
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.max_bytes = max_bytes
        self.max_records = max_records
        self._reset()

    def _reset(self) -> None:
        self._pks: dict[str, int] = {}
        self._ehks: dict[str, int] = {}
        self._entries: list[tuple[int, int | None, bytes]] = []
        self._body_size = 0
        self._outer_pk_size = 0
        self._first: tuple[str, str | None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def size_bytes(self) -> int:
        """Size of the current aggregate as it would be put (data + outer partition key)."""
        return len(MAGIC) + self._body_size + DIGEST_SIZE + self._outer_pk_size

    def _growth(self, pk: str, ehk: str | None, data: bytes, empty: bool = False) -> int:
        """Bytes the protobuf grows by when this record is added (to an empty aggregate if `empty`)."""
        pks, ehks = ({}, {}) if empty else (self._pks, self._ehks)
        grow = 0
        pk_index = pks.get(pk)
        if pk_index is None:
            pk_index = len(pks)
            n = len(pk.encode())
            grow += 1 + _varint_size(n) + n
        inner = 1 + _varint_size(pk_index) + 1 + _varint_size(len(data)) + len(data)
        if ehk is not None:
            ehk_index = ehks.get(ehk)
            if ehk_index is None:
                ehk_index = len(ehks)
                grow += 1 + _varint_size(len(ehk)) + len(ehk)
            inner += 1 + _varint_size(ehk_index)
        return grow + 1 + _varint_size(inner) + inner

    def add(self, partition_key: str, explicit_hash_key: str | None, data: bytes) -> Aggregate | None:
        """Add one user record; returns the previous aggregate if this record closed it, else None.

        A record too large for any aggregate raises ValueError and leaves the pending aggregate intact.
        """
        _check_user_record(partition_key, explicit_hash_key, data)
        data = bytes(data)
        if self.max_bytes is not None:
            alone = (len(MAGIC) + self._growth(partition_key, explicit_hash_key, data, empty=True)
                     + DIGEST_SIZE + len(partition_key.encode()))
            if alone > self.max_bytes:
                raise ValueError(
                    f"user record ({len(data)} bytes of data) does not fit in one aggregate of "
                    f"{self.max_bytes} bytes"
                )
        done = None
        if self._entries:
            full = self.max_records is not None and len(self._entries) >= self.max_records
            if not full and self.max_bytes is not None:
                grown = self.size_bytes() + self._growth(partition_key, explicit_hash_key, data)
                full = grown > self.max_bytes
            if full:
                done = self.flush()
        self._body_size += self._growth(partition_key, explicit_hash_key, data)
        pk_index = self._pks.setdefault(partition_key, len(self._pks))
        ehk_index = None
        if explicit_hash_key is not None:
            ehk_index = self._ehks.setdefault(explicit_hash_key, len(self._ehks))
        if self._first is None:
            self._first = (partition_key, explicit_hash_key)
            self._outer_pk_size = len(partition_key.encode())
        self._entries.append((pk_index, ehk_index, data))
        return done

    def flush(self) -> Aggregate | None:
        if not self._entries:
            return None
        assert self._first is not None
        data = _encode(list(self._pks), list(self._ehks), self._entries)
        done = Aggregate(self._first[0], self._first[1], data, len(self._entries))
        self._reset()
        return done


def aggregate_all(user_records: Iterable[tuple[str, str | None, bytes]], max_bytes: int | None = MAX_RECORD_BYTES,
                  max_records: int | None = None) -> Iterator[Aggregate]:
    """Every user record, packed in order into as few aggregates as the limits allow."""
    agg = Aggregator(max_bytes=max_bytes, max_records=max_records)
    for pk, ehk, data in user_records:
        done = agg.add(pk, ehk, data)
        if done is not None:
            yield done
    last = agg.flush()
    if last is not None:
        yield last
