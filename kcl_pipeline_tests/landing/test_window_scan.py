"""The sensor's window decisions (pure): where reporting starts, which windows to report, what to list for the plan."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.windows.completeness import WindowStatus
from kcl_pipeline.windows.scan import (
    ShardEnds,
    complete_windows,
    ending_shards,
    first_window,
    next_frontier,
    plan_listing_end,
    plan_listing_start,
    resume_window,
    scan_windows,
    shard_ends_to_plan,
    window_floor,
)
from kcl_pipeline.zone.layout import BatchKey
from kcl_pipeline.zone.progress import ShardProgress

from .helpers import T0, seq

W = 120_000  # 2-minute windows
A, B = "shardId-000000000000", "shardId-000000000001"
TH = Checkpoint("TRIM_HORIZON")


def lease(key: str, cp: Checkpoint = TH, parents: tuple[str, ...] = ()) -> Lease:
    return Lease(key, cp, lease_owner="w", parent_shard_ids=parents)


def landed(shard: str, arrival: int) -> ShardProgress:
    return ShardProgress(shard, Checkpoint(seq(1)), arrival)


def polled(shard: str, at: int, behind: int = 0) -> ShardProgress:
    return ShardProgress(shard, None, None, at, behind)


@pytest.mark.parametrize("earliest,leases,progress,not_before,start,waiting", [
    # nothing landed, nobody polled: undecided
    (None, [], {}, None, None, []),
    # a live lease without progress: wait for it (it may hold older records than the zone's earliest)
    (T0 + 60_000, [lease(A), lease(B)], {A: landed(A, T0 + 70_000)}, None, None, [B]),
    # every lease reported: the earliest landed minute, floored to its window
    (T0 + 60_000, [lease(A), lease(B)], {A: landed(A, T0 + 70_000), B: landed(B, T0 + 200_000)}, None, T0, []),
    # a shard that only polled (caught up, nothing landed) bounds the start too, minus the grace
    (T0 + 300_000, [lease(A), lease(B)], {A: landed(A, T0 + 310_000), B: polled(B, T0 + 125_000)}, None,
     T0 + 120_000, []),
    (T0 + 300_000, [lease(A), lease(B)], {A: landed(A, T0 + 310_000), B: polled(B, T0 + 121_000)}, None, T0, []),
    # ended leases are not waited for
    (T0, [lease(A), lease(B, Checkpoint("SHARD_END"))], {A: landed(A, T0 + 1)}, None, T0, []),
    # the first partition is later than the data: start at the first whole window from it
    (T0, [lease(A)], {A: landed(A, T0 + 1)}, T0 + 240_000, T0 + 240_000, []),
    (T0, [lease(A)], {A: landed(A, T0 + 1)}, T0 + 230_000, T0 + 240_000, []),
    # the first partition is earlier: the data decides
    (T0 + 480_000, [lease(A)], {A: landed(A, T0 + 490_000)}, T0, T0 + 480_000, []),
])
def test_first_window(earliest, leases, progress, not_before, start, waiting):
    got = first_window(W, earliest, leases, progress, grace_ms=2_000, not_before_ms=not_before)
    assert (got.start_ms, got.waiting_on) == (start, waiting)
    assert got.reason


def test_first_window_rejects_a_bad_window():
    with pytest.raises(ValueError, match="window_ms"):
        first_window(0, T0, [], {}, 0)


def status_table(complete_until: int):
    """A status function: windows ending at or before `complete_until` are complete; records the calls."""
    calls = []

    def status(t0: int, t1: int) -> WindowStatus:
        calls.append(t0)
        done = t1 <= complete_until
        return WindowStatus(t0, t1, done, [] if done else [A], {A: "done" if done else "waiting"})

    return status, calls


@pytest.mark.parametrize("complete_until,now,limit,reported,next_start,stopped_by", [
    (T0 + 3 * W, T0 + 10 * W, 10, 3, T0 + 3 * W, "incomplete"),
    (T0 + 10 * W, T0 + 4 * W + 1, 10, 4, T0 + 4 * W, "now"),  # the 5th window has not ended yet
    (T0 + 10 * W, T0 + 10 * W, 2, 2, T0 + 2 * W, "limit"),
    (T0, T0 + 10 * W, 10, 0, T0, "incomplete"),
    (T0 + 10 * W, T0 + W - 1, 10, 0, T0, "now"),
])
def test_scan_windows(complete_until, now, limit, reported, next_start, stopped_by):
    status, calls = status_table(complete_until)
    scan = scan_windows(T0, W, now, status, limit)
    assert [s.window_start_ms for s in scan.complete] == [T0 + i * W for i in range(reported)]
    assert (scan.next_start_ms, scan.stopped_by) == (next_start, stopped_by)
    assert (scan.blocking is not None) == (stopped_by == "incomplete")
    assert calls == [T0 + i * W for i in range(reported + (stopped_by == "incomplete"))]  # in order, no skipping


@pytest.mark.parametrize("start,limit", [(T0 + 1, 5), (T0, 0)])
def test_scan_windows_rejects_bad_arguments(start, limit):
    with pytest.raises(ValueError):
        scan_windows(start, W, T0 + 10 * W, status_table(T0)[0], limit)


C = "shardId-000000000002"


@pytest.mark.parametrize("zone_start,frontier,leases,expected", [
    (None, {}, [lease(A)], None),  # nothing landed
    (T0, {}, [], None),  # no lease
    (T0, {}, [lease(A, Checkpoint("SHARD_END"))], None),  # only ended leases
    (T0, {A: T0 + 5 * W}, [lease(A, Checkpoint(seq(9)))], T0 + 5 * W),  # committed: from its frontier
    (T0, {}, [lease(A, Checkpoint(seq(9)))], T0),  # a checkpoint of unknown origin: from the zone's start
    (T0, {A: T0 + 5 * W}, [lease(A, Checkpoint(seq(9))), lease(B)], T0),  # B committed nothing: whole zone
    # a child with nothing committed starts at its parents' earliest frontier
    (T0, {A: T0 + 5 * W, B: T0 + 7 * W}, [lease(A, Checkpoint("SHARD_END")), lease(B, Checkpoint(seq(3))),
                                          lease(C, TH, (A, B))], T0 + 5 * W),
    (T0, {A: T0 + 5 * W, B: T0 + 7 * W}, [lease(B, Checkpoint(seq(3)))], T0 + 7 * W),
    (T0 + 9 * W, {A: T0 + 5 * W}, [lease(A, Checkpoint(seq(9)))], T0 + 9 * W),  # never before the zone's start
])
def test_plan_listing_start(zone_start, frontier, leases, expected):
    assert plan_listing_start(zone_start, frontier, leases) == expected


def test_window_floor():
    assert window_floor(T0 + W + 5, W) == T0 + W and window_floor(T0, W) == T0


@pytest.mark.parametrize("cursor,start,expected", [
    (None, T0, (None, False)),
    (T0 + W, T0, (T0 + W, False)),
    (T0, T0, (T0, False)),
    (T0 - 5 * W, T0, (T0, True)),  # a cursor from before the fixed start moves up to it
])
def test_resume_window(cursor, start, expected):
    assert resume_window(cursor, start) == expected


def test_ending_shards_are_those_landed_to_their_end_and_not_ended():
    progress = {A: ShardProgress(A, Checkpoint(seq(5)), T0, shard_end_landed=True),
                B: ShardProgress(B, Checkpoint(seq(9)), T0),
                "shardId-ended": ShardProgress("shardId-ended", None, None, shard_end_landed=True)}
    leases = [lease(A), lease(B), lease("shardId-ended", Checkpoint("SHARD_END")), lease("shardId-none")]
    assert ending_shards(leases, progress) == [A]


def test_plan_listing_end_covers_the_last_materialised_window_and_every_landed_shard_end():
    assert plan_listing_end([], {}, W) is None
    assert plan_listing_end([T0, T0 + W], {}, W) == T0 + 2 * W
    late_end = {A: ShardProgress(A, Checkpoint(seq(5)), T0 + 5 * W + 1, shard_end_landed=True),
                B: ShardProgress(B, Checkpoint(seq(9)), T0 + 9 * W)}  # not at its end: ignored
    assert plan_listing_end([T0], late_end, W) == T0 + 6 * W
    assert plan_listing_end([], late_end, W) == T0 + 6 * W


def test_a_fresh_cursor_does_not_re_transform_windows_whose_output_is_committed():
    from kcl_pipeline.windows.scan import skip_materialised

    assert skip_materialised(T0, [T0, T0 + W, T0 + 2 * W, T0 + 4 * W], W) == T0 + 3 * W  # stops at the gap
    assert skip_materialised(T0, [T0 + W], W) == T0
    assert skip_materialised(T0, [], W) == T0


def batch(shard: str, minute: int, first: int, last: int) -> BatchKey:
    return BatchKey("s", shard, minute, Checkpoint(seq(first)), Checkpoint(seq(last)))


def test_an_idle_shard_does_not_make_every_checkpoint_run_list_the_whole_history():
    """Before: a lease still at its start marker (a shard that never got a record) kept no frontier, so every
    checkpoint run listed the zone from its first batch, a listing that grows for ever."""
    leases = [lease(A, Checkpoint(seq(5))), lease(B)]  # B idle at TRIM_HORIZON
    batches = {A: [batch(A, T0 + 40 * W, 1, 5), batch(A, T0 + 41 * W, 6, 9)]}
    progress = {B: polled(B, T0 + 42 * W + 30_000)}
    frontier = next_frontier({A: T0 + 10 * W}, leases, batches, {A: Checkpoint(seq(9))}, progress, 10_000, W, [A, B])
    assert frontier == {A: T0 + 41 * W, B: T0 + 42 * W}
    assert plan_listing_start(T0, frontier, leases) == T0 + 41 * W  # not T0: the history stays unlisted


@pytest.mark.parametrize("lease_b,batches_b,progress_b,expected", [
    (lease(B), [batch(B, T0 + 7 * W, 1, 2), batch(B, T0 + 8 * W, 3, 4)], None, T0 + 7 * W),  # its first batch
    (lease(B), [], polled(B, T0 + 9 * W + 5_000), T0 + 8 * W),  # caught up at t: from the window of t - grace
    (lease(B), [], polled(B, T0 + 9 * W + 5_000, behind=300), None),  # behind: nothing proven
    (lease(B), [], landed(B, T0 + 9 * W), None),  # landed, yet nothing listed: nothing proven
    (lease(B), [], None, None),  # no progress yet
    (lease(B, Checkpoint(seq(4))), [batch(B, T0 + 3 * W, 1, 2), batch(B, T0 + 5 * W, 3, 4)], None, T0 + 5 * W),
    (lease(B, Checkpoint(seq(4))), [batch(B, T0 + 3 * W, 1, 2)], None, None),  # its checkpoint's batch unlisted
    (lease(B, Checkpoint("SHARD_END")), [], polled(B, T0 + 9 * W), None),  # ended: left alone
])
def test_next_frontier_moves_only_as_far_as_the_listing_proves(lease_b, batches_b, progress_b, expected):
    frontier = next_frontier({}, [lease_b], {B: batches_b}, {}, {B: progress_b} if progress_b else {}, 10_000, W,
                             [B])
    assert frontier.get(B) == expected


def test_next_frontier_never_moves_back_and_drops_shards_gone_from_the_stream():
    leases = [lease(A, Checkpoint(seq(2)))]
    frontier = next_frontier({A: T0 + 9 * W, B: T0}, leases, {A: [batch(A, T0 + 2 * W, 1, 2)]}, {}, {}, 0, W, [A])
    assert frontier == {A: T0 + 9 * W}


def test_a_lease_with_its_own_frontier_lists_from_it_even_at_a_start_marker():
    assert plan_listing_start(T0, {B: T0 + 6 * W}, [lease(B)]) == T0 + 6 * W
    assert plan_listing_start(T0, {A: T0 + 6 * W}, [lease(B, parents=(A,))]) == T0 + 6 * W  # a child: parents'


def test_complete_windows_reports_at_least_one_window_and_stops_at_the_first_incomplete():
    shards, leases, progress = [Shard(A)], [lease(A)], {A: landed(A, T0 + 3 * W)}
    scan = complete_windows(T0, W, T0 + 10 * W, shards, progress, leases, 0, limit=0)
    assert [s.window_start_ms for s in scan.complete] == [T0] and scan.stopped_by == "limit"
    scan = complete_windows(T0, W, T0 + 10 * W, shards, progress, leases, 0, limit=12)
    assert [s.window_start_ms for s in scan.complete] == [T0, T0 + W, T0 + 2 * W]
    assert scan.stopped_by == "incomplete" and scan.blocking is not None and scan.blocking.waiting_on == [A]


def test_shard_ends_are_planned_under_the_window_before_the_next_one_once_a_partition_exists():
    ended = {A: ShardProgress(A, Checkpoint(seq(9)), T0 + W, shard_end_landed=True)}
    leases = [lease(A), lease(B)]
    assert shard_ends_to_plan(leases, ended, T0 + 5 * W, W, T0) == ShardEnds([A], T0 + 4 * W)
    assert shard_ends_to_plan(leases, ended, T0 + W, W, T0 + W) is None  # no partition before the next window
    assert shard_ends_to_plan(leases, ended, None, W, T0) is None  # no window decided yet
    assert shard_ends_to_plan(leases, {}, T0 + 5 * W, W, T0) is None  # nothing to end
    assert shard_ends_to_plan([lease(A, Checkpoint("SHARD_END"))], ended, T0 + 5 * W, W, T0) is None  # ended
