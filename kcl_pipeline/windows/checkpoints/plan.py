"""The checkpoint plan (pure): what to commit to the lease table once windows have materialised downstream.

Per shard, walking its landed batches in shard order from the lease checkpoint: the checkpoint advances
through each batch whose window has materialised and stops at the first whose window has not. The result
is the last landed record of the longest run of materialised windows starting at the checkpoint, so a
window materialised out of order (a later window before an earlier one) moves nothing until the gap is
filled. Windows are aligned to the epoch (`[k*window_ms, (k+1)*window_ms)`), like Dagster's time-window
partitions; a batch belongs to the window of its arrival minute (batches never span minutes).

Ending a shard (SHARD_END) needs its last record landed (progress `shard_end_landed`, and the batch
holding that record is in the listing) and every batch of the shard materialised — except those in the
window holding its last record. That one exception avoids a deadlock: the window in which a shard closes
holds records of its children (they are born in it), so it cannot be complete until the children land;
the children's leases are only created once the parent is SHARD_END (`child_leases_on_end` in kcl/core/lineage.py,
as in Java KCL). Ending the
parent then is safe: its records are durably landed (the landing zone, not Kinesis, is the source of the
window's transform), and the lineage audit must compare SHARD_END with the landed chain, not with the
materialised windows. A holder reporting the end landed with nothing landed from a starting position while the
start link names a batch (claimed by a holder it never saw) does not end the shard: that chain is not landed.
One whose start link says the shard ended with nothing landed after it (`layout.ENDED_EMPTY`, claimed by the
holder that ended it, which fences every later claim of that start) ends it: the chain is complete and empty.

Records older than the first partition (`first_window_ms`, the fixed KCL_PIPELINE_PARTITIONS_START) belong
to no window, so no window run will ever transform them: the plan steps over their batches (they stay in the
landing zone, where a backfill with an earlier start can transform them) and reports them per shard
(`before_start`), rather than holding the shard's checkpoint before them for ever.

The checkpoint passes a batch only when the batch provably follows the record before it (`ChainEvidence`):
landed batches are not consecutive just because their keys sort one after the other, since a batch missing
from the zone (deleted, lost, never written after its claim) leaves no trace among the batch keys. Its link
does: every batch is claimed by the link `after=<predecessor>` in its own minute before it is written
(docs/landing.md), so the link names in a listing say which position each batch follows. A batch follows
the previous landed batch when the greatest link position below its first record, in its minute, is the
previous batch's last record (positions between a batch's predecessor and its first record are not records,
so no other link can sit there); the first batch after a starting position must be the one its start link
names. A batch without that proof stops the shard's walk (a "gap"), however many materialised windows
follow; so does an overlap. SHARD_END needs the chain unbroken up to the shard's last record, too.

The listing passed in must hold every landed batch of each shard after its lease checkpoint, and the links
in the same minutes. Batches at or below the checkpoint are ignored.
"""
from __future__ import annotations

import logging
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ...kcl.core import coverage
from ...kcl.core.lineage import child_leases_on_end
from ...kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard, checkpoint_advances
from ...zone.layout import BatchKey, LinkName, ends_empty
from ...zone.progress import ShardProgress
from ..manifest import Materialised, batch_materialised
from ..scan import window_floor

log = logging.getLogger(__name__)


Position = tuple[int, str, int]  # Checkpoint.key()


@dataclass(frozen=True)
class ChainEvidence:
    """What the zone says each batch follows (pure input of the plan; `chain_evidence` builds it).

    `links`: per shard (lease key) and minute, the sorted positions its `after=` links name; `starts`: per
    shard at a starting position, the batch key its start link names (None: no start link; `layout.ENDED_EMPTY`:
    the shard ended with nothing landed after that start)."""

    links: Mapping[str, Mapping[int, Sequence[Position]]] = field(default_factory=dict)
    starts: Mapping[str, str | None] = field(default_factory=dict)

    def follows(self, shard: str, batch: BatchKey) -> Position | None:
        """The position `batch` follows, as its minute's links show it (None: no link below its first record)."""
        positions = self.links.get(shard, {}).get(batch.minute_ms, ())
        i = bisect_left(positions, batch.first.key())
        return positions[i - 1] if i else None


