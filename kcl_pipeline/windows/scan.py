"""Which windows became complete since the last look (pure): the sensor's decision, kept out of Dagster.

Windows are [t0, t1) aligned to multiples of their length since the epoch. They are reported strictly in
order: a window is reported only once every earlier one was, so "every window before the cursor is
landed" holds and the checkpoint plan can commit per shard up to the longest run of materialised windows.

Where the first window is. The landing zone's earliest batch is not enough on its own: a shard whose
worker has not landed anything yet may still hold older records than the earliest batch of the others.
So the first window waits until every live lease has reported landing progress, and starts at the
earliest of: the earliest landed batch's minute, and for shards that landed nothing, the time of their
last settled poll (minus the grace: records arriving just before a poll may not be readable yet).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from ..kcl.core.model import Checkpoint, Lease, Shard
from ..zone.layout import BatchKey
from ..zone.progress import ShardProgress
from .completeness import WindowStatus, window_complete


def window_floor(ms: int, window_ms: int) -> int:
    return ms - ms % window_ms


@dataclass(frozen=True)
class FirstWindow:
    start_ms: int | None  # None: not decidable yet (see waiting_on), or nothing to report yet
    waiting_on: list[str] = field(default_factory=list)  # live leases with no landing progress
    reason: str = ""


def first_window(window_ms: int, earliest_landed_ms: int | None, leases: Iterable[Lease],
                 progress: Mapping[str, ShardProgress], grace_ms: int,
                 not_before_ms: int | None = None) -> FirstWindow:
    """The start of the first window to report, once it is known.

    `earliest_landed_ms`: the minute of the earliest batch in the zone (None if the zone holds none).
    `not_before_ms`: the first partition's start; earlier windows cannot be reported.
    """
    if window_ms <= 0:
        raise ValueError(f"window_ms must be > 0, got {window_ms}")
    waiting: list[str] = []
    bounds: list[int] = [] if earliest_landed_ms is None else [earliest_landed_ms]
    for lease in leases:
        if lease.is_ended:
            continue
        p = progress.get(lease.lease_key)
        if p is None or (p.landed is None and p.polled_at_ms is None and not p.shard_end_landed):
            waiting.append(lease.lease_key)
        elif p.landed is None and p.polled_at_ms is not None:
            bounds.append(p.polled_at_ms - grace_ms)
    if waiting:
        return FirstWindow(None, sorted(waiting), f"{len(waiting)} lease(s) have not reported landing progress yet")
    if not bounds:
        return FirstWindow(None, [], "nothing landed and no shard has polled yet")
    start = window_floor(min(bounds), window_ms)
    if not_before_ms is not None and start < not_before_ms:
        first = window_floor(not_before_ms + window_ms - 1, window_ms)  # the first whole window from it
        return FirstWindow(first, [], f"records from {start} precede the first partition ({not_before_ms}): "
                                      f"they are not reported (set an earlier partitions start to include them)")
    return FirstWindow(start, [], "earliest landed record or settled poll")


@dataclass(frozen=True)
class WindowScan:
    complete: list[WindowStatus]  # the windows to report now, in order
    next_start_ms: int  # the first window not reported (the new cursor)
    stopped_by: str  # "incomplete" | "now" | "limit"
    blocking: WindowStatus | None = None  # the incomplete window, when stopped_by == "incomplete"


def scan_windows(next_start_ms: int, window_ms: int, now_ms: int, status_of: Callable[[int, int], WindowStatus],
                 limit: int) -> WindowScan:
    """Complete windows from `next_start_ms` on, in order, at most `limit`, never a window ending after `now_ms`
    (its partition does not exist yet)."""
    if window_ms <= 0 or next_start_ms % window_ms:
        raise ValueError(f"window start {next_start_ms} is not aligned to windows of {window_ms} ms")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    complete: list[WindowStatus] = []
    t0 = next_start_ms
    while True:
        if t0 + window_ms > now_ms:
            return WindowScan(complete, t0, "now")
        if len(complete) >= limit:
            return WindowScan(complete, t0, "limit")
        status = status_of(t0, t0 + window_ms)
        if not status.complete:
            return WindowScan(complete, t0, "incomplete", status)
        complete.append(status)
        t0 += window_ms


def complete_windows(next_start_ms: int, window_ms: int, now_ms: int, shards: Sequence[Shard],
                     progress: Mapping[str, ShardProgress], leases: Sequence[Lease], grace_ms: int,
                     limit: int) -> WindowScan:
    """`scan_windows` by the completeness rule (completeness.py): the windows a tick may report now, at
    least one and at most `limit`."""
    return scan_windows(next_start_ms, window_ms, now_ms,
                        lambda t0, t1: window_complete(t0, t1, shards, progress, leases, grace_ms),
                        limit=max(1, limit))


def plan_listing_start(zone_start_ms: int | None, frontier: Mapping[str, int], leases: Iterable[Lease]) -> int | None:
    """Where the checkpoint plan's listing of landed batches must start (None: nothing landed or no live lease).

    The plan needs every landed batch after each live lease's checkpoint: a batch missing from the listing
    would be stepped over. `frontier` remembers, per shard, the window of the batch its last commit ended
    (checkpoints only move forward, so an old frontier is merely early). A lease with nothing committed yet
    starts at its parents' frontier (a child's records follow its parents'), else, like a checkpoint of
    unknown origin, at the start of the zone (`zone_start_ms`: the window of its earliest batch).
    """
    if zone_start_ms is None:
        return None
    starts = []
    for lease in leases:
        if lease.is_ended:
            continue
        key = lease.lease_key
        if key in frontier or not lease.checkpoint.is_sentinel:
            starts.append(frontier.get(key, zone_start_ms))
        else:
            parents = [frontier[p] for p in lease.parent_shard_ids if p in frontier]
            starts.append(min(parents) if parents else zone_start_ms)
    return max(zone_start_ms, min(starts)) if starts else None


def next_frontier(previous: Mapping[str, int], leases: Iterable[Lease], batches: Mapping[str, Sequence[BatchKey]],
                  committed: Mapping[str, Checkpoint], progress: Mapping[str, ShardProgress], grace_ms: int,
                  window_ms: int, listed_shards: Iterable[str]) -> dict[str, int]:
    """Per shard, the window the next checkpoint plan's listing may start at (pure).

    `batches` is what this run listed (from `plan_listing_start`, which covered every live lease's range) and
    `committed` the checkpoints it wrote. A shard's batches land in order, so a shard moves to:
    * the window of the batch ending at its new checkpoint, or at its current one;
    * with nothing committed yet (a start marker): the window of its first listed batch; with no batch at all
      and caught up with nothing landed at t, the window of t - grace (no record of it arrived before) —
      an idle shard must not make every run list the zone's whole history.
    Entries only move forward; shards the stream no longer lists are dropped."""
    frontier = dict(previous)

    def advance(shard: str, window: int) -> None:
        frontier[shard] = max(window, frontier.get(shard, window))

    for shard, checkpoint in committed.items():
        holder = next((b for b in batches.get(shard, ()) if b.last == checkpoint), None)
        if holder is not None:
            advance(shard, window_floor(holder.minute_ms, window_ms))
    for lease in leases:
        key = lease.lease_key
        if lease.is_ended or key in committed:
            continue
        own = batches.get(key, ())
        if not lease.checkpoint.is_sentinel:
            holder = next((b for b in own if b.last == lease.checkpoint), None)
            if holder is not None:
                advance(key, window_floor(holder.minute_ms, window_ms))
        elif own:
            advance(key, min(window_floor(b.minute_ms, window_ms) for b in own))
        else:
            p = progress.get(key)
            caught_up = p.caught_up_at() if p is not None and p.landed is None else None
            if caught_up is not None:
                advance(key, window_floor(caught_up - grace_ms, window_ms))
    listed = set(listed_shards)
    return {k: v for k, v in sorted(frontier.items()) if k in listed}


def resume_window(cursor_next_ms: int | None, partitions_start_ms: int) -> tuple[int | None, bool]:
    """The sensor's next window to report, from its cursor: never before the first partition (a cursor from
    an earlier start, or written before the start was fixed). Returns (window, whether it was moved up)."""
    if cursor_next_ms is not None and cursor_next_ms < partitions_start_ms:
        return partitions_start_ms, True
    return cursor_next_ms, False


def ending_shards(leases: Iterable[Lease], progress: Mapping[str, ShardProgress]) -> list[str]:
    """Shards whose last record has landed but whose lease is not SHARD_END yet: the checkpoint plan ends them."""
    return sorted(lease.lease_key for lease in leases if not lease.is_ended
                  and progress.get(lease.lease_key) is not None and progress[lease.lease_key].shard_end_landed)


@dataclass(frozen=True)
class ShardEnds:
    """Shards the checkpoint plan should end now, and the window whose partition its run is requested under
    (any existing partition: the plan itself is global)."""

    shards: list[str]
    anchor_ms: int


def shard_ends_to_plan(leases: Iterable[Lease], progress: Mapping[str, ShardProgress], next_window_ms: int | None,
                       window_ms: int, partitions_start_ms: int) -> ShardEnds | None:
    """The shards whose last record has landed but whose lease is not SHARD_END yet, once a partition exists
    to run the plan under (the window before the next one to report). None: nothing to end, or no partition.

    Only the checkpoint plan ends a shard in the pipeline, and the window holding a parent's last record
    cannot complete until its children land, whose leases exist only once the parent is ended: without
    this run a split would wait forever."""
    ending = ending_shards(leases, progress)
    if not ending or next_window_ms is None or next_window_ms - window_ms < partitions_start_ms:
        return None
    return ShardEnds(ending, next_window_ms - window_ms)


def plan_listing_end(materialised: Iterable[int], progress: Mapping[str, ShardProgress],
                     window_ms: int) -> int | None:
    """Where the checkpoint plan's listing ends: after the last materialised window, and after the window of
    every landed last record of a shard (the plan needs the batch holding it to end the shard; that window
    need not have materialised). None: nothing to list."""
    ends = [window_floor(p.landed_arrival_ms, window_ms) + window_ms for p in progress.values()
            if p.shard_end_landed and p.landed_arrival_ms is not None]
    done = list(materialised)
    return max(([max(done) + window_ms] if done else []) + ends, default=None)


def skip_materialised(start_ms: int, materialised: Iterable[int], window_ms: int) -> int:
    """A fresh cursor's first window, past the unbroken run of windows from `start_ms` whose transformed
    output is already committed: a new Dagster instance (or a cleared cursor) must not re-transform days of
    windows. The first gap stops the skip; everything from there is reported as usual."""
    done = set(materialised)
    while start_ms in done:
        start_ms += window_ms
    return start_ms
