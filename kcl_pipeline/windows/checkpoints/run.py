"""One checkpoint commit of a stream: the work of the `kinesis_checkpoints` asset, without Dagster.

List the landed batches and their links from the stored frontier (`plan_listing_start`) to past the last
materialised window (`plan_listing_end`), read the start link of each shard still at a starting position (what
its chain begins with), plan per shard (windows/checkpoints/plan.py), commit the plan with the lease table's conditional
writes (ending shards and creating their children's leases), and move the frontier on (`next_frontier`). The
report says what was committed, and what the next run and the sensor need: the frontier, the windows that
received batches after their runs listed the zone (`late`), and the windows a shard is stopped on that have no
commit at all (`uncommitted`): the sensor requests both again and follows them (windows/followup.py). Those
three are stored, last, as the stream's checkpoint record in the output location (windows/checkpoints/record.py): the
one place the next run and the sensor read them from.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...kcl.core.model import Checkpoint
from ...zone.layout import BatchKey, LandedListing, link_key, link_target, split_landed_keys, window_prefixes
from ...zone.progress import ShardProgress, progress_from_leases
from ...zone.store import ZoneStore
from ...zone.stream_slice import StreamSlice
from ..manifest import Materialised, late_batches, read_materialised_from
from ..report import earliest_landed_minute, json_position
from ..scan import next_frontier, plan_listing_end, plan_listing_start, window_floor
from .plan import ChainEvidence, CheckpointPlan, Committed, apply_plan, chain_evidence, plan_checkpoints
from .record import CheckpointRecord, CheckpointRecordError, read_checkpoint_record, write_checkpoint_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointReport:
    plan: CheckpointPlan
    committed: list[Committed]
    materialised_windows: int  # windows from the listing start on whose commit is in
    listed_from_ms: int | None  # where the listing of landed batches starts (None: nothing landed, or no lease)
    late: dict[int, list[str]]  # materialised window -> batches landed in it that its manifest does not name
    frontier: dict[str, int]  # per shard, the window the next run's listing may start at
    uncommitted: list[int] = field(default_factory=list)  # windows a shard is stopped on that have no commit
    record: CheckpointRecord | None = None  # what the run stored for the next run and the sensor

    @property
    def broken(self) -> dict[str, str]:
        """Per shard stopped on a gap (a lost batch) or an overlap in its chain, why: no window run mends it."""
        return {k: p.broken for k, p in self.plan.shards.items() if p.broken is not None}

    @property
    def before_start(self) -> dict[str, int]:
        """Per shard, the batches stepped over because they precede the first partition (never transformed)."""
        return {k: p.before_start for k, p in self.plan.shards.items() if p.before_start}

    @property
    def shard_ends(self) -> list[str]:
        return [c.shard_id for c in self.committed if c.ended]

    @property
    def commits(self) -> int:
        return sum(1 for c in self.committed if c.checkpointed)

    def committed_rows(self) -> list[dict[str, Any]]:
        """JSON-ready: per committed shard its checkpoint, whether it moved, ended, and the children created."""
        return [{"shard_id": c.shard_id,
                 "sequence_number": c.checkpoint.sequence_number if c.checkpoint else None,
                 "sub_sequence_number": c.checkpoint.sub_sequence_number if c.checkpoint else None,
                 "checkpointed": c.checkpointed, "shard_end": c.ended, "children_created": list(c.children_created)}
                for c in self.committed]

    def plan_rows(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: per shard what the plan decided, and why."""
        return {k: {"commit": json_position(p.commit), "end": p.end, "reason": p.reason}
                for k, p in sorted(self.plan.shards.items())}


