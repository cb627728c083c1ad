"""KCL 3.5 coexistence, item 7: a multi-stream lease key is whatever the Java application configured.

Java's multi-stream applications name each stream by a serialized StreamIdentifier `<account>:<name>:<creationEpoch>`
(StreamIdentifier.multiStreamInstance): the account is any run of digits and the creation epoch is the
application's (> 0), never checked against DescribeStreamSummary. Reading the epoch from DescribeStreamSummary and
requiring 12 account digits gave a fleet whose Java side wrote another epoch a second set of leases for the same
shards. A stream configured by its identifier (`--stream 1:orders:5`) now uses exactly that identifier."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.config import ConfigError, ConsumerConfig
from kcl_pipeline.kcl.core.lineage import leases_to_create, scoped_leases
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint
from kcl_pipeline.kcl.core.streams import (
    StreamScope,
    identifier_parts,
    parse_multi_stream_key,
    scope_of,
    stream_name,
)
from kcl_pipeline.kcl.core.table.lease_codec import lease_from_item, lease_to_item
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_application_shards, stream_scope, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec

SEQ = "49590338271490256608559692538361571095921575989136588898"


def java_multi_stream_lease(identifier: str, shard_id: str, owner: str = "java-worker-1") -> dict:
    # Exactly as Java writes a multi-stream lease: DynamoDBMultiStreamLeaseSerializer.toDynamoRecord adds
    # streamName (the serialized StreamIdentifier) and shardId to DynamoDBLeaseSerializer's leaseKey, leaseOwner,
    # leaseCounter, ownerSwitchesSinceCheckpoint, checkpoint, checkpointSubSequenceNumber and entityType.
    return {"leaseKey": {"S": f"{identifier}:{shard_id}"}, "leaseOwner": {"S": owner}, "leaseCounter": {"N": "9"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": SEQ},
            "checkpointSubSequenceNumber": {"N": "0"}, "streamName": {"S": identifier}, "shardId": {"S": shard_id},
            "entityType": {"S": "LEASE"}}


# -- account ids and epochs as Java accepts them ---------------------------------------------------------------

@pytest.mark.parametrize("identifier", ["1:orders:5", "0123:orders:1700000000", "123456789012:orders:42"])
def test_a_java_multi_stream_key_with_any_account_digits_is_a_multi_stream_key(identifier):
    item = java_multi_stream_lease(identifier, "shardId-000000000001")
    assert parse_multi_stream_key(item["leaseKey"]["S"]) == (identifier, "shardId-000000000001")
    lease = lease_from_item(item)
    assert lease_to_item(lease) == item  # round-trips attribute for attribute


def test_an_identifier_with_creation_epoch_0_is_refused_as_java_refuses_it():
    assert parse_multi_stream_key("1:orders:0:shardId-000000000001") is None
    with pytest.raises(ValueError, match="creation epoch must be > 0"):
        identifier_parts("1:orders:0")
    with pytest.raises(ConfigError, match="creation epoch must be > 0"):
        ConsumerConfig(stream="1:orders:0", more_streams=("clicks",), application="app")


# -- a stream configured by its identifier ---------------------------------------------------------------------

def test_a_configured_identifier_is_used_as_given_and_the_api_is_called_by_name():
    config = ConsumerConfig(stream="1:orders:5", more_streams=("clicks",), application="app")
    assert config.stream_name == "orders" and stream_name("1:orders:5") == "orders"
    scope = scope_of(config.streams, "1:orders:5:shardId-000000000003")
    assert scope == StreamScope("orders", "1:orders:5", pinned=True)
    assert scope.shard_id("1:orders:5:shardId-000000000003") == "shardId-000000000003"
    with pytest.raises(ValueError, match="not one of this consumer's streams"):
        scope_of(config.streams, "1:orders:6:shardId-000000000003")  # another epoch: not this application's
    with pytest.raises(ConfigError, match="named twice"):
        ConsumerConfig(stream="1:orders:5", more_streams=("orders",), application="app")


class _Kinesis:
    """ListShards only: a configured identifier needs no DescribeStreamSummary."""

    def __init__(self):
        self.calls = []

    def list_shards(self, **kwargs):
        self.calls.append(("ListShards", kwargs))
        return {"Shards": [{"ShardId": "shardId-000000000000", "SequenceNumberRange": {"StartingSequenceNumber": "1"},
                            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}]}

    def describe_stream_summary(self, **kwargs):  # pragma: no cover - must not be called
        raise AssertionError("DescribeStreamSummary called for a configured identifier")


def test_a_fleet_whose_java_side_wrote_another_epoch_gets_no_second_set_of_leases():
    kinesis = _Kinesis()
    shards = list_application_shards(kinesis, ("7:orders:5",), multi_stream=True)
    assert kinesis.calls == [("ListShards", {"StreamName": "orders"})]
    assert [s.shard_id for s in shards] == ["7:orders:5:shardId-000000000000"]
    java = [lease_from_item(java_multi_stream_lease("7:orders:5", "shardId-000000000000"))]
    assert [lease.lease_key for lease in scoped_leases(java, shards)] == ["7:orders:5:shardId-000000000000"]
    assert leases_to_create(Checkpoint(TRIM_HORIZON), shards, java) == []
    assert stream_scope(kinesis, "7:orders:5") == StreamScope("orders", "7:orders:5", pinned=True)


@pytest.mark.emulator
def test_the_manager_takes_javas_leases_of_a_configured_identifier_and_creates_none_beside_them(
        emulators, kinesis_client, dynamodb_client, unique_name):
    orders, clicks, app = unique_name("pin"), unique_name("pinc"), unique_name("pinapp")
    for stream in (orders, clicks):
        kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    for stream in (orders, clicks):
        wait_stream_active(kinesis_client, stream)
    identifier = f"42:{orders}:1234"  # what the Java side configured: not this account, not the creation time
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    dynamodb_client.put_item(TableName=app, Item=java_multi_stream_lease(identifier, "shardId-000000000000",
                                                                        owner="java-worker-gone"))
    config = ConsumerConfig(stream=identifier, more_streams=(clicks,), application=app, worker_id="me",
                            heartbeat_seconds=1.0, lease_expiry_seconds=3.0, leases_to_acquire=4,
                            aws=emulators.aws_settings())
    clock = [1000.0]
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"), clock=lambda: clock[0])
    spawned = []
    manager._spawn = lambda spawn: spawned.append(spawn.lease.lease_key)
    manager.start()
    first = manager.run_cycle()
    clicks_key = f"{stream_scope(kinesis_client, clicks).identifier}:shardId-000000000000"
    assert first.created == [clicks_key]  # the other stream's lease: created as before, from its real creation time
    clock[0] += 10.0  # the Java worker's lease expired (its counter stood still for the expiry)
    manager.run_cycle()
    assert f"{identifier}:shardId-000000000000" in spawned
    keys = sorted(lease.lease_key for lease in table.scan())
    assert keys == sorted([f"{identifier}:shardId-000000000000", clicks_key])  # no second set for the same shard
