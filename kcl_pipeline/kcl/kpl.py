"""KPL record aggregation and deaggregation (the Kinesis Producer Library's aggregated record format).

An aggregated Kinesis record is ``MAGIC + AggregatedRecord + MD5(AggregatedRecord)``; the protobuf
schema is ``kpl.proto`` beside this module, and user record *i* of an aggregate has sub-sequence
number *i*. Anything that does not verify (magic present but too short, MD5 mismatch, protobuf that
does not decode, a table index out of range, an aggregate without records) is delivered whole as ONE
plain user record and counted in :class:`KplStats` — never raised, never dropped.

``kpl_pb2.py`` and ``kpl_columns_pb2.py`` are generated and checked in; regenerate both from the
repository root with::

    .venv/bin/python -m grpc_tools.protoc -I. --python_out=. kcl_pipeline/kcl/kpl*.proto

(kcl_pipeline_tests/kcl/test_kpl.py checks the checked-in modules against a fresh generation.) Generated
code refuses a protobuf runtime older than the protoc that generated it (``# Protobuf Python Version``
in its header): pyproject's protobuf lower bound follows it (a test checks that too).

Speed: MD5 (OpenSSL) and the upb parser do the byte work. A second parse with the columnar schema
(kpl_columns.proto) hands over every record's fields as flat lists, so no Python object is made per
protobuf record (see ``_columns`` for when that is provably exact), and UserRecords are built without
the frozen dataclass ``__init__`` (see ``_fast_user_records``). benchmarks/bench_kpl.py measures it
against aws-kinesis-agg.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import count, repeat
from operator import attrgetter
from typing import Any, Iterable, Iterator, Mapping, Sequence

from google.protobuf.message import DecodeError

from kcl_pipeline.kcl import kpl_columns_pb2, kpl_pb2
from kcl_pipeline.kcl.model import STARTING_SENTINELS, Checkpoint, UserRecord

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


# --- building UserRecords fast ------------------------------------------------------------------
#
# UserRecord is a frozen dataclass: its generated __init__ goes through object.__setattr__ once per
# field (~1 µs a record, more than parsing the protobuf). Its instances are plain __dict__ objects,
# so we allocate them with object.__new__ and install a ready dict — the same state __init__ would
# produce (there is no __post_init__ and no default factory). If model.py ever changes shape
# (fields, slots, __post_init__) we fall back to the constructor; a test keeps the fast path honest.

_FIELDS = (
    "shard_id", "sequence_number", "sub_sequence_number", "partition_key", "explicit_hash_key",
    "approximate_arrival_timestamp_ms", "data", "aggregated",
)
_FAST = (
    tuple(f.name for f in dataclasses.fields(UserRecord)) == _FIELDS
    and not hasattr(UserRecord, "__post_init__")
    and not hasattr(UserRecord, "__slots__")
    and "__dict__" in vars(UserRecord)
)
_new = object.__new__
_set_dict = vars(UserRecord)["__dict__"].__set__ if _FAST else None


def _user_record(shard_id: str, seq: str, sub: int, pk: str, ehk: str | None, ms: int, data: bytes,
                 aggregated: bool) -> UserRecord:
    if not _FAST:
        return UserRecord(shard_id, seq, sub, pk, ehk, ms, data, aggregated)
    rec = _new(UserRecord)
    _set_dict(rec, {
        "shard_id": shard_id, "sequence_number": seq, "sub_sequence_number": sub, "partition_key": pk,
        "explicit_hash_key": ehk, "approximate_arrival_timestamp_ms": ms, "data": data,
        "aggregated": aggregated,
    })
    return rec


def _fast_user_records(out: list, shard_id: str, seq: str, ms: int, pks: list, ehks: list | None,
                       datas: list, first_sub: int) -> None:
    """Append UserRecords for one aggregate (pks/ehks/datas aligned, sub-sequence from `first_sub`)."""
    if not _FAST:
        out.extend(
            UserRecord(shard_id, seq, sub, pk, ehk, ms, data, True)
            for sub, pk, ehk, data in zip(count(first_sub), pks, ehks or repeat(None), datas)
        )
        return
    base = {
        "shard_id": shard_id, "sequence_number": seq, "sub_sequence_number": 0, "partition_key": "",
        "explicit_hash_key": None, "approximate_arrival_timestamp_ms": ms, "data": b"", "aggregated": True,
    }
    new, set_dict, cls, copy = _new, _set_dict, UserRecord, base.copy
    objs = list(map(new, repeat(cls, len(datas))))
    if ehks is None:
        for obj, sub, pk, data in zip(objs, count(first_sub), pks, datas):
            d = copy()
            d["sub_sequence_number"] = sub
            d["partition_key"] = pk
            d["data"] = data
            set_dict(obj, d)
    else:
        for obj, sub, pk, ehk, data in zip(objs, count(first_sub), pks, ehks, datas):
            d = copy()
            d["sub_sequence_number"] = sub
            d["partition_key"] = pk
            d["explicit_hash_key"] = ehk
            d["data"] = data
            set_dict(obj, d)
    out.extend(objs)


# --- deaggregation --------------------------------------------------------------------------------

_get_data = attrgetter("data")
_get_pk_index = attrgetter("partition_key_index")
_has_field = kpl_pb2.Record.HasField  # unbound: map() skips a bound-method per record
_AggregatedRecord = kpl_pb2.AggregatedRecord
_Columns = kpl_columns_pb2.AggregatedRecordColumns
_md5 = hashlib.md5
_ONLY_STR = frozenset({str})


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


def _decode_aggregate(data: bytes) -> tuple[list, list | None, list]:
    """(partition keys, explicit hash keys or None, data) per user record; raises _BadAggregate."""
    if len(data) <= len(MAGIC) + DIGEST_SIZE:
        raise _BadAggregate(TOO_SHORT, f"{len(data)} bytes")
    body = data[4:-DIGEST_SIZE]
    if _md5(body).digest() != data[-DIGEST_SIZE:]:
        raise _BadAggregate(MD5_MISMATCH)
    agg = _AggregatedRecord()
    try:
        agg.ParseFromString(body)
    except DecodeError as e:
        raise _BadAggregate(PROTOBUF_DECODE_ERROR, str(e)) from None
    # upb does not enforce proto2 `required` while parsing; the KPL's own readers do.
    if not agg.IsInitialized():
        raise _BadAggregate(MISSING_REQUIRED_FIELD, ", ".join(agg.FindInitializationErrors()))
    n = len(agg.records)
    if not n:
        raise _BadAggregate(NO_USER_RECORDS)
    pk_table = list(agg.partition_key_table)
    ehk_table = list(agg.explicit_hash_key_table)
    # upb hands back bytes (not str) for a proto2 string that is not UTF-8.
    if not _ONLY_STR.issuperset(map(type, pk_table)) or not _ONLY_STR.issuperset(map(type, ehk_table)):
        raise _BadAggregate(INVALID_UTF8_KEY)
    pk_indexes, ehk_indexes, datas = _columns(body, agg, n)
    try:
        pks = list(map(pk_table.__getitem__, pk_indexes))
    except IndexError:
        raise _BadAggregate(PARTITION_KEY_INDEX_OUT_OF_RANGE, f"table has {len(pk_table)}") from None
    ehks: list | None = None
    if ehk_indexes is not None:
        get = ehk_table.__getitem__
        try:
            ehks = [None if i is None else get(i) for i in ehk_indexes]
        except IndexError:
            raise _BadAggregate(EXPLICIT_HASH_KEY_INDEX_OUT_OF_RANGE, f"table has {len(ehk_table)}") from None
    return pks, ehks, datas


def _columns(body: bytes, agg: Any, n: int) -> tuple[Sequence[int], list | None, list]:
    """Per-record partition key index, explicit hash key index (None: no record has one), data.

    Fast path: parse `body` again with the columnar schema (kpl_columns.proto), which yields each field
    of every record as one flat list without a Python object per record. Its lists line up with the
    records only if every record holds exactly one occurrence; `agg` is initialised, so every record
    holds at least one partition key index and one data, and totals equal to the record count prove
    exactly one. Anything irregular (repeated fields, packed or stray encodings) takes the per-record
    path, which reads the fields exactly as kpl.proto defines them (the last occurrence wins).
    """
    cols = _Columns()
    try:
        cols.ParseFromString(body)
    except DecodeError:  # e.g. a stray length-delimited field 1 that kpl.proto kept as unknown
        cols = None
    if cols is not None:
        c = cols.records
        pk_indexes, datas, ehk_count = c.partition_key_index, c.data, len(c.explicit_hash_key_index)
        if len(pk_indexes) == n and len(datas) == n:
            if not ehk_count:
                return pk_indexes, None, list(datas)
            if ehk_count == n and all(map(_has_field, agg.records, repeat("explicit_hash_key_index"))):
                return pk_indexes, list(c.explicit_hash_key_index), list(datas)
    records = list(agg.records)
    has = list(map(_has_field, records, repeat("explicit_hash_key_index")))
    ehk_indexes = None
    if any(has):
        ehk_indexes = [r.explicit_hash_key_index if h else None for r, h in zip(records, has)]
    return list(map(_get_pk_index, records)), ehk_indexes, list(map(_get_data, records))


def _deaggregate_into(out: list, record: Mapping, shard_id: str, stats: KplStats | None,
                      min_sub: int) -> None:
    """Append the user records of one Kinesis record whose sub-sequence is >= min_sub."""
    seq, ms, data, pk = _fields(record)
    added = len(out)
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
            _fast_user_records(out, shard_id, seq, ms, pks, ehks, datas, min_sub)
            if stats is not None:
                stats.kinesis_records += 1
                stats.aggregates += 1
                stats.user_records += len(out) - added
            return
    elif stats is not None:
        stats.plain_records += 1
    if stats is not None:
        stats.kinesis_records += 1
    if min_sub == 0:
        out.append(_user_record(shard_id, seq, 0, pk, record.get("ExplicitHashKey"), ms, data, False))
        if stats is not None:
            stats.user_records += 1


def deaggregate(record: Mapping, shard_id: str, stats: KplStats | None = None) -> list[UserRecord]:
    """The user records of one Kinesis record as boto3 GetRecords returns it.

    An aggregate yields one UserRecord per user record (sub-sequence = index, aggregated=True);
    anything else yields exactly one plain record (sub-sequence 0). Raises ValueError only when
    `record` is not a GetRecords record at all (a missing key or a wrongly typed field).
    """
    out: list[UserRecord] = []
    _deaggregate_into(out, record, shard_id, stats, 0)
    return out


def deaggregate_batch(records: Iterable[Mapping], shard_id: str, after: Checkpoint | None = None,
                      stats: KplStats | None = None) -> list[UserRecord]:
    """Deaggregate a GetRecords batch, dropping user records at or below `after`.

    `after` is the resume point (a checkpoint or the last record landed): reading restarts
    AT_SEQUENCE_NUMBER of a partly processed aggregate, and only its later user records are kept.
    None or a starting sentinel keeps everything; SHARD_END has nothing after it (ValueError).
    """
    out: list[UserRecord] = []
    if after is None or after.sequence_number in STARTING_SENTINELS:
        for record in records:
            _deaggregate_into(out, record, shard_id, stats, 0)
        return out
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
    return out


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
