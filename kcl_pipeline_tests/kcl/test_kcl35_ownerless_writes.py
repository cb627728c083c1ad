"""KCL 3.5 coexistence, item 6: the pipeline's ownerless checkpoint and end never write under a Java holder.

The Dagster checkpoint path commits checkpoints without holding the lease (counter untouched) and ends a shard by
removing its owner. Under one of this consumer's holders that is the design; under a Java holder it is not Java's
semantics: Java's checkpoint (DynamoDBLeaseRefresher.updateLease) is conditioned on leaseCounter alone and sets
the checkpoint it has, so it overwrote ours — the checkpoint went back — and Java's renewal (renewLease) is
conditioned on leaseCounter too, so an end that removed leaseOwner left a Java holder renewing an ownerless lease.
Leases this protocol took carry leaseClaimOwner = leaseOwner; a Java take or assignment changes leaseOwner only."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

KEY = "shardId-000000000002"
BASE = "4959033827149025660855969253836157109592157598913658"


def seq(n: int) -> str:
    return f"{BASE}{n:04d}"


# Our holder took the lease (acquire: leaseOwner, leaseCounter, leaseClaim, leaseClaimOwner), then a Java worker
# took it: DynamoDBLeaseRefresher.takeLease sets leaseOwner and leaseCounter (getDynamoTakeLeaseUpdate deletes
# checkpointOwner) and leaves the attributes it does not know. The rest as DynamoDBLeaseSerializer writes it.
JAVA_HELD = {
    "leaseKey": {"S": KEY}, "leaseOwner": {"S": "java-worker-1"}, "leaseCounter": {"N": "12"},
    "ownerSwitchesSinceCheckpoint": {"N": "1"}, "checkpoint": {"S": seq(200)},
    "checkpointSubSequenceNumber": {"N": "0"}, "leaseClaim": {"S": "our-old-claim"},
    CLAIM_OWNER_ATTRIBUTE: {"S": "consumer-a"}, "entityType": {"S": "LEASE"},
}


@pytest.fixture
def table(any_dynamodb_client, unique_name) -> LeaseTable:
    t = LeaseTable(unique_name("ownerless"), any_dynamodb_client)
    t.ensure_table()
    return t


def put(table: LeaseTable, item: dict) -> None:
    table.client.put_item(TableName=table.table_name, Item=item)


def raw(table: LeaseTable) -> dict:
    return table.client.get_item(TableName=table.table_name, Key={"leaseKey": {"S": KEY}}, ConsistentRead=True)["Item"]


def java_checkpoint(table: LeaseTable, counter: int, sequence: str) -> None:
    """Java's updateLease: SET checkpoint (what its processor checkpointed), leaseCounter + 1 IF leaseCounter."""
    table.client.update_item(
        TableName=table.table_name, Key={"leaseKey": {"S": KEY}},
        UpdateExpression="SET checkpoint = :cp, checkpointSubSequenceNumber = :zero, leaseCounter = :next",
        ConditionExpression="leaseCounter = :c",
        ExpressionAttributeValues={":cp": {"S": sequence}, ":zero": {"N": "0"}, ":c": {"N": str(counter)},
                                   ":next": {"N": str(counter + 1)}})


def java_renew(table: LeaseTable, counter: int) -> None:
    """Java's renewLease: leaseCounter + 1 IF leaseCounter AND attribute_not_exists(checkpointOwner)."""
    table.client.update_item(
        TableName=table.table_name, Key={"leaseKey": {"S": KEY}}, UpdateExpression="SET leaseCounter = :next",
        ConditionExpression="leaseCounter = :c AND attribute_not_exists(checkpointOwner)",
        ExpressionAttributeValues={":c": {"N": str(counter)}, ":next": {"N": str(counter + 1)}})


def test_the_pipelines_checkpoint_never_moves_under_a_java_holder_so_it_never_goes_back(table):
    put(table, JAVA_HELD)
    seen = [raw(table)["checkpoint"]["S"]]
    assert table.checkpoint(KEY, Checkpoint(seq(300))) is False  # what we landed is ahead of Java's checkpoint
    seen.append(raw(table)["checkpoint"]["S"])
    java_checkpoint(table, 12, seq(250))  # the Java holder checkpoints what its processor did
    seen.append(raw(table)["checkpoint"]["S"])
    assert seen == [seq(200), seq(200), seq(250)] == sorted(seen)


