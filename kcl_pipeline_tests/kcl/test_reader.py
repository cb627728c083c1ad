"""ShardReader: unit tests with botocore's Stubber, then integration tests on kinesis-local over HTTP."""
from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import botocore.session
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint
from kcl_pipeline.kcl.records.kpl import KplStats, aggregate
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.read.reader import ReaderError, ShardReader, paced_delay
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, list_shards, wait_stream_active

STREAM = "orders"
SHARD = "shardId-000000000000"
# AWS-like 56-digit sequence numbers (A < B < C < D), so string comparison bugs would show.
A = "49680448157447593082725076377578417499464239771979612162"
B = "49680448157447593082725076377579626425283854401154318338"
C = "49680448157447593082725076377580835351103469030329024514"
D = "49680448157447593082725076377582044276923083659503730690"
T0 = datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc)


# -- unit-test helpers ------------------------------------------------------------------------------
class FakeClock:
    """Monotonic time that only moves when the reader sleeps; records every requested sleep."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def kinesis():
    kin = botocore.session.get_session().create_client(
        "kinesis", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(kin) as stub:
        kin.stub = stub
        yield kin
        stub.assert_no_pending_responses()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def rec(seq: str, data: bytes = b"payload", pk: str = "pk") -> dict:
    return {"SequenceNumber": seq, "ApproximateArrivalTimestamp": T0, "Data": data, "PartitionKey": pk}


def reader_for(kinesis, fake: FakeClock, start: Checkpoint, **kw) -> ShardReader:
    kw.setdefault("rng", random.Random(7))
    return ShardReader(kinesis, STREAM, SHARD, start, sleep=fake.sleep, monotonic=fake.monotonic, **kw)


def expect_iterator(kinesis, iterator: str, **params) -> None:
    kinesis.stub.add_response("get_shard_iterator", {"ShardIterator": iterator},
                              {"StreamName": STREAM, "ShardId": SHARD, **params})


def expect_records(kinesis, iterator: str, records: list[dict], next_iterator: str | None = "next",
                   millis: int = 0, limit: int = 10000, children: list[dict] | None = None) -> None:
    resp: dict = {"Records": records, "MillisBehindLatest": millis}
    if next_iterator is not None:
        resp["NextShardIterator"] = next_iterator
    if children is not None:
        resp["ChildShards"] = children
    kinesis.stub.add_response("get_records", resp, {"ShardIterator": iterator, "Limit": limit})


def expect_error(kinesis, operation: str, code: str, status: int = 400, params: dict | None = None) -> None:
    kinesis.stub.add_client_error(operation, service_error_code=code, service_message=f"{code} (stubbed)",
                                  http_status_code=status, expected_params=params)


def seqs(batch) -> list[tuple[str, int]]:
    return [(r.sequence_number, r.sub_sequence_number) for r in batch.records]


# -- iterator types from each checkpoint kind ---------------------------------------------------------
@pytest.mark.parametrize("start, params", [
    (Checkpoint(TRIM_HORIZON), {"ShardIteratorType": "TRIM_HORIZON"}),
    (Checkpoint(LATEST), {"ShardIteratorType": "LATEST"}),
    (Checkpoint(AT_TIMESTAMP, 1795316400123),
     {"ShardIteratorType": "AT_TIMESTAMP",
      "Timestamp": datetime(2026, 11, 22, 3, 0, 0, 123000, tzinfo=timezone.utc)}),
    (Checkpoint(B, 3), {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": B}),
], ids=["trim_horizon", "latest", "at_timestamp", "sequence"])
def test_iterator_type_from_checkpoint(kinesis, clock, start, params):
    expect_iterator(kinesis, "it-1", **params)
    expect_records(kinesis, "it-1", [], limit=500)
    batch = reader_for(kinesis, clock, start, max_records=500).poll()
    assert batch.records == [] and batch.millis_behind_latest == 0 and not batch.shard_ended


def test_stream_arn_is_passed_as_stream_arn(kinesis, clock):
    arn = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
    kinesis.stub.add_response("get_shard_iterator", {"ShardIterator": "it-1"},
                              {"StreamARN": arn, "ShardId": SHARD, "ShardIteratorType": "TRIM_HORIZON"})
    expect_records(kinesis, "it-1", [rec(A)])
    reader = ShardReader(kinesis, arn, SHARD, Checkpoint(TRIM_HORIZON), sleep=clock.sleep, monotonic=clock.monotonic)
    assert seqs(reader.poll()) == [(A, 0)]


def test_shard_end_checkpoint_is_already_ended(kinesis, clock):
    reader = reader_for(kinesis, clock, Checkpoint(SHARD_END))
    assert reader.ended
    with pytest.raises(ReaderError, match="already ended"):
        reader.poll()  # no call reaches the (empty) stub


# -- the (sequence, sub-sequence) filter ----------------------------------------------------------------
def test_plain_record_at_the_checkpoint_is_dropped(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-1", [rec(B), rec(C), rec(D)])
    reader = reader_for(kinesis, clock, Checkpoint(B))
    batch = reader.poll()
    assert seqs(batch) == [(C, 0), (D, 0)]
    assert batch.kinesis_records == 3  # what Kinesis served, before the filter
    assert reader.position == Checkpoint(D)


def test_resume_mid_aggregate_keeps_higher_sub_sequences(kinesis, clock):
    users = [("pk", None, f"u{i}".encode()) for i in range(4)]
    blob = aggregate(users)
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-1", [rec(B, blob), rec(C, b"plain")])
    stats = KplStats()
    reader = reader_for(kinesis, clock, Checkpoint(B, 1), kpl_stats=stats)
    batch = reader.poll()
    assert seqs(batch) == [(B, 2), (B, 3), (C, 0)]
    assert [r.data for r in batch.records] == [b"u2", b"u3", b"plain"]
    assert batch.bytes == len(blob) + len(b"plain")
    assert stats.aggregates == 1
    assert reader.position == Checkpoint(C, 0)


@pytest.mark.parametrize("checkpoint_sub, new", [(3, False), (1, True)])
def test_an_aggregate_read_again_only_for_what_follows_a_checkpoint_inside_it_is_not_new_traffic(
        kinesis, clock, checkpoint_sub, new):
    """Simulation seed 3579: a taker resuming at a checkpoint on an aggregate's last user record reads the aggregate
    again, keeps none of it, and counted its bytes as the shard's traffic: on a stream gone quiet, the lease's
    reported load jumped from 0 at every take, and the fleet balanced that. `new_bytes` counts only the Kinesis
    records that gave a user record (the whole aggregate when some of it follows the checkpoint)."""
    blob = aggregate([("pk", None, f"u{i}".encode()) for i in range(4)])
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-1", [rec(B, blob), rec(C, b"plain")])
    batch = reader_for(kinesis, clock, Checkpoint(B, checkpoint_sub)).poll()
    assert batch.bytes == len(blob) + len(b"plain")  # what the shard served (pacing, metrics)
    assert batch.new_bytes == (len(blob) if new else 0) + len(b"plain")


def test_position_stays_at_start_until_a_record_is_delivered(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-1", [rec(B)], next_iterator="it-2")
    reader = reader_for(kinesis, clock, Checkpoint(B))
    assert reader.poll().records == []
    assert reader.position == Checkpoint(B)


# -- pacing ------------------------------------------------------------------------------------------
def test_polling_interval_between_calls_with_records(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator="it-2")
    expect_records(kinesis, "it-2", [rec(B)], next_iterator="it-3")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.25, idle_interval=2.0)
    reader.poll()
    reader.poll()
    assert clock.sleeps == [0.25]  # none before the first call


def test_idle_interval_after_an_empty_caught_up_response(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [], next_iterator="it-2", millis=0)
    expect_records(kinesis, "it-2", [], next_iterator="it-3", millis=4000)  # empty but behind
    expect_records(kinesis, "it-3", [rec(A)], next_iterator="it-4")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.2, idle_interval=1.5)
    for _ in range(3):
        reader.poll()
    # idle after the caught-up empty response; only the polling interval after the empty-but-behind one
    assert clock.sleeps == [1.5, 0.2]


def test_a_byte_budgeted_reader_waits_out_what_it_read(kinesis, clock):
    """A bounded reader (a backfill) must not take the shard's whole 2 MiB/s from the live consumer: after a
    response of N bytes it waits N / budget seconds, never less than its polling interval."""
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A, b"x" * 3000)], next_iterator="it-2")
    expect_records(kinesis, "it-2", [rec(B, b"y" * 10)], next_iterator="it-3")
    expect_records(kinesis, "it-3", [rec(C)], next_iterator="it-4")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.25, idle_interval=2.0,
                        max_bytes_per_second=1000)
    for _ in range(3):
        reader.poll()
    assert clock.sleeps == [3.0, 0.25]


@pytest.mark.parametrize("interval,size,budget,delay", [
    (0.2, 0, None, 0.2), (0.2, 10_000_000, None, 0.2),  # no budget: the interval alone
    (1.0, 512, 1024, 1.0), (1.0, 4096, 1024, 4.0), (2.0, 0, 1024, 2.0)])
def test_paced_delay(interval, size, budget, delay):
    assert paced_delay(interval, size, budget) == delay


def test_a_byte_budget_must_be_positive(kinesis):
    with pytest.raises(ReaderError, match="max_bytes_per_second must be > 0"):
        ShardReader(kinesis, STREAM, SHARD, Checkpoint(TRIM_HORIZON), max_bytes_per_second=0)


def test_no_sleep_when_the_interval_already_passed(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [], next_iterator="it-2")
    expect_records(kinesis, "it-2", [rec(A)], next_iterator="it-3")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    reader.poll()
    clock.now += 5.0  # the worker spent 5 s processing
    reader.poll()
    assert clock.sleeps == []


def test_never_more_than_five_calls_per_second(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    for i in range(7):
        expect_records(kinesis, f"it-{i + 1}", [rec(A)] if i == 0 else [], next_iterator=f"it-{i + 2}",
                       millis=1000)
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.0, idle_interval=0.0)
    for _ in range(7):
        reader.poll()
    # calls 1-5 at t=0, the 6th waits for the 1 s window, the 7th goes right after the 6th (window
    # now starts at the 2nd call, also at t=0, so it waits 0).
    assert clock.sleeps == [1.0]


def test_a_cut_short_sleep_makes_no_early_call(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [], next_iterator="it-2")
    expect_records(kinesis, "it-2", [rec(A)], next_iterator="it-3")
    interrupted: list[float] = []
    reader = ShardReader(kinesis, STREAM, SHARD, Checkpoint(TRIM_HORIZON), idle_interval=2.0,
                         sleep=interrupted.append, monotonic=clock.monotonic)  # returns at once, time stands
    reader.poll()
    batch = reader.poll()
    assert batch.records == [] and batch.millis_behind_latest is None  # no GetRecords call was made
    assert interrupted == [2.0]
    clock.now += 2.0
    assert seqs(reader.poll()) == [(A, 0)]


# -- expired iterators --------------------------------------------------------------------------------
def test_expired_iterator_restarts_after_the_last_fetched_record(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A), rec(B)], next_iterator="it-2")
    expect_error(kinesis, "get_records", "ExpiredIteratorException", params={"ShardIterator": "it-2", "Limit": 10000})
    expect_iterator(kinesis, "it-3", ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-3", [rec(C)], next_iterator="it-4")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    delivered = seqs(reader.poll())
    expired = reader.poll()
    assert expired.records == [] and expired.millis_behind_latest is None and not expired.shard_ended
    delivered += seqs(reader.poll())
    assert delivered == [(A, 0), (B, 0), (C, 0)]
    assert reader.stats.expired_iterators == 1


def test_expired_iterator_after_filtered_records_restarts_after_them(kinesis, clock):
    # The first batch was all at or below the checkpoint: still "fetched", so no re-read from the start.
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-1", [rec(B)], next_iterator="it-2")
    expect_error(kinesis, "get_records", "ExpiredIteratorException")
    expect_iterator(kinesis, "it-3", ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-3", [rec(C)])
    reader = reader_for(kinesis, clock, Checkpoint(B))
    assert [seqs(reader.poll()) for _ in range(3)] == [[], [], [(C, 0)]]


def test_expired_before_any_fetch_restarts_from_the_start_checkpoint(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_error(kinesis, "get_records", "ExpiredIteratorException")
    expect_iterator(kinesis, "it-2", ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=B)
    expect_records(kinesis, "it-2", [rec(B), rec(C)])
    reader = reader_for(kinesis, clock, Checkpoint(B))
    assert [seqs(reader.poll()) for _ in range(2)] == [[], [(C, 0)]]


def test_expired_latest_iterator_restarts_at_the_time_latest_was_taken(kinesis, clock):
    taken_at = 1795316400.123
    expect_iterator(kinesis, "it-1", ShardIteratorType="LATEST")
    expect_records(kinesis, "it-1", [], next_iterator="it-2")
    expect_error(kinesis, "get_records", "ExpiredIteratorException")
    expect_iterator(kinesis, "it-3", ShardIteratorType="AT_TIMESTAMP",
                    Timestamp=datetime(2026, 11, 22, 3, 0, 0, 123000, tzinfo=timezone.utc))
    expect_records(kinesis, "it-3", [rec(C)])
    wall = iter([taken_at, taken_at + 400, taken_at + 401])
    reader = reader_for(kinesis, clock, Checkpoint(LATEST), clock=lambda: next(wall))
    assert [seqs(reader.poll()) for _ in range(3)] == [[], [], [(C, 0)]]


def test_emulator_http_500_re_gets_the_iterator_once(kinesis, clock):
    # kinesis-local answers an invalid iterator with a bare HTTP 500 (code "500").
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator="it-2")
    expect_error(kinesis, "get_records", "500", status=500)
    expect_iterator(kinesis, "it-3", ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=A)
    expect_records(kinesis, "it-3", [rec(B)], next_iterator="it-4")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    assert [seqs(reader.poll()) for _ in range(3)] == [[(A, 0)], [], [(B, 0)]]


def test_http_500_with_a_fresh_iterator_is_fatal(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator="it-2")
    expect_error(kinesis, "get_records", "InternalFailure", status=500)
    expect_iterator(kinesis, "it-3", ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=A)
    expect_error(kinesis, "get_records", "InternalFailure", status=500)
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    reader.poll()
    reader.poll()
    with pytest.raises(ReaderError, match="HTTP 500.*fresh iterator"):
        reader.poll()


# -- throttling --------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "KMSThrottlingException"])
def test_throttled_get_records_backs_off_and_keeps_the_iterator(kinesis, clock, code):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator="it-2")
    expect_error(kinesis, "get_records", code, params={"ShardIterator": "it-2", "Limit": 10000})
    expect_error(kinesis, "get_records", code, params={"ShardIterator": "it-2", "Limit": 10000})
    expect_records(kinesis, "it-2", [rec(B)], next_iterator="it-3")  # the same iterator: nothing lost
    expect_records(kinesis, "it-3", [rec(C)], next_iterator="it-4")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.2)
    delivered = [seqs(reader.poll()) for _ in range(5)]
    assert delivered == [[(A, 0)], [], [], [(B, 0)], [(C, 0)]]
    assert reader.stats.throttles == 2
    first, second, third, after_success = clock.sleeps
    assert first == 0.2  # pacing before the first (throttled) retry
    assert 0.25 <= second <= 0.5  # back-off 1: equal jitter over a 0.5 s ceiling
    assert 0.5 <= third <= 1.0  # back-off 2: the ceiling doubles
    assert after_success == 0.2  # success resets the back-off


def test_throttled_get_shard_iterator_backs_off_then_retries(kinesis, clock):
    expect_error(kinesis, "get_shard_iterator", "LimitExceededException")
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)])
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    assert reader.poll().records == []
    assert seqs(reader.poll()) == [(A, 0)]
    assert len(clock.sleeps) == 1 and 0.25 <= clock.sleeps[0] <= 0.5
    assert reader.stats.throttles == 1


def test_back_off_is_capped(kinesis, clock):
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    assert all(5.0 <= reader._backoff(n) <= 10.0 for n in range(6, 40))


# -- shard end -----------------------------------------------------------------------------------------
def test_shard_end_when_next_iterator_is_absent(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator=None)
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    batch = reader.poll()
    assert seqs(batch) == [(A, 0)] and batch.shard_ended and batch.child_shards == []
    assert reader.ended
    with pytest.raises(ReaderError, match="already ended"):
        reader.poll()


def test_shard_end_via_child_shards(kinesis, clock):
    children = [
        {"ShardId": "shardId-000000000001", "ParentShards": [SHARD],
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "170141183460469231731687303715884105726"}},
        {"ShardId": "shardId-000000000002", "ParentShards": [SHARD],
         "HashKeyRange": {"StartingHashKey": "170141183460469231731687303715884105727",
                          "EndingHashKey": "340282366920938463463374607431768211455"}},
    ]
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_records(kinesis, "it-1", [rec(A)], next_iterator="it-2")
    expect_records(kinesis, "it-2", [rec(B)], next_iterator="it-3", children=children)
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    assert not reader.poll().shard_ended
    batch = reader.poll()
    assert seqs(batch) == [(B, 0)]
    assert batch.shard_ended and batch.child_shards == ["shardId-000000000001", "shardId-000000000002"]
    assert reader.child_shards == batch.child_shards
    with pytest.raises(ReaderError, match="shardId-000000000001"):
        reader.poll()


def test_no_iterator_for_a_closed_shard_is_shard_end(kinesis, clock):
    kinesis.stub.add_response("get_shard_iterator", {}, {"StreamName": STREAM, "ShardId": SHARD,
                                                         "ShardIteratorType": "TRIM_HORIZON"})
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    batch = reader.poll()
    assert batch.shard_ended and batch.records == []
    with pytest.raises(ReaderError):
        reader.poll()


# -- errors --------------------------------------------------------------------------------------------
def test_missing_stream_or_shard_is_a_reader_error(kinesis, clock):
    expect_error(kinesis, "get_shard_iterator", "ResourceNotFoundException")
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON))
    with pytest.raises(ReaderError, match=f"stream {STREAM} or shard {SHARD} does not exist in region us-east-1"):
        reader.poll()


def test_missing_shard_during_get_records_is_a_reader_error(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    expect_error(kinesis, "get_records", "ResourceNotFoundException")
    with pytest.raises(ReaderError, match="GetRecords: stream orders or shard"):
        reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON)).poll()


@pytest.mark.parametrize("code", ["InvalidArgumentException", "AccessDeniedException"])
def test_other_client_errors_are_reader_errors(kinesis, clock, code):
    expect_error(kinesis, "get_shard_iterator", code)
    with pytest.raises(ReaderError, match=code):
        reader_for(kinesis, clock, Checkpoint(B)).poll()


def test_server_errors_on_get_shard_iterator_mean_unavailable(kinesis, clock):
    expect_error(kinesis, "get_shard_iterator", "ServiceUnavailable", status=503)
    with pytest.raises(KinesisUnavailable, match="GetShardIterator failed in region us-east-1"):
        reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON)).poll()


def test_unreachable_endpoint_is_kinesis_unavailable(clock):
    kin = botocore.session.get_session().create_client(
        "kinesis", region_name="us-east-1", endpoint_url="http://127.0.0.1:9", aws_access_key_id="x",
        aws_secret_access_key="x", config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=2))
    reader = ShardReader(kin, STREAM, SHARD, Checkpoint(TRIM_HORIZON), sleep=clock.sleep, monotonic=clock.monotonic)
    with pytest.raises(KinesisUnavailable, match="endpoint http://127.0.0.1:9"):
        reader.poll()


@pytest.mark.parametrize("kwargs, message", [
    ({"max_records": 0}, "max_records"),
    ({"max_records": 10001}, "max_records"),
    ({"polling_interval": -1}, "polling_interval"),
    ({"polling_interval": 1.0, "idle_interval": 0.5}, "idle_interval"),
])
def test_invalid_arguments(kinesis, clock, kwargs, message):
    with pytest.raises(ReaderError, match=message):
        reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), **kwargs)


@pytest.mark.parametrize("stream, shard, start, message", [
    ("", SHARD, Checkpoint(TRIM_HORIZON), "stream"),
    (STREAM, "", Checkpoint(TRIM_HORIZON), "shard"),
    (STREAM, SHARD, "TRIM_HORIZON", "Checkpoint"),
])
def test_invalid_identity(kinesis, stream, shard, start, message):
    with pytest.raises(ReaderError, match=message):
        ShardReader(kinesis, stream, shard, start)


# -- integration: kinesis-local over HTTP --------------------------------------------------------------
def create_stream(kinesis, name: str, shards: int = 1) -> list[str]:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_stream_active(kinesis, name, timeout=30)
    return [s.shard_id for s in list_shards(kinesis, name)]


def put(kinesis, stream: str, payloads: list[bytes], pk: str = "pk") -> list[str]:
    seqs_out: list[str] = []
    for i in range(0, len(payloads), 500):
        resp = kinesis.put_records(StreamName=stream, Records=[{"Data": d, "PartitionKey": pk}
                                                               for d in payloads[i:i + 500]])
        assert resp["FailedRecordCount"] == 0
        seqs_out += [r["SequenceNumber"] for r in resp["Records"]]
    return seqs_out


def read_until(reader: ShardReader, count: int | None = None, max_polls: int = 50) -> list:
    """Poll until `count` records arrived, or the shard ended, or the reader is caught up twice."""
    out, caught_up = [], 0
    for _ in range(max_polls):
        batch = reader.poll()
        out += batch.records
        if batch.shard_ended or (count is not None and len(out) >= count):
            return out
        if count is None and not batch.records and batch.millis_behind_latest == 0:
            caught_up += 1
            if caught_up == 2:
                return out
    raise AssertionError(f"gave up after {max_polls} polls with {len(out)} records")


def fast(kinesis, stream, shard, start, **kw) -> ShardReader:
    return ShardReader(kinesis, stream, shard, start, polling_interval=0.2, idle_interval=0.2, **kw)


def test_emulator_reads_everything_from_trim_horizon_and_from_a_checkpoint(kinesis_client, unique_name):
    stream = unique_name("reader")
    (shard,) = create_stream(kinesis_client, stream)
    payloads = [f"record-{i}".encode() for i in range(300)]
    sequence_numbers = put(kinesis_client, stream, payloads)

    reader = fast(kinesis_client, stream, shard, Checkpoint(TRIM_HORIZON))
    records = read_until(reader)
    assert [r.data for r in records] == payloads
    assert [r.sequence_number for r in records] == sequence_numbers
    assert reader.position == Checkpoint(sequence_numbers[-1])

    resumed = read_until(fast(kinesis_client, stream, shard, Checkpoint(sequence_numbers[99])))
    assert [r.data for r in resumed] == payloads[100:]


def test_emulator_resumes_mid_aggregate(kinesis_client, unique_name):
    stream = unique_name("reader-kpl")
    (shard,) = create_stream(kinesis_client, stream)
    users = [("pk", None, f"user-{i}".encode()) for i in range(5)]
    seq_plain, seq_agg, seq_after = put(kinesis_client, stream, [b"before", aggregate(users), b"after"])
    stats = KplStats()
    records = read_until(fast(kinesis_client, stream, shard, Checkpoint(seq_agg, 2), kpl_stats=stats))
    assert [(r.sequence_number, r.sub_sequence_number, r.data) for r in records] == [
        (seq_agg, 3, b"user-3"), (seq_agg, 4, b"user-4"), (seq_after, 0, b"after")]
    assert stats.aggregates == 1 and stats.bad_aggregates == 0


def test_emulator_latest_sees_only_new_records(kinesis_client, unique_name):
    stream = unique_name("reader-latest")
    (shard,) = create_stream(kinesis_client, stream)
    put(kinesis_client, stream, [b"old-1", b"old-2"])
    reader = fast(kinesis_client, stream, shard, Checkpoint(LATEST))
    assert reader.poll().records == []  # takes the LATEST iterator
    put(kinesis_client, stream, [b"new-1", b"new-2"])
    assert [r.data for r in read_until(reader, 2)] == [b"new-1", b"new-2"]


def test_emulator_at_timestamp(kinesis_client, unique_name):
    stream = unique_name("reader-ts")
    (shard,) = create_stream(kinesis_client, stream)
    put(kinesis_client, stream, [f"early-{i}".encode() for i in range(20)])
    time.sleep(0.05)  # separates the arrival milliseconds of the two groups
    put(kinesis_client, stream, [f"late-{i}".encode() for i in range(20)])
    everything = read_until(fast(kinesis_client, stream, shard, Checkpoint(TRIM_HORIZON)))
    start_ms = everything[20].approximate_arrival_timestamp_ms
    assert everything[19].approximate_arrival_timestamp_ms < start_ms
    records = read_until(fast(kinesis_client, stream, shard, Checkpoint(AT_TIMESTAMP, start_ms)))
    assert [r.data for r in records] == [f"late-{i}".encode() for i in range(20)]


def test_emulator_split_reads_the_parent_to_its_end(kinesis_client, unique_name):
    stream = unique_name("reader-split")
    (parent,) = create_stream(kinesis_client, stream)
    before = put(kinesis_client, stream, [f"p-{i}".encode() for i in range(50)])
    kinesis_client.split_shard(StreamName=stream, ShardToSplit=parent,
                               NewStartingHashKey=str(2**127))
    wait_stream_active(kinesis_client, stream, timeout=30)
    put(kinesis_client, stream, [f"c-{i}".encode() for i in range(10)])  # goes to the children
    shards = list_shards(kinesis_client, stream)
    children = [s.shard_id for s in shards if s.parent_shard_id == parent]
    assert len(children) == 2

    reader = fast(kinesis_client, stream, parent, Checkpoint(TRIM_HORIZON))
    records = read_until(reader)
    assert [r.sequence_number for r in records] == before
    assert reader.ended and sorted(reader.child_shards) == sorted(children)
    with pytest.raises(ReaderError, match="already ended"):
        reader.poll()
    # From the parent's last record the reader goes straight to the end.
    tail = fast(kinesis_client, stream, parent, Checkpoint(before[-1]))
    assert read_until(tail) == [] and tail.ended


def test_emulator_invalid_iterator_is_recovered_without_loss(aws_settings, unique_name):
    kinesis = client("kinesis", aws_settings, max_attempts=1)  # the emulator's HTTP 500 is not retried here
    stream = unique_name("reader-500")
    (shard,) = create_stream(kinesis, stream)
    payloads = [f"r-{i}".encode() for i in range(30)]
    put(kinesis, stream, payloads[:10])
    reader = fast(kinesis, stream, shard, Checkpoint(TRIM_HORIZON))
    first = read_until(reader, 10)
    put(kinesis, stream, payloads[10:])
    reader._iterator = "AAAAAAAAAAFnotAvalidIterator="  # what an expired iterator looks like to kinesis-local
    rest = read_until(reader, 20)
    assert [r.data for r in first + rest] == payloads
    assert reader.stats.expired_iterators == 1


def test_emulator_missing_stream_and_shard(kinesis_client, unique_name):
    with pytest.raises(ReaderError, match="does not exist"):
        fast(kinesis_client, unique_name("nope"), SHARD, Checkpoint(TRIM_HORIZON)).poll()
    stream = unique_name("reader-noshard")
    create_stream(kinesis_client, stream)
    with pytest.raises(ReaderError, match="shardId-000000000042"):
        fast(kinesis_client, stream, "shardId-000000000042", Checkpoint(TRIM_HORIZON)).poll()


# -- the service's clock and botocore's own retries -----------------------------------------------------
def _metadata(date: str | None = None, retries: int = 0) -> dict:
    headers = {"date": date} if date else {}
    return {"ResponseMetadata": {"HTTPHeaders": headers, "RetryAttempts": retries, "HTTPStatusCode": 200}}


def test_expired_latest_iterator_restarts_at_the_service_clock_not_a_skewed_host_clock(kinesis, clock):
    # The host clock is 30 s fast; restarting at its time would skip 30 s of records.
    kinesis.stub.add_response("get_shard_iterator",
                              {"ShardIterator": "it-1", **_metadata("Sun, 22 Nov 2026 03:00:05 GMT")},
                              {"StreamName": STREAM, "ShardId": SHARD, "ShardIteratorType": "LATEST"})
    expect_records(kinesis, "it-1", [], next_iterator="it-2")
    expect_error(kinesis, "get_records", "ExpiredIteratorException")
    expect_iterator(kinesis, "it-3", ShardIteratorType="AT_TIMESTAMP",
                    Timestamp=datetime(2026, 11, 22, 3, 0, 4, tzinfo=timezone.utc))  # the Date, less its precision
    expect_records(kinesis, "it-3", [rec(C)])
    skewed = T0.timestamp() + 5 + 30
    reader = reader_for(kinesis, clock, Checkpoint(LATEST), clock=lambda: skewed)
    assert [seqs(reader.poll()) for _ in range(3)] == [[], [], [(C, 0)]]


def test_batches_carry_the_service_time_of_their_response(kinesis, clock):
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    kinesis.stub.add_response("get_records", {"Records": [rec(A)], "MillisBehindLatest": 0, "NextShardIterator": "n",
                                              **_metadata("Sun, 22 Nov 2026 03:00:07 GMT")},
                              {"ShardIterator": "it-1", "Limit": 10000})
    batch = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON)).poll()
    assert batch.service_time_ms == int(T0.timestamp() * 1000) + 7000


def test_botocore_retries_count_against_the_five_calls_per_second(kinesis, clock):
    # One GetRecords that botocore retried 4 times inside the call was 5 calls against the shard's budget.
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    kinesis.stub.add_response("get_records", {"Records": [rec(A)], "MillisBehindLatest": 1000,
                                              "NextShardIterator": "it-2", **_metadata(retries=4)},
                              {"ShardIterator": "it-1", "Limit": 10000})
    expect_records(kinesis, "it-2", [rec(B)], next_iterator="it-3", millis=1000)
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.0, idle_interval=0.0)
    reader.poll()
    reader.poll()
    assert clock.sleeps == [1.0]  # the second call waits for the 1 s window


def test_a_get_records_call_botocore_retried_is_logged_with_how_long_the_shard_waited(kinesis, clock, caplog):
    """Six throttled reads retried inside botocore held a shard for 18 s with no log line: the reader's own
    throttle warning sees only the throttles that reach it."""
    expect_iterator(kinesis, "it-1", ShardIteratorType="TRIM_HORIZON")
    kinesis.stub.add_response("get_records", {"Records": [rec(A)], "MillisBehindLatest": 0,
                                              "NextShardIterator": "it-2", **_metadata(retries=6)},
                              {"ShardIterator": "it-1", "Limit": 10000})
    reader = reader_for(kinesis, clock, Checkpoint(TRIM_HORIZON), polling_interval=0.0, idle_interval=0.0)
    with caplog.at_level("WARNING", logger="kcl_pipeline.kcl.shells.read.reader"):
        reader.poll()
    lines = [r.getMessage() for r in caplog.records if "retries inside the call" in r.getMessage()]
    assert lines and lines[0].startswith(f"shard {SHARD}: GetRecords answered after 6 retries inside the call")
