"""UserRecordBatch: the columnar Sequence[UserRecord] deaggregate_batch returns (construction, access, errors, Arrow).

Its agreement with the per-record path on every vector and property is tested in test_kpl.py.
"""
from __future__ import annotations

import pickle
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from kcl_pipeline.kcl.core.model import SHARD_END, TRIM_HORIZON, Checkpoint, UserRecord
from kcl_pipeline.kcl.records.kpl import aggregate, deaggregate_batch
from kcl_pipeline.kcl.records.record_batch import UserRecordBatch, arrow_schema

SHARD = "shardId-000000000001"
ARRIVAL = datetime(2024, 5, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)
ARRIVAL_MS = 1714566615123


def kinesis_record(data: bytes, seq: str, **extra) -> dict:
    return {"SequenceNumber": seq, "ApproximateArrivalTimestamp": ARRIVAL, "Data": data, "PartitionKey": "outer",
            **extra}


AGG = aggregate([("a", None, b"0"), ("b", "99", b"1"), ("a", None, b"2")])
RECORDS = [kinesis_record(b"plain", "10", ExplicitHashKey="7"), kinesis_record(AGG, "11"),
           kinesis_record(b"last", "12")]


def make_batch() -> UserRecordBatch:
    return deaggregate_batch(RECORDS, SHARD)


def test_columns_and_runs():
    batch = make_batch()
    assert len(batch) == 5
    assert list(batch.run_sequence_numbers) == ["10", "11", "12"]
    assert list(batch.run_lengths) == [1, 3, 1]
    assert list(batch.run_first_sub_sequence_numbers) == [0, 0, 0]
    assert list(batch.run_aggregated) == [False, True, False]
    assert list(batch.run_arrival_ms) == [ARRIVAL_MS] * 3
    assert list(batch.partition_keys) == ["outer", "a", "b", "a", "outer"]
    assert list(batch.explicit_hash_keys) == ["7", None, "99", None, None]
    assert list(batch.data) == [b"plain", b"0", b"1", b"2", b"last"]
    assert batch.sequence_numbers == ["10", "11", "11", "11", "12"]
    assert batch.sub_sequence_numbers == [0, 0, 1, 2, 0]
    assert batch.last == Checkpoint("12", 0)
    assert batch[2] == UserRecord(SHARD, "11", 1, "b", "99", ARRIVAL_MS, b"1", True)


def test_a_batch_without_explicit_hash_keys_holds_none_for_each():
    batch = deaggregate_batch([kinesis_record(aggregate([("a", None, b"0"), ("b", None, b"1")]), "5")], SHARD)
    assert not batch.has_explicit_hash_keys and list(batch.explicit_hash_keys) == [None, None]
    assert batch.to_arrow("s").column("explicit_hash_key").to_pylist() == [None, None]


def test_resume_inside_an_aggregate_starts_the_run_at_the_next_sub_sequence():
    batch = deaggregate_batch(RECORDS, SHARD, Checkpoint("11", 0))
    assert list(batch.run_first_sub_sequence_numbers) == [1, 0]
    assert batch.sub_sequence_numbers == [1, 2, 0]
    assert batch.to_arrow("s").column("sub_sequence_number").to_pylist() == [1, 2, 0]
    assert make_batch().slice_after(Checkpoint("11", 0)) == batch


def test_slice_after_keeps_the_batch_itself_when_nothing_is_dropped():
    batch = make_batch()
    assert batch.slice_after(None) is batch
    assert batch.slice_after(Checkpoint(TRIM_HORIZON)) is batch
    assert batch.slice_after(Checkpoint("9", 5)) is batch
    assert batch.slice_after(Checkpoint("12")) == [] and batch.slice_after(Checkpoint("12")).shard_id == SHARD


def test_iteration_builds_each_record_once():
    batch = make_batch()
    first = batch[0]
    assert first == batch[0] and first is not batch[0]  # built on demand before iteration
    records = list(batch)
    assert all(a is b for a, b in zip(records, batch, strict=True))
    assert batch[3] is records[3]


def test_equality():
    batch = make_batch()
    assert batch == list(batch) and batch == tuple(batch) and list(batch) == batch
    assert batch == make_batch() and batch != make_batch()[1:]
    assert batch != list(batch)[:-1]
    assert batch != [*list(batch)[:-1], UserRecord(SHARD, "12", 0, "outer", None, ARRIVAL_MS, b"other", False)]
    assert batch != "not records" and batch != 5
    assert UserRecordBatch.empty(SHARD) == [] and UserRecordBatch.empty(SHARD) != UserRecordBatch.empty("other")
    with pytest.raises(TypeError):
        hash(batch)


def test_pickle_keeps_the_columns():
    batch = make_batch()
    list(batch)  # built records are not part of the state
    again = pickle.loads(pickle.dumps(batch))
    assert again == batch and again.explicit_hash_keys == batch.explicit_hash_keys