def chain_evidence(links: Iterable[tuple[str, LinkName]], starts: Mapping[str, str | None]) -> ChainEvidence:
    """Evidence from the listed links, each with its shard's lease key, and the start links read."""
    by_shard: dict[str, dict[int, set[Position]]] = {}
    for shard, link in links:
        if link.minute_ms is not None:
            by_shard.setdefault(shard, {}).setdefault(link.minute_ms, set()).add(link.prev.key())
    return ChainEvidence({shard: {m: sorted(p) for m, p in minutes.items()} for shard, minutes in by_shard.items()},
                         dict(starts))


@dataclass(frozen=True)
class ShardPlan:
    shard_id: str
    commit: Checkpoint | None  # advance the lease checkpoint to it (None: nothing new to commit)
    end: bool  # then write SHARD_END
    reason: str
    before_start: int = 0  # batches stepped over because they precede the first partition
    blocked_window: int | None = None  # the window whose batch stopped the walk, not materialised (or late)
    broken: str | None = None  # the walk stopped on a gap or an overlap in the chain: why


@dataclass(frozen=True)
class CheckpointPlan:
    shards: dict[str, ShardPlan]

    @property
    def commits(self) -> dict[str, Checkpoint]:
        return {k: p.commit for k, p in self.shards.items() if p.commit is not None}

    @property
    def ends(self) -> list[str]:
        return sorted(k for k, p in self.shards.items() if p.end)


@dataclass(frozen=True)
class Committed:
    shard_id: str
    checkpoint: Checkpoint | None
    checkpointed: bool  # False: the table already had it or later (another committer won), or no commit
    ended: bool
    children_created: tuple[str, ...] = ()


def plan_checkpoints(materialised: Iterable[tuple[int, int] | int] | Materialised, window_ms: int,
                     batches: Mapping[str, Sequence[BatchKey]], progress: Mapping[str, ShardProgress],
                     leases: Iterable[Lease] | Mapping[str, Lease], *,
                     first_window_ms: int | None = None, chain: ChainEvidence | None = None) -> CheckpointPlan:
    """The plan for every leased shard. `materialised`: the committed manifests (windows/manifest.py), or
    windows asserted whole as (t0, t1) or t0 (aligned, `window_ms` long); `first_window_ms`: the first
    partition's start (batches before it are stepped over and counted); `chain`: what the links say each
    batch follows (None: the caller vouches that the batches are consecutive — pure tests of other rules;
    the pipeline always passes it, `windows/checkpoints/run.py`)."""
    if window_ms <= 0 or window_ms % 60_000:
        raise ValueError(f"window_ms must be a positive whole number of minutes, got {window_ms}")
    # committed manifests count per batch, not per window
    done = materialised if isinstance(materialised, Materialised) else _whole_windows(materialised, window_ms)
    by_key = dict(leases) if isinstance(leases, Mapping) else {lease.lease_key: lease for lease in leases}
    return CheckpointPlan({
        key: _plan_shard(lease, batches.get(key, ()), progress.get(key), done, window_ms, first_window_ms, chain)
        for key, lease in sorted(by_key.items())
    })


def _whole_windows(windows: Iterable[tuple[int, int] | int], window_ms: int) -> set[int]:
    """The starts of windows asserted whole, each checked to be an aligned window `window_ms` long."""
    done: set[int] = set()
    for w in windows:
        t0, t1 = (w, w + window_ms) if isinstance(w, int) else w
        if t1 - t0 != window_ms or t0 % window_ms:
            raise ValueError(f"materialised window [{t0}, {t1}) is not an aligned {window_ms} ms window")
        done.add(t0)
    return done


