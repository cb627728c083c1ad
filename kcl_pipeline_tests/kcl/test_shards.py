"""Shard discovery: ListShards paging, stream ARN and status, errors (Stubber units, kinesis-local integration)."""
from __future__ import annotations

import botocore.session
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from kcl_pipeline.kcl.core.model import Shard
from kcl_pipeline.kcl.shells.shards import (
    KinesisError,
    KinesisUnavailable,
    StreamNotFound,
    list_shards,
    stream_arn,
    wait_stream_active,
)

ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"


@pytest.fixture
def kinesis():
    kin = botocore.session.get_session().create_client(
        "kinesis", region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(kin) as stub:
        kin.stub = stub
        yield kin
        stub.assert_no_pending_responses()


def shard(n: int, parent: int | None = None) -> dict:
    item = {"ShardId": f"shardId-{n:012d}", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
            "SequenceNumberRange": {"StartingSequenceNumber": "1"}}
    if parent is not None:
        item["ParentShardId"] = f"shardId-{parent:012d}"
    return item


def summary(status: str) -> dict:
    return {"StreamDescriptionSummary": {
        "StreamName": "orders", "StreamARN": ARN, "StreamStatus": status, "RetentionPeriodHours": 24,
        "StreamCreationTimestamp": "2026-11-22T00:00:00Z", "EnhancedMonitoring": [], "OpenShardCount": 1}}


def test_list_shards_pages_with_next_token_only_and_keeps_order(kinesis):
    kinesis.stub.add_response("list_shards", {"Shards": [shard(3), shard(1)], "NextToken": "t1"},
                              {"StreamName": "orders"})
    kinesis.stub.add_response("list_shards", {"Shards": [shard(7, parent=3)], "NextToken": "t2"}, {"NextToken": "t1"})
    kinesis.stub.add_response("list_shards", {"Shards": [shard(2)]}, {"NextToken": "t2"})
    shards = list_shards(kinesis, "orders")
    assert [s.shard_id for s in shards] == [f"shardId-{n:012d}" for n in (3, 1, 7, 2)]
    assert shards[2] == Shard.from_api(shard(7, parent=3)) and shards[2].parent_shard_id == "shardId-000000000003"


def test_list_shards_by_arn(kinesis):
    kinesis.stub.add_response("list_shards", {"Shards": [shard(0)]}, {"StreamARN": ARN})
    assert [s.shard_id for s in list_shards(kinesis, ARN)] == ["shardId-000000000000"]


def test_missing_stream_names_stream_region_and_endpoint(kinesis):
    kinesis.stub.add_client_error("list_shards", "ResourceNotFoundException", "Stream orders not found")
    with pytest.raises(StreamNotFound) as err:
        list_shards(kinesis, "orders")
    assert str(err.value) == ("Kinesis stream orders does not exist in region eu-west-1 "
                              "(endpoint https://kinesis.eu-west-1.amazonaws.com)")


def test_server_error_after_retries_is_unavailable(kinesis):
    kinesis.stub.add_client_error("list_shards", "InternalFailure", "boom", http_status_code=500,
                                  response_meta={"RetryAttempts": 7})
    with pytest.raises(KinesisUnavailable, match="ListShards failed in region eu-west-1 .* after 8 attempts"):
        list_shards(kinesis, "orders")


def test_other_client_errors_pass_through(kinesis):
    kinesis.stub.add_client_error("list_shards", "AccessDeniedException", "no")
    with pytest.raises(Exception, match="AccessDeniedException") as err:
        list_shards(kinesis, "orders")
    assert not isinstance(err.value, KinesisError)


def test_unreachable_endpoint_is_unavailable():
    kin = botocore.session.get_session().create_client(
        "kinesis", region_name="us-east-1", endpoint_url="http://127.0.0.1:9", aws_access_key_id="x",
        aws_secret_access_key="x", config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=2))
    with pytest.raises(KinesisUnavailable, match=r"ListShards failed in region us-east-1 \(endpoint http://127.0.0.1:9\)"):
        list_shards(kin, "orders")


def test_stream_arn(kinesis):
    kinesis.stub.add_response("describe_stream_summary", summary("ACTIVE"), {"StreamName": "orders"})
    assert stream_arn(kinesis, "orders") == ARN


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_wait_stream_active_polls_until_active(kinesis):
    for status in ("CREATING", "UPDATING", "ACTIVE"):
        kinesis.stub.add_response("describe_stream_summary", summary(status), {"StreamName": "orders"})
    clock = Clock()
    assert wait_stream_active(kinesis, "orders", 10, poll_interval=0.5, sleep=clock.sleep,
                              monotonic=lambda: clock.now)["StreamStatus"] == "ACTIVE"
    assert clock.sleeps == [0.5, 0.5]


def test_wait_stream_active_times_out(kinesis):
    for _ in range(3):
        kinesis.stub.add_response("describe_stream_summary", summary("CREATING"), {"StreamName": "orders"})
    clock = Clock()
    with pytest.raises(KinesisError, match="orders .* is still CREATING after 1 s"):
        wait_stream_active(kinesis, "orders", 1, poll_interval=0.5, sleep=clock.sleep, monotonic=lambda: clock.now)


def test_wait_stream_active_on_a_deleting_stream(kinesis):
    kinesis.stub.add_response("describe_stream_summary", summary("DELETING"), {"StreamName": "orders"})
    with pytest.raises(StreamNotFound, match="being deleted"):
        wait_stream_active(kinesis, "orders", 10)


# -- integration: kinesis-local over HTTP --------------------------------------------------------------
def test_emulator_list_shards_pages_over_100_shards(kinesis_client, unique_name):
    stream = unique_name("many-shards")
    kinesis_client.create_stream(StreamName=stream, ShardCount=120)
    try:
        wait_stream_active(kinesis_client, stream, 30)
        first_page = kinesis_client.list_shards(StreamName=stream)
        assert len(first_page["Shards"]) == 100 and first_page.get("NextToken")  # the emulator's page cap
        shards = list_shards(kinesis_client, stream)
        assert [s.shard_id for s in shards] == [f"shardId-{n:012d}" for n in range(120)]
        assert all(s.ending_sequence_number is None for s in shards)
    finally:
        kinesis_client.delete_stream(StreamName=stream)  # closed shards count against SHARD_LIMIT


def test_emulator_missing_stream(kinesis_client, aws_settings, unique_name):
    name = unique_name("absent")
    with pytest.raises(StreamNotFound) as err:
        list_shards(kinesis_client, name)
    assert str(err.value) == (f"Kinesis stream {name} does not exist in region {aws_settings.resolved_region()} "
                              f"(endpoint {aws_settings.endpoint_for('kinesis')})")
    with pytest.raises(StreamNotFound):
        stream_arn(kinesis_client, name)


def test_emulator_stream_arn_and_split_listing(kinesis_client, unique_name):
    stream = unique_name("arn")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    summary_ = wait_stream_active(kinesis_client, stream, 30)
    arn = stream_arn(kinesis_client, stream)
    assert arn == summary_["StreamARN"] and arn.endswith(f":stream/{stream}")
    kinesis_client.split_shard(StreamName=stream, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127))
    wait_stream_active(kinesis_client, stream, 30)
    shards = list_shards(kinesis_client, arn)
    assert [s.shard_id for s in shards] == ["shardId-000000000000", "shardId-000000000001", "shardId-000000000002"]
    assert shards[0].ending_sequence_number is not None  # closed
    assert [s.parent_shard_id for s in shards[1:]] == ["shardId-000000000000"] * 2
