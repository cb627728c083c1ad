"""Multi-stream lease keys (KCL's `account:stream:creationEpoch:shardId`) and their items, as Java writes them."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kcl_pipeline.kcl.config import ConfigError, ConsumerConfig
from kcl_pipeline.kcl.core.lineage import leases_to_create, scoped_leases
from kcl_pipeline.kcl.core.model import Checkpoint, HashKeyRange, Shard
from kcl_pipeline.kcl.core.streams import (
    StreamScope,
    multi_stream_attributes,
    parse_multi_stream_key,
    scope_of,
    stream_identifier,
)
from kcl_pipeline.kcl.core.table.lease_codec import lease_from_item, lease_to_item

ORDERS = StreamScope("orders", "123456789012:orders:1700000000")
CLICKS = StreamScope("clicks", "123456789012:clicks:1700000500")

# A lease as KCL 2.x/3.x's DynamoDBMultiStreamLeaseSerializer writes it: parents by shard id, streamName and
# shardId beside the key, and 3.x attributes this consumer does not manage.
JAVA_ITEM = {
    "leaseKey": {"S": "123456789012:orders:1700000000:shardId-000000000002"},
    "leaseCounter": {"N": "7"}, "leaseOwner": {"S": "java-worker"},
    "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
    "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "1"},
    "parentShardId": {"SS": ["shardId-000000000000"]},
    "startingHashKey": {"S": "0"}, "endingHashKey": {"S": "170141183460469231731687303715884105727"},
    "streamName": {"S": "123456789012:orders:1700000000"}, "shardId": {"S": "shardId-000000000002"},
    "checkpointOwner": {"S": "java-worker"}, "throughputKBps": {"N": "12.5"}, "entityType": {"S": "LEASE"},
}


def test_a_java_multi_stream_item_round_trips_unchanged_and_names_its_parents_by_lease_key():
    lease = lease_from_item(JAVA_ITEM)
    assert lease.parent_shard_ids == ("123456789012:orders:1700000000:shardId-000000000000",)
    assert lease_to_item(lease) == JAVA_ITEM


def test_a_new_multi_stream_lease_is_written_as_java_writes_it():
    shards = ORDERS.shards([Shard("shardId-000000000000", hash_key_range=HashKeyRange("0", "9")),
                            Shard("shardId-000000000001", parent_shard_id="shardId-000000000000",
                                  hash_key_range=HashKeyRange("0", "4"))])
    assert [s.shard_id for s in shards] == [ORDERS.lease_key("shardId-000000000000"),
                                           ORDERS.lease_key("shardId-000000000001")]
    assert shards[1].parent_ids == (ORDERS.lease_key("shardId-000000000000"),)
    created = leases_to_create(Checkpoint("TRIM_HORIZON"), shards, [])
    assert created
    for lease in created:
        item = lease_to_item(lease)
        assert item["streamName"] == {"S": ORDERS.identifier}
        assert item["shardId"] == {"S": ORDERS.shard_id(lease.lease_key)}
        assert all(":" not in p for p in item.get("parentShardId", {}).get("SS", []))  # shard ids, as Java
        assert lease_to_item(lease_from_item(item)) == item


def test_two_streams_with_the_same_shard_ids_never_share_a_lease():
    listed = [Shard("shardId-000000000000")]
    shards = ORDERS.shards(listed) + CLICKS.shards(listed)
    leases = [lease_from_item({**JAVA_ITEM, "leaseKey": {"S": CLICKS.lease_key("shardId-000000000000")},
                               "streamName": {"S": CLICKS.identifier}, "shardId": {"S": "shardId-000000000000"}})]
    assert [lease.lease_key for lease in scoped_leases(leases, shards)] == [CLICKS.lease_key("shardId-000000000000")]
    # The same stream re-created (a new creation time): its old leases are not its leases.
    recreated = StreamScope("clicks", "123456789012:clicks:1700009999")
    assert scoped_leases(leases, recreated.shards(listed)) == []


def test_scope_translation_and_its_errors():
    assert ORDERS.shard_id(ORDERS.lease_key("shardId-1")) == "shardId-1"
    with pytest.raises(ValueError, match="not a lease of stream"):
        ORDERS.shard_id(CLICKS.lease_key("shardId-1"))
    single = StreamScope("orders")
    assert single.lease_key("shardId-1") == "shardId-1" == single.shard_id("shardId-1")
    assert single.shards([Shard("s")]) == [Shard("s")]
    assert ORDERS.creation_epoch == 1700000000 and ORDERS.name == "orders"
    assert parse_multi_stream_key("shardId-000000000001") is None
    assert parse_multi_stream_key("Migration3.0") is None
    assert multi_stream_attributes("shardId-000000000001") == {}
    assert scope_of(["orders", "clicks"], CLICKS.lease_key("shardId-1")) == CLICKS
    assert scope_of(["orders"], "shardId-1") == StreamScope("orders")
    with pytest.raises(ValueError, match="not one of this consumer's streams"):
        scope_of(["orders", "views"], CLICKS.lease_key("shardId-1"))
    with pytest.raises(ValueError, match="not a multi-stream lease key"):
        scope_of(["orders", "clicks"], "shardId-1")


def test_stream_identifier_from_describe_stream_summary():
    summary = {"StreamARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders", "StreamName": "orders",
               "StreamCreationTimestamp": datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)}
    assert stream_identifier(summary) == "123456789012:orders:1700000000"
    with pytest.raises(ValueError, match="names no account"):
        stream_identifier({**summary, "StreamARN": "orders"})


def test_a_multi_stream_config_names_each_stream_once():
    config = ConsumerConfig(stream="orders", more_streams=("clicks",), application="app")
    assert config.streams == ("orders", "clicks") and config.multi_stream
    assert not ConsumerConfig(stream="orders", application="app").multi_stream
    with pytest.raises(ConfigError, match="named twice"):
        ConsumerConfig(stream="orders", more_streams=("arn:aws:kinesis:eu-west-1:123456789012:stream/orders",),
                       application="app")
    with pytest.raises(ConfigError, match="must be 1-128"):
        ConsumerConfig(stream="orders", more_streams=("bad name",), application="app")
    with pytest.raises(ConfigError, match="tuple"):
        ConsumerConfig(stream="orders", more_streams="clicks", application="app")
