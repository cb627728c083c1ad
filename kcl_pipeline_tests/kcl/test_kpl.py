"""KPL (de)aggregation: conformance vectors, the aws-kinesis-agg peer, properties, failure paths, resume filter."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, UserRecord
from kcl_pipeline.kcl.records import kpl, kpl_columns_pb2, kpl_pb2, record_batch
from kcl_pipeline.kcl.records.kpl import (
    MAGIC,
    Aggregate,
    Aggregator,
    KplStats,
    aggregate,
    aggregate_all,
    deaggregate,
    deaggregate_batch,
)
from kcl_pipeline.kcl.records.record_batch import UserRecordBatch

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "kcl_pipeline_tests" / "fixtures"
SHARD = "shardId-000000000007"
SEQ = "49545115243490985018280067714973144582180062593244200961"
ARRIVAL = datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)
ARRIVAL_MS = 1714566615123

settings.register_profile("kpl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kpl")


def kinesis_record(data: bytes, seq: str = SEQ, pk: str = "outer-pk", **extra) -> dict:
    """A record as boto3 GetRecords returns it."""
    return {"SequenceNumber": seq, "ApproximateArrivalTimestamp": ARRIVAL, "Data": data, "PartitionKey": pk,
            **extra}


def users_of(records: list[UserRecord]) -> list[tuple[str, str | None, bytes]]:
    return [(r.partition_key, r.explicit_hash_key, r.data) for r in records]


def wrap(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


def utc_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)


def assert_batch_agrees(batch: UserRecordBatch, records: list[UserRecord]) -> None:
    """The columnar batch holds exactly `records`: by index, by iteration, column by column, through Arrow."""
    assert isinstance(batch, UserRecordBatch) and len(batch) == len(records)
    assert [batch[i] for i in range(len(batch))] == records  # built one at a time, before any iteration
    assert [batch[i - len(batch)] for i in range(len(batch))] == records
    assert list(batch) == records and batch == records and list(reversed(batch)) == records[::-1]
    assert list(batch.partition_keys) == [r.partition_key for r in records]
    assert list(batch.explicit_hash_keys) == [r.explicit_hash_key for r in records]
    assert batch.has_explicit_hash_keys == any(r.explicit_hash_key is not None for r in records)
    assert list(batch.data) == [r.data for r in records]
    assert batch.sequence_numbers == [r.sequence_number for r in records]
    assert batch.sub_sequence_numbers == [r.sub_sequence_number for r in records]
    assert batch.arrival_ms == [r.approximate_arrival_timestamp_ms for r in records]
    assert batch.aggregated == [r.aggregated for r in records]
    assert all(n >= 1 for n in batch.run_lengths) and sum(batch.run_lengths) == len(records)
    assert batch.last == (records[-1].checkpoint if records else None)
    assert all(r.shard_id == batch.shard_id for r in records)
    table = batch.to_arrow("a-stream")
    assert table.schema == record_batch.arrow_schema()
    assert table.to_pylist() == [{
        "stream": "a-stream", "shard_id": r.shard_id, "sequence_number": r.sequence_number,
        "sub_sequence_number": r.sub_sequence_number, "partition_key": r.partition_key,
        "explicit_hash_key": r.explicit_hash_key,
        "approximate_arrival_timestamp": utc_ms(r.approximate_arrival_timestamp_ms), "data": r.data,
    } for r in records]


# -- a plain reading of the format, record by record: the oracle for the fast path ----------------------
def reference(data: bytes) -> list[tuple[str, str | None, bytes]] | None:
    """User records of a valid aggregate, None when `data` is not one (read field by field)."""
    if data[:4] != MAGIC or len(data) <= 20:
        return None
    body = data[4:-16]
    if hashlib.md5(body).digest() != data[-16:]:
        return None
    agg = kpl_pb2.AggregatedRecord()
    try:
        agg.ParseFromString(body)
    except Exception:
        return None
    if not agg.IsInitialized() or len(agg.records) == 0:
        return None
    pks, ehks = list(agg.partition_key_table), list(agg.explicit_hash_key_table)
    if not all(isinstance(k, str) for k in pks + ehks):
        return None
    out = []
    for r in agg.records:
        if r.partition_key_index >= len(pks):
            return None
        ehk = None
        if r.HasField("explicit_hash_key_index"):
            if r.explicit_hash_key_index >= len(ehks):
                return None
            ehk = ehks[r.explicit_hash_key_index]
        out.append((pks[r.partition_key_index], ehk, r.data))
    return out


def check_delivery(data: bytes, stats: KplStats | None = None) -> list[UserRecord]:
    """Deaggregate `data` and check it against the oracle: the records it holds, or itself as one plain record."""
    out = deaggregate(kinesis_record(data), SHARD, stats)
    assert_batch_agrees(deaggregate_batch([kinesis_record(data)], SHARD), out)
    expected = reference(data)
    if expected is None:
        assert len(out) == 1
        plain = out[0]
        assert (plain.data, plain.sub_sequence_number, plain.aggregated) == (data, 0, False)
        assert (plain.partition_key, plain.sequence_number, plain.shard_id) == ("outer-pk", SEQ, SHARD)
    else:
        assert users_of(out) == expected
        assert [r.sub_sequence_number for r in out] == list(range(len(expected)))
        assert all(r.aggregated and r.sequence_number == SEQ for r in out)
    return out


# -- wire helpers, for encodings the KPL never writes but the format allows or forbids ------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def field_bytes(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def record_bytes(*fields: bytes) -> bytes:
    return field_bytes(3, b"".join(fields))


# -- conformance: KPL-written records ---------------------------------------------------------------------
def test_sample_lambda_event_holds_100_user_records():
    event = json.loads((FIXTURES / "SampleLambdaEvent.json").read_text())["Records"][0]["kinesis"]
    data = base64.b64decode(event["data"])
    assert data[:4] == MAGIC
    assert hashlib.md5(data[4:-16]).digest() == data[-16:]
    arrival = datetime.fromtimestamp(event["approximateArrivalTimestamp"], timezone.utc)
    stats = KplStats()
    out = deaggregate({"SequenceNumber": event["sequenceNumber"], "ApproximateArrivalTimestamp": arrival,
                       "Data": data, "PartitionKey": event["partitionKey"]}, "shardId-000000000000", stats)
    assert len(out) == 100
    alphabet = b"abcdefghijklmnopqrstuvwxyz"
    assert [r.data for r in out] == [alphabet if i % 2 == 0 else alphabet[::-1] for i in range(100)]
    assert {r.partition_key for r in out} == {"abc"}
    assert {r.explicit_hash_key for r in out} == {"191415658344158766168031473277922803570"}
    assert [r.sub_sequence_number for r in out] == list(range(100))
    assert all(r.aggregated and r.sequence_number == event["sequenceNumber"] for r in out)
    assert {r.approximate_arrival_timestamp_ms for r in out} == {1428537600000}
    assert (stats.kinesis_records, stats.aggregates, stats.user_records, stats.bad_aggregates) == (1, 1, 100, 0)
    assert_batch_agrees(deaggregate_batch([{"SequenceNumber": event["sequenceNumber"], "ApproximateArrivalTimestamp":
                                            arrival, "Data": data, "PartitionKey": event["partitionKey"]}],
                                          "shardId-000000000000"), out)


VECTORS = json.loads((FIXTURES / "aws_kinesis_agg_vectors.json").read_text())["vectors"]


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_aws_kinesis_agg_vectors(name):
    vector = VECTORS[name]
    record = kinesis_record(base64.b64decode(vector["data_base64"]), seq=vector["outer_sequence_number"],
                            pk=vector["outer_partition_key"])
    stats = KplStats()
    out = deaggregate(record, SHARD, stats)
    expected = [(u["sub_sequence_number"], u["partition_key"], u.get("explicit_hash_key"), u["data_utf8"].encode())
                for u in vector["user_records"]]
    assert [(r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data) for r in out] == expected
    assert all(r.aggregated is vector["aggregated"] for r in out)
    assert all(r.sequence_number == vector["outer_sequence_number"] for r in out)
    assert stats.aggregates == (1 if vector["aggregated"] else 0)
    assert stats.plain_records == (0 if vector["aggregated"] else 1)
    assert_batch_agrees(deaggregate_batch([record], SHARD), out)
    if vector["aggregated"]:
        assert sorted({r.partition_key for r in out}) == sorted(vector["partition_key_table"])


# -- the peer: aws-kinesis-agg 1.2.3 ----------------------------------------------------------------------
try:  # a dev dependency; it imports six without declaring it
    from aws_kinesis_agg.aggregator import RecordAggregator
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records
except ImportError:
    RecordAggregator = iter_deaggregate_records = None
needs_peer = pytest.mark.skipif(RecordAggregator is None, reason="aws-kinesis-agg (or six) is not installed")

partition_keys = st.text(min_size=1, max_size=24)
hash_keys = st.integers(0, 2**128 - 1).map(str)
payloads = st.binary(max_size=300)
# The peer resolves a record without an explicit hash key to table[0] when the table is non-empty, so
# interop cases use explicit hash keys on every record or on none.
uniform_users = st.one_of(
    st.lists(st.tuples(partition_keys, st.none(), payloads), min_size=1, max_size=40),
    st.lists(st.tuples(partition_keys, hash_keys, payloads), min_size=1, max_size=40),
)


@needs_peer
@given(uniform_users)
def test_peer_aggregates_deaggregate_with_ours(users):
    peer = RecordAggregator()
    for pk, ehk, data in users:
        assert peer.add_user_record(pk, data, ehk) is None  # small: never full
    _, _, blob = peer.clear_and_get().get_contents()
    out = deaggregate(kinesis_record(blob), SHARD)
    assert users_of(out) == users
    assert [r.sub_sequence_number for r in out] == list(range(len(users)))
    assert_batch_agrees(deaggregate_batch([kinesis_record(blob)], SHARD), out)


@needs_peer
@given(uniform_users)
def test_our_aggregates_deaggregate_with_the_peer(users):
    record = kinesis_record(aggregate(users), pk=users[0][0])
    theirs = [r["kinesis"] for r in iter_deaggregate_records([record], data_format="Boto3")]
    assert [(k["partitionKey"], k["explicitHashKey"], base64.b64decode(k["data"])) for k in theirs] == users
    assert [k["subSequenceNumber"] for k in theirs] == list(range(len(users)))


# -- properties --------------------------------------------------------------------------------------------
users_strategy = st.lists(st.tuples(partition_keys, st.none() | hash_keys, payloads), min_size=1, max_size=60)


@given(users_strategy)
def test_every_aggregate_round_trips(users):
    out = deaggregate(kinesis_record(aggregate(users)), SHARD)
    assert users_of(out) == users
    assert_batch_agrees(deaggregate_batch([kinesis_record(aggregate(users))], SHARD), out)
    assert [r.sub_sequence_number for r in out] == list(range(len(users)))
    assert all(r.aggregated for r in out)


@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data):
    stats = KplStats()
    check_delivery(data, stats)
    assert stats.kinesis_records == 1


@given(st.binary(max_size=400))
def test_arbitrary_bytes_behind_magic_never_raise(body):
    check_delivery(MAGIC + body)


@given(st.binary(max_size=400))
def test_arbitrary_protobuf_with_valid_digest_never_raises(body):
    """MAGIC and MD5 right, protobuf arbitrary: exercises the parser and the table checks."""
    check_delivery(wrap(body))


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=20), st.just(0)),
)


@given(users_strategy, mutations)
def test_mutated_aggregates_never_raise_nor_lose_the_record(users, mutation):
    data = aggregate(users)
    kind, arg, bit = mutation
    if kind == "flip":
        i = arg % len(data)
        mutated = data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1:]
    elif kind == "truncate":
        mutated = data[: arg % len(data)]
    else:
        mutated = data + arg
    out = check_delivery(mutated)
    assert reference(mutated) is None  # MD5 (or the magic) catches every one of these
    assert len(out) == 1 and out[0].data == mutated


@given(st.lists(st.tuples(st.booleans(), hash_keys, payloads), min_size=1, max_size=30))
def test_mixed_explicit_hash_keys_round_trip(spec):
    users = [(f"pk{i % 3}", ehk if has else None, data) for i, (has, ehk, data) in enumerate(spec)]
    out = deaggregate(kinesis_record(aggregate(users)), SHARD)
    assert users_of(out) == users
    assert_batch_agrees(deaggregate_batch([kinesis_record(aggregate(users))], SHARD), out)


# -- irregular but valid encodings take the per-record path and read as the format says ---------------------
IRREGULAR = {
    "repeated partition key index: the last wins": [
        record_bytes(field_varint(1, 1), field_varint(1, 0), field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "repeated data: the last wins": [
        record_bytes(field_varint(1, 0), field_bytes(3, b"x"), field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "packed field 1 is unknown to kpl.proto, the varint one counts": [
        record_bytes(field_bytes(1, varint(1)), field_varint(1, 0), field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "explicit hash key index twice in one record, none in the other": [
        record_bytes(field_varint(1, 0), field_varint(2, 1), field_varint(2, 0), field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "packed explicit hash key indexes in one record, none in the other": [
        record_bytes(field_varint(1, 0), field_bytes(2, varint(1) + varint(0)), field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "an explicit hash key index with a non-minimal varint": [
        record_bytes(field_varint(1, 0), varint(2 << 3) + b"\x81\x00", field_bytes(3, b"a")),
        record_bytes(field_varint(1, 1), field_varint(2, 0), field_bytes(3, b"b")),
    ],
    "an unknown field beside explicit hash key indexes": [
        record_bytes(field_varint(1, 0), field_varint(2, 1), field_bytes(3, b"a"), field_varint(9, 7)),
        record_bytes(field_varint(1, 1), field_varint(2, 0), field_bytes(3, b"b")),
    ],
    "tags are ignored": [
        record_bytes(field_varint(1, 0), field_bytes(3, b"a"),
                     field_bytes(4, field_bytes(1, b"k") + field_bytes(2, b"v"))),
        record_bytes(field_varint(1, 1), field_bytes(3, b"b")),
    ],
    "fields out of order": [
        record_bytes(field_bytes(3, b"a"), field_varint(2, 0), field_varint(1, 0)),
        record_bytes(field_bytes(3, b"b"), field_varint(1, 1), field_varint(2, 1)),
    ],
}


@pytest.mark.parametrize("case", sorted(IRREGULAR))
def test_irregular_encodings_match_the_field_by_field_reading(case):
    tables = field_bytes(1, b"pk0") + field_bytes(1, b"pk1") + field_bytes(2, b"10") + field_bytes(2, b"20")
    data = wrap(tables + b"".join(IRREGULAR[case]))
    assert reference(data) is not None
    out = check_delivery(data)
    assert [r.data for r in out] == [b"a", b"b"]


def test_a_record_without_data_is_a_bad_aggregate_even_if_totals_match():
    # Three data fields over two records: the totals cannot prove one each, and kpl.proto says record 2 lacks data.
    body = field_bytes(1, b"pk") + record_bytes(field_varint(1, 0), field_bytes(3, b"a"), field_bytes(3, b"b")) \
        + record_bytes(field_varint(1, 0))
    stats = KplStats()
    out = check_delivery(wrap(body), stats)
    assert len(out) == 1 and stats.bad_reasons == Counter({kpl.MISSING_REQUIRED_FIELD: 1})


def test_columnar_schema_mirrors_the_format():
    """kpl_columns.proto must keep kpl.proto's field numbers and wire types."""
    def numbers(descriptor):
        return {f.name: (f.number, f.type) for f in descriptor.fields}

    agg, cols = kpl_pb2.AggregatedRecord.DESCRIPTOR, kpl_columns_pb2.AggregatedRecordColumns.DESCRIPTOR
    assert {n: num for n, (num, _) in numbers(agg).items()} == {n: num for n, (num, _) in numbers(cols).items()}
    rec, rcols = numbers(kpl_pb2.Record.DESCRIPTOR), numbers(kpl_columns_pb2.RecordColumns.DESCRIPTOR)
    assert {k: rec[k] for k in rcols} == rcols
    assert set(rec) - set(rcols) == {"tags"}


