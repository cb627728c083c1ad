"""Enhanced fan-out's reader over real HTTP: botocore's SubscribeToShard against the loopback event-stream
endpoint (kcl_pipeline_tests/fanout_endpoint.py) serving kinesis-local's records. Every subscription fault
(the service's end, exception events, resets, refusals, a deregistered consumer, a missing shard) and every
start (checkpoint mid-aggregate, LATEST, a shard's end) delivers each user record once, in order."""
from __future__ import annotations

import binascii
import json
import struct
import time
from typing import Callable

import pytest
from botocore.config import Config
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from kcl_pipeline.kcl.core.model import LATEST, TRIM_HORIZON, Checkpoint
from kcl_pipeline.kcl.shells.aws import boto3_session
from kcl_pipeline.kcl.shells.read.fanout import FanOutReader, ReaderError
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, list_shards, wait_stream_active
from kcl_pipeline.local.producer import produce
from kcl_pipeline_tests.fanout_endpoint import (
    FanOutEndpoint,
    SubscriptionFault,
    encode_message,
    event_message,
    exception_message,
)

SHARD = "shardId-000000000000"


# -- the encoding, read back by botocore's own decoder ------------------------------------------------------

@pytest.mark.core
def test_event_stream_messages_are_what_botocores_decoder_reads():
    stream = EventStreamBuffer()
    stream.add_data(event_message("initial-response", {}) + event_message("SubscribeToShardEvent", {"Records": []})
                    + exception_message("ResourceInUseException", "taken"))
    first, second, third = list(stream)
    assert first.headers == {":message-type": "event", ":event-type": "initial-response",
                             ":content-type": "application/json"}
    assert json.loads(second.payload) == {"Records": []}
    assert third.headers[":exception-type"] == "ResourceInUseException"
    assert third.to_response_dict()["status_code"] == 400


@pytest.mark.core
def test_a_corrupt_message_fails_botocores_crc_check():
    message = bytearray(encode_message({":message-type": "event"}, b"{}"))
    message[-6] ^= 0xFF  # a payload byte: the message CRC no longer matches
    stream = EventStreamBuffer()
    stream.add_data(bytes(message))
    with pytest.raises(ChecksumMismatch):
        list(stream)
    total, headers_length, prelude_crc = struct.unpack(">III", bytes(message[:12]))
    assert total == len(message) and prelude_crc == binascii.crc32(bytes(message[:8])) & 0xFFFFFFFF


# -- the reader ------------------------------------------------------------------------------------------

@pytest.fixture
def fanout(emulators):
    endpoint = FanOutEndpoint(emulators.kinesis, heartbeat_seconds=0.2, in_use_seconds=0.3).start()
    yield endpoint
    endpoint.stop()


def once(url: str, region: str):
    """A Kinesis client that tries each call once (botocore retries nothing): the reader's own handling of each
    refusal is what is tested."""
    config = Config(region_name=region, retries={"mode": "standard", "total_max_attempts": 1}, read_timeout=20)
    return boto3_session().client("kinesis", endpoint_url=url, config=config)


@pytest.fixture
def kinesis(emulators, fanout):
    return once(fanout.url, emulators.region)


@pytest.fixture
def stream(kinesis_client, unique_name) -> Callable[..., str]:
    def make(shards: int = 1) -> str:
        name = unique_name("fan")
        kinesis_client.create_stream(StreamName=name, ShardCount=shards)
        wait_stream_active(kinesis_client, name)
        return name
    return make


def _ids(records) -> list[int]:
    return [json.loads(r.data)["id"] for r in records]