def commit_checkpoints(lease_table: Any, view: StreamSlice, store: ZoneStore, output: ZoneStore, *,
                       window_ms: int, first_window_ms: int, initial: Checkpoint, grace_ms: int,
                       now_ms: int | None = None, requested_for: tuple[int, int] | None = None) -> CheckpointReport:
    """Plan and commit the stream's checkpoints for what has materialised in `output`, and store the stream's
    checkpoint record there.

    `view`: the stream's leases and shards from the lease table's scan, named by lease key (a multi-stream
    key: stream + shard); `store`: the landing zone; `first_window_ms`: the first partition's start;
    `initial`: where a child's new lease starts; `now_ms`: the time (commits are listed up to it);
    `requested_for`: the windows of the Dagster run, for the record.

    What it reads follows what changed since the frontier, not the history: the landed batches and the
    window commits from the listing start on (`read_materialised_from`), one GET of the stored record."""
    leases, shards = view.leases, view.shards
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    previous = _previous_record(output)
    previous_frontier = dict(previous.frontier) if previous is not None else {}
    earliest = earliest_landed_minute(store, view.directory)
    zone_start = None if earliest is None else window_floor(earliest, window_ms)
    start = plan_listing_start(zone_start, previous_frontier, leases)
    committed = Materialised({}) if start is None else read_materialised_from(output, start, now_ms + window_ms)
    progress = progress_from_leases(leases)
    end = plan_listing_end(committed.windows, progress, window_ms)
    batches: dict[str, list[BatchKey]] = {}
    listing = LandedListing([], [], [])
    if start is not None and end is not None and end > start:
        listing = list_landed(store, view.directory, start, end)
        for b in listing.batches:
            batches.setdefault(view.lease_key(b.shard_id), []).append(b)
    chain = read_chain_evidence(store, view, listing, batches, progress)
    plan = plan_checkpoints(committed, window_ms, batches, progress, leases, first_window_ms=first_window_ms,
                            chain=chain)
    late = late_batches(committed, [(window_floor(b.minute_ms, window_ms), b.key())
                                    for listed in batches.values() for b in listed])
    written = apply_plan(plan, lease_table, shards=shards, initial=initial)
    # Only checkpoints the table took move the frontier: one it refused (a Java holder, a lease gone) must be
    # listed from again, or the next run could not prove its next batch follows the lease's checkpoint.
    frontier = next_frontier(previous_frontier, leases, batches,
                             {c.shard_id: c.checkpoint for c in written if c.checkpoint is not None and c.checkpointed},
                             progress, grace_ms, window_ms, [s.shard_id for s in shards])
    uncommitted = sorted({p.blocked_window for p in plan.shards.values() if p.blocked_window is not None
                          and p.blocked_window not in committed.batches_by_window})
    record = CheckpointRecord.of_run(previous, frontier=frontier, late=late, uncommitted=uncommitted, now_ms=now_ms,
                                     requested_for=requested_for)
    write_checkpoint_record(output, record, replaces_legacy=previous is None or previous.report is None)
    return CheckpointReport(plan, written, len(committed.windows), start, late, frontier, uncommitted, record)


def _previous_record(output: ZoneStore) -> CheckpointRecord | None:
    """The record the last run stored. One that cannot be read costs its frontier only (the frontier saves
    listing, it proves nothing): this run lists from the zone's start once and writes a good record over it."""
    try:
        return read_checkpoint_record(output)
    except CheckpointRecordError as exc:
        log.warning("%s; listing from the zone's start once (this run stores a new record)", exc)
        return None


def list_landed(store: ZoneStore, directory: str, t0: int, t1: int) -> LandedListing:
    """The batches of `directory` whose arrival minute is in [t0, t1), in (shard, position) order, with the links
    listed beside them (the same LIST pages: no extra request)."""
    batches, links, malformed = [], [], []
    for prefix in window_prefixes(directory, t0, t1):
        listing = split_landed_keys(store.list_keys(prefix))
        batches += [b for b in listing.batches if b.stream == directory]
        links += [link for link in listing.links if link.stream == directory]
        malformed += listing.malformed
    batches.sort(key=lambda b: (b.shard_id, b.first.key(), b.last.key()))
    return LandedListing(batches, links, malformed)


def read_chain_evidence(store: ZoneStore, view: StreamSlice, listing: LandedListing,
                        batches: Mapping[str, list[BatchKey]],
                        progress: Mapping[str, ShardProgress] | None = None) -> ChainEvidence:
    """The links' evidence by lease key, and, for each live lease still at a starting position with batches
    listed — or none, and its holder reporting the shard's end landed (`progress`) —, the batch its start link
    names, or `layout.ENDED_EMPTY` (one GET per such shard: only shards that never committed)."""
    starts: dict[str, str | None] = {}
    for lease in view.leases:
        if lease.is_ended or not lease.checkpoint.is_starting_sentinel:
            continue
        if not batches.get(lease.lease_key):
            reported = (progress or {}).get(lease.lease_key)
            if reported is None or not reported.shard_end_landed:
                continue
        body = store.get_optional(link_key(view.directory, 0, view.scope.shard_id(lease.lease_key),
                                           lease.checkpoint))
        starts[lease.lease_key] = None if body is None else link_target(body)
    return chain_evidence(((view.lease_key(link.shard_id), link) for link in listing.links), starts)
