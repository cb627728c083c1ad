"""Landing progress on lease items: attribute names, round trips, merging reports from many consumers."""
from __future__ import annotations

from decimal import Decimal

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_codec import encode_value
from kcl_pipeline.kcl.core.table.lease_rules import JAVA_HANDOVER_ATTRIBUTES, LEASE_ATTRIBUTES
from kcl_pipeline.zone.progress import (
    ATTRIBUTES,
    ShardProgress,
    merge_all,
    merge_progress,
    progress_from_leases,
)

from .helpers import SHARD, seq

FULL = ShardProgress(SHARD, Checkpoint(seq(42), 3), 1_000, 2_000, 0, True, "s/dt=…/k.parquet", 1_500)

# Every attribute Java KCL 2.x/3.x writes on a lease item (KCL 3 adds these beside the 2.x ones).
JAVA_NAMES = set(LEASE_ATTRIBUTES) | set(JAVA_HANDOVER_ATTRIBUTES) | {
    "leaseKey", "leaseOwner", "leaseCounter", "checkpoint", "checkpointSubSequenceNumber",
    "pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState",
    "ownerSwitchesSinceCheckpoint", "parentShardId", "childShardIds", "startingHashKey", "endingHashKey",
    "throughputKBps", "checkpointOwner", "isMarkedForLeaseSteal", "entityType", "lastCounterIncrementNanos"}


def test_names_never_collide_with_java():
    assert not JAVA_NAMES & set(ATTRIBUTES)
    assert all(name.startswith("landing") for name in ATTRIBUTES)
    assert set(FULL.to_attributes()) == set(ATTRIBUTES)


@pytest.mark.parametrize("progress", [
    FULL,
    ShardProgress(SHARD, polled_at_ms=5, millis_behind_latest=10),
    ShardProgress(SHARD, Checkpoint(seq(1)), 7, last_batch_key="k"),
    ShardProgress(SHARD, Checkpoint(seq(1)), 7, next_arrival_ms=9),
])
def test_round_trip_plain_and_dynamodb_typed(progress):
    attrs = progress.to_attributes()
    plain = {k: v for k, v in attrs.items() if v is not None}
    assert ShardProgress.from_attributes(SHARD, plain) == progress
    typed = {k: encode_value(v) for k, v in plain.items()}
    assert ShardProgress.from_attributes(SHARD, typed) == progress
    boto3_style = {k: Decimal(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in plain.items()}
    assert ShardProgress.from_attributes(SHARD, boto3_style) == progress


def test_absent_and_malformed():
    assert ShardProgress.from_attributes(SHARD, {"other": 1}) is None
    odd = ShardProgress.from_attributes(SHARD, {
        "landingSequenceNumber": "007", "landingArrivalMillis": "soon", "landingPolledAtMillis": 1.5,
        "landingMillisBehindLatest": 0, "landingShardEnd": "yes"})
    assert odd == ShardProgress(SHARD, None, None, None, 0, False, None)


def test_a_next_arrival_without_the_landed_record_it_follows_is_dropped():
    """The next record's arrival says something only about the record after `landed`: alone (a holder that
    landed nothing, a malformed item) it is never read, nor written."""
    assert ShardProgress.from_attributes(SHARD, {"landingNextArrivalMillis": 5, "landingPolledAtMillis": 1}) == \
        ShardProgress(SHARD, polled_at_ms=1)
    assert ShardProgress(SHARD, next_arrival_ms=5).to_attributes()["landingNextArrivalMillis"] is None


def test_merge_keeps_the_next_arrival_with_the_landed_record_it_follows():
    held = ShardProgress(SHARD, Checkpoint(seq(5)), 100, next_arrival_ms=130)
    flushed = ShardProgress(SHARD, Checkpoint(seq(9)), 200)  # landed past the held record: no next held
    assert merge_progress(held, flushed) == flushed and merge_progress(flushed, held) == flushed
    other = ShardProgress(SHARD, Checkpoint(seq(5)), 100, polled_at_ms=50, millis_behind_latest=0)
    for a, b in [(held, other), (other, held)]:  # the same landed record: the report that read its successor
        assert merge_progress(a, b).next_arrival_ms == 130


def test_from_leases_reads_extra():
    leases = [Lease(SHARD, Checkpoint(seq(1)), extra={k: v for k, v in FULL.to_attributes().items()}),
              Lease("shardId-000000000001", Checkpoint("TRIM_HORIZON"))]
    assert progress_from_leases(leases) == {SHARD: FULL}
    assert ShardProgress.from_lease(leases[1]) is None


def test_merge_takes_each_fact_from_the_newer_report():
    old = ShardProgress(SHARD, Checkpoint(seq(5)), 100, polled_at_ms=900, millis_behind_latest=0)
    new = ShardProgress(SHARD, Checkpoint(seq(9)), 200, polled_at_ms=500, millis_behind_latest=40,
                        last_batch_key="k9")
    merged = merge_progress(old, new)
    assert merged == ShardProgress(SHARD, Checkpoint(seq(9)), 200, 900, 0, False, "k9")
    assert merge_progress(new, old) == merged  # a late report never moves progress back
    assert merge_progress(merged, ShardProgress(SHARD, shard_end_landed=True)).shard_end_landed
    assert merge_progress(None, old) is old and merge_progress(old, None) is old
    with pytest.raises(ValueError):
        merge_progress(old, ShardProgress("other"))
    assert merge_all({SHARD: old}, {SHARD: new, "b": ShardProgress("b")}) == {SHARD: merged, "b": ShardProgress("b")}


def test_progress_rides_on_the_heartbeat(dynamodb_client, unique_name):
    """Through the real lease table (dynalite): written by the heartbeat, read back by every scanner."""
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    table = LeaseTable(unique_name("leases"), dynamodb_client)
    table.ensure_table()
    assert table.create(Lease(SHARD, Checkpoint("TRIM_HORIZON")))
    assert table.acquire(SHARD, "w1", None, 0) is not None
    assert table.heartbeat(SHARD, "w1", 1, FULL.to_attributes())
    (lease,) = table.scan()
    assert ShardProgress.from_lease(lease) == FULL
    assert lease.lease_counter == 2  # one write: the heartbeat itself
    partial = ShardProgress(SHARD, polled_at_ms=3_000, millis_behind_latest=7)
    assert table.heartbeat(SHARD, "w1", 2, partial.to_attributes())
    (lease,) = table.scan()
    assert ShardProgress.from_lease(lease) == partial  # None removed the other attributes