def _read(reader: FanOutReader, count: int, timeout: float = 60.0) -> list:
    """Poll until `count` user records came (a stuck reader fails after `timeout`, never a timing check)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} records after {timeout}s"
        got.extend(reader.poll().records)
    return got


def _reader(kinesis, stream: str, start: Checkpoint = Checkpoint(TRIM_HORIZON), **kwargs) -> FanOutReader:
    return FanOutReader(kinesis, stream, SHARD, start, consumer=f"{stream}-app", event_wait=0.3, **kwargs)


def test_resubscriptions_mid_stream_neither_lose_nor_repeat_a_record(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=60, aggregate=4)
    produce(kinesis_client, name, count=20, first_id=60)
    fanout.records_per_event, fanout.events_per_subscription = 3, 2  # many subscriptions for 35 Kinesis records
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 80)) == list(range(80))
    subs = fanout.subscriptions_of(SHARD)
    assert len(subs) >= 5 and reader.stats.resubscriptions >= 4
    assert subs[0].starting_position == {"Type": "TRIM_HORIZON"}
    assert all(s.starting_position["Type"] == "AFTER_SEQUENCE_NUMBER" for s in subs[1:])
    reader.close()


@pytest.mark.parametrize("fault", [
    SubscriptionFault(1, "exception", "InternalFailureException"),
    SubscriptionFault(2, "exception", "ResourceInUseException"),  # another subscription took this one over
    SubscriptionFault(1, "exception", "KMSThrottlingException"),
    SubscriptionFault(1, "drop"),
    SubscriptionFault(0, "drop"),  # before any event: the start is the lease's again
    SubscriptionFault(1, "reset"),  # RST: the event sent may be lost with the connection, or read first
    SubscriptionFault(0, "reset"),  # the initial response too: SubscribeToShard itself fails
], ids=lambda f: f"{f.kind}-{f.code}-after-{f.after_events}")
def test_a_subscription_failing_mid_stream_resubscribes_from_its_continuation(kinesis, kinesis_client, fanout, stream,
                                                                              fault):
    name = stream()
    produce(kinesis_client, name, count=40, aggregate=3)
    fanout.records_per_event = 2
    fanout.faults.extend([fault, fault])
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 40)) == list(range(40))
    assert reader.stats.subscription_errors == 2
    ended = [s.ended for s in fanout.subscriptions_of(SHARD)]
    assert ended[:2] == [f"fault:{fault.kind}"] * 2
    reader.close()


def test_a_record_put_after_the_subscription_opened_is_pushed(kinesis, kinesis_client, fanout, stream):
    name = stream()
    reader = _reader(kinesis, name)
    assert reader.poll().records == []  # subscribed, caught up
    produce(kinesis_client, name, count=5)
    assert _ids(_read(reader, 5)) == list(range(5))
    assert len(fanout.subscriptions_of(SHARD)) == 1
    reader.close()


@pytest.mark.parametrize("code", ["ResourceInUseException", "LimitExceededException"])
def test_a_refused_subscribe_backs_off_and_retries(kinesis, kinesis_client, fanout, stream, code):
    name = stream()
    produce(kinesis_client, name, count=10)
    fanout.fail_operation("SubscribeToShard", code, times=2)
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 10)) == list(range(10))
    assert reader.stats.subscription_errors == 2 and fanout.counts["SubscribeToShard"] == 3
    assert reader.stats.throttles == (2 if code == "LimitExceededException" else 0)
    reader.close()


def test_a_subscription_the_service_never_ends_is_closed_by_the_reader(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=3)
    reader = _reader(kinesis, name, subscription_limit=0.5)
    assert _ids(_read(reader, 3)) == [0, 1, 2]
    deadline = time.monotonic() + 30
    while reader.stats.resubscriptions == 0:
        assert time.monotonic() < deadline
        assert reader.poll().records == []
    produce(kinesis_client, name, count=2, first_id=3)
    assert _ids(_read(reader, 2)) == [3, 4]
    assert fanout.subscriptions_of(SHARD)[-1].starting_position["Type"] == "AFTER_SEQUENCE_NUMBER"
    reader.close()


def test_a_deregistered_consumer_is_registered_again_and_reading_goes_on(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=10)
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 10)) == list(range(10))
    first_arn = fanout.subscriptions_of(SHARD)[0].consumer_arn
    arn = kinesis_client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    kinesis_client.deregister_stream_consumer(StreamARN=arn, ConsumerName=reader.consumer_name)
    deadline = time.monotonic() + 30
    while fanout.subscriptions_of(SHARD)[0].open:  # the endpoint ends it with ResourceNotFoundException
        assert time.monotonic() < deadline
        assert reader.poll().records == []
    assert fanout.subscriptions_of(SHARD)[0].ended == "error:consumer_deleted"
    produce(kinesis_client, name, count=10, first_id=10)
    assert _ids(_read(reader, 10)) == list(range(10, 20))
    consumers = kinesis_client.list_stream_consumers(StreamARN=arn)["Consumers"]
    assert [c["ConsumerName"] for c in consumers] == [reader.consumer_name]
    assert consumers[0]["ConsumerARN"] != first_arn  # a new registration
    assert fanout.subscriptions_of(SHARD)[-1].consumer_arn == consumers[0]["ConsumerARN"]
    reader.close()


def test_a_missing_shard_is_its_end_as_java_kcl_has_it_not_an_endless_resubscription(kinesis, stream):
    """Java's FanOutRecordsPublisher marks a shard SubscribeToShard cannot find (the consumer ACTIVE) for
    completion; the reader failed the worker instead, which released the lease for the next cycle to fail again."""
    name = stream()
    reader = FanOutReader(kinesis, name, "shardId-000000000042", Checkpoint(TRIM_HORIZON), consumer=f"{name}-app",
                          event_wait=0.3)
    batches = []
    while not (batches and batches[-1].shard_ended):
        assert len(batches) < 10
        batches.append(reader.poll())
    assert batches[-1].records == [] and batches[-1].child_shards == [] and reader.ended
    with pytest.raises(ReaderError, match="already ended"):
        reader.poll()


def test_an_event_with_neither_continuation_nor_children_is_refused_and_read_again_not_a_shard_end(
        kinesis, kinesis_client, fanout, stream):
    """Java (DataRetrievalUtil.isValidResult) refuses such an event and subscribes again; the reader took it for the
    shard's end, ending an open shard with its later records never read."""
    name = stream()
    produce(kinesis_client, name, count=20, aggregate=1)
    fanout.records_per_event = 2
    fanout.faults.append(SubscriptionFault(after_events=2, kind="invalid-event"))
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 20)) == list(range(20))  # every record once: the refused event's were read again
    assert not reader.ended and reader.stats.subscription_errors == 1
    assert fanout.subscriptions_of(SHARD)[0].ended == "fault:invalid-event"
    reader.close()