def test_the_pipelines_end_never_removes_the_owner_under_a_renewing_java_holder(table):
    put(table, JAVA_HELD)
    assert table.end(KEY) is False
    java_renew(table, 12)
    item = raw(table)
    assert item["leaseOwner"] == {"S": "java-worker-1"} and item["checkpoint"] == {"S": seq(200)}
    assert item["leaseCounter"] == {"N": "13"}


def test_under_this_protocols_holder_and_on_a_free_lease_the_pipeline_commits_as_before(table):
    assert table.create(Lease(KEY, Checkpoint(TRIM_HORIZON)))
    assert table.acquire(KEY, "consumer-b", None, 0, claim="c1") is not None  # our holder: claim owner written
    assert raw(table)[CLAIM_OWNER_ATTRIBUTE] == {"S": "consumer-b"}
    assert table.checkpoint(KEY, Checkpoint(seq(300))) is True
    assert table.release(KEY, "consumer-b", 1)
    assert table.checkpoint(KEY, Checkpoint(seq(400))) is True  # free
    assert table.end(KEY) is True


def test_a_java_2x_lease_never_taken_by_this_protocol_is_java_held(table):
    # DynamoDBLeaseSerializer without entityType (KCL 2.x): leaseKey, leaseOwner, leaseCounter, checkpoint, ...
    put(table, {k: v for k, v in JAVA_HELD.items() if k not in ("leaseClaim", CLAIM_OWNER_ATTRIBUTE, "entityType")})
    assert table.checkpoint(KEY, Checkpoint(seq(300))) is False and table.end(KEY) is False


# A KCL 3.x leader's graceful hand-off (DynamoDBLeaseRefresher.initiateLeaseHandoff): leaseOwner = the next
# owner, checkpointOwner = the live holder, the counter untouched. Here the next owner is our consumer, whose
# earlier take left leaseClaimOwner = its worker id; the Java holder is still finishing (it renews with its
# counter alone and ends with its checkpoint).
JAVA_HANDING_TO_US = {**JAVA_HELD, "leaseOwner": {"S": "consumer-a"}, "checkpointOwner": {"S": "java-worker-1"}}


def java_finish_handoff(table: LeaseTable, counter: int, sequence: str) -> None:
    """The Java holder's last writes: its checkpoint (updateLease, fenced by the counter), then the eviction
    that removes checkpointOwner (counter + 1) so the next owner can start."""
    java_checkpoint(table, counter, sequence)
    table.client.update_item(
        TableName=table.table_name, Key={"leaseKey": {"S": KEY}},
        UpdateExpression="SET leaseCounter = :next REMOVE checkpointOwner",
        ConditionExpression="leaseCounter = :c AND checkpointOwner = :holder",
        ExpressionAttributeValues={":c": {"N": str(counter + 1)}, ":next": {"N": str(counter + 2)},
                                   ":holder": {"S": "java-worker-1"}})


def test_the_pipelines_checkpoint_never_lands_during_a_java_holders_hand_off_so_it_never_goes_back(table):
    put(table, JAVA_HANDING_TO_US)
    seen = [raw(table)["checkpoint"]["S"]]
    assert table.checkpoint(KEY, Checkpoint(seq(300))) is False  # the Java holder still owns the checkpoint
    seen.append(raw(table)["checkpoint"]["S"])
    java_finish_handoff(table, 12, seq(250))
    seen.append(raw(table)["checkpoint"]["S"])
    assert seen == [seq(200), seq(200), seq(250)] == sorted(seen)
    assert table.checkpoint(KEY, Checkpoint(seq(300))) is True  # handed over to our holder: ours again


def test_the_pipelines_end_never_lands_during_a_java_holders_hand_off_so_the_shard_stays_ended(table):
    put(table, JAVA_HANDING_TO_US)
    assert table.end(KEY) is False
    java_finish_handoff(table, 12, seq(250))
    item = raw(table)
    assert item["leaseOwner"] == {"S": "consumer-a"} and "checkpointOwner" not in item
    assert table.end(KEY) is True and raw(table)["checkpoint"] == {"S": "SHARD_END"}


def test_a_workers_flush_never_lands_during_a_hand_off_naming_it_as_the_next_owner(table):
    put(table, JAVA_HANDING_TO_US)
    assert table.checkpoint(KEY, Checkpoint(seq(300)), unless_held_by_another="consumer-a") is False
