"""The demo producer: pure batching / retry / pacing decisions, PutRecords failure paths (botocore Stubber),
and end to end against kinesis-local over HTTP (read back with GetRecords + deaggregate)."""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from types import SimpleNamespace
from typing import Callable

import boto3
import pytest
from botocore.stub import ANY, Stubber

from kcl_pipeline.kcl.records.kpl import deaggregate
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, StreamNotFound, list_shards, wait_stream_active
from kcl_pipeline.local import producer
from kcl_pipeline.local.producer import (
    MAX_BYTES_PER_CALL,
    MAX_PUT_ATTEMPTS,
    Entry,
    ProduceReport,
    PutRecordsFailed,
    backoff_seconds,
    batches,
    default_payload,
    due_at,
    failed_entries,
    is_poison,
    poison_payload,
    produce,
    users_per_batch,
)


# -- pure decisions ------------------------------------------------------------------------------------------
def entry(n: int, size: int = 10, users: int = 1) -> Entry:
    return Entry(f"pk{n}", b"x" * size, tuple(range(n, n + users)))


def test_batches_hold_at_most_500_entries():
    sizes = [len(b) for b in batches(entry(i) for i in range(1201))]
    assert sizes == [500, 500, 201]


def test_batches_hold_at_most_5_mib():
    big = [entry(i, size=1024 * 1024 - 4) for i in range(11)]  # 1 MiB each with the key
    out = list(batches(big))
    assert [len(b) for b in out] == [5, 5, 1]
    assert all(sum(e.size() for e in b) <= MAX_BYTES_PER_CALL for b in out)


def test_batches_hold_at_most_max_users_but_never_nothing():
    out = list(batches([entry(0, users=4), entry(4, users=4), entry(8, users=4), entry(12, users=9)], max_users=8))
    assert [[len(e.ids) for e in b] for b in out] == [[4, 4], [4], [9]]


def test_failed_entries_are_picked_in_order():
    sent = [entry(i) for i in range(4)]
    results = [{"SequenceNumber": "1", "ShardId": "s"}, {"ErrorCode": "ProvisionedThroughputExceededException"},
               {"SequenceNumber": "2", "ShardId": "s"}, {"ErrorCode": "InternalFailure"}]
    refused, codes = failed_entries(sent, results)
    assert refused == [sent[1], sent[3]]
    assert codes == ["ProvisionedThroughputExceededException", "InternalFailure"]


def test_failed_entries_refuses_a_misaligned_answer():
    with pytest.raises(ValueError, match="2 results for 3 entries"):
        failed_entries([entry(i) for i in range(3)], [{}, {}])


@pytest.mark.parametrize("attempt, ceiling", [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (30, 5.0)])
def test_backoff_is_full_jitter_under_a_capped_exponential(attempt, ceiling):
    rnd = random.Random(attempt)
    waits = [backoff_seconds(attempt, rnd) for _ in range(200)]
    assert all(0 <= w <= ceiling for w in waits)
    assert max(waits) > ceiling / 2  # jitter spreads over the range


@pytest.mark.parametrize("rate, users_before, expected", [(None, 1000, 50.0), (10.0, 0, 50.0), (10.0, 25, 52.5),
                                                          (0.5, 3, 56.0)])
def test_due_at(rate, users_before, expected):
    assert due_at(50.0, users_before, rate) == expected


@pytest.mark.parametrize("rate, expected", [(None, None), (1.0, 1), (0.1, 1), (100.0, 20), (1000.0, 200)])
def test_users_per_batch(rate, expected):
    assert users_per_batch(rate) == expected


@pytest.mark.parametrize("n, every, expected", [(0, None, False), (2, 3, True), (3, 3, False), (5, 3, True),
                                                (0, 1, True), (7, 1, True)])
def test_is_poison(n, every, expected):
    assert is_poison(n, every) is expected


def test_default_payload_is_small_json_and_poison_is_not_json():
    doc = json.loads(default_payload(42, 1714566615.123))
    assert doc["id"] == 42 and doc["ts"] == "2024-05-01T12:30:15.123Z" and 0 <= doc["value"] <= 1000
    assert json.loads(default_payload(42, 0))["value"] == doc["value"]  # deterministic per id
    with pytest.raises(json.JSONDecodeError):
        json.loads(poison_payload(42))
    assert b'"id": 42' in poison_payload(42)