def test_a_missing_stream_is_an_error_naming_it(kinesis, unique_name):
    from kcl_pipeline.kcl.shells.shards import StreamNotFound

    reader = _reader(kinesis, unique_name("gone"))
    with pytest.raises(StreamNotFound, match="does not exist"):
        reader.poll()


def test_an_endpoint_without_the_initial_response_is_a_clear_error(emulators, kinesis_client, stream):
    """kinesis-local itself answers SubscribeToShard without the initial-response event botocore needs."""
    name = stream()
    reader = _reader(once(emulators.kinesis, emulators.region), name)
    with pytest.raises(ReaderError, match="did not answer with an event stream botocore accepts"):
        reader.poll()


def test_a_checkpoint_mid_aggregate_restarts_after_its_sub_sequence(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=30, aggregate=10)
    first = _read(_reader(kinesis, name), 30)
    checkpoint = first[13].checkpoint  # the fourth user record of the second aggregate
    assert checkpoint.sub_sequence_number == 3
    reader = _reader(kinesis, name, start=checkpoint)
    assert _ids(_read(reader, 16)) == list(range(14, 30))
    assert fanout.subscriptions_of(SHARD)[-1].starting_position == {
        "Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": checkpoint.sequence_number}
    reader.close()


def test_a_latest_subscription_that_got_no_event_restarts_at_its_time_not_at_latest(kinesis, kinesis_client, fanout,
                                                                                     stream):
    name = stream()
    produce(kinesis_client, name, count=3)  # before LATEST: never read
    fanout.faults.append(SubscriptionFault(0, "drop"))
    reader = _reader(kinesis, name, start=Checkpoint(LATEST))
    assert reader.poll().records == []  # subscribed LATEST; the connection broke before any event
    produce(kinesis_client, name, count=4, first_id=3)  # after LATEST: LATEST again would skip them
    got: list[int] = []
    deadline = time.monotonic() + 60
    while not {3, 4, 5, 6} <= set(got):
        assert time.monotonic() < deadline, got
        got.extend(_ids(reader.poll().records))
    # AT_TIMESTAMP of the service's time less a second: records put just before LATEST may come too, once each.
    assert got[-4:] == [3, 4, 5, 6] and got == sorted(set(got)) and set(got) <= set(range(7))
    first, second = fanout.subscriptions_of(SHARD)[:2]
    assert first.starting_position == {"Type": "LATEST"} and second.starting_position["Type"] == "AT_TIMESTAMP"
    reader.close()


