"""KCL 3.5 coexistence, item 4: Java's two-phase checkpoint survives a take.

A Java processor may prepare a checkpoint (DynamoDBCheckpointer.prepareCheckpoint writes pendingCheckpoint,
pendingCheckpointSubSequenceNumber, pendingCheckpointState) and lose the lease before committing it. Java's take
(DynamoDBLeaseSerializer.getDynamoTakeLeaseUpdate) deletes only checkpointOwner: the next owner's processor is
handed the pending checkpoint. A checkpoint (setCheckpoint) then clears it. Our take used to delete it."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.core.table import lease_rules as rules
from kcl_pipeline.kcl.core.table.lease_codec import lease_from_item
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

KEY = "shardId-000000000004"
SEQ = "49590338271490256608559692538361571095921575989136588898"
PENDING = "49590338271490256608559692538361571095921575989136589999"
LATER = "49590338271490256608559692538361571095921575989136599999"

# A lease as Java leaves it after prepareCheckpoint (DynamoDBLeaseSerializer.getDynamoUpdateLeaseUpdate: checkpoint,
# checkpointSubSequenceNumber, ownerSwitchesSinceCheckpoint, pendingCheckpoint, pendingCheckpointSubSequenceNumber,
# pendingCheckpointState as bytes), held by a Java worker that then died (leaseOwner, leaseCounter as it left them).
JAVA_PREPARED = {
    "leaseKey": {"S": KEY}, "leaseOwner": {"S": "java-worker-1"}, "leaseCounter": {"N": "31"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": SEQ}, "checkpointSubSequenceNumber": {"N": "0"},
    "pendingCheckpoint": {"S": PENDING}, "pendingCheckpointSubSequenceNumber": {"N": "2"},
    "pendingCheckpointState": {"B": b"app-state-v1"}, "entityType": {"S": "LEASE"},
}
PENDING_NAMES = ("pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState")


@pytest.fixture
def table(any_dynamodb_client, unique_name) -> LeaseTable:
    t = LeaseTable(unique_name("pending"), any_dynamodb_client)
    t.ensure_table()
    any_dynamodb_client.put_item(TableName=t.table_name, Item=JAVA_PREPARED)
    return t


def raw(table: LeaseTable) -> dict:
    return table.client.get_item(TableName=table.table_name, Key={"leaseKey": {"S": KEY}}, ConsistentRead=True)["Item"]


def test_taking_a_java_lease_keeps_its_prepared_checkpoint_for_the_next_owners_processor(table):
    taken = table.acquire(KEY, "me", "java-worker-1", 31, claim="c1")
    assert taken is not None
    # What the worker hands its processor (InitializationInput.extra) is the item as taken: the prepared checkpoint.
    assert taken.extra["pendingCheckpoint"] == PENDING and taken.extra["pendingCheckpointSubSequenceNumber"] == 2
    assert taken.extra["pendingCheckpointState"] == b"app-state-v1"
    item = raw(table)
    assert all(item[name] == JAVA_PREPARED[name] for name in PENDING_NAMES)
    assert rules.acquire(lease_from_item(JAVA_PREPARED), "me", "java-worker-1", 31, claim="c1") == taken


def test_a_checkpoint_clears_the_prepared_checkpoint_as_javas_set_checkpoint_does(table):
    assert table.acquire(KEY, "me", "java-worker-1", 31) is not None
    assert table.heartbeat(KEY, "me", 32, checkpoint=Checkpoint(LATER))
    assert not set(PENDING_NAMES) & set(raw(table))
    assert rules.heartbeat(rules.acquire(lease_from_item(JAVA_PREPARED), "me", "java-worker-1", 31), "me", 32,
                           checkpoint=Checkpoint(LATER)) == table.get(KEY)


def test_the_ownerless_checkpoint_and_the_end_clear_it_too(table):
    assert table.release(KEY, "java-worker-1", 31)  # as if the holder had let it go
    assert table.checkpoint(KEY, Checkpoint(LATER))
    assert not set(PENDING_NAMES) & set(raw(table))
    table.client.put_item(TableName=table.table_name, Item={**JAVA_PREPARED, "leaseKey": {"S": "shardId-5"}})
    assert table.end("shardId-5", "java-worker-1", 31)
    assert not set(PENDING_NAMES) & set(table.client.get_item(
        TableName=table.table_name, Key={"leaseKey": {"S": "shardId-5"}}, ConsistentRead=True)["Item"])