def test_keyed_schema_is_the_format_with_explicit_hash_keys_required():
    def shape(descriptor):
        return {f.name: (f.number, f.type, f.is_required, f.is_repeated) for f in descriptor.fields}

    keyed, plain = kpl_columns_pb2, kpl_pb2
    assert shape(keyed.KeyedAggregatedRecord.DESCRIPTOR) == shape(plain.AggregatedRecord.DESCRIPTOR)
    assert shape(keyed.KeyedTag.DESCRIPTOR) == shape(plain.Tag.DESCRIPTOR)
    record = shape(plain.Record.DESCRIPTOR)
    number, kind, _, repeated = record["explicit_hash_key_index"]
    record["explicit_hash_key_index"] = (number, kind, True, repeated)
    assert shape(keyed.KeyedRecord.DESCRIPTOR) == record


# -- every failure path: one plain record, counted ---------------------------------------------------------
def _good_body() -> bytes:
    return aggregate([("pk", None, b"a"), ("pk", None, b"b")])[4:-16]


BAD = {
    kpl.TOO_SHORT: MAGIC + b"0123456789abcdef",
    kpl.MD5_MISMATCH: MAGIC + _good_body() + b"\x00" * 16,
    kpl.PROTOBUF_DECODE_ERROR: wrap(b"\x0a\x7fshort"),
    kpl.MISSING_REQUIRED_FIELD: wrap(field_bytes(1, b"pk") + record_bytes(field_varint(1, 0))),
    kpl.NO_USER_RECORDS: wrap(field_bytes(1, b"pk") + field_bytes(1, b"pk2")),
    kpl.INVALID_UTF8_KEY: wrap(field_bytes(1, b"\xff\xfe") + record_bytes(field_varint(1, 0), field_bytes(3, b"a"))),
    kpl.PARTITION_KEY_INDEX_OUT_OF_RANGE:
        wrap(field_bytes(1, b"pk") + record_bytes(field_varint(1, 1), field_bytes(3, b"a"))),
    kpl.EXPLICIT_HASH_KEY_INDEX_OUT_OF_RANGE:
        wrap(field_bytes(1, b"pk") + record_bytes(field_varint(1, 0), field_varint(2, 0), field_bytes(3, b"a"))),
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_bad_aggregates_are_delivered_whole_as_one_plain_record(reason, caplog):
    data = BAD[reason]
    stats = KplStats()
    out = deaggregate(kinesis_record(data, ExplicitHashKey="12345"), SHARD, stats)
    assert out == [UserRecord(SHARD, SEQ, 0, "outer-pk", "12345", ARRIVAL_MS, data, False)]
    assert stats.bad_aggregates == 1 and stats.bad_reasons == Counter({reason: 1})
    assert (stats.kinesis_records, stats.user_records, stats.aggregates, stats.plain_records) == (1, 1, 0, 0)
    assert stats.as_metrics()[f"kpl_bad_aggregates_{reason}"] == 1
    assert reason in caplog.text and SEQ in caplog.text


def test_bad_explicit_hash_key_index_among_valid_ones():
    body = field_bytes(1, b"pk") + field_bytes(2, b"5") \
        + record_bytes(field_varint(1, 0), field_varint(2, 0), field_bytes(3, b"a")) \
        + record_bytes(field_varint(1, 0), field_varint(2, 3), field_bytes(3, b"b"))
    stats = KplStats()
    assert len(check_delivery(wrap(body), stats)) == 1
    assert stats.bad_reasons == Counter({kpl.EXPLICIT_HASH_KEY_INDEX_OUT_OF_RANGE: 1})


def test_plain_record_keeps_its_own_keys():
    stats = KplStats()
    out = deaggregate(kinesis_record(b'{"id": 1}', ExplicitHashKey="42"), SHARD, stats)
    assert out == [UserRecord(SHARD, SEQ, 0, "outer-pk", "42", ARRIVAL_MS, b'{"id": 1}', False)]
    assert (stats.plain_records, stats.bad_aggregates, stats.user_records) == (1, 0, 1)


@pytest.mark.parametrize("record, message", [
    ({"ApproximateArrivalTimestamp": ARRIVAL, "Data": b"x", "PartitionKey": "p"}, "missing SequenceNumber"),
    ({"SequenceNumber": SEQ, "ApproximateArrivalTimestamp": ARRIVAL, "PartitionKey": "p"}, "missing Data"),
    ({"SequenceNumber": 12, "ApproximateArrivalTimestamp": ARRIVAL, "Data": b"x", "PartitionKey": "p"},
     "SequenceNumber must be a string"),
    ({"SequenceNumber": SEQ, "ApproximateArrivalTimestamp": ARRIVAL, "Data": "x", "PartitionKey": "p"},
     "Data must be bytes"),
    ({"SequenceNumber": SEQ, "ApproximateArrivalTimestamp": "yesterday", "Data": b"x", "PartitionKey": "p"},
     "ApproximateArrivalTimestamp must be"),
])
def test_a_mapping_that_is_not_a_getrecords_record_is_a_clear_error(record, message):
    with pytest.raises(ValueError, match=message):
        deaggregate(record, SHARD)


@pytest.mark.parametrize("value, millis", [
    (ARRIVAL, ARRIVAL_MS),
    (datetime(2015, 4, 9, 0, 0, 0, 123000, tzinfo=timezone.utc), 1428537600123),  # float maths would say ...122
    (datetime(2015, 4, 9, 2, 0, 0, 123000, tzinfo=timezone(timedelta(hours=2))), 1428537600123),
    (datetime(2015, 4, 9, 0, 0, 0, 123000), 1428537600123),  # naive: UTC
    (1428537600.123, 1428537600123),
    (1428537600, 1428537600000),
])
def test_arrival_millis(value, millis):
    assert kpl.arrival_millis(value) == millis


# -- stats ---------------------------------------------------------------------------------------------
def test_stats_count_a_batch_and_reset_per_period():
    records = [kinesis_record(aggregate([("a", None, b"1"), ("b", None, b"2")]), seq="10"),
               kinesis_record(b"plain", seq="11"), kinesis_record(BAD[kpl.MD5_MISMATCH], seq="12")]
    stats = KplStats()
    assert len(deaggregate_batch(records, SHARD, None, stats)) == 4
    assert stats.as_metrics() == {
        "kpl_kinesis_records": 3, "kpl_user_records": 4, "kpl_aggregates": 1, "kpl_plain_records": 1,
        "kpl_bad_aggregates": 1, "kpl_bad_aggregates_md5_mismatch": 1,
    }
    total = KplStats()
    total.add(stats)
    period = stats.take()
    assert period == total and period.bad_reasons == Counter({kpl.MD5_MISMATCH: 1})
    assert stats == KplStats()
    period.bad_reasons[kpl.TOO_SHORT] += 1  # the snapshot does not share state with the live counters
    assert not stats.bad_reasons


def test_no_stats_is_fine():
    assert len(deaggregate_batch([kinesis_record(BAD[kpl.TOO_SHORT])], SHARD)) == 1


# -- the resume filter: drop user records at or below `after` ---------------------------------------------
AGG_4 = aggregate([(f"pk{i}", None, f"u{i}".encode()) for i in range(4)])
BATCH = [kinesis_record(b"p99", seq="99"), kinesis_record(AGG_4, seq="100"), kinesis_record(b"p101", seq="101")]


@pytest.mark.parametrize("after, expected", [
    (None, [("99", 0), ("100", 0), ("100", 1), ("100", 2), ("100", 3), ("101", 0)]),
    (Checkpoint(TRIM_HORIZON), [("99", 0), ("100", 0), ("100", 1), ("100", 2), ("100", 3), ("101", 0)]),
    (Checkpoint("99"), [("100", 0), ("100", 1), ("100", 2), ("100", 3), ("101", 0)]),
    (Checkpoint("100", 0), [("100", 1), ("100", 2), ("100", 3), ("101", 0)]),
    (Checkpoint("100", 1), [("100", 2), ("100", 3), ("101", 0)]),
    (Checkpoint("100", 3), [("101", 0)]),
    (Checkpoint("100", 9), [("101", 0)]),
    (Checkpoint("101"), []),
    (Checkpoint("1000"), []),  # longer is larger: "1000" > "101" although "1000" < "101" as text
    (Checkpoint("9"), [("99", 0), ("100", 0), ("100", 1), ("100", 2), ("100", 3), ("101", 0)]),
])
def test_after_filter(after, expected):
    stats = KplStats()
    out = deaggregate_batch(BATCH, SHARD, after, stats)
    assert [(r.sequence_number, r.sub_sequence_number) for r in out] == expected
    assert deaggregate_batch(BATCH, SHARD).slice_after(after) == out
    assert stats.user_records == len(expected)
    by_position = {(r.sequence_number, r.sub_sequence_number): r.data for r in deaggregate_batch(BATCH, SHARD)}
    assert [r.data for r in out] == [by_position[p] for p in expected]


def test_after_filter_on_a_bad_aggregate_at_the_resume_point():
    batch = [kinesis_record(BAD[kpl.MD5_MISMATCH], seq="100"), kinesis_record(b"next", seq="101")]
    assert [r.data for r in deaggregate_batch(batch, SHARD, Checkpoint("100", 0))] == [b"next"]


def test_nothing_follows_shard_end():
    with pytest.raises(ValueError, match="SHARD_END"):
        deaggregate_batch(BATCH, SHARD, Checkpoint(SHARD_END))
    with pytest.raises(ValueError, match="SHARD_END"):
        deaggregate_batch(BATCH, SHARD).slice_after(Checkpoint(SHARD_END))


# -- building UserRecords without the dataclass __init__ ----------------------------------------------------
def test_fast_construction_is_active_and_equal_to_the_constructor(monkeypatch):
    assert record_batch._FAST, "model.UserRecord changed shape: review record_batch._user_records"
    users = [("a", None, b"1"), ("b", "7", b"2"), ("a", None, b"3")]
    records = [kinesis_record(aggregate(users)), kinesis_record(b"plain", seq="9" * 57)]
    fast = list(deaggregate_batch(records, SHARD))  # UserRecords are built when the batch is iterated
    monkeypatch.setattr(record_batch, "_FAST", False)
    slow = list(deaggregate_batch(records, SHARD))
    assert fast == slow
    assert [hash(r) for r in fast] == [hash(r) for r in slow]
    assert all(type(r) is UserRecord for r in fast)
    assert [vars(r) for r in fast] == [vars(r) for r in slow]
    with pytest.raises(AttributeError):
        fast[0].data = b"frozen"  # still frozen
    assert fast[1].checkpoint == Checkpoint(SEQ, 1)


# -- aggregation ----------------------------------------------------------------------------------------------
@given(users_strategy, st.integers(200, 4000), st.none() | st.integers(1, 7))
def test_aggregator_splits_under_the_limits_and_keeps_order(users, max_bytes, max_records):
    assume(all(len(d) + 2 * len(pk.encode()) + 100 < max_bytes for pk, _, d in users))
    aggregates = list(aggregate_all(users, max_bytes=max_bytes, max_records=max_records))
    back = []
    for agg in aggregates:
        assert len(agg.data) + len(agg.partition_key.encode()) <= max_bytes
        assert max_records is None or agg.user_records <= max_records
        inner = users_of(deaggregate(kinesis_record(agg.data), SHARD))
        assert (agg.partition_key, agg.explicit_hash_key) == inner[0][:2]
        assert agg.user_records == len(inner)
        back += inner
    assert back == users


@given(users_strategy)
def test_aggregator_size_is_exact(users):
    agg = Aggregator(max_bytes=None)
    for user in users:
        agg.add(*user)
    expected = agg.size_bytes()
    done = agg.flush()
    assert expected == len(done.data) + len(done.partition_key.encode())
    assert len(agg) == 0 and agg.flush() is None


def test_aggregator_fills_to_the_kinesis_limit():
    users = [(f"pk-{i:05d}", None, b"x" * 1000) for i in range(2500)]
    agg, pending, full = Aggregator(), [], []
    for user in users:
        done = agg.add(*user)
        if done is not None:
            full.append(done)
            # it was full: with the record that did not fit it would exceed the limit
            assert len(aggregate(pending + [user])) + len(done.partition_key) > kpl.MAX_RECORD_BYTES
            assert done.user_records == len(pending)
            pending = []
        pending.append(user)
    full.append(agg.flush())
    assert len(full) == 3 and sum(a.user_records for a in full) == 2500
    assert all(len(a.data) + len(a.partition_key) <= kpl.MAX_RECORD_BYTES for a in full)


def test_aggregator_returns_the_full_aggregate_when_max_records_is_reached():
    agg = Aggregator(max_records=2)
    assert agg.add("a", None, b"1") is None
    assert agg.add("b", None, b"2") is None
    done = agg.add("c", None, b"3")
    assert isinstance(done, Aggregate) and (done.partition_key, done.user_records) == ("a", 2)
    assert agg.flush().partition_key == "c"


@pytest.mark.parametrize("kwargs, message", [
    ({"max_bytes": kpl.MAX_RECORD_BYTES + 1}, "exceeds the Kinesis record limit"),
    ({"max_records": 0}, "max_records must be >= 1"),
])
def test_aggregator_limits_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Aggregator(**kwargs)


@pytest.mark.parametrize("user, message", [
    (("", None, b"x"), "partition key must be 1..256"),
    (("p" * 257, None, b"x"), "partition key must be 1..256"),
    ((b"pk", None, b"x"), "partition key must be"),
    (("pk", "12a", b"x"), "explicit hash key must be a decimal"),
    (("pk", str(2**128), b"x"), "explicit hash key must be a decimal"),
    (("pk", "١٢", b"x"), "explicit hash key must be a decimal"),  # Unicode digits are not ASCII
    (("pk", None, "text"), "data must be bytes"),
])
def test_bad_user_records_are_refused(user, message):
    with pytest.raises(ValueError, match=message):
        Aggregator().add(*user)


def test_a_user_record_that_cannot_fit_is_refused_and_the_pending_aggregate_kept():
    agg = Aggregator(max_bytes=200)
    assert agg.add("a", None, b"1") is None
    with pytest.raises(ValueError, match="does not fit in one aggregate of 200 bytes"):
        agg.add("b", None, b"x" * 500)
    assert users_of(deaggregate(kinesis_record(agg.flush().data), SHARD)) == [("a", None, b"1")]


def test_aggregate_needs_records():
    with pytest.raises(ValueError, match="at least one user record"):
        aggregate([])


# -- the generated modules -------------------------------------------------------------------------------
PROTOS = ["kcl_pipeline/kcl/records/kpl.proto", "kcl_pipeline/kcl/records/kpl_columns.proto"]


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_checked_in_modules_match_the_protos(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO}", f"--python_out={tmp_path}",
                    *(str(REPO / p) for p in PROTOS)], check=True, capture_output=True)
    for proto in PROTOS:
        module = proto.replace(".proto", "_pb2.py")
        assert (tmp_path / module).read_text() == (REPO / module).read_text(), (
            f"{module} is stale: regenerate it (see the kcl_pipeline/kcl/records/kpl.py docstring)")