def test_a_shard_end_reports_its_children_and_stops_reading(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=12, aggregate=2)
    kinesis_client.split_shard(StreamName=name, ShardToSplit=SHARD, NewStartingHashKey=str(2 ** 127))
    wait_stream_active(kinesis_client, name)
    fanout.records_per_event = 2
    reader = _reader(kinesis, name)
    got, batch = [], None
    deadline = time.monotonic() + 60
    while batch is None or not batch.shard_ended:
        assert time.monotonic() < deadline
        batch = reader.poll()
        got.extend(batch.records)
    children = {s.shard_id for s in list_shards(kinesis_client, name) if s.parent_shard_id == SHARD}
    assert _ids(got) == list(range(12))
    assert set(batch.child_shards) == children and reader.ended
    assert fanout.subscriptions_of(SHARD)[-1].ended == "shard_end"
    with pytest.raises(ReaderError, match="already ended"):
        reader.poll()


def test_events_carry_the_service_time_never_ahead_of_it(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=3)
    reader = _reader(kinesis, name)
    before_ms = int(time.time() * 1000)  # the emulator and this test share the host's clock
    batches = []
    while sum(len(b.records) for b in batches) < 3 or len(batches) < 3:
        batches.append(reader.poll())
    stamped = [b.service_time_ms for b in batches if b.millis_behind_latest is not None]
    assert stamped and all(t is not None and t <= int(time.time() * 1000) for t in stamped)
    assert stamped == sorted(stamped) and stamped[-1] >= before_ms - 3000
    assert all(t % 1000 == 0 for t in stamped)  # whole seconds, as a GetRecords response's Date
    reader.close()


@pytest.mark.parametrize("code", ["InvalidArgumentException", "AccessDeniedException"])
def test_a_subscribe_refused_for_good_is_an_error_not_a_retry(kinesis, fanout, stream, code):
    name = stream()
    fanout.fail_operation("SubscribeToShard", code, times=None)
    with pytest.raises(ReaderError, match=f"SubscribeToShard of shard {SHARD} .*{code}"):
        _reader(kinesis, name).poll()
    assert fanout.counts["SubscribeToShard"] == 1


def test_a_subscribe_answered_with_a_server_error_is_kinesis_unavailable(kinesis, fanout, stream):
    name = stream()
    fanout.fail_operation("SubscribeToShard", "InternalFailureException", status=500, times=None)
    with pytest.raises(KinesisUnavailable, match="SubscribeToShard"):
        _reader(kinesis, name).poll()


def test_a_kms_error_inside_the_stream_is_an_error_not_a_resubscription_loop(kinesis, kinesis_client, fanout,
                                                                               stream):
    name = stream()
    produce(kinesis_client, name, count=4)
    fanout.faults.append(SubscriptionFault(1, "exception", "KMSDisabledException"))
    reader = _reader(kinesis, name)
    with pytest.raises(ReaderError, match="KMSDisabledException"):
        for _ in range(20):
            reader.poll()


class FakeClock:
    """The reader's clock and sleep: back-offs pass at once."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_subscriptions_failing_on_and_on_end_in_kinesis_unavailable(kinesis, fanout, stream):
    name = stream()
    fanout.fail_operation("SubscribeToShard", "ResourceInUseException", times=None)
    clock = FakeClock()
    reader = _reader(kinesis, name, sleep=clock.sleep, monotonic=clock.monotonic)
    with pytest.raises(KinesisUnavailable, match="failed 11 times in a row without an event"):
        for _ in range(20):
            reader.poll()
    assert fanout.counts["SubscribeToShard"] == 11 and reader.stats.subscription_errors == 11
    assert clock.now > 30  # backed off, exponentially, between them


def test_a_closed_reader_leaves_no_subscription_open(kinesis, kinesis_client, fanout, stream):
    name = stream()
    produce(kinesis_client, name, count=2)
    reader = _reader(kinesis, name)
    assert _ids(_read(reader, 2)) == [0, 1]
    reader.close()
    deadline = time.monotonic() + 30
    while fanout.subscriptions_of(SHARD)[0].open:  # its next heartbeat finds the connection gone
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert fanout.subscriptions_of(SHARD)[0].ended == "client_gone"
