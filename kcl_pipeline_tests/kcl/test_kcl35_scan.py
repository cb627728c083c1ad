"""KCL 3.5 coexistence, item 8: one corrupt item in the lease table must not fail every scan of every consumer.
Java's DynamoDBLeaseRefresher skips an item it cannot deserialize and logs it; so does the scan here, and the
items of other types KCL 3.5 keeps in the lease table are set apart, never read as leases."""
from __future__ import annotations

import logging

import pytest

from kcl_pipeline.kcl.core.table.lease_codec import LeaseScan, lease_from_item, scan_entities
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

SEQ = "49590338271490256608559692538361571095921575989136588898"

# A lease exactly as Java writes it: DynamoDBLeaseSerializer.toDynamoRecord — leaseKey, leaseCounter,
# leaseOwner, ownerSwitchesSinceCheckpoint, checkpoint, checkpointSubSequenceNumber, parentShardId,
# startingHashKey / endingHashKey (HashKeyRangeForLease), throughputKBps, entityType (EntityType.LEASE "LEASE").
JAVA_LEASE = {
    "leaseKey": {"S": "shardId-000000000001"}, "leaseCounter": {"N": "17"}, "leaseOwner": {"S": "java-worker-1"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": SEQ}, "checkpointSubSequenceNumber": {"N": "0"},
    "parentShardId": {"SS": ["shardId-000000000000"]}, "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "170141183460469231731687303715884105727"}, "throughputKBps": {"N": "4.5"},
    "entityType": {"S": "LEASE"},
}
# The migration state as KCL 3.5 keeps it in the lease table: CoordinatorState.serialize (entityType
# CLIENT_VERSION_MIGRATION) + MigrationState.serialize (cv, mb, mts), keyed by the table's leaseKey.
JAVA_MIGRATION = {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
                  "cv": {"S": "CLIENT_VERSION_3X"}, "mb": {"S": "java-worker-1"}, "mts": {"N": "1732441200000"}}


def corrupt(**changes) -> dict:
    return {**JAVA_LEASE, "leaseKey": {"S": "shardId-000000000009"}, **changes}


@pytest.mark.emulator
@pytest.mark.parametrize("bad", [
    corrupt(leaseCounter={"S": "17"}),                       # a counter of the wrong type
    corrupt(checkpoint={"S": "not-a-sequence-number"}),       # a checkpoint no reader can start from
    {k: v for k, v in corrupt().items() if k != "checkpoint"},  # half-written: no checkpoint at all
], ids=["counter-type", "checkpoint-value", "no-checkpoint"])
def test_a_corrupt_item_is_skipped_and_logged_instead_of_failing_the_whole_scan(
        any_dynamodb_client, unique_name, bad, caplog):
    table = LeaseTable(unique_name("corrupt"), any_dynamodb_client, scan_page_size=1)
    table.ensure_table()
    for item in (JAVA_LEASE, bad, JAVA_MIGRATION):
        any_dynamodb_client.put_item(TableName=table.table_name, Item=item)
    with caplog.at_level(logging.ERROR, logger="kcl_pipeline.kcl.shells.lease_table"):
        scanned = table.scan()
    assert [lease.lease_key for lease in scanned] == ["shardId-000000000001"]
    assert scanned[0] == lease_from_item(JAVA_LEASE)
    assert scanned.skipped == ("shardId-000000000009",) and table.corrupt_items == 1
    assert "shardId-000000000009" in caplog.text and "skipping" in caplog.text
    assert scan_entities(scanned) == (JAVA_MIGRATION,)  # set apart, not a lease, not an error


def test_a_plain_list_carries_no_entities():
    assert scan_entities([]) is None
    assert scan_entities(LeaseScan()) == ()
