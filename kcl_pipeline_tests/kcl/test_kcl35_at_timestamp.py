"""KCL 3.5 coexistence, item 3: AT_TIMESTAMP as Java writes and reads it.

Java's HierarchicalShardSyncer creates an AT_TIMESTAMP lease with the sentinel ExtendedSequenceNumber.AT_TIMESTAMP
(sub-sequence 0), and its IteratorBuilder takes the timestamp from the application's InitialPositionInStreamExtended,
never from the lease. Reading that 0 as epoch milliseconds started a Java-created lease in 1970: the whole
retention."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.config import ConsumerConfig, InitialPosition
from kcl_pipeline.kcl.core.lease.effects import Spawn
from kcl_pipeline.kcl.core.lease.lease_life import AtTimestampUnknown, start_position
from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_codec import lease_from_item, lease_to_item
from kcl_pipeline.kcl.processor import RecordProcessor
from kcl_pipeline.kcl.shells.read.reader import ShardReader
from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker

CONFIGURED = "2026-11-22T03:00:00.123Z"
CONFIGURED_MS = 1795316400123

# A new lease exactly as Java writes it (DynamoDBLeaseSerializer.toDynamoRecord of a HierarchicalShardSyncer lease
# at InitialPositionInStream.AT_TIMESTAMP): leaseKey, leaseCounter, ownerSwitchesSinceCheckpoint, checkpoint =
# SentinelCheckpoint.AT_TIMESTAMP, checkpointSubSequenceNumber = 0, startingHashKey / endingHashKey, entityType.
JAVA_AT_TIMESTAMP_LEASE = {
    "leaseKey": {"S": "shardId-000000000000"}, "leaseCounter": {"N": "0"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"}, "checkpoint": {"S": "AT_TIMESTAMP"},
    "checkpointSubSequenceNumber": {"N": "0"}, "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "340282366920938463463374607431768211455"}, "entityType": {"S": "LEASE"},
}


def iterator_timestamp(start: Checkpoint) -> datetime:
    reader = ShardReader(object(), "orders", "shardId-000000000000", start)
    return reader._iterator_request()["Timestamp"]


def test_a_java_created_at_timestamp_lease_is_read_from_the_configured_timestamp_not_from_1970():
    lease = lease_from_item(JAVA_AT_TIMESTAMP_LEASE)
    start = start_position(lease.checkpoint, None, CONFIGURED_MS)
    assert start == Checkpoint(AT_TIMESTAMP, CONFIGURED_MS)
    assert iterator_timestamp(start) == datetime(2026, 11, 22, 3, 0, 0, 123000, tzinfo=timezone.utc)


class _Unused(RecordProcessor):
    """A processor nothing is delivered to (it resumes nowhere of its own)."""


def test_the_worker_starts_a_java_created_at_timestamp_lease_at_its_configured_timestamp():
    config = ConsumerConfig(stream="orders", application="app", worker_id="me",
                            initial_position=InitialPosition.parse(AT_TIMESTAMP, CONFIGURED),
                            aws=AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9"))
    lease = lease_from_item(JAVA_AT_TIMESTAMP_LEASE)
    worker = LeaseWorker(config, Spawn(lease), processor=_Unused())
    assert worker._start_position(lease) == Checkpoint(AT_TIMESTAMP, CONFIGURED_MS)


def test_a_new_at_timestamp_lease_is_written_as_java_writes_it_with_sub_sequence_0():
    initial = InitialPosition.parse(AT_TIMESTAMP, CONFIGURED).checkpoint()
    item = lease_to_item(Lease("shardId-000000000000", initial,
                               starting_hash_key="0", ending_hash_key="340282366920938463463374607431768211455"))
    assert item["checkpoint"] == {"S": "AT_TIMESTAMP"} and item["checkpointSubSequenceNumber"] == {"N": "0"}
    assert JAVA_AT_TIMESTAMP_LEASE == item  # entityType LEASE included, as KCL 3.x's serializer writes it


def test_the_configured_timestamp_wins_over_one_an_earlier_version_stored_in_the_lease():
    # Earlier versions of this consumer kept the timestamp in the sub-sequence: Java ignores it, and so do we
    # when a timestamp is configured; without one, it is still the best record of where the lease starts.
    assert start_position(Checkpoint(AT_TIMESTAMP, 1700000000000), None, CONFIGURED_MS) == \
        Checkpoint(AT_TIMESTAMP, CONFIGURED_MS)
    assert start_position(Checkpoint(AT_TIMESTAMP, 1700000000000), None, None) == \
        Checkpoint(AT_TIMESTAMP, 1700000000000)


def test_a_java_at_timestamp_lease_without_a_configured_timestamp_is_refused_not_read_from_1970():
    with pytest.raises(AtTimestampUnknown, match="--initial-position AT_TIMESTAMP --timestamp"):
        start_position(lease_from_item(JAVA_AT_TIMESTAMP_LEASE).checkpoint, None, None)


def test_a_landed_position_still_wins_over_the_initial_timestamp():
    landed = Checkpoint("49590338271490256608559692538361571095921575989136588898", 2)
    assert start_position(Checkpoint(AT_TIMESTAMP), landed, CONFIGURED_MS) == landed