def test_declared_protobuf_range_admits_the_generated_modules():
    """Generated code refuses a runtime older than its protoc: pyproject's lower bound must not be older."""
    def version(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split("."))

    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [p for p in pins if re.match(r"protobuf\b", p)]
    lower = version(re.search(r">=\s*([\d.]+)", pin).group(1))
    for proto in PROTOS:
        header = (REPO / proto.replace(".proto", "_pb2.py")).read_text()
        gencode = version(re.search(r"# Protobuf Python Version: ([\d.]+)", header).group(1))
        assert lower >= gencode, f"pyproject allows protobuf {lower}, {proto} needs >= {gencode}"


# -- the columnar batch against the per-record path, on whole GetRecords batches ----------------------------
def _kinesis_batch(draw) -> list[dict]:
    """GetRecords-shaped records in shard order: aggregates, plain records (some with explicit hash keys)
    and bad aggregates, with sequence numbers that sometimes grow a digit."""
    seq = draw(st.integers(1, 10**6))
    out = []
    for kind in draw(st.lists(st.sampled_from(["aggregate", "plain", "bad"]), max_size=8)):
        seq += draw(st.integers(1, 10**6))
        arrival = ARRIVAL + timedelta(milliseconds=draw(st.integers(0, 10**7)))
        if kind == "aggregate":
            data = aggregate(draw(users_strategy))
            extra = {}
        elif kind == "plain":
            data = draw(payloads)
            extra = draw(st.sampled_from([{}, {"ExplicitHashKey": "12345"}]))
        else:
            data = BAD[draw(st.sampled_from(sorted(BAD)))]
            extra = {}
        out.append({"SequenceNumber": str(seq), "ApproximateArrivalTimestamp": arrival, "Data": data,
                    "PartitionKey": "outer-pk", **extra})
    return out