# -- produce() against a stubbed client ---------------------------------------------------------------------
class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def stubbed():
    kinesis = boto3.client("kinesis", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s",
                           endpoint_url="http://127.0.0.1:9")
    with Stubber(kinesis) as stub:
        yield kinesis, stub
        stub.assert_no_pending_responses()


def expect_active(stub, stream="s1", status="ACTIVE"):
    stub.add_response("describe_stream_summary", {"StreamDescriptionSummary": {
        "StreamName": stream, "StreamARN": f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream}",
        "StreamStatus": status, "RetentionPeriodHours": 24, "StreamCreationTimestamp": 0,
        "EnhancedMonitoring": [], "OpenShardCount": 1}}, {"StreamName": stream})


def ok(seq: int, shard: str = "shardId-000000000000") -> dict:
    return {"SequenceNumber": str(seq), "ShardId": shard}


def refused(code: str = "ProvisionedThroughputExceededException") -> dict:
    return {"ErrorCode": code, "ErrorMessage": "slow down"}


def records_param(datas: list[bytes]) -> list[dict]:
    return [{"Data": d, "PartitionKey": ANY} for d in datas]


def payload(n: int) -> bytes:
    return f"r{n}".encode()


def test_only_refused_entries_are_resent_after_a_backoff(stubbed):
    kinesis, stub = stubbed
    fake = FakeTime()
    expect_active(stub)
    stub.add_response("put_records",
                      {"FailedRecordCount": 2, "Records": [ok(1), refused(), ok(2), refused("InternalFailure")]},
                      {"StreamName": "s1", "Records": records_param([b"r0", b"r1", b"r2", b"r3"])})
    stub.add_response("put_records", {"Records": [ok(3, "shardId-000000000001"), ok(4)]},
                      {"StreamName": "s1", "Records": records_param([b"r1", b"r3"])})
    report = produce(kinesis, "s1", 4, payload=payload, seed=1, clock=fake.clock, sleep=fake.sleep)
    assert (report.user_records, report.kinesis_records, report.put_calls) == (4, 4, 2)
    assert (report.retried_entries, report.throttled_entries) == (2, 1)
    assert report.shards == {"shardId-000000000000": 3, "shardId-000000000001": 1}
    assert report.ids == [0, 1, 2, 3] and report.bytes == 8
    assert len(fake.sleeps) == 1 and 0 <= fake.sleeps[0] <= 0.1


