"""The demo producer: pure batching / retry / pacing decisions, PutRecords failure paths (botocore Stubber),
and end to end against kinesis-local over HTTP (read back with GetRecords + deaggregate)."""
from __future__ import annotations

import json
import random
import re

import boto3
import pytest
from botocore.stub import ANY, Stubber

from kcl_pipeline.kcl.records.kpl import deaggregate
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, StreamNotFound
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


def test_aggregated_entries_carry_their_first_user_records_partition_key(stubbed):
    kinesis, stub = stubbed
    expect_active(stub)
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
    assert report.user_records == 600 and report.ids == list(range(1000, 1600))
    assert report.kinesis_records == (600 if aggregate == 1 else 24)
    assert report.aggregates == (0 if aggregate == 1 else 24)
    assert sum(report.shards.values()) == report.kinesis_records
    users = read_all(kinesis_client, stream)
    assert sorted(ids_of(users)) == list(range(1000, 1600))
    assert all(u.aggregated is (aggregate > 1) for u in users)
    poison = [u for u in users if not u.data.endswith(b"}")]
    assert sorted(ids_of(poison)) == report.poison_ids == list(range(1099, 1600, 100))
    good = [json.loads(u.data) for u in users if u not in poison]
    assert all(set(d) == {"id", "ts", "value"} for d in good)


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