kinesis_batches = st.composite(_kinesis_batch)()


def per_record(records: list[dict]) -> list[UserRecord]:
    return [u for r in records for u in deaggregate(r, SHARD)]


def resume_points(records: list[UserRecord]):
    """Checkpoints to resume after: sentinels, every record's position, and positions between records."""
    positions = [Checkpoint(r.sequence_number, r.sub_sequence_number) for r in records]
    between = [Checkpoint(r.sequence_number, r.sub_sequence_number + 7) for r in records]
    return st.sampled_from([None, Checkpoint(TRIM_HORIZON), Checkpoint(LATEST), Checkpoint(AT_TIMESTAMP, 5),
                            Checkpoint("1"), Checkpoint("9" * 60), *positions, *between])


@given(kinesis_batches, st.data())
def test_the_batch_equals_the_per_record_path(records, data):
    stats, expected_stats = KplStats(), KplStats()
    batch = deaggregate_batch(records, SHARD, None, stats)
    expected = [u for r in records for u in deaggregate(r, SHARD, expected_stats)]
    assert_batch_agrees(batch, expected)
    assert stats == expected_stats
    assert batch.run_sequence_numbers == [r["SequenceNumber"] for r in records]  # one run per Kinesis record
    after = data.draw(resume_points(expected))
    kept = expected if after is None or after.is_starting_sentinel else [
        r for r in expected if r.position() > after.key()]
    assert_batch_agrees(deaggregate_batch(records, SHARD, after), kept)
    assert_batch_agrees(batch.slice_after(after), kept)


@given(kinesis_batches, st.data())
def test_slicing_and_concatenating_a_batch(records, data):
    batch = deaggregate_batch(records, SHARD)
    expected = per_record(records)
    n = len(expected)
    i = data.draw(st.integers(-n - 2, n + 2))
    j = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
    assert_batch_agrees(batch[i:j:step], expected[i:j:step])
    cut = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    parts = [batch[a:b] for a, b in zip([0, *cut], [*cut, n], strict=True)]
    assert_batch_agrees(UserRecordBatch.concat(parts), expected)
    assert_batch_agrees(UserRecordBatch.from_records(SHARD, expected), expected)
    assert UserRecordBatch.from_records(SHARD, expected) == batch