def _plan_shard(lease: Lease, batches: Sequence[BatchKey], progress: ShardProgress | None,
                done: set[int] | Materialised, window_ms: int, first_window_ms: int | None = None,
                chain: ChainEvidence | None = None) -> ShardPlan:
    key = lease.lease_key
    if lease.is_ended:
        return ShardPlan(key, None, False, "already SHARD_END")
    current = lease.checkpoint
    pending = sorted((b for b in batches if checkpoint_advances(current, b.last)), key=lambda b: b.first.key())
    broken = _chain_break(key, current, pending, chain)
    chained = pending if broken is None else pending[:broken[0]]  # provably consecutive from the checkpoint
    commit: Checkpoint | None = None
    stop = None
    blocked: int | None = None
    before_start = 0
    for b in chained:
        w = window_floor(b.minute_ms, window_ms)
        if first_window_ms is not None and w < first_window_ms:
            before_start += 1  # in no partition: never transformed by a window run (see the module docstring)
            commit = b.last
            continue
        if not batch_materialised(done, w, b.key()):
            coverage.hit("plan.commit-stops-at-an-unmaterialised-window")
            stop = f"window starting {w} (batch {b.key()}) not materialised (or the batch landed after its run)"
            blocked = w
            break
        commit = b.last
    if stop is None and broken is not None:
        coverage.hit("plan.commit-stops-at-a-chain-break")
        stop = broken[1]
    chain_stop = broken[1] if broken is not None and stop == broken[1] else None

    end = False
    reason = stop or ("every landed batch is in a materialised window" if pending else "no landed batch after "
                      f"the checkpoint {current}")
    if before_start:
        reason = f"{reason}; {before_start} batch(es) before the first partition stepped over, untransformed"
    if progress is not None and progress.shard_end_landed:
        end, why = _may_end(chained, progress, done, window_ms, current, first_window_ms,
                            broken_before=broken is not None,
                            started=chain.starts.get(key) if chain is not None else None)
        reason = f"{reason}; {why}"
        coverage.hit("plan.shard-ended" if end else "plan.shard-end-held")
    return ShardPlan(key, commit, end, reason, before_start, blocked, chain_stop)


def _chain_break(shard: str, current: Checkpoint, pending: Sequence[BatchKey],
                 chain: ChainEvidence | None) -> tuple[int, str] | None:
    """The first pending batch not proven to follow the one before it (or the checkpoint), and why; None when
    the whole run is consecutive. Overlaps break it whatever the evidence."""
    previous: BatchKey | None = None
    for i, b in enumerate(pending):
        if previous is not None and b.first.key() <= previous.last.key():
            return i, f"overlapping batches {previous.key()} and {b.key()}: not advancing past them"
        why = None if chain is None else _unproven(shard, current, previous, b, chain)
        if why is not None:
            return i, f"{why}: not advancing past it (a missing batch would be checkpointed untransformed)"
        previous = b
    return None


def _unproven(shard: str, current: Checkpoint, previous: BatchKey | None, b: BatchKey,
              chain: ChainEvidence) -> str | None:
    """Why `b` is not proven to follow `previous` (or, first, the checkpoint); None when it is."""
    if previous is None and current.is_starting_sentinel:
        named = chain.starts.get(shard)
        if named == b.key():
            return None
        if ends_empty(named):
            return (f"the first landed batch {b.key()} follows {current}, but the start link after it says the "
                    f"shard ended with nothing landed: not of the shard's chain")
        return (f"the first landed batch {b.key()} is not the batch the start link after {current} names "
                f"({named or 'no start link'}): records before it may not be landed")
    if previous is None and b.first.key() <= current.key():
        return None  # the checkpoint is inside it (a peer committed mid-batch): nothing between them
    expected = previous.last if previous is not None else current
    follows = chain.follows(shard, b)
    if follows == expected.key():
        return None
    after = "no link" if follows is None else "a link after " + "/".join(str(p) for p in follows[1:])
    what = f"the previous landed batch ends at {expected}" if previous is not None else f"the checkpoint is {expected}"
    return f"gap before {b.key()}: its minute holds {after} below its first record, but {what}"