def test_repr():
    assert repr(make_batch()) == f"UserRecordBatch({SHARD}, 5 records of 3 Kinesis records, 10/0 .. 12/0)"
    assert repr(UserRecordBatch.empty(SHARD)) == f"UserRecordBatch({SHARD}, empty)"


def test_the_constructor_copies_its_columns():
    seqs, data = ["1"], [b"x"]
    batch = UserRecordBatch(SHARD, seqs, [5], [False], [0], [1], ["pk"], None, data)
    seqs[0], data[0] = "2", b"y"
    assert list(batch) == [UserRecord(SHARD, "1", 0, "pk", None, 5, b"x", False)]


@pytest.mark.parametrize("columns, message", [
    ((["1", "2"], [5], [False], [0], [1], ["pk"], None, [b"x"]), "run columns differ in length"),
    ((["1"], [5], [False], [0], [1], ["pk", "pk"], None, [b"x"]), "record columns differ in length"),
    ((["1"], [5], [False], [0], [1], ["pk"], [None, None], [b"x"]), "record columns differ in length"),
    ((["1"], [5], [False], [0], [2], ["pk"], None, [b"x"]), "run lengths must be >= 1 and add up to the 1"),
    ((["1", "2"], [5, 5], [False, False], [0, 0], [2, 0], ["pk", "pk"], None, [b"x", b"y"]), "run lengths must"),
    ((["1"], [5], [False], [-1], [1], ["pk"], None, [b"x"]), "sub-sequence numbers must be >= 0"),
])
def test_inconsistent_columns_are_refused(columns, message):
    with pytest.raises(ValueError, match=message):
        UserRecordBatch(SHARD, *columns)


def test_index_errors():
    batch = make_batch()
    with pytest.raises(IndexError, match="record index 5 out of range for a batch of 5"):
        batch[5]
    with pytest.raises(IndexError, match="record index -6"):
        batch[-6]
    with pytest.raises(TypeError):
        batch["0"]


def test_concat_errors_and_shortcuts():
    batch = make_batch()
    assert UserRecordBatch.concat([batch]) is batch
    assert UserRecordBatch.concat([], shard_id=SHARD) == [] and UserRecordBatch.concat([], SHARD).shard_id == SHARD
    with pytest.raises(ValueError, match="concat of no batches needs a shard_id"):
        UserRecordBatch.concat([])
    with pytest.raises(ValueError, match="cannot concatenate a batch of other to one of " + SHARD):
        UserRecordBatch.concat([batch, UserRecordBatch.empty("other")])
    with pytest.raises(TypeError, match="concat takes UserRecordBatch objects, got list"):
        UserRecordBatch.concat([batch, list(batch)])


def test_from_records_refuses_another_shard():
    with pytest.raises(ValueError, match=f"a batch of {SHARD} cannot hold a record of other"):
        UserRecordBatch.from_records(SHARD, [UserRecord("other", "1", 0, "pk", None, 5, b"x")])


def test_slice_after_shard_end_is_an_error():
    with pytest.raises(ValueError, match="nothing can be read after SHARD_END"):
        make_batch().slice_after(Checkpoint(SHARD_END))


# -- Arrow ------------------------------------------------------------------------------------------------
def test_arrow_schema_is_the_landing_schema():
    """kcl/ cannot import landing/; this keeps the two definitions equal."""
    from kcl_pipeline.zone.batch import SCHEMA

    assert arrow_schema() == SCHEMA
    assert make_batch().to_arrow("s").schema == SCHEMA


def test_to_arrow():
    table = make_batch().to_arrow("a-stream", memory_pool=pa.system_memory_pool())
    assert table.num_rows == 5
    assert table.column("stream").to_pylist() == ["a-stream"] * 5
    assert table.column("shard_id").to_pylist() == [SHARD] * 5
    assert table.column("sequence_number").to_pylist() == ["10", "11", "11", "11", "12"]
    assert table.column("sub_sequence_number").to_pylist() == [0, 0, 1, 2, 0]
    assert table.column("explicit_hash_key").to_pylist() == ["7", None, "99", None, None]
    assert table.column("approximate_arrival_timestamp").to_pylist() == [ARRIVAL] * 5
    assert table.column("data").to_pylist() == [b"plain", b"0", b"1", b"2", b"last"]


def test_to_arrow_of_plain_records_only_and_of_nothing():
    plain = deaggregate_batch([kinesis_record(b"a", "1"), kinesis_record(b"b", "2")], SHARD)
    assert plain.to_arrow("s").column("sub_sequence_number").to_pylist() == [0, 0]
    empty = UserRecordBatch.empty(SHARD).to_arrow("s")
    assert empty.num_rows == 0 and empty.schema == arrow_schema()
