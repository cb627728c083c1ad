"""The lease manager's decisions, as pure functions: which leases to acquire or steal, and when a lease is stuck.

No clock and no I/O here: the manager scans the table, lists the shards and feeds the results in (what to delete
and create as shards split and merge is kcl/core/lineage.py's); the same functions run in the conformance tests
and in the fleet simulation. Everything is linear in the number of shards and leases (dicts and sets, one graph
walk per question), so a 10,000-shard stream with 100 consumers plans in a few milliseconds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

from ..lineage import blocked_on_parents
from ..model import Lease
from ..table.lease_rules import HANDOFF_ATTRIBUTE
from .balance import effective_loads, overloaded_owners, plan_steal, reported_load

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


# How many expiries a spawned worker has to show its take before it is judged stuck (stuck_local_leases), and how
# many times that patience doubles for a lease whose workers were each killed before their take (start_patience).
START_PATIENCE_EXPIRIES = 2
START_PATIENCE_DOUBLINGS = 3


def start_patience(slow_starts: int) -> float:
    """Expiries a worker spawned for a free lease (or one of ours) has to show its take, after `slow_starts`
    workers of that lease in a row were killed before theirs showed. On a host loaded enough that a worker's start
    outlasts the patience, every respawn would be killed the same way and the lease never worked: the patience
    doubles with each such kill, up to START_PATIENCE_DOUBLINGS times, and a shown take resets it."""
    return START_PATIENCE_EXPIRIES * 2 ** min(max(slow_starts, 0), START_PATIENCE_DOUBLINGS)


def take_shown(key: str, ages: "LeaseAges", now: float, spawned_at: Mapping[str, float]) -> bool:
    """Whether the lease changed after its local worker's spawn (its take, or another holder's move)."""
    spawned = spawned_at.get(key)
    age = ages.age(key, now)
    return spawned is not None and age is not None and now - age > spawned


def stuck_local_leases(worker_id: str, leases: Sequence[Lease], locally_worked: Collection[str],
                       ages: "LeaseAges", now: float, expiry_seconds: float,
                       spawned_at: Mapping[str, float] | None = None,
                       slow_starts: Mapping[str, int] | None = None) -> list[Lease]:
    """Leases a local worker holds in our name whose counter has not moved for longer than the expiry: the
    worker is frozen or stuck (its heartbeats stopped), yet as long as it lives no consumer works the lease
    — peers wait for it to expire and this manager counts it as worked. Its manager must stop it for good.

    Also a local worker's lease that is not ours, unchanged for longer than the expiry, when the worker was
    spawned (`spawned_at`, this manager's clock) longer than an expiry ago: a live worker would have taken it
    (its counter moves) or ended by now; this one froze before its take, or while another holder took the
    lease from it — a holder that then stopped working it (a Java peer that lost it to its own retried write,
    a consumer that crashed). As long as the frozen worker lives this manager never takes that lease (it
    counts as worked here), and every other consumer may be gone.

    Never a worker spawned less than two expiries ago (`start_patience`, longer after `slow_starts` such kills of
    the lease in a row) while nothing of its lease changed since its spawn: it is taking the lease as it found
    it — free, a stale one of ours (left by an earlier incarnation under the same id), or one expired in another
    consumer's name (a consumer that stopped or died with it) — and each is unchanged past the expiry until its
    take shows. A scan from before its take must not kill it (killed a second after its spawn, before its release,
    it would leave the lease held through a graceful stop). On a loaded host a worker's start alone can take longer
    than an expiry: with one expiry's patience every respawn is killed before its take the same way, and the lease
    is never worked. A worker frozen before its take is found after its patience instead; one frozen after its
    take (a change seen since its spawn), an expiry after it. For a lease another holder moved since the spawn
    (took it from this worker), one expiry: that holder works it meanwhile, or, having dropped it, leaves it to
    this kill."""
    spawned_at = spawned_at or {}
    slow_starts = slow_starts or {}
    stuck = []
    for lease in leases:
        key = lease.lease_key
        if key not in locally_worked or lease.is_ended or not ages.expired(key, now, expiry_seconds):
            continue
        spawned = spawned_at.get(key)
        # Just spawned: its take may not show yet, whoever's name the lease was left in. Once a change after the spawn
        # shows (its take, or another holder's move: working it, or, having dropped it, leaving it to this kill):
        # one expiry.
        shown = take_shown(key, ages, now, spawned_at)
        patience = 1 if shown else start_patience(slow_starts.get(key, 0))
        if spawned is not None and now - spawned <= patience * expiry_seconds:
            continue
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


__all__ = ["START_PATIENCE_DOUBLINGS", "START_PATIENCE_EXPIRIES", "AcquirePlan", "LeaseAges", "leases_to_acquire",
           "start_patience", "stuck_local_leases", "take_shown"]
