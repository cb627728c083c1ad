"""The checkpoint plan (pure, table-driven) and applying it to a real lease table (dynalite)."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.windows.checkpoints.plan import apply_plan, plan_checkpoints
from kcl_pipeline.windows.scan import window_floor
from kcl_pipeline.zone.layout import BatchKey
from kcl_pipeline.zone.progress import ShardProgress

from .helpers import seq

HOUR = 3_600_000
MIN = 60_000
W0 = 1_795_316_400_000  # aligned hour
W1, W2, W3 = W0 + HOUR, W0 + 2 * HOUR, W0 + 3 * HOUR
S, T = "shardId-S", "shardId-T"


def b(shard: str, minute: int, first: int, last: int) -> BatchKey:
    return BatchKey("orders", shard, minute, Checkpoint(seq(first)), Checkpoint(seq(last)))


# Shard S: two batches in W0, one in W1, two in W2.
S_BATCHES = [b(S, W0 + 5 * MIN, 1, 10), b(S, W0 + 59 * MIN, 11, 20), b(S, W1 + 30 * MIN, 21, 30),
             b(S, W2, 31, 40), b(S, W2 + 7 * MIN, 41, 50)]
TH = Checkpoint("TRIM_HORIZON")


def cp(i: int, sub: int = 0) -> Checkpoint:
    return Checkpoint(seq(i), sub)


def ended(last: int | None) -> ShardProgress:
    return ShardProgress(S, cp(last) if last else None, 0, shard_end_landed=True)


CASES = [
    # (id, materialised, lease checkpoint, batches, progress, expected commit (last seq) or None, end)
    ("nothing materialised", [], TH, S_BATCHES, None, None, False),
    ("first window materialised", [W0], TH, S_BATCHES, None, 20, False),
    ("two windows in order", [W0, W1], TH, S_BATCHES, None, 30, False),
    ("all windows", [W0, W1, W2], TH, S_BATCHES, None, 50, False),
    ("out of order: W2 before W1 moves nothing past W0", [W0, W2], TH, S_BATCHES, None, 20, False),
    ("out of order: later windows only, the earliest missing", [W1, W2], TH, S_BATCHES, None, None, False),
    ("the checkpoint is past W0 already: W0 need not be materialised", [W1], cp(20), S_BATCHES, None, 30, False),
    ("a checkpoint inside a batch (a peer committed mid-batch): that batch still pending", [W1], cp(25), S_BATCHES,
     None, 30, False),
    ("checkpoint inside a batch whose window is not materialised", [W0], cp(25), S_BATCHES, None, None, False),
    ("windows with no batch of the shard do not block it", [W0, W2], cp(30), S_BATCHES, None, 50, False),
    ("idle shard: no batches", [W0, W1], TH, [], None, None, False),
    ("listing order does not matter", [W0, W1], TH, list(reversed(S_BATCHES)), None, 30, False),
    ("overlap stops the walk", [W0, W1, W2], TH, S_BATCHES[:2] + [b(S, W0 + 59 * MIN, 15, 22)], None, 20, False),
    # ending
    ("shard end landed, every window materialised", [W0, W1, W2], TH, S_BATCHES, ended(50), 50, True),
    ("shard end landed: the window of its last record may wait for its children", [W0, W1], TH, S_BATCHES,
     ended(50), 30, True),
    ("shard end landed, an earlier window missing: not ended", [W0, W2], TH, S_BATCHES, ended(50), 20, False),
    ("shard end landed, nothing after the checkpoint", [], cp(50), S_BATCHES, ended(50), None, True),
    ("shard end landed on an empty shard", [], TH, [], ended(None), None, True),
    ("shard end landed but its last batch is not in the listing: not ended", [W0, W1, W2], TH, S_BATCHES[:4],
     ended(50), 40, False),
    ("no shard end: never ended, even when everything is materialised", [W0, W1, W2], TH, S_BATCHES,
     ShardProgress(S, cp(50), 0), 50, False),
]


@pytest.mark.parametrize("materialised,checkpoint,batches,progress,commit,end", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_plan(materialised, checkpoint, batches, progress, commit, end):
    plan = plan_checkpoints(materialised, HOUR, {S: batches}, {S: progress} if progress else {},
                            [Lease(S, checkpoint)])
    shard = plan.shards[S]
    assert shard.commit == (cp(commit) if commit else None), shard.reason
    assert shard.end == end, shard.reason
    assert plan.ends == ([S] if end else [])
    assert plan.commits == ({S: cp(commit)} if commit else {})


def test_windows_as_pairs_and_several_shards():
    t_batches = [b(T, W0 + MIN, 100, 110), b(T, W1 + MIN, 111, 120)]
    leases = [Lease(S, TH), Lease(T, cp(110)), Lease("shardId-ended", Checkpoint("SHARD_END")),
              Lease("shardId-idle", TH)]
    plan = plan_checkpoints([(W0, W1), (W1, W2)], HOUR, {S: S_BATCHES, T: t_batches}, {}, leases)
    assert plan.commits == {S: cp(30), T: cp(120)}
    assert plan.shards["shardId-ended"].reason == "already SHARD_END"
    assert plan.shards["shardId-idle"].commit is None
    # Batches of shards without a lease are not planned (nothing to commit to).
    assert set(plan_checkpoints([W0], HOUR, {"shardId-x": S_BATCHES}, {}, []).shards) == set()


def test_minute_windows():
    plan = plan_checkpoints([W0, W0 + 5 * MIN], 5 * MIN, {S: S_BATCHES}, {}, [Lease(S, TH)])
    # Batch 1..10 (minute W0+5) is in the materialised window [W0+5, W0+10); the next batch (minute W0+59)
    # is in [W0+55, W0+60), not materialised. [W0, W0+5) holds no batch of the shard.
    assert plan.commits == {S: cp(10)}
    assert window_floor(W0 + 59 * MIN, 5 * MIN) == W0 + 55 * MIN


@pytest.mark.parametrize("materialised,window", [([W0 + MIN], HOUR), ([(W0, W0 + 2 * HOUR)], HOUR), ([W0], 0),
                                                 ([W0], 90_000)])
def test_bad_windows(materialised, window):
    with pytest.raises(ValueError):
        plan_checkpoints(materialised, window, {}, {}, [])


def test_apply_plan_commits_ends_and_creates_children(dynamodb_client, unique_name):
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    table = LeaseTable(unique_name("leases"), dynamodb_client)
    table.ensure_table()
    parent, child1, child2, other = "shardId-P", "shardId-C1", "shardId-C2", "shardId-O"
    shards = [Shard(parent), Shard(child1, parent), Shard(child2, parent), Shard(other)]
    for key in (parent, other):
        assert table.create(Lease(key, TH))
    assert table.acquire(parent, "w1", None, 0)
    assert table.checkpoint(other, cp(200))  # another committer got further on `other` already

    p_batches = [b(parent, W0 + MIN, 1, 10), b(parent, W1 + MIN, 11, 20)]
    o_batches = [b(other, W0 + MIN, 100, 150)]
    progress = {parent: ShardProgress(parent, cp(20), W1 + MIN, shard_end_landed=True)}
    plan = plan_checkpoints([W0], HOUR, {parent: p_batches, other: o_batches}, progress, table.scan())
    assert plan.commits == {parent: cp(10)}  # `other` is already at 200
    assert plan.ends == [parent]

    done = apply_plan(plan, table, shards=shards)
    assert [(c.shard_id, c.checkpoint, c.checkpointed, c.ended, sorted(c.children_created)) for c in done] == \
        [(parent, cp(10), True, True, [child1, child2])]
    leases = {lease.lease_key: lease for lease in table.scan()}
    assert leases[parent].is_ended and leases[parent].lease_owner is None
    assert leases[child1].checkpoint == TH and leases[child1].parent_shard_ids == (parent,)
    assert leases[other].checkpoint == cp(200)

    # A stale plan applied again changes nothing and fails nothing.
    again = apply_plan(plan, table, shards=shards)
    assert [(c.checkpointed, c.children_created) for c in again] == [(False, ())]
    assert {lease.lease_key: lease.checkpoint for lease in table.scan()} == \
        {k: v.checkpoint for k, v in leases.items()}


def test_records_older_than_the_first_partition_never_stall_the_checkpoint():
    """W0 precedes the first partition (W1): its batches belong to no window run. They used to hold the
    checkpoint before them for ever; now they are stepped over and counted."""
    stalled = plan_checkpoints([W1, W2], HOUR, {S: S_BATCHES}, {}, [Lease(S, TH)])
    assert stalled.shards[S].commit is None  # without the start, W0 is just "not materialised"
    plan = plan_checkpoints([W1, W2], HOUR, {S: S_BATCHES}, {}, [Lease(S, TH)], first_window_ms=W1)
    shard = plan.shards[S]
    assert shard.commit == cp(50) and shard.before_start == 2
    assert "2 batch(es) before the first partition" in shard.reason
    # Nothing materialised yet: the pre-start batches alone are passed, nothing beyond them.
    assert plan_checkpoints([], HOUR, {S: S_BATCHES}, {}, [Lease(S, TH)], first_window_ms=W1).commits == {S: cp(20)}
    # A shard whose last record landed: pre-start windows never block its end.
    ending = plan_checkpoints([W1], HOUR, {S: S_BATCHES}, {S: ended(50)}, [Lease(S, TH)], first_window_ms=W1)
    assert ending.shards[S].end and ending.shards[S].commit == cp(30)