def _may_end(pending: Sequence[BatchKey], progress: ShardProgress, done: set[int] | Materialised, window_ms: int,
             current: Checkpoint, first_window_ms: int | None = None, *,
             broken_before: bool = False, started: str | None = None) -> tuple[bool, str]:
    """`pending`: the batches after the checkpoint proven consecutive; `broken_before`: the chain breaks after
    them (the shard's last record must then be in `pending` for the shard to end); `started`: the batch the
    start link names, when the checkpoint is a starting position (`layout.ENDED_EMPTY`: the holder that ended
    the shard with nothing landed claimed it for that)."""
    landed = progress.landed
    if landed is None and current.is_starting_sentinel and ends_empty(started):
        # The ending holder's claim of the start: no holder's chain can begin after it, so nothing is owed.
        return True, f"shard end landed; the start link after {current} says the shard ended with nothing landed: end"
    if landed is None and current.is_starting_sentinel and started is not None:
        # The holder saw nothing landed, yet a chain begins at the start link (claimed by a holder it never
        # saw, its batch perhaps never written): the records from that batch on are not landed as far as
        # the holder's progress tells.
        return False, f"shard end landed with nothing landed, but the start link names {started}: not ending"
    if landed is None or not checkpoint_advances(current, landed):
        # Nothing landed after the checkpoint: the shard's last record (if any) is committed already.
        return True, "shard end landed, nothing after the checkpoint: end"
    holder = next((b for b in pending if b.first.key() <= landed.key() <= b.last.key()), None)
    if holder is None:
        where = "the chain breaks before it" if broken_before else "no listed batch holds it"
        return False, f"shard end landed at {landed}, but {where}: not ending"
    last_window = window_floor(holder.minute_ms, window_ms)
    missing = sorted({window_floor(b.minute_ms, window_ms) for b in pending
                      if not batch_materialised(done, window_floor(b.minute_ms, window_ms), b.key())
                      and (first_window_ms is None or window_floor(b.minute_ms, window_ms) >= first_window_ms)}
                     - {last_window})
    if missing:
        return False, f"shard end landed; windows {missing} not materialised: not ending"
    return True, (f"shard end landed; every earlier window materialised (its last window {last_window} may wait "
                  f"for its children): end")


def apply_plan(plan: CheckpointPlan, lease_table, *, shards: Sequence[Shard] | None = None,
               initial: Checkpoint = Checkpoint(TRIM_HORIZON)) -> list[Committed]:
    """Commit the plan with the lease table's conditional writes (any process may).

    Checkpoints only move forward (the table's condition), so a stale plan is harmless. After ending a
    shard, its children's leases are created (if `shards`, the stream's shard list, is given): the worker
    holding the ended lease does the same when its heartbeat sees SHARD_END; creation is conditional.
    """

    out: list[Committed] = []
    leases_now: list[Lease] | None = None
    for key, shard_plan in sorted(plan.shards.items()):
        if shard_plan.commit is None and not shard_plan.end:
            continue
        checkpointed = False
        if shard_plan.commit is not None:
            checkpointed = lease_table.checkpoint(key, shard_plan.commit)
        ended = False
        children: tuple[str, ...] = ()
        if shard_plan.end:
            ended = lease_table.end(key)
            if ended and shards is not None:
                if leases_now is None:
                    leases_now = lease_table.scan()
                created = []
                for child in child_leases_on_end(key, shards, leases_now, initial):
                    if lease_table.create(child):
                        created.append(child.lease_key)
                        leases_now.append(child)
                children = tuple(created)
        log.info("checkpoint plan %s: commit %s (%s), end %s, children %s — %s", key, shard_plan.commit,
                 checkpointed, ended, list(children), shard_plan.reason)
        out.append(Committed(key, shard_plan.commit, checkpointed, ended, children))
    return out
