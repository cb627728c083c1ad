"""One lease-manager cycle, as a sans-I/O coroutine: scan → list shards → delete → create → decide → spawn.

The manager (manager.py) and the deterministic simulation (kcl_pipeline.sim) drive the same generator,
the same way as a lease's life (see lease_life.py): it yields effects (effects.py), its driver answers
them. The decisions themselves are planner.py's pure functions; this module fixes their order and what
each one is fed — which is where the subtle bugs live (a scan's observations stamped when the scan
*returned*, shards listed *after* the scan, one re-scan after deletions and creations).

`ManagerState` is what a manager remembers between cycles; a restarted process starts from a new one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from .. import coverage
from ..lease.effects import (
    Abandon,
    Create,
    CycleCoroutine,
    Delete,
    DuplicateWorkerId,
    ListShards,
    Now,
    PublishWorkerMetrics,
    ReadWorkerMetrics,
    RenewHeld,
    Scanned,
    ScanTable,
    Spawn,
)
from ..lease.lease_life import LifeOutcome, LifeResult
from ..lineage import leases_to_create, leases_to_delete, scoped_leases, unknown_lease_keys
from ..model import Checkpoint, Lease, Shard
from ..table.lease_codec import scan_entities
from ..table.lease_rules import UNSETTLED_ATTRIBUTE, held_by_another_protocol
from ..table.worker_metrics import MAX_VALUES as METRIC_VALUES
from ..table.worker_metrics import live_workers
from . import fleet_mode, retry
from .balance import confirmed_overloaded, reported_load, still_overloaded
from .planner import LeaseAges, leases_to_acquire, stuck_local_leases, take_shown


@dataclass(frozen=True)
class CycleSettings:
    worker_id: str
    initial: Checkpoint
    expiry_seconds: float
    leases_to_acquire: int
    max_leases: int
    list_shards_probability: float = 1.0
    drained_attribute: str | None = None
    worker_metrics_period_seconds: float = 0.0  # 0: this consumer publishes no worker metrics
    balance_patience_seconds: float = 0.0  # a load-aware steal needs its victim overloaded this long

    @classmethod
    def of(cls, config: Any) -> "CycleSettings":
        """From a ConsumerConfig."""
        return cls(config.worker_id, config.initial_position.checkpoint(), config.lease_expiry_seconds,
                   config.leases_to_acquire, config.max_leases, config.list_shards_probability,
                   config.parent_drained_attribute, config.worker_metrics_period_seconds,
                   balance_patience(config.cycle_seconds))


@dataclass
class ManagerState:
    ages: LeaseAges = field(default_factory=LeaseAges)
    shards: list[Shard] = field(default_factory=list)       # the last listing
    leases: list[Lease] = field(default_factory=list)       # this stream's leases as last scanned
    unknown_keys: frozenset[str] = frozenset()
    our_counters: dict[str, int] = field(default_factory=dict)  # ours in the table, not worked here
    recently_ended: set[str] = field(default_factory=set)
    list_next: bool = True
    duplicate_worker_id_sightings: int = 0
    metrics_published_at: float | None = None  # the manager's clock at the last worker metrics write
    throughput_history: list[float] = field(default_factory=list)  # published values, most recent last
    overloaded_since: dict[str, float] = field(default_factory=dict)  # owner → first cycle seen overloaded
    live_peers: frozenset[str] = frozenset()  # other workers whose metrics item is fresh (last read)
    ownership: frozenset[tuple[str, str]] = frozenset()  # (lease, owner) of the live leases last scanned
    spawned_at: dict[str, float] = field(default_factory=dict)  # lease → when its local worker was spawned
    # Lease → its local workers killed in a row before their take showed (planner.start_patience).
    slow_starts: dict[str, int] = field(default_factory=dict)
    # Steals by graceful hand-off that took nothing: lease → (how many in a row, when the last was asked).
    handoffs_overtaken: dict[str, tuple[int, float]] = field(default_factory=dict)
    handoff_asked: dict[str, float] = field(default_factory=dict)  # lease → when this cycle asked for it
    # Leases finished workers may have left in our name (LifeResult.left_at): lease → the counter to release at.
    left_at: dict[str, int] = field(default_factory=dict)
    # Leases whose local worker this manager killed as stuck, still in our name at the last scan: the kill may have
    # followed a take no scan showed, and a worker spawned after it may be stopped before its own take, leaving the
    # lease in our name.
    killed: set[str] = field(default_factory=set)
    # A Java 3.x fleet on this application: what its tables said last (the mode this consumer runs in).
    fleet: fleet_mode.FleetView = field(default_factory=fleet_mode.FleetView)
    # Leases whose worker failed: held (renewed) by this manager until their retry (retry.py).
    backoffs: dict[str, retry.Backoff] = field(default_factory=dict)


@dataclass
class CycleResult:
    total_shards: int | None = None  # None when this cycle did not list shards
    deleted: list[str] = field(default_factory=list)
    # Deleted leases whose shard left the stream (retention) before the lease ended: (lease key, its checkpoint)
    # — the records after that checkpoint may never have been processed, and nothing else will say so.
    trimmed_unfinished: list[tuple[str, Checkpoint]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    stolen: str | None = None
    leases: list[Lease] = field(default_factory=list)
    duplicate_worker_id: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # leases whose back-off ended: a worker spawned again
    backing_off: list[str] = field(default_factory=list)  # leases in back-off after this cycle
    started_at: float = 0.0
    fleet_change: str | None = None  # the Java 3.x fleet's mode changed at this cycle's scan (fleet_mode.change)


@dataclass
class CycleReport:
    """What one cycle did and the fleet it saw, as a manager reports it (its log line, its metrics, the
    sensor's metadata); an observer counts a scan into one too (windows/fleet_view.py)."""

    total_leases: int = 0
    total_shards: int | None = None  # None when this cycle did not list shards
    unclaimed_leases: int = 0
    worker_leases: int = 0
    deleted: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    stolen: str | None = None
    retried: list[str] = field(default_factory=list)
    backing_off: list[str] = field(default_factory=list)
    finished: list[LifeResult] = field(default_factory=list)  # the workers reaped at its start
    owners: dict[str, int] = field(default_factory=dict)
    fleet: str = ""  # the KCL 3.x fleet's mode and leader (fleet_mode.FleetView.summary)

    def summary(self) -> str:
        parts = [f"leases={self.total_leases}", f"shards={self.total_shards if self.total_shards is not None else '-'}",
                 f"unclaimed={self.unclaimed_leases}", f"mine={self.worker_leases}"]
        for name in ("deleted", "created", "spawned", "retried"):
            if getattr(self, name):
                parts.append(f"{name}={','.join(getattr(self, name))}")
        if self.stolen:
            parts.append(f"stole={self.stolen}")
        if self.backing_off:
            parts.append(f"backing_off={','.join(self.backing_off)}")
        for r in self.finished:
            parts.append(f"{r.lease_key}:{r.outcome}" + (f"({r.detail})" if r.detail else ""))
        if self.fleet:
            parts.append(f"kcl3: {self.fleet}")
        return " ".join(parts)


Cycle = CycleCoroutine[CycleResult]


def worker_throughput_kbps(worker_id: str, leases: Sequence[Lease]) -> float:
    """This consumer's throughput: the sum of what its holders last reported on their live leases
    (`throughputKBps`, written on heartbeats); unreported or corrupt values count as 0."""
    return sum(reported_load(lease) or 0.0 for lease in leases
               if lease.lease_owner == worker_id and not lease.is_ended)


def balance_patience(cycle_seconds: float) -> float:
    """How long an owner must stay overloaded before a load-aware steal from it: two cycles, so that the
    imbalance is seen by three scans in a row, several smoothed heartbeats each."""
    return 2 * cycle_seconds


def fresh_seconds(settings: "CycleSettings") -> float:
    """How recent a peer's worker metrics item must be for the peer to count as live: two of its periods
    (one write may fail) plus an expiry, which also absorbs clock differences between hosts."""
    return 2 * settings.worker_metrics_period_seconds + settings.expiry_seconds


def idle_consumers(live_peers: Collection[str], leases: Sequence[Lease], worker_id: str,
                   predecessor: Callable[[str], bool] | None = None) -> int:
    """Live peers (fresh worker metrics) that hold no live lease: invisible in the lease table, yet part
    of the fleet's mean load. Earlier incarnations of this consumer do not count."""
    owners = {lease.lease_owner for lease in leases if lease.lease_owner is not None and not lease.is_ended}
    return sum(1 for peer in live_peers if peer != worker_id and peer not in owners
               and not (predecessor is not None and predecessor(peer)))


def answers_handoffs(lease: Lease, live_peers: Collection[str]) -> bool:
    """Whether the lease's holder answers a graceful hand-off: it publishes fresh worker metrics (a KCL 3.x worker,
    or a consumer of this protocol in a table a 3.x fleet keeps its metadata in), or it took the lease by this
    protocol's acquire (`leaseClaimOwner` names it: in a 2.x table, where nobody publishes metrics, that is how
    this protocol's consumers know each other). A KCL 2.x holder does neither: its take sets `leaseOwner` only,
    and it ignores `checkpointOwner`."""
    return lease.lease_owner in live_peers or not held_by_another_protocol(lease)


def worker_metrics_due(last_published_at: float | None, now: float, period_seconds: float) -> bool:
    """Whether this cycle writes the worker metrics item: at the first cycle, then once per period."""
    return period_seconds > 0 and (last_published_at is None or now - last_published_at >= period_seconds)


def manager_cycle(state: ManagerState, settings: CycleSettings, locally_worked: Collection[str],
                  rng: random.Random, predecessor: Callable[[str], bool] | None = None) -> Cycle:
    result = CycleResult()
    result.started_at = yield from Now().ask()
    scanned = yield from ScanTable().ask()
    leases = scanned.leases
    # Stamp what a scan saw when it returned, never earlier: a slow, throttled scan must not make live
    # peers' leases look older than they are.
    state.ages.observe(leases, scanned.returned_at)
    # KCL 3.5 keeps its migration state and leader lock in the lease table: the scan read them too.
    result.fleet_change = _see_fleet(state, scanned)
    follower = state.fleet.mode is fleet_mode.FleetMode.FOLLOWER
    unknown = unknown_lease_keys(leases, state.shards)
    # New keys outside the last listing: new shards (a peer created children), or other streams' leases
    # sharing the table. List again when that set changes, not every cycle.
    relist = bool(unknown - state.unknown_keys)
    if state.list_next or relist or not leases or rng.random() < settings.list_shards_probability:
        # Shards are listed after the scan, so a lease is never deleted for a shard created meanwhile.
        state.shards = list((yield from ListShards().ask()))
        state.list_next = False
        result.total_shards = len(state.shards)
        listed = {shard.shard_id for shard in state.shards}
        for lease in leases_to_delete(leases, state.shards):
            if (yield from Delete(lease).ask()):
                result.deleted.append(lease.lease_key)
                if lease.lease_key not in listed and not lease.is_ended:
                    result.trimmed_unfinished.append((lease.lease_key, lease.checkpoint))
        for lease in leases_to_create(settings.initial, state.shards, leases, settings.drained_attribute):
            if (yield from Create(lease).ask()):
                result.created.append(lease.lease_key)
        if result.deleted or result.created:
            scanned = yield from ScanTable().ask()
            leases = scanned.leases
            state.ages.observe(leases, scanned.returned_at)
    state.unknown_keys = unknown_lease_keys(leases, state.shards)
    leases = scoped_leases(leases, state.shards)
    previous = {lease.lease_key: lease for lease in state.leases}
    state.leases = leases
    result.leases = leases
    state.backoffs = retry.seen_in_scan(state.backoffs, leases, settings.worker_id)
    # Leases this manager holds through their back-off move by its own renewals: not another process's writes.
    moved = watch_our_id(state, settings.worker_id, leases, set(locally_worked) | set(retry.held(state.backoffs)))
    if moved and not follower:  # a 3.x leader's assignments move our leases' counters: not another process
        state.duplicate_worker_id_sightings += 1
        result.duplicate_worker_id = moved
        yield from DuplicateWorkerId(tuple(moved)).ask()
    state.killed = killed_still_ours(state.killed, settings.worker_id, leases, moved)
    now = yield from Now().ask()
    state.spawned_at = {key: at for key, at in state.spawned_at.items() if key in locally_worked}
    stuck = stuck_local_leases(settings.worker_id, leases, locally_worked, state.ages, now, settings.expiry_seconds,
                               state.spawned_at, state.slow_starts)
    _count_slow_starts(state, leases, locally_worked, stuck, now)
    for lease in stuck:
        yield from _abandon(state, lease, now)
        result.abandoned.append(lease.lease_key)
    if stuck:
        locally_worked = set(locally_worked) - {lease.lease_key for lease in stuck}
    # Failed leases: those whose back-off is over get a worker again (below); the others are renewed where this
    # manager holds them and are not taken meanwhile (counted as worked here).
    retrying = retry.due(state.backoffs, leases, settings.worker_id, now, set(locally_worked))
    yield from renew_held(state, set(locally_worked) | {lease.lease_key for lease in retrying})
    waiting = retry.waiting(state.backoffs, now)
    result.backing_off = sorted(waiting)
    locally_worked = set(locally_worked) | waiting
    # Any move in the fleet (ours, a peer's, a failover) restarts the patience: loads are judged again
    # once the holders' reports reflect the new ownership.
    ownership = frozenset((lease.lease_key, lease.lease_owner) for lease in leases
                          if lease.lease_owner is not None and not lease.is_ended)
    if ownership != state.ownership:
        state.ownership, state.overloaded_since = ownership, {}
    # Worker metrics are written and read only where a KCL 3.x fleet keeps them: never into a 2.x table.
    publishing = fleet_mode.publishes_worker_metrics(state.fleet)
    if not publishing:
        state.live_peers = frozenset()
    metrics_due = publishing and worker_metrics_due(state.metrics_published_at, now,
                                                    settings.worker_metrics_period_seconds)
    if metrics_due:
        peers = yield from ReadWorkerMetrics().ask()
        if peers is not None:
            state.live_peers = frozenset(live_workers(peers.last_updates, peers.now_epoch_seconds,
                                                      fresh_seconds(settings)))
    # A failed lease's retry is this consumer's own: under a 3.x leader too (the lease is still assigned to us; its
    # counter moves by our renewals, so it would never look adoptable).
    for lease in retrying:
        if follower and lease.lease_owner != settings.worker_id:
            continue  # a free lease is the leader's to assign
        coverage.hit("cycle.failed-lease-retried")
        yield from _spawn(state, Spawn(lease))
        result.spawned.append(lease.lease_key)
        result.retried.append(lease.lease_key)
    locally_worked = set(locally_worked) | {lease.lease_key for lease in retrying}
    if follower:
        # A 3.x leader assigns: take nothing, steal nothing; work what it assigned to us.
        for lease, stolen in fleet_mode.adoptions(settings.worker_id, leases, locally_worked, previous,
                                                  state.ages.ages(now), settings.expiry_seconds):
            yield from _spawn(state, Spawn(lease, stolen=stolen))
            result.spawned.append(lease.lease_key)
        state.overloaded_since = {}
        yield from _publish_metrics(state, settings, leases, now, metrics_due)
        return result
    plan = leases_to_acquire(
        settings.worker_id, leases, state.ages.ages(now), expiry_seconds=settings.expiry_seconds,
        leases_to_acquire=settings.leases_to_acquire, max_leases=settings.max_leases,
        recently_ended_by_us=state.recently_ended, locally_worked=set(locally_worked),
        drained_attribute=settings.drained_attribute, predecessor=predecessor, rng=rng,
        idle_consumers=idle_consumers(state.live_peers, leases, settings.worker_id, predecessor),
        confirmed_overloaded=confirmed_overloaded(state.overloaded_since, now, settings.balance_patience_seconds)
        if settings.balance_patience_seconds > 0 else None,
        backing_off=handoffs_backing_off(state.handoffs_overtaken, now, settings.expiry_seconds))
    state.overloaded_since = still_overloaded(state.overloaded_since, plan.overloaded, now)
    for lease in plan.take:
        # A lease released before its stealer's wait was over: wait one expiry as the stealer would have.
        if lease.extra.get(UNSETTLED_ATTRIBUTE):
            coverage.hit("cycle.take-unsettled-waits")
        yield from _spawn(state, Spawn(lease, stolen=bool(lease.extra.get(UNSETTLED_ATTRIBUTE))))
        result.spawned.append(lease.lease_key)
    if plan.steal is not None:
        coverage.hit("cycle.steal")
        # A holder that answers a graceful hand-off is asked for one; a KCL 2.x holder is stolen from cold, as
        # Java steals.
        handoff = answers_handoffs(plan.steal, state.live_peers)
        yield from _spawn(state, Spawn(plan.steal, stolen=True, handoff=handoff))
        if handoff:
            state.handoff_asked[plan.steal.lease_key] = now
        result.stolen = plan.steal.lease_key
    if plan.take or plan.steal:
        state.recently_ended.clear()
    yield from _publish_metrics(state, settings, leases, now, metrics_due)
    return result


def _publish_metrics(state: ManagerState, settings: CycleSettings, leases: Sequence[Lease], now: float,
                     due: bool) -> CycleCoroutine[None]:
    if due:
        state.throughput_history = [*state.throughput_history, worker_throughput_kbps(settings.worker_id, leases)][
            -METRIC_VALUES:]
        state.metrics_published_at = now
        yield from PublishWorkerMetrics(tuple(state.throughput_history)).ask()


def _see_fleet(state: ManagerState, scanned: Scanned) -> str | None:
    """Fold what a scan met of the Java 3.x fleet into the state; the change of mode it made, if any."""
    before = state.fleet
    state.fleet = fleet_mode.scanned(before, scan_entities(scanned.leases), scanned.returned_at)
    return fleet_mode.change(before, state.fleet)


def _count_slow_starts(state: ManagerState, leases: Sequence[Lease],
                       locally_worked: Collection[str], stuck: Sequence[Lease], now: float) -> None:
    """A worker killed before its take showed makes the lease's next one more patient; a shown take resets it."""
    killed = {lease.lease_key for lease in stuck}
    counts = {}
    for lease in leases:
        key = lease.lease_key
        before = state.slow_starts.get(key, 0)
        if key in killed and not take_shown(key, state.ages, now, state.spawned_at):
            counts[key] = before + 1
        elif before and not (key in locally_worked and take_shown(key, state.ages, now, state.spawned_at)):
            counts[key] = before
    state.slow_starts = counts


def _abandon(state: ManagerState, lease: Lease, now: float) -> CycleCoroutine[None]:
    """Stop a stuck worker, saying which kind it is: one that never showed its take (its start outlasted the
    patience) or one whose lease stopped changing after it."""
    key = lease.lease_key
    note_killed(state, key)
    spawned = state.spawned_at.get(key)
    if spawned is not None and not take_shown(key, state.ages, now, state.spawned_at):
        yield from Abandon(lease, before_take=True, waited_seconds=now - spawned).ask()
    else:
        yield from Abandon(lease, waited_seconds=state.ages.age(key, now) or 0.0).ask()


def _spawn(state: ManagerState, spawn: Spawn) -> CycleCoroutine[None]:
    """Spawn a worker and note when (stuck_local_leases) and that its writes are this manager's own worker's — a
    lease of ours it then moves and dies with before the next cycle is no second process under our id
    (watch_our_id). The time is read when the spawn returned: starting a worker can take seconds (the worker
    server's own start, a busy host), and its take is judged from then, not from the cycle's start."""
    yield from spawn.ask()
    key = spawn.lease.lease_key
    state.spawned_at[key] = yield from Now().ask()
    state.our_counters.pop(key, None)
    state.left_at.pop(key, None)  # the new worker's take moves the counter on
    if key in state.backoffs:  # the worker holds it now: never renewed by the manager beside its heartbeats
        state.backoffs = retry.renewed(state.backoffs, key, None)


def renew_held(state: ManagerState, locally_worked: Collection[str]) -> CycleCoroutine[None]:
    """Renew the leases this manager holds through their back-off (never one a local worker works: its own
    heartbeats fence it). A refused renewal means the lease moved on: it is no longer held."""
    for key, counter in retry.held(state.backoffs).items():
        if key in locally_worked:
            continue
        renewed = yield from RenewHeld(key, counter).ask()
        state.backoffs = retry.renewed(state.backoffs, key, renewed)
        if renewed is None:
            coverage.hit("cycle.held-lease-renewal-refused")
            state.left_at.pop(key, None)
        else:
            state.left_at[key] = renewed  # released at that counter if this manager stops meanwhile


def watch_our_id(state: ManagerState, worker_id: str, leases: Sequence[Lease],
                 locally_worked: Collection[str]) -> list[str]:
    """Leases owned by our worker id, not worked here, whose counter moved since the last cycle: another
    live process writes under our id (a copy-pasted --worker-id, say). Such leases are never touched."""
    ours = {lease.lease_key: lease.lease_counter for lease in leases
            if lease.lease_owner == worker_id and lease.lease_key not in locally_worked and not lease.is_ended}
    moved = sorted(key for key, counter in ours.items()
                   if key in state.our_counters and state.our_counters[key] != counter)
    state.our_counters = ours
    return moved


def watch_for_expiry(state: ManagerState, settings: CycleSettings,
                     locally_worked: Collection[str]) -> CycleCoroutine[bool]:
    """A scan between cycles (reads only): True when a peer's lease has expired, so the next cycle runs
    at once. Lease ages count from when this consumer saw a counter change, so without these scans a
    dead peer's lease would be noticed up to a whole cycle late."""
    try:
        scanned = yield from ScanTable().ask()
    except Exception:  # the next cycle retries; a failed look changes nothing
        return False
    state.ages.observe(scanned.leases, scanned.returned_at)
    now = scanned.returned_at
    leases = scoped_leases(scanned.leases, state.shards)
    if _see_fleet(state, scanned) is not None:
        return True  # the fleet's mode changed: the cycle acts on it now
    if state.fleet.mode is fleet_mode.FleetMode.FOLLOWER:
        # A leader's failover is its business; a lease it assigned to us is ours to work at once.
        return fleet_mode.assigned_to(settings.worker_id, leases, locally_worked, state.ages.ages(now),
                                      settings.expiry_seconds)
    waiting = retry.waiting(state.backoffs, now)  # not taken before their retry: no reason to cycle now
    return any(not lease.is_ended and lease.lease_key not in locally_worked and lease.lease_key not in waiting
               and state.ages.expired(lease.lease_key, now, settings.expiry_seconds)
               for lease in leases) or bool(
        stuck_local_leases(settings.worker_id, leases, locally_worked, state.ages, now, settings.expiry_seconds,
                           state.spawned_at, state.slow_starts))


def watch_interval(settings: CycleSettings) -> float:
    """How often the table is re-scanned between cycles."""
    return settings.expiry_seconds / 4


def wakes_manager(outcome: LifeOutcome) -> bool:
    """Whether a worker's outcome makes the next cycle run at once: a local worker ended a shard, so its
    children are ready, and this consumer (which read their parent) is their natural reader; or a worker failed,
    leaving its lease in our name with its heartbeats stopped: the cycle starts its back-off and renews it."""
    return outcome in (LifeOutcome.SHARD_ENDED, LifeOutcome.FAILED)


# A hand-off overtaken n times in a row is not asked again for expiry × 2^n, at most this many expiries: the
# first back-off (two expiries) outlasts the holder's validity, so the next ask meets a settled lease.
HANDOFF_BACKOFF_MAX_EXPIRIES = 8


def handoffs_backing_off(overtaken: Mapping[str, tuple[int, float]], now: float,
                         expiry_seconds: float) -> frozenset[str]:
    """The leases not to steal by hand-off now: each overtaken hand-off backs its lease off exponentially, so
    a stealer whose asks keep being overtaken (the holder's hand-off racing another move) tries another lease
    of the richest owner instead of asking for the same one cycle after cycle."""
    return frozenset(key for key, (times, asked_at) in overtaken.items()
                     if now < asked_at + expiry_seconds * min(2 ** times, HANDOFF_BACKOFF_MAX_EXPIRIES))


def held_at_stop(state: ManagerState, locally_worked: Collection[str]) -> list[tuple[str, int]]:
    """What a stopping manager releases at once: the leases it holds through their back-off (no local worker works
    them), each at the counter its last renewal left. Their back-offs end with them."""
    held = [(key, counter) for key, counter in retry.held(state.backoffs).items() if key not in locally_worked]
    state.backoffs = {key: b for key, b in state.backoffs.items() if key not in dict(held)}
    return held


def releases_at_stop(state: ManagerState) -> list[tuple[str, int]]:
    """What a stopping manager releases once its workers are done: each lease a finished worker may have
    left in our name (it could not release it, or not see it gone: the table was unreachable), fenced on the
    counter that worker last wrote. Otherwise it stays owned by a consumer that is gone until it expires, and
    every peer waits for it. A write by anyone since moved the counter on, and the release is refused."""
    return sorted(state.left_at.items())


def note_killed(state: ManagerState, key: str) -> None:
    """This manager killed the local worker of `key` as stuck (before or after its take)."""
    state.killed.add(key)


def killed_still_ours(killed: Collection[str], worker_id: str, leases: Sequence[Lease],
                      written_by_another: Collection[str] = ()) -> set[str]:
    """The leases of killed workers still to watch after a scan: those in our name, not ended, and not written
    by another process under our id (watch_our_id). A lease another consumer took, or that ended, no longer
    carries anything a kill of ours left."""
    return {lease.lease_key for lease in leases
            if lease.lease_key in killed and lease.lease_owner == worker_id and not lease.is_ended
            and lease.lease_key not in written_by_another}


def killed_left_in_our_name(state: ManagerState, worker_id: str, leases: Sequence[Lease]) -> list[tuple[str, int]]:
    """What a stopping manager releases of the leases whose worker it killed, from a scan read once every worker
    is gone: each still in our name, at the counter that scan read. A worker killed before its take showed may
    have taken the lease just before the kill (its take raced the scan that judged it stuck), and a worker spawned
    after the kill may have been stopped before its own take. No process of ours writes them any more, so the
    counter read is the last of ours, and a write by anyone since refuses the release. Leases a finished worker
    reported are released at their own counter (releases_at_stop). A worker that hangs through the stop itself and
    is killed there is not among them: a stop that cannot end its workers leaves their leases to expire, as it says."""
    killed, state.killed = killed_still_ours(state.killed, worker_id, leases), set()
    return sorted((lease.lease_key, lease.lease_counter) for lease in leases
                  if lease.lease_key in killed and lease.lease_key not in state.left_at)


def note_worker_ends(state: ManagerState, ends: Iterable[LifeResult], now: float, rng: random.Random,
                     policy: retry.RetryPolicy = retry.DEFAULT_POLICY) -> None:
    """Fold finished workers into the back-offs: a failed one backs its lease off (held where it left it in our
    name), any other end clears it. `now` is the manager's clock; one jitter draw per failure."""
    backoffs = dict(state.backoffs)
    for end in ends:
        failed = end.outcome is LifeOutcome.FAILED
        spawned = state.spawned_at.get(end.lease_key)
        backoff = retry.after_worker_end(
            backoffs.get(end.lease_key),
            retry.WorkerEnd(end.lease_key, failed, end.left_at if end.kept else None,
                            None if spawned is None else now - spawned, end.detail),
            now, rng.random() if failed else 0.0, policy)
        if backoff is None:
            backoffs.pop(end.lease_key, None)
        else:
            coverage.hit("cycle.failed-lease-backs-off")
            backoffs[end.lease_key] = backoff
    state.backoffs = backoffs


def note_results(state: ManagerState, outcomes: Iterable[tuple[str, LifeOutcome]],
                 left_at: Mapping[str, int] | None = None) -> None:
    """Fold finished workers' (lease key, outcome) into the state, and the leases they may have left in our name
    (lease → counter)."""
    state.left_at.update(left_at or {})
    for key, outcome in outcomes:
        if outcome is LifeOutcome.SHARD_ENDED:
            state.recently_ended.add(key)
            state.list_next = True
        asked_at = state.handoff_asked.pop(key, None)
        if asked_at is None:
            continue
        if outcome is LifeOutcome.NOT_ACQUIRED:
            coverage.hit("cycle.handoff-overtaken-backs-off")
            times = state.handoffs_overtaken.get(key, (0, asked_at))[0] + 1
            state.handoffs_overtaken[key] = (times, asked_at)
        else:
            state.handoffs_overtaken.pop(key, None)


__all__ = [
    "Cycle", "CycleResult", "CycleSettings", "ManagerState", "handoffs_backing_off", "manager_cycle", "note_results",
    "held_at_stop", "killed_left_in_our_name", "killed_still_ours", "note_killed", "note_worker_ends",
    "releases_at_stop", "renew_held", "wakes_manager",
    "watch_for_expiry", "watch_interval", "watch_our_id",
]
