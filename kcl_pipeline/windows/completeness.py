"""Window completeness (pure): has every record that arrived in [t0, t1) landed?

A shard is done with the window when one of these holds (checked in this order):

1. it has ended: its lease is SHARD_END, or its progress says the shard's last record landed;
2. it landed a record that arrived at or after t1 (arrival timestamps grow with the sequence within a
   shard, so every record before it, and so every record of the window, is landed);
   or it has read, and holds, the record right after its last landed one, and that record arrived at or
   after t1 (`next_arrival_ms`: the same argument, one record on — see "The next record" below);
3. it is caught up: a poll at or after t1 + grace found MillisBehindLatest 0 with everything delivered
   landed (grace covers the gap between the service's arrival clock and the worker's clock, and records
   becoming readable slightly after they arrive);
4. it cannot hold records of the window:
   - it was born after t1: a parent (or any ancestor) landed a record arriving at or after t1, so the
     parent was still open then — its children only receive records from the moment it closed;
   - its lease starts at AT_TIMESTAMP at or after t1 (it will never read the window);
   - it has no lease, and a descendant does: its lease was finished and removed (Java KCL deletes the
     leases of completed parents), or it was never to be read (LATEST starts at the open shards).

Only listed shards count. Shards the stream no longer lists (aged out of retention) cannot be read
any more, so nothing can be waited for from them; progress and leases of such shards are ignored.

A shard with no lease and no leased descendant is waited on: its lease is not created yet (typically a
child waiting for its parent's SHARD_END). Note the consequence for the checkpoint plan
(windows/checkpoints/plan.py): a parent must be ended before the window holding its last record is complete.

Progress may come from several consumers and arrive late: merge it first (progress.merge_all); every
fact used here only ever becomes true, so a merged view never wrongly un-completes a window.

The next record. A landing sink publishes, with its last landed record L, the arrival H of the first
record it holds and has not landed, and only when that record is the one right after L in the shard
(zone/sink.py `_publish_next`: the held records are consecutive from the record after the buffer's
predecessor, and it publishes only when that predecessor is L). So the fact is "the successor of L
arrived at H", and it is a fact about the shard, not about the holder:

* L is landed, and so is every record of the chain before L (batches are written in chain order, each
  fenced by the link after its predecessor) — the fact rule 2 already rests on;
* a position of a shard has exactly one successor, whoever reads it, so any holder that read it saw the
  same H; a window ending at or before H ends before the successor arrived, so each of its records
  arrived before it, comes before it in the shard and is at or before L: landed.

Across hand-offs: a lease's new holder re-reads from the checkpoint or from the last landed batch, and
publishes the fact only once its own held records follow its own L again; a previous holder's report
(merged late, or held in its lease item until the new holder's first heartbeat) says the same of its L,
which stays landed whoever holds the lease. What is never published is the arrival of a record whose
predecessor is not landed: a holder that has landed nothing yet holds the chain's first records, but the
chain's start is settled only when a holder's first batch claims its start link (another holder, reading
LATEST at another moment, may claim it from earlier records that arrived in the window and are not landed
yet), and a holder resuming after a lease checkpoint beyond the last landed batch it found does not know
that the records between are in the zone. Merging keeps the fact with the `landed` it follows; when
`landed` moves past the successor, `landed_arrival_ms` is at least H, so rule 2 takes over and a window
that passed stays passed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ..kcl.core import coverage
from ..kcl.core.model import AT_TIMESTAMP, Lease, Shard
from ..zone.progress import ShardProgress


@dataclass(frozen=True)
class WindowStatus:
    window_start_ms: int
    window_end_ms: int
    complete: bool
    waiting_on: list[str]  # shard ids, sorted
    reasons: dict[str, str] = field(default_factory=dict)  # every listed shard -> why done / why waiting


def window_complete(window_start_ms: int, window_end_ms: int, shards: Sequence[Shard],
                    progress: Mapping[str, ShardProgress], leases: Iterable[Lease] | Mapping[str, Lease],
                    grace_ms: int) -> WindowStatus:
    if window_end_ms <= window_start_ms:
        raise ValueError(f"window [{window_start_ms}, {window_end_ms}) is empty")
    if grace_ms < 0:
        raise ValueError(f"grace_ms must be >= 0, got {grace_ms}")
    t1 = window_end_ms
    by_key = dict(leases) if isinstance(leases, Mapping) else {lease.lease_key: lease for lease in leases}
    listed = {s.shard_id: s for s in shards}
    children: dict[str, list[str]] = {}
    for s in shards:
        for parent in s.parent_ids:
            children.setdefault(parent, []).append(s.shard_id)

    born_after: dict[str, str | None] = {}

    def born_after_window(shard_id: str) -> str | None:
        """Why `shard_id` only has records from t1 on (an ancestor was open then), or None."""
        if shard_id not in born_after:
            born_after[shard_id] = None  # cycle guard (a malformed graph)
            why = None
            for parent in listed[shard_id].parent_ids if shard_id in listed else ():
                p = progress.get(parent)
                if p is not None and p.landed_arrival_ms is not None and p.landed_arrival_ms >= t1:
                    why = f"parent {parent} landed a record arriving at {p.landed_arrival_ms} >= window end"
                    break
                if born_after_window(parent):
                    why = f"parent {parent} was born after the window"
                    break
            born_after[shard_id] = why
        return born_after[shard_id]

    def has_leased_descendant(shard_id: str, seen: set[str]) -> bool:
        for child in children.get(shard_id, ()):
            if child in seen:
                continue
            seen.add(child)
            if child in by_key or has_leased_descendant(child, seen):
                return True
        return False

    reasons: dict[str, str] = {}
    waiting: list[str] = []
    for shard_id in listed:
        lease = by_key.get(shard_id)
        p = progress.get(shard_id)
        done = None
        if lease is not None and lease.is_ended:
            done = "ended (lease SHARD_END)"
            coverage.hit("completeness.passed.lease-ended")
        elif p is not None and p.shard_end_landed:
            done = f"ended (last record {p.landed} landed)"
            coverage.hit("completeness.passed.last-record-landed")
        elif p is not None and p.landed_arrival_ms is not None and p.landed_arrival_ms >= t1:
            done = f"landed {p.landed} arriving at {p.landed_arrival_ms} >= window end"
            coverage.hit("completeness.passed.landed-past-the-end")
        elif (p is not None and p.landed is not None and p.next_arrival_ms is not None
              and p.next_arrival_ms >= t1):
            done = f"holds the record after {p.landed}, arriving at {p.next_arrival_ms} >= window end"
            coverage.hit("completeness.passed.next-record-past-the-end")
        elif p is not None and (caught_up := p.caught_up_at()) is not None and caught_up >= t1 + grace_ms:
            done = f"caught up at {p.polled_at_ms} >= window end + grace"
            coverage.hit("completeness.passed.caught-up-after-the-grace")
        elif born_after_window(shard_id):
            done = f"born after the window: {born_after_window(shard_id)}"
            coverage.hit("completeness.passed.born-after")
        elif (lease is not None and lease.checkpoint.sequence_number == AT_TIMESTAMP
              and lease.checkpoint.sub_sequence_number >= t1):
            done = f"starts at AT_TIMESTAMP {lease.checkpoint.sub_sequence_number} >= window end"
            coverage.hit("completeness.passed.starts-after")
        elif lease is None and has_leased_descendant(shard_id, set()):
            done = "no lease, a descendant is leased (finished, or never to be read)"
            coverage.hit("completeness.passed.descendant-leased")
        if done is not None:
            reasons[shard_id] = done
            continue
        waiting.append(shard_id)
        if lease is None:
            reasons[shard_id] = "no lease yet" + (
                f" (waits for parent {', '.join(listed[shard_id].parent_ids)})" if listed[shard_id].parent_ids else "")
        elif p is None or (p.landed is None and p.polled_at_ms is None):
            reasons[shard_id] = f"no landing progress yet (lease checkpoint {lease.checkpoint})"
        else:
            reasons[shard_id] = (f"landed up to {p.landed} arriving at {p.landed_arrival_ms}; last settled poll "
                                 f"at {p.polled_at_ms}, {p.millis_behind_latest} ms behind")
    waiting.sort()
    coverage.hit("completeness.waits-on-a-shard" if waiting else "completeness.window-complete")
    return WindowStatus(window_start_ms, window_end_ms, not waiting, waiting, reasons)