def test_entries_still_refused_after_every_attempt_are_an_error(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    stub.add_response("put_records", {"FailedRecordCount": 1, "Records": [ok(1), refused()]},
                      {"StreamName": "s1", "Records": records_param([b"r0", b"r1"])})
    for _ in range(MAX_PUT_ATTEMPTS - 1):
        stub.add_response("put_records", {"FailedRecordCount": 1, "Records": [refused()]},
                          {"StreamName": "s1", "Records": records_param([b"r1"])})
    fake = FakeTime()
    with pytest.raises(PutRecordsFailed, match=r"still refused 1 entries after 10 attempts "
                                               r"\(ProvisionedThroughputExceededException\); 1 user records were put"):
        produce(kinesis, "s1", 2, payload=payload, clock=fake.clock, sleep=fake.sleep)
    assert len(fake.sleeps) == MAX_PUT_ATTEMPTS - 1


def test_a_throttled_call_is_retried(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    stub.add_client_error("put_records", "ProvisionedThroughputExceededException", http_status_code=400)
    stub.add_response("put_records", {"Records": [ok(1)]},
                      {"StreamName": "s1", "Records": records_param([b"r0"])})
    fake = FakeTime()
    report = produce(kinesis, "s1", 1, payload=payload, clock=fake.clock, sleep=fake.sleep)
    assert (report.user_records, report.throttled_entries, report.put_calls) == (1, 1, 2)


def test_other_put_errors_are_raised(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    stub.add_client_error("put_records", "AccessDeniedException", http_status_code=400)
    with pytest.raises(Exception, match="AccessDeniedException"):
        produce(kinesis, "s1", 1, payload=payload, sleep=FakeTime().sleep)


def test_missing_stream_without_create_shards_is_a_clear_error(stubbed):
    kinesis, stub = stubbed
    stub.add_client_error("describe_stream_summary", "ResourceNotFoundException", http_status_code=400)
    with pytest.raises(StreamNotFound, match=r"stream 'nope' does not exist in region us-east-1 "
                                             r"\(endpoint http://127.0.0.1:9\): create it, or pass create_shards"):
        produce(kinesis, "nope", 10)


def test_missing_stream_is_created_and_awaited(stubbed):
    kinesis, stub = stubbed
    stub.add_client_error("describe_stream_summary", "ResourceNotFoundException", http_status_code=400)
    stub.add_response("create_stream", {}, {"StreamName": "s1", "ShardCount": 3})
    stub.add_client_error("describe_stream_summary", "ResourceNotFoundException", http_status_code=400)
    expect_active(stub, status="CREATING")
    expect_active(stub)
    fake = FakeTime()
    report = produce(kinesis, "s1", 0, create_shards=3, clock=fake.clock, sleep=fake.sleep)
    assert report.created_stream and report.user_records == 0
    assert fake.sleeps == [0.25, 0.25, 0.25]


def test_a_stream_being_deleted_is_an_error(stubbed):
    kinesis, stub = stubbed
    expect_active(stub, status="DELETING")
    with pytest.raises(StreamNotFound, match="being deleted"):
        produce(kinesis, "s1", 1, sleep=FakeTime().sleep)


def test_a_stream_that_never_becomes_active_is_an_error(stubbed):
    kinesis, stub = stubbed
    for _ in range(2):
        expect_active(stub, status="CREATING")
    ticks = iter([0.0, 30.0, 61.0])
    with pytest.raises(KinesisUnavailable, match="still CREATING after 60 s"):
        producer.ensure_stream(kinesis, "s1", None, sleep=lambda s: None, clock=lambda: next(ticks))


def test_rate_paces_batches(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    for i in range(5):  # rate 10/s → 2 user records a batch, due every 0.2 s
        payloads = [f"r{2 * i}".encode(), f"r{2 * i + 1}".encode()]
        stub.add_response("put_records", {"Records": [ok(2 * i), ok(2 * i + 1)]},
                          {"StreamName": "s1", "Records": records_param(payloads)})
    fake = FakeTime()
    report = produce(kinesis, "s1", 10, rate=10.0, payload=payload, clock=fake.clock, sleep=fake.sleep)
    assert report.user_records == 10
    assert fake.sleeps == pytest.approx([0.2, 0.2, 0.2, 0.2])


def expect_one_shard(stub, stream="s1"):
    stub.add_response("list_shards", {"Shards": [{
        "ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)},
        "SequenceNumberRange": {"StartingSequenceNumber": "1"}}]}, {"StreamName": stream})


def test_aggregated_entries_carry_their_first_user_records_partition_key(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    expect_one_shard(stub)
    captured: list[dict] = []
    stub.add_response("put_records", {"Records": [ok(1), ok(2), ok(3)]},
                      {"StreamName": "s1", "Records": ANY})
    kinesis.meta.events.register("provide-client-params.kinesis.PutRecords",
                                 lambda params, **_: captured.extend(params["Records"]))
    report = produce(kinesis, "s1", 10, aggregate=4, payload=payload, poison_every=5, sleep=FakeTime().sleep)
    assert (report.user_records, report.kinesis_records, report.aggregates) == (10, 3, 3)
    assert report.poison_ids == [4, 9] and report.poisoned == 2
    users = []
    for i, put in enumerate(captured):
        out = deaggregate({"SequenceNumber": str(i + 1), "ApproximateArrivalTimestamp": 0, "Data": put["Data"],
                           "PartitionKey": put["PartitionKey"]}, "shardId-000000000000")
        assert all(u.aggregated for u in out)
        assert out[0].partition_key == put["PartitionKey"]
        assert put["ExplicitHashKey"] == str(md5_key(put["PartitionKey"]))
        assert len({u.partition_key for u in out}) == len(out)  # random keys
        users += [u.data for u in out]
    assert len(users) == 10
    assert users == [poison_payload(n) if n in (4, 9) else payload(n) for n in range(10)]


@pytest.mark.parametrize("kwargs, message", [
    ({"count": -1}, "count must be >= 0"),
    ({"aggregate": 0}, "aggregate must be >= 1"),
    ({"rate": 0.0}, "rate must be > 0"),
    ({"poison_every": 0}, "poison_every must be >= 1"),
    ({"create_shards": 0}, "create_shards must be >= 1"),
])
def test_arguments_are_checked_before_any_call(stubbed, kwargs, message):
    kinesis, _ = stubbed
    with pytest.raises(ValueError, match=message):
        produce(kinesis, "s1", **{"count": 1, **kwargs})


def test_a_payload_that_is_not_bytes_is_a_clear_error(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    with pytest.raises(ValueError, match=r"payload\(0\) returned str, not bytes"):
        produce(kinesis, "s1", 1, payload=lambda n: "text")


def test_a_plain_payload_over_the_record_limit_is_a_clear_error(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
    with pytest.raises(ValueError, match="over the Kinesis record limit"):
        produce(kinesis, "s1", 1, payload=lambda n: b"x" * (1024 * 1024))


# -- per-shard aggregation against a fake Kinesis -------------------------------------------------------------
MAX_KEY = 2**128 - 1


def md5_key(partition_key: str) -> int:
    """Kinesis's hash key of a partition key: MD5 as a 128-bit big-endian integer."""
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


class FakeKinesis:
    """Kinesis as the producer meets it: shards with hash key ranges, listed `page` at a time (NextToken), a
    status, PutRecords routing each entry by its ExplicitHashKey (else its partition key's MD5) to the open shard
    holding that key, and SplitShard. `calls` logs every call; `puts` every record put: (shard id, request, the
    shard's range then, the number of the PutRecords call)."""

    def __init__(self, cuts: list[int], page: int = 1) -> None:
        self.meta = SimpleNamespace(region_name="us-east-1", endpoint_url="fake")
        self.shards: list[dict] = []
        self.page = page
        self.status = "ACTIVE"
        self.calls: list[str] = []
        self.puts: list[tuple[str, dict, tuple[int, int], int]] = []
        self.after_put: Callable[[], object] | None = None
        self.on_describe: Callable[[], object] | None = None
        bounds = [0, *cuts, MAX_KEY + 1]
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            self._add(lo, hi - 1)

    def _add(self, lo: int, hi: int, parent: str | None = None) -> str:
        shard_id = f"shardId-{len(self.shards):012d}"
        item = {"ShardId": shard_id, "HashKeyRange": {"StartingHashKey": str(lo), "EndingHashKey": str(hi)},
                "SequenceNumberRange": {"StartingSequenceNumber": str(len(self.shards))}}
        if parent:
            item["ParentShardId"] = parent
        self.shards.append(item)
        return shard_id

    def open_ranges(self) -> dict[str, tuple[int, int]]:
        return {s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
                for s in self.shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]}

    def split(self, shard_id: str) -> None:
        parent = next(s for s in self.shards if s["ShardId"] == shard_id)
        lo, hi = self.open_ranges()[shard_id]
        parent["SequenceNumberRange"]["EndingSequenceNumber"] = "99"
        self._add(lo, (lo + hi) // 2, shard_id)
        self._add((lo + hi) // 2 + 1, hi, shard_id)

    def describe_stream_summary(self, StreamName: str) -> dict:
        self.calls.append("describe")
        if self.on_describe:
            self.on_describe()
        return {"StreamDescriptionSummary": {"StreamName": StreamName, "StreamStatus": self.status}}

    def list_shards(self, **kwargs) -> dict:
        self.calls.append("list")
        start = int(kwargs.get("NextToken", "0"))
        assert ("NextToken" in kwargs) != ("StreamName" in kwargs)
        out = {"Shards": self.shards[start:start + self.page]}
        if start + self.page < len(self.shards):
            out["NextToken"] = str(start + self.page)
        return out

    def put_records(self, StreamName: str, Records: list[dict]) -> dict:
        self.calls.append("put")
        call = self.calls.count("put")
        results = []
        for r in Records:
            key = int(r["ExplicitHashKey"]) if "ExplicitHashKey" in r else md5_key(r["PartitionKey"])
            shard_id, hash_range = next((s, (lo, hi)) for s, (lo, hi) in self.open_ranges().items() if lo <= key <= hi)
            self.puts.append((shard_id, r, hash_range, call))
            results.append({"ShardId": shard_id, "SequenceNumber": str(len(self.puts))})
        if self.after_put:
            self.after_put()
        return {"FailedRecordCount": 0, "Records": results}


def landed(fake: FakeKinesis) -> list[tuple[str, list, bool]]:
    """Per record put: (shard id, user records, whether every user record's key hashes into that shard's range)."""
    out = []
    for i, (shard_id, r, (lo, hi), _) in enumerate(fake.puts):
        users = deaggregate({"SequenceNumber": str(i + 1), "ApproximateArrivalTimestamp": 0, "Data": r["Data"],
                             "PartitionKey": r["PartitionKey"]}, shard_id)
        out.append((shard_id, users, all(lo <= md5_key(u.partition_key) <= hi for u in users)))
    return out


def test_every_aggregate_holds_records_of_one_shard_and_lands_there():
    """Four shards of uneven ranges, listed one a page: every aggregate's user records hash into the range of the
    shard it lands on (the KPL's rule; Java KCL drops an aggregate holding a record outside it), aggregates are
    full but for one per shard, and counts, ids and poison are as before."""
    fake = FakeKinesis([MAX_KEY // 7, MAX_KEY // 2, MAX_KEY // 2 + MAX_KEY // 5], page=1)
    report = produce(fake, "s1", 2000, aggregate=10, poison_every=7, payload=payload, seed=3,
                     sleep=FakeTime().sleep)
    got = landed(fake)
    mixed = [(shard, len(users)) for shard, users, inside in got if not inside]
    assert not mixed, f"{len(mixed)} of {len(got)} aggregates hold user records of another shard: {mixed[:5]}"
    assert (report.user_records, report.aggregates, report.kinesis_records) == (2000, len(got), len(got))
    per_shard = {s: [len(users) for shard, users, _ in got if shard == s] for s in fake.open_ranges()}
    assert all(sizes and sorted(sizes)[1:] == [10] * (len(sizes) - 1) for sizes in per_shard.values()), per_shard
    assert report.shards == {s: len(sizes) for s, sizes in per_shard.items()}
    assert fake.calls.count("list") == 4 and report.shard_listings == 1  # one listing of four pages
    assert all(int(r["ExplicitHashKey"]) == md5_key(r["PartitionKey"]) for _, r, _, _ in fake.puts)
    datas = [u.data for _, users, _ in got for u in users]
    assert sorted(datas) == sorted(poison_payload(n) if is_poison(n, 7) else payload(n) for n in range(2000))
    assert sorted(report.ids) == list(range(2000)) and report.poison_ids == [n for n in range(2000) if n % 7 == 6]
    assert report.misrouted_aggregates == report.off_shard_user_records == 0


def test_with_a_rate_a_partial_aggregate_waits_at_most_max_buffered_seconds():
    """10 records/s into aggregates of up to 100 on two shards: an aggregate is put once 2 s of the schedule (20
    records) have passed since its first record, so the rate holds and no record waits long for its shard's."""
    fake = FakeKinesis([MAX_KEY // 2])
    fake_time = FakeTime()
    report = produce(fake, "s1", 200, rate=10.0, aggregate=100, payload=payload, seed=8, clock=fake_time.clock,
                     sleep=fake_time.sleep)
    spans = [[int(u.data[1:]) for u in users] for _, users, _ in landed(fake)]
    assert all(inside for *_, inside in landed(fake))
    assert all(max(ids) - min(ids) < 20 for ids in spans), spans
    assert sorted(n for ids in spans for n in ids) == list(range(200)) and report.user_records == 200
    assert 18.0 <= fake_time.now - 1000.0 <= 20.0  # 200 records at 10/s, as plain records take


def test_plain_records_list_no_shards():
    fake = FakeKinesis([MAX_KEY // 2])
    report = produce(fake, "s1", 50, payload=payload, sleep=FakeTime().sleep)
    assert "list" not in fake.calls and report.user_records == 50 and report.shard_listings == 0
    assert all("ExplicitHashKey" not in r for _, r, _, _ in fake.puts)


def test_a_put_landing_off_its_shard_after_a_split_lists_the_shards_again():
    """A split right after the third PutRecords: the next call's aggregates built for the closed parent land on a
    child (counted, with their user records outside the child's range); the producer lists the shards again, packs
    the parent's pending records for the children, and every later aggregate is within its shard. Nothing is put
    twice (the KPL would re-send those records)."""
    fake = FakeKinesis([MAX_KEY // 2], page=2)
    fake.after_put = lambda: fake.calls.count("put") == 3 and fake.split("shardId-000000000000")
    fake_time = FakeTime()
    report = produce(fake, "s1", 3000, rate=1000.0, aggregate=10, payload=payload, seed=5,
                     clock=fake_time.clock, sleep=fake_time.sleep)
    got = landed(fake)
    assert report.shard_listings == 2
    assert sorted(report.ids) == list(range(3000)) and report.user_records == 3000
    assert sorted(u.data for _, users, _ in got for u in users) == sorted(payload(n) for n in range(3000))
    off = [i for i, (_, _, inside) in enumerate(got) if not inside]
    # Only the call that revealed the split, and the one entry batching had built ahead of it (the next call's
    # first), hold any.
    calls = [fake.puts[i][3] for i in off]
    assert off and set(calls) <= {4, 5} and calls.count(5) <= 1, calls
    assert report.off_shard_user_records == sum(len(got[i][1]) for i in off)
    assert report.misrouted_aggregates >= len(off)
    children = {"shardId-000000000002", "shardId-000000000003"}
    assert children <= set(report.shards) and set(fake.open_ranges()) == {"shardId-000000000001", *children}


def test_a_map_listed_while_updating_is_listed_again_once_the_stream_is_active():
    """Listed during a reshard (UPDATING): the status is checked between puts and the shards are listed again as
    soon as it is ACTIVE (the split completing there); every aggregate lands within its shard."""
    fake = FakeKinesis([MAX_KEY // 2], page=5)
    fake.status = "UPDATING"
    describes = 0

    def on_describe():
        nonlocal describes
        describes += 1
        if describes == 3:  # the first answers ensure_stream; the second the first check; the third completes it
            fake.split("shardId-000000000001")
            fake.status = "ACTIVE"

    fake.on_describe = on_describe
    fake_time = FakeTime()
    report = produce(fake, "s1", 3000, rate=1000.0, aggregate=10, payload=payload, seed=6,
                     clock=fake_time.clock, sleep=fake_time.sleep)
    assert report.shard_listings == 2
    i = [n for n, c in enumerate(fake.calls) if c == "list"][-1]
    assert fake.calls[i - 1] == "describe" and describes >= 3  # listed again right after ACTIVE was seen
    got = landed(fake)
    assert report.off_shard_user_records == sum(len(users) for _, users, inside in got if not inside)
    assert sum(1 for *_, inside in got if not inside) <= 1
    assert {"shardId-000000000002", "shardId-000000000003"} <= set(report.shards)
    assert sorted(report.ids) == list(range(3000))


# -- end to end on kinesis-local ------------------------------------------------------------------------------
def read_all(kinesis, stream: str) -> list:
    """Every user record of every shard, from TRIM_HORIZON until each shard is caught up."""
    out = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        for _ in range(100):
            resp = kinesis.get_records(ShardIterator=it, Limit=1000)
            for record in resp["Records"]:
                out += deaggregate(record, shard["ShardId"])
            it = resp.get("NextShardIterator")
            if not resp["Records"] and resp.get("MillisBehindLatest", 0) == 0 or not it:
                break
    return out


def ids_of(users) -> list[int]:
    ids = []
    for u in users:
        try:
            ids.append(json.loads(u.data)["id"])
        except ValueError:
            ids.append(int(re.match(rb'\{"id": (\d+)', u.data).group(1)))
    return ids


@pytest.mark.parametrize("aggregate", [1, 25])
def test_emulator_produce_and_read_back(kinesis_client, unique_name, aggregate):
    stream = unique_name("producer")
    report = produce(kinesis_client, stream, 600, aggregate=aggregate, poison_every=100, create_shards=2,
                     first_id=1000)
    assert isinstance(report, ProduceReport) and report.created_stream
    assert report.user_records == 600 and sorted(report.ids) == list(range(1000, 1600))
    users = read_all(kinesis_client, stream)
    per_shard = [sum(1 for u in users if u.shard_id == s) for s in report.shards]
    assert report.kinesis_records == (600 if aggregate == 1 else sum(math.ceil(n / 25) for n in per_shard))
    assert report.aggregates == (0 if aggregate == 1 else report.kinesis_records)
    assert sum(report.shards.values()) == report.kinesis_records
    assert sorted(ids_of(users)) == list(range(1000, 1600))
    assert all(u.aggregated is (aggregate > 1) for u in users)
    poison = [u for u in users if not u.data.endswith(b"}")]
    assert sorted(ids_of(poison)) == report.poison_ids == list(range(1099, 1600, 100))
    good = [json.loads(u.data) for u in users if u not in poison]
    assert all(set(d) == {"id", "ts", "value"} for d in good)


def read_by_record(kinesis, stream: str) -> dict[str, list[list]]:
    """Per shard, the user records of each of its Kinesis records, from TRIM_HORIZON until caught up."""
    out: dict[str, list[list]] = {}
    for shard in list_shards(kinesis, stream):
        records = out.setdefault(shard.shard_id, [])
        it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard.shard_id,
                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        for _ in range(100):
            resp = kinesis.get_records(ShardIterator=it, Limit=1000)
            records += [deaggregate(record, shard.shard_id) for record in resp["Records"]]
            it = resp.get("NextShardIterator")
            if not resp["Records"] and resp.get("MillisBehindLatest", 0) == 0 or not it:
                break
    return out


def off_shard(kinesis, stream: str) -> tuple[dict[str, list[list]], list[list]]:
    """What was read per shard, and the aggregates holding a user record outside their shard's hash key range."""
    ranges = {s.shard_id: (int(s.hash_key_range.starting_hash_key), int(s.hash_key_range.ending_hash_key))
              for s in list_shards(kinesis, stream)}
    per_shard = read_by_record(kinesis, stream)
    off = [users for shard, records in per_shard.items() for users in records
           if not all(ranges[shard][0] <= md5_key(u.partition_key) <= ranges[shard][1] for u in users)]
    return per_shard, off


def test_emulator_each_aggregate_lands_on_the_shard_all_its_records_belong_to(kinesis_client, unique_name):
    """Three shards on kinesis-local: every aggregate is read from the shard whose hash key range holds every one of
    its user records (Java KCL drops one that holds another shard's), one partial aggregate at most per shard. Then
    a shard is split mid-run (from the payload callback, between puts): the producer lists the shards again, and
    the only aggregates outside their shard are those it counted, put before the put that revealed the split."""
    stream = unique_name("producer")
    report = produce(kinesis_client, stream, 900, aggregate=10, poison_every=50, create_shards=3, seed=11)
    per_shard, off = off_shard(kinesis_client, stream)
    assert not off, f"{len(off)} aggregates hold user records of another shard"
    assert len(per_shard) == 3 and all(per_shard.values())
    for records in per_shard.values():
        assert all(u.aggregated for users in records for u in users)
        assert sorted(len(users) for users in records)[1:] == [10] * (len(records) - 1)
    users = [u for records in per_shard.values() for users in records for u in users]
    assert sorted(ids_of(users)) == list(range(900)) and report.kinesis_records == sum(map(len, per_shard.values()))
    assert report.shard_listings == 1 and report.misrouted_aggregates == 0

    split = list_shards(kinesis_client, stream)[0]
    middle = (int(split.hash_key_range.starting_hash_key) + int(split.hash_key_range.ending_hash_key)) // 2

    def payload(n: int) -> bytes:
        if n == 1500:
            kinesis_client.split_shard(StreamName=stream, ShardToSplit=split.shard_id, NewStartingHashKey=str(middle))
            wait_stream_active(kinesis_client, stream)
        return default_payload(n, time.time())

    report = produce(kinesis_client, stream, 1000, rate=2000.0, aggregate=10, payload=payload, first_id=1000, seed=12)
    per_shard, off = off_shard(kinesis_client, stream)
    assert len(per_shard) == 5 and report.shard_listings >= 2
    assert sum(map(len, off)) == report.off_shard_user_records
    assert len(off) <= report.misrouted_aggregates
    children = [s.shard_id for s in list_shards(kinesis_client, stream) if s.parent_shard_id == split.shard_id]
    assert all(per_shard[c] for c in children)
    users = [u for records in per_shard.values() for users in records for u in users]
    assert sorted(ids_of(users)) == [*range(900), *range(1000, 2000)]
    print(f"split mid-run: {report.misrouted_aggregates} aggregates landed on a child, "
          f"{report.off_shard_user_records} user records outside it")


def test_emulator_existing_stream_is_used_as_is(kinesis_client, unique_name):
    stream = unique_name("producer")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    report = produce(kinesis_client, stream, 20, create_shards=4, rate=1000.0)
    assert not report.created_stream and report.user_records == 20
    assert len(kinesis_client.list_shards(StreamName=stream)["Shards"]) == 1
    assert sorted(ids_of(read_all(kinesis_client, stream))) == list(range(20))


def test_emulator_missing_stream_is_a_clear_error(kinesis_client, unique_name):
    stream = unique_name("missing")
    with pytest.raises(StreamNotFound, match=f"stream '{stream}' does not exist in region .* \\(endpoint http://127.0.0.1:"):
        produce(kinesis_client, stream, 5)
