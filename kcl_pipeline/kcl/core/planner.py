"""The lease manager's decisions, as pure functions: which leases to delete, create, acquire or steal.

No clock and no I/O here: the manager (manager.py) scans the table, lists the shards and feeds the results
in; the same functions run in the conformance tests and in the fleet simulation. Everything is linear in
the number of shards and leases (dicts and sets, one graph walk per question), so a 10,000-shard stream
with 100 consumers plans in a few milliseconds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from .balance import effective_loads, overloaded_owners, plan_steal, reported_load
from .lease_rules import HANDOFF_ATTRIBUTE
from .model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, Lease, Shard
from .shard_graph import ShardGraph

# -- scope: which leases are this stream's -----------------------------------------------------------

def scoped_leases(leases: Sequence[Lease], shards: Sequence[Shard]) -> list[Lease]:
    """The leases of this stream's listed shards: the only ones this consumer may acquire, renew or steal.

    A table may be shared: a KCL multi-stream application (keys `account:stream:epoch:shardId`), another
    application of the same name on another stream, KCL 3.x's other entities. Keys it does not know are
    never touched.
    """
    listed = {shard.shard_id for shard in shards}
    return [lease for lease in leases if lease.lease_key in listed]


def unknown_lease_keys(leases: Sequence[Lease], shards: Sequence[Shard]) -> frozenset[str]:
    """Lease keys not among the listed shards (new shards since the last listing, or other streams')."""
    listed = {shard.shard_id for shard in shards}
    return frozenset(lease.lease_key for lease in leases if lease.lease_key not in listed)


def parent_finished(lease: Lease | None, drained_attribute: str | None = None) -> bool:
    """Reading order: a child may be read once every parent is finished — its lease SHARD_END or gone
    (Java's BlockOnParentShard), or, with `drained_attribute`, marked as having every record delivered
    durably (the pipeline lands a parent's last record long before it may write SHARD_END)."""
    if lease is None or lease.is_ended:
        return True
    return drained_attribute is not None and lease.extra.get(drained_attribute) is True


def blocked_on_parents(lease: Lease, by_key: Mapping[str, Lease], drained_attribute: str | None = None) -> list[str]:
    """The parents of `lease` not yet finished (empty: it may be read)."""
    return [p for p in lease.parent_shard_ids if not parent_finished(by_key.get(p), drained_attribute)]


# -- deleting ------------------------------------------------------------------------------------

def leases_to_delete(leases: Sequence[Lease], shards: Sequence[Shard]) -> list[Lease]:
    """Leases of this stream whose shard is finished; each is deleted on condition of its observed counter.

    Finished (Java's lease cleanup): SHARD_END with every child's lease started (its checkpoint past the
    starting sentinel) or itself finished and removed; or gone from the stream past retention — provably
    this stream's because a listed shard still names it as a parent. A lease this consumer cannot prove
    to be its own (other streams, other applications, keys it does not understand) is never deleted.
    An empty listing deletes nothing: a stream always has an open shard, so an empty result is a failed or
    misdirected call, never evidence that every lease is obsolete.
    """
    if not shards:
        return []
    graph = ShardGraph(shards)
    by_key = {lease.lease_key: lease for lease in leases}
    named_as_parent = {parent for shard in shards for parent in shard.parent_ids}
    leased_below = graph.strict_ancestors_of({k: v for k, v in by_key.items() if k in graph})
    doomed: list[Lease] = []
    for lease in leases:
        key = lease.lease_key
        if key not in graph:
            if key in named_as_parent:
                doomed.append(lease)  # trimmed out of the stream: nothing can be read from it any more
            continue
        if not lease.is_ended:
            continue
        children = graph.children(key)
        if children and all(_started(by_key.get(c)) or (c not in by_key and c in leased_below) for c in children):
            doomed.append(lease)
    return doomed


def _started(lease: Lease | None) -> bool:
    return lease is not None and not lease.checkpoint.is_starting_sentinel


# -- creating ------------------------------------------------------------------------------------

def _starting_positions(initial: Checkpoint) -> tuple[Checkpoint, Checkpoint]:
    """(first use, child of an ended parent). Children start at TRIM_HORIZON so that nothing between the
    parent's end and the child's first record is skipped; AT_TIMESTAMP keeps its timestamp (Java and
    Disney agree), which still reads the child from its start when the timestamp is older."""
    if initial.sequence_number not in (TRIM_HORIZON, LATEST, AT_TIMESTAMP):
        raise ValueError(
            f"initial position must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {initial.sequence_number!r}"
        )
    if initial.sequence_number == AT_TIMESTAMP:
        return initial, initial
    return initial, Checkpoint(TRIM_HORIZON)


def _new_lease(graph: ShardGraph, shard: Shard, checkpoint: Checkpoint) -> Lease:
    hkr = shard.hash_key_range
    return Lease(
        lease_key=shard.shard_id,
        checkpoint=checkpoint,
        lease_owner=None,
        lease_counter=0,
        parent_shard_ids=graph.parents(shard.shard_id),
        starting_hash_key=hkr.starting_hash_key if hkr else None,
        ending_hash_key=hkr.ending_hash_key if hkr else None,
    )


def _listed_leases(graph: ShardGraph, leases: Sequence[Lease]) -> dict[str, Lease]:
    # A lease whose shard is not listed is about to be deleted: its shard is gone, nothing waits for it.
    return {lease.lease_key: lease for lease in leases if lease.lease_key in graph}


def _parents_done(graph: ShardGraph, shard_id: str, leases: Mapping[str, Lease], ended: str | None = None,
                  drained_attribute: str | None = None) -> bool:
    """Every parent has a finished lease or is gone from the listing (`ended` counts as SHARD_END)."""
    for parent in graph.parents(shard_id):
        if parent == ended or parent not in graph:
            continue
        lease = leases.get(parent)
        if lease is None or not parent_finished(lease, drained_attribute):
            return False
    return True


def leases_to_create(initial: Checkpoint, shards: Sequence[Shard], leases: Sequence[Lease],
                     drained_attribute: str | None = None) -> list[Lease]:
    """The leases missing from the table, in listing order (conditional puts: the first creator wins).

    One rule, for an empty table and a running fleet alike. Never a lease for a shard with a leased
    descendant (it was processed, or deliberately skipped) nor for a child of a parent lease that has not
    reached SHARD_END (its records would overtake the parent's). Otherwise a shard gets a lease when:
      * all its listed parents' leases are SHARD_END (or drained, see `parent_finished`): the child of
        ended parents, from TRIM_HORIZON (AT_TIMESTAMP keeps the timestamp); the worker that ended the
        parent usually made it already;
      * TRIM_HORIZON / AT_TIMESTAMP: it is a root (oldest generation present) — read the whole history;
      * LATEST, for a shard descending from no lease: it is open (the newest data), or it is the parent
        of an unleased descendant of a lease — Java's gap fill, without which that descendant's other
        parent would never be read and the descendant never unblocked;
      * a child whose parents are all gone from the listing (trimmed by retention) while one still has a
        lease in the table: this application was reading its parents, so it reads the child from
        TRIM_HORIZON (AT_TIMESTAMP keeps the timestamp). Taken for a root, a LATEST application would start it
        at the tip and never read what the child holds (the simulation's seed 2577: its parents' leases
        were deleted in the very cycle that created it). Workers create children at SHARD_END first; this
        covers a parent whose end never came (a lost batch held it, its shard trimmed meanwhile). A new
        application, with no lease of those parents, still starts such a child as a root.
    """
    first_use, after_parent = _starting_positions(initial)
    graph = ShardGraph(shards)
    by_key = _listed_leases(graph, leases)
    # Both sets come from one linear walk each, so the loop below does O(1) work per shard.
    has_leased_descendant = graph.strict_ancestors_of(by_key)
    under_a_lease = graph.descendants_of(by_key)  # leased shards and everything below them
    latest = initial.sequence_number == LATEST
    leased = {lease.lease_key for lease in leases}  # listed or not: a lease of a trimmed shard is still there

    created: list[Lease] = []
    for shard_id, shard in graph.shards.items():
        if shard_id in by_key or shard_id in has_leased_descendant:
            continue
        listed_parents = graph.listed_parents(shard_id)
        if listed_parents:
            parent_leases = [by_key.get(p) for p in listed_parents]
            if any(lease is not None and not parent_finished(lease, drained_attribute) for lease in parent_leases):
                continue  # a parent is still being read
            if all(lease is not None for lease in parent_leases):
                created.append(_new_lease(graph, shard, after_parent))
                continue
        elif any(p in leased for p in graph.parents(shard_id)):
            created.append(_new_lease(graph, shard, after_parent))  # its parents trimmed: read on from them
            continue
        elif not latest:
            created.append(_new_lease(graph, shard, first_use))  # a root: TRIM_HORIZON / AT_TIMESTAMP start here
            continue
        if latest and shard_id not in under_a_lease and (
            graph.is_open(shard_id)
            or any(c not in by_key and c in under_a_lease for c in graph.children(shard_id))
        ):
            created.append(_new_lease(graph, shard, first_use))
    return created


def child_leases_on_end(
    ended_shard_id: str, shards: Sequence[Shard], leases: Sequence[Lease], initial: Checkpoint,
    drained_attribute: str | None = None,
) -> list[Lease]:
    """The leases the worker that just ended `ended_shard_id` creates for its children.

    `leases` may predate the SHARD_END write, so the ended shard counts as ended whatever it says. A merged
    child waits until every other parent is SHARD_END or gone; whichever parent ends last creates it.
    """
    _, after_parent = _starting_positions(initial)
    graph = ShardGraph(shards)
    by_key = _listed_leases(graph, leases)
    children = [c for c in graph.children(ended_shard_id) if c not in by_key]
    has_leased_descendant = graph.strict_ancestors_of(by_key)
    return [
        _new_lease(graph, graph.shard(child), after_parent)
        for child in children
        if child not in has_leased_descendant
        and _parents_done(graph, child, by_key, ended=ended_shard_id, drained_attribute=drained_attribute)
    ]


# -- lease ages (expiry by this consumer's own clock) -----------------------------------------------

class LeaseAges:
    """When this consumer last saw each lease's (counter, owner) change.

    The table holds no timestamps (Java KCL's design): a lease is expired when its counter and owner have
    not changed for the expiry, as measured on the observer's own clock. A lease seen for the first time
    is therefore young, not expired: a consumer that just started cannot tell a dead owner from a live one
    until a full expiry has passed (Java behaves the same). Leases missing from a scan are forgotten.
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, str | None], float]] = {}

    def observe(self, leases: Sequence[Lease], now: float) -> None:
        seen: dict[str, tuple[tuple[int, str | None], float]] = {}
        for lease in leases:
            state = (lease.lease_counter, lease.lease_owner)
            previous = self._seen.get(lease.lease_key)
            seen[lease.lease_key] = previous if previous is not None and previous[0] == state else (state, now)
        self._seen = seen

    def age(self, key: str, now: float) -> float | None:
        """Seconds since the lease last changed, or None if it was never observed."""
        entry = self._seen.get(key)
        return None if entry is None else now - entry[1]

    def expired(self, key: str, now: float, expiry: float) -> bool:
        age = self.age(key, now)
        return age is not None and age > expiry

    def ages(self, now: float) -> dict[str, float]:
        return {key: now - since for key, (_, since) in self._seen.items()}


def stuck_local_leases(worker_id: str, leases: Sequence[Lease], locally_worked: Collection[str],
                       ages: "LeaseAges", now: float, expiry_seconds: float,
                       spawned_at: Mapping[str, float] | None = None) -> list[Lease]:
    """Leases a local worker holds in our name whose counter has not moved for longer than the expiry: the
    worker is frozen or stuck (its heartbeats stopped), yet as long as it lives no consumer works the lease
    — peers wait for it to expire and this manager counts it as worked. Its manager must stop it for good.

    Also a local worker's lease that is not ours, unchanged for longer than the expiry, when the worker was
    spawned (`spawned_at`, this manager's clock) longer than an expiry ago: a live worker would have taken it
    (its counter moves) or ended by now; this one froze before its take, or while another holder took the
    lease from it — a holder that then stopped working it (a Java peer that lost it to its own retried write,
    a consumer that crashed). As long as the frozen worker lives this manager never takes that lease (it
    counts as worked here), and every other consumer may be gone (seed 3407).

    Never a worker spawned less than an expiry ago: it is taking the lease (a stale one of ours, left by an
    earlier incarnation under the same id, is unchanged past the expiry until its take shows), and a scan from
    before its take must not kill it (seed 192, `short-reads`: killed a second after its spawn, before its
    release, so a graceful stop left the lease held)."""
    spawned_at = spawned_at or {}
    stuck = []
    for lease in leases:
        key = lease.lease_key
        if key not in locally_worked or lease.is_ended or not ages.expired(key, now, expiry_seconds):
            continue
        spawned = spawned_at.get(key)
        if spawned is not None and now - spawned <= expiry_seconds:
            continue  # just spawned: its take may not show yet
        if lease.lease_owner == worker_id or spawned is not None:
            stuck.append(lease)
    return stuck


# -- acquiring and stealing ------------------------------------------------------------------------

@dataclass(frozen=True)
class AcquirePlan:
    """Leases to acquire this cycle (each with the owner seen, for the conditional update)."""

    take: list[Lease] = field(default_factory=list)
    steal: Lease | None = None
    overloaded: tuple[str, ...] = ()  # owners above the load tolerance this cycle (load-aware balance)

    @property
    def leases(self) -> list[Lease]:
        return self.take + ([self.steal] if self.steal is not None else [])


def leases_to_acquire(
    worker_id: str,
    leases: Sequence[Lease],
    heartbeat_ages: Mapping[str, float],
    *,
    expiry_seconds: float,
    leases_to_acquire: int,
    max_leases: int,
    recently_ended_by_us: Collection[str] = (),
    locally_worked: Collection[str] = (),
    drained_attribute: str | None = None,
    predecessor: Callable[[str], bool] | None = None,
    idle_consumers: int = 0,
    confirmed_overloaded: Collection[str] | None = None,
    backing_off: Collection[str] = frozenset(),
    rng: random.Random,
) -> AcquirePlan:
    """What this consumer tries to acquire this cycle.

    `leases` must be this stream's (see `scoped_leases`). Candidates are leases not at SHARD_END, whose
    parents are all finished (`parent_finished`: never read a child before its parents), and not worked
    here that are unowned or expired (age greater
    than the expiry; a lease absent from `heartbeat_ages` never expires), our own expired leases
    included (a worker that died without releasing). At most `leases_to_acquire` per cycle and never
    beyond `max_leases` held (held = leases worked here plus live leases the table gives us). When this
    consumer just ended shards, only their children are taken this cycle: it read the parents, so it is
    the natural reader of the children. If nothing is taken, steal one lease, at random, from the most
    loaded live owner when it holds at least max(avg + 1, ours + 2), avg being the integer mean over live
    owners, us included. The integer mean guarantees that any spread of 2 or more gets stolen from,
    so the fleet settles with max - min <= 1; ours + 2 means a steal never reverses the imbalance.
    When any live lease reports its throughput (`throughputKBps`, written by holders on heartbeats), the
    steal is load-aware instead (balance.py: load converges within its tolerance, hot shards spread, one
    steal at most, hysteresis); `idle_consumers` counts live peers holding no lease (worker metrics).
    The plan names the owners above the load tolerance (`overloaded`); a load-aware steal is made only
    from an owner in `confirmed_overloaded` when given (the cycle's patience: seen so for a while).
    Owners for which `predecessor` is true are earlier incarnations of this very consumer (a reloaded code
    server): their leases are never stolen nor counted for balance, only taken once expired. Leases in
    `backing_off` (hand-offs recently overtaken: cycle.handoffs_backing_off) are counted but not stolen.
    """
    if leases_to_acquire < 0 or max_leases < 0:
        raise ValueError(f"leases_to_acquire ({leases_to_acquire}) and max_leases ({max_leases}) must be >= 0")
    local = set(locally_worked)
    ended_by_us = set(recently_ended_by_us)
    held = len(local)
    candidates: list[Lease] = []
    owned: dict[str, list[Lease]] = {}
    by_key = {lease.lease_key: lease for lease in leases}
    for lease in leases:
        if lease.is_ended or lease.lease_key in local:
            continue
        age = heartbeat_ages.get(lease.lease_key)
        if lease.lease_owner is None or (age is not None and age > expiry_seconds):
            if not blocked_on_parents(lease, by_key, drained_attribute):
                candidates.append(lease)
        elif lease.lease_owner == worker_id:
            held += 1  # ours and live, but no local worker: another process of ours, or a restart
        elif predecessor is not None and predecessor(lease.lease_owner):
            continue  # an earlier incarnation of this consumer, stopping: take its leases when they expire
        else:
            owned.setdefault(lease.lease_owner, []).append(lease)

    # A KCL 3.x graceful hand-off in flight (leaseOwner names the new owner, checkpointOwner the old one
    # that still has to checkpoint): counted for balance, never stolen — stealing would cut the hand-off.
    stealable = {owner: [lease for lease in held
                         if HANDOFF_ATTRIBUTE not in lease.extra and lease.lease_key not in backing_off]
                 for owner, held in owned.items()}

    capacity = min(leases_to_acquire, max_leases - held)
    if capacity <= 0:
        return AcquirePlan()
    if ended_by_us:
        children = [lease for lease in candidates if ended_by_us.intersection(lease.parent_shard_ids)]
        candidates = children or candidates
    if candidates:
        # Sorted first so that the pick depends on the rng alone, not on scan order.
        candidates.sort(key=lambda lease: lease.lease_key)
        return AcquirePlan(take=rng.sample(candidates, min(capacity, len(candidates))))

    if not owned:
        return AcquirePlan()
    loads = _reported_loads(leases, local, worker_id, owned)
    if any(load is not None for load in loads.values()):
        return _load_aware_steal(worker_id, loads, owned, stealable, by_key, idle_consumers, confirmed_overloaded)
    counts = {owner: len(held_by) for owner, held_by in owned.items()}
    average = (sum(counts.values()) + held) // (len(counts) + 1)
    richest = max(counts.values())
    if richest < max(average + 1, held + 2):
        return AcquirePlan()
    victims = sorted(owner for owner, count in counts.items() if count == richest and stealable[owner])
    if not victims:
        return AcquirePlan()
    victim = rng.choice(victims)
    return AcquirePlan(steal=rng.choice(sorted(stealable[victim], key=lambda lease: lease.lease_key)))


def _reported_loads(leases: Sequence[Lease], local: Collection[str], worker_id: str,
                    owned: Mapping[str, list[Lease]]) -> dict[str, float | None]:
    counted = {lease.lease_key for held in owned.values() for lease in held}
    return {lease.lease_key: reported_load(lease) for lease in leases
            if lease.lease_key in local or lease.lease_key in counted
            or (lease.lease_owner == worker_id and not lease.is_ended)}


def _load_aware_steal(worker_id: str, reported: Mapping[str, float | None], owned: Mapping[str, list[Lease]],
                      stealable: Mapping[str, list[Lease]], by_key: Mapping[str, Lease], idle_consumers: int,
                      confirmed: Collection[str] | None) -> AcquirePlan:
    loads = effective_loads(reported)
    theirs = {owner: {lease.lease_key: loads[lease.lease_key] for lease in held} for owner, held in owned.items()}
    counted = {key for held in theirs.values() for key in held}
    mine = {key: load for key, load in loads.items() if key not in counted}
    overloaded = tuple(overloaded_owners(worker_id, mine, theirs, idle_consumers=idle_consumers))
    steal = plan_steal(worker_id, mine, theirs, idle_consumers=idle_consumers, confirmed=confirmed,
                       movable={lease.lease_key for held in stealable.values() for lease in held})
    return AcquirePlan(steal=None if steal is None else by_key[steal.lease_key], overloaded=overloaded)


__all__ = [
    "AcquirePlan",
    "LeaseAges",
    "blocked_on_parents",
    "parent_finished",
    "reported_load",
    "scoped_leases",
    "stuck_local_leases",
    "unknown_lease_keys",
    "child_leases_on_end",
    "leases_to_acquire",
    "leases_to_create",
    "leases_to_delete",
]
