"""A deterministic simulation of a fleet of consumers sharing one lease table (test support, not shipped).

Virtual time, one event queue, one `random.Random(seed)`: the same seed replays the same history.

* The table is a dict of leases whose every write goes through `lease_rules` (DynamoDB's conditional
  semantics). It also keeps, outside the protocol, what the checkers need: when each worker last had its
  ownership confirmed by a successful acquire or heartbeat.
* The stream has shards that receive records (some KPL-like: several user records under one sequence
  number), split and merge during the chaos period, and disappear after a retention period once closed.
  Sequence numbers start short and grow, so numeric and lexicographic order differ.
* Each consumer runs the real planner every cycle (scan -> list shards -> delete -> create -> acquire or
  steal) and one simulated worker per lease: acquire, heartbeat on its own timer, read, checkpoint after
  every batch, and at the shard's end write SHARD_END and create the children (`child_leases_on_end`).
* Chaos: consumers crash (maybe restarting with the same id), stop gracefully (releasing their leases),
  pause (every timer frozen, then resume), and join late.

Invariants are checked as the history unfolds (`Violation` is raised at the first one) and at the end;
see `FleetSim.check_final`. Deliberately broken variants (`Mutation`) show that the checks can fail.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from kcl_pipeline.kcl import lease_rules as rules
from kcl_pipeline.kcl.model import TRIM_HORIZON, Checkpoint, HashKeyRange, Lease, Shard
from kcl_pipeline.kcl.planner import (
    AcquirePlan,
    LeaseAges,
    child_leases_on_end,
    leases_to_acquire,
    leases_to_create,
    leases_to_delete,
)

HASH_SPACE = 1 << 20
INITIAL = Checkpoint(TRIM_HORIZON)


class Violation(AssertionError):
    """An invariant of the lease protocol was broken; the message says which, where and when."""


@dataclass(frozen=True)
class Mutation:
    """Deliberate bugs, to prove that the invariant checks catch them."""

    deliver_after_expiry: bool = False   # a worker keeps delivering without a recent heartbeat
    children_early: bool = False         # the planner leases every shard at once, ignoring lineage
    checkpoint_backwards: bool = False   # checkpoints are written unconditionally
    no_steal: bool = False               # consumers never steal, so late joiners stay idle
    never_expire: bool = False           # a dead consumer's leases are never taken over


@dataclass(frozen=True)
class SimConfig:
    seed: int
    consumers: int = 3
    late_joiners: int = 1
    initial_shards: int = 2
    reshards: int = 2
    chaos_until: float = 300.0
    end: float = 700.0
    expiry: float = 10.0
    heartbeat: float = 3.0
    cycle: float = 5.0
    poll: float = 1.0
    idle_poll: float = 2.0
    batch: int = 6
    leases_to_acquire: int = 1
    max_leases: int = 64
    retention: float = 200.0
    crashes: int = 2
    pauses: int = 2
    graceful_stops: int = 1
    restart_probability: float = 0.7
    mutation: Mutation = Mutation()

    @classmethod
    def random(cls, seed: int, mutation: Mutation = Mutation()) -> "SimConfig":
        rng = random.Random(f"config-{seed}")
        return cls(
            seed=seed,
            consumers=rng.randint(1, 5),
            late_joiners=rng.randint(0, 3),
            initial_shards=rng.randint(1, 10),
            reshards=rng.randint(0, 6),
            crashes=rng.randint(0, 4),
            pauses=rng.randint(0, 4),
            graceful_stops=rng.randint(0, 1),
            leases_to_acquire=rng.choice([1, 1, 2]),
            mutation=mutation,
        )


# -- the stream -----------------------------------------------------------------------------------

@dataclass
class SimShard:
    shard_id: str
    parents: tuple[str, ...]
    lo: int
    hi: int
    keys: list[tuple[int, str, int]] = field(default_factory=list)  # (len, sequence, sub): record order
    closed_at: float | None = None
    trimmed: bool = False

    def as_listed(self) -> Shard:
        padded = self.parents + (None, None)
        return Shard(
            shard_id=self.shard_id,
            parent_shard_id=padded[0],
            adjacent_parent_shard_id=padded[1],
            hash_key_range=HashKeyRange(str(self.lo), str(self.hi)),
            starting_sequence_number="0",
            ending_sequence_number=(self.keys[-1][1] if self.keys else "0") if self.closed_at is not None else None,
        )

    def after(self, position: Checkpoint, limit: int) -> list[tuple[int, str, int]]:
        start = 0 if position.is_starting_sentinel else bisect.bisect_right(self.keys, position.key())
        return self.keys[start:start + limit]


class SimStream:
    def __init__(self, rng: random.Random, initial_shards: int):
        self.rng = rng
        self.shards: dict[str, SimShard] = {}
        self._ids = itertools.count()
        self._sequence = 1
        step = HASH_SPACE // initial_shards
        for i in range(initial_shards):
            hi = HASH_SPACE - 1 if i == initial_shards - 1 else (i + 1) * step - 1
            self._add((), i * step, hi)

    def _add(self, parents: tuple[str, ...], lo: int, hi: int) -> SimShard:
        shard = SimShard(f"shardId-{next(self._ids):012d}", parents, lo, hi)
        self.shards[shard.shard_id] = shard
        return shard

    def open_shards(self) -> list[SimShard]:
        return [s for s in self.shards.values() if s.closed_at is None]

    def list_shards(self) -> list[Shard]:
        return [s.as_listed() for s in self.shards.values() if not s.trimmed]

    def listed(self, shard_id: str) -> SimShard | None:
        shard = self.shards.get(shard_id)
        return None if shard is None or shard.trimmed else shard

    def produce(self) -> None:
        for shard in self.open_shards():
            if self.rng.random() < 0.7:
                self._sequence += self.rng.randint(1, 40)
                seq = str(self._sequence)
                users = 1 if self.rng.random() < 0.7 else self.rng.randint(2, 5)  # KPL aggregate
                shard.keys.extend((len(seq), seq, sub) for sub in range(users))

    def reshard(self, now: float) -> str:
        open_shards = sorted(self.open_shards(), key=lambda s: s.lo)
        pairs = [(a, b) for a, b in zip(open_shards, open_shards[1:]) if a.hi + 1 == b.lo]
        if pairs and (len(open_shards) > 3 or self.rng.random() < 0.4):
            a, b = self.rng.choice(pairs)
            a.closed_at = b.closed_at = now
            self._add((a.shard_id, b.shard_id), a.lo, b.hi)
            return "merge"
        parent = self.rng.choice(open_shards)
        if parent.hi - parent.lo < 2:
            return "none"
        parent.closed_at = now
        mid = (parent.lo + parent.hi) // 2
        self._add((parent.shard_id,), parent.lo, mid)
        self._add((parent.shard_id,), mid + 1, parent.hi)
        return "split"

    def trim(self, now: float, retention: float) -> int:
        trimmed = 0
        for shard in self.shards.values():
            if not shard.trimmed and shard.closed_at is not None and now - shard.closed_at > retention:
                shard.trimmed = True
                trimmed += 1
        return trimmed


# -- the table ------------------------------------------------------------------------------------

def _order(cp: Checkpoint) -> tuple:
    if cp.is_starting_sentinel:
        return (0,)
    if cp.is_shard_end:
        return (2,)
    return (1,) + cp.key()


class SimTable:
    def __init__(self, sim: "FleetSim"):
        self.sim = sim
        self.items: dict[str, Lease] = {}
        self.confirmed: dict[int, float] = {}  # worker serial -> last acquire/heartbeat that succeeded

    def scan(self) -> list[Lease]:
        return list(self.items.values())  # stored leases are never mutated: every rule returns a copy

    def write(self, key: str, rule: Callable[..., Lease | None], *args, worker: "SimWorker | None" = None):
        before = self.items.get(key)
        after = rule(before, *args)
        if after is None:
            return None
        if before is not None and _order(after.checkpoint) < _order(before.checkpoint):
            raise self.sim.violation(f"checkpoint of {key} went back from {before.checkpoint} to {after.checkpoint}")
        self.items[key] = after
        if worker is not None and rule in (rules.acquire, rules.heartbeat):
            self.confirmed[worker.serial] = self.sim.now
        self.sim.on_write(key, after)
        return after

    def delete(self, key: str) -> None:
        self.items.pop(key, None)


# -- consumers and their workers ------------------------------------------------------------------

class SimWorker:
    _serials = itertools.count()

    def __init__(self, consumer: "SimConsumer", lease: Lease):
        self.consumer = consumer
        self.sim = consumer.sim
        self.key = lease.lease_key
        self.last_owner = lease.lease_owner
        self.serial = next(self._serials)
        self.position: Checkpoint = lease.checkpoint
        self.confirmed_at = -1e18
        self.stopped = False

    def schedule(self, delay: float, action: Callable[[], None]) -> None:
        self.consumer.schedule(delay, lambda: None if self.stopped else action())

    def start(self) -> None:
        table = self.sim.table
        acquired = table.write(self.key, rules.acquire, self.consumer.worker_id, self.last_owner, worker=self)
        if acquired is None or acquired.is_ended:
            self.sim.stats["acquire refused"] += 1
            self.stop()
            return
        self.sim.stats["acquired"] += 1
        self.confirmed_at = self.sim.now
        self.position = acquired.checkpoint
        self.schedule(self.sim.config.heartbeat, self.heartbeat)
        self.schedule(self.sim.rng.uniform(0.0, self.sim.config.poll), self.poll)

    def stale(self) -> bool:
        return self.sim.now - self.confirmed_at >= self.sim.config.expiry

    def heartbeat(self) -> None:
        if self.stale() and not self.sim.config.mutation.deliver_after_expiry:
            self.sim.stats["stopped: no heartbeat within expiry"] += 1
            self.stop()  # could not heartbeat within the expiry: the lease may be someone else's now
            return
        if self.sim.table.write(self.key, rules.heartbeat, self.consumer.worker_id, worker=self) is None:
            self.sim.stats["stopped: heartbeat failed"] += 1
            self.stop()  # lease lost
            return
        self.confirmed_at = self.sim.now
        self.schedule(self.sim.config.heartbeat, self.heartbeat)

    def poll(self) -> None:
        config = self.sim.config
        if self.stale() and not config.mutation.deliver_after_expiry:
            self.sim.stats["stopped: no heartbeat within expiry"] += 1
            self.stop()
            return
        shard = self.sim.stream.listed(self.key)
        if shard is None:
            self.stop()  # trimmed: nothing left to read
            return
        batch = shard.after(self.position, config.batch)
        for key in batch:
            self.sim.deliver(self, shard, key)
        if batch:
            self.position = Checkpoint(batch[-1][1], batch[-1][2])
            rule = _unconditional_checkpoint if config.mutation.checkpoint_backwards else rules.checkpoint
            if self.sim.table.write(self.key, rule, self.position) is None:
                self.sim.stats["checkpoint refused"] += 1
        if shard.closed_at is not None and not shard.after(self.position, 1):
            self.end()
            return
        self.schedule(config.poll if batch else config.idle_poll, self.poll)

    def end(self) -> None:
        sim = self.sim
        sim.table.write(self.key, rules.end)
        sim.stats["shard ended"] += 1
        for child in child_leases_on_end(self.key, sim.stream.list_shards(), sim.table.scan(), INITIAL):
            if sim.table.write(child.lease_key, rules.create, child) is not None:
                sim.stats["child created by the ending worker"] += 1
        self.stop()
        self.consumer.recently_ended.add(self.key)
        self.consumer.run_cycle_soon()

    def stop(self) -> None:
        self.stopped = True
        if self.consumer.workers.get(self.key) is self:
            del self.consumer.workers[self.key]


def _unconditional_checkpoint(lease: Lease | None, new: Checkpoint) -> Lease | None:
    if lease is None or lease.is_ended:
        return None
    return replace(lease, checkpoint=new, owner_switches_since_checkpoint=0)


class SimConsumer:
    def __init__(self, sim: "FleetSim", worker_id: str):
        self.sim = sim
        self.worker_id = worker_id
        self.incarnation = 0
        self.alive = False
        self.paused_until = 0.0
        self.workers: dict[str, SimWorker] = {}
        self.recently_ended: set[str] = set()
        self.ages = LeaseAges()
        self.rng = random.Random()
        self._cycle_token = 0

    def start(self) -> None:
        self.incarnation += 1
        self.alive = True
        self.paused_until = 0.0
        self.workers = {}
        self.recently_ended = set()
        self.ages = LeaseAges()  # a restarted process remembers nothing
        self.rng = random.Random(self.sim.rng.random())
        self.run_cycle_soon()

    def crash(self) -> None:
        self.alive = False
        self.incarnation += 1  # drops every pending event of the old process
        for worker in list(self.workers.values()):
            worker.stopped = True
        self.workers = {}

    def stop_gracefully(self) -> None:
        for key in list(self.workers):
            if self.sim.table.write(key, rules.release, self.worker_id) is not None:
                self.sim.stats["released"] += 1
        self.crash()

    def schedule(self, delay: float, action: Callable[[], None]) -> None:
        self.sim.schedule(delay, self, self.incarnation, action)

    def run_cycle_soon(self) -> None:
        self._cycle_token += 1
        token = self._cycle_token
        self.schedule(self.rng.uniform(0.0, 0.5), lambda: self.run_cycle(token))

    def run_cycle(self, token: int) -> None:
        if token != self._cycle_token:
            return  # superseded by an earlier wake-up (a local shard end)
        sim, config = self.sim, self.sim.config
        leases = sim.table.scan()
        shards = sim.stream.list_shards()  # after the scan, as the protocol requires
        gone = leases_to_delete(leases, shards)
        for key in gone:
            sim.table.delete(key)
            sim.stats["lease deleted"] += 1
        gone_keys = set(gone)
        leases = [lease for lease in leases if lease.lease_key not in gone_keys]
        planner = _lease_everything if config.mutation.children_early else leases_to_create
        for new in planner(INITIAL, shards, leases):
            created = sim.table.write(new.lease_key, rules.create, new)
            if created is not None:
                sim.stats["lease created by a manager"] += 1
                leases.append(created)
        self.ages.observe(leases, sim.now)
        ages = {} if config.mutation.never_expire else self.ages.ages(sim.now)
        plan = leases_to_acquire(
            self.worker_id, leases, ages, expiry_seconds=config.expiry,
            leases_to_acquire=config.leases_to_acquire, max_leases=config.max_leases,
            recently_ended_by_us=self.recently_ended, locally_worked=self.workers, rng=self.rng,
        )
        if config.mutation.no_steal:
            plan = AcquirePlan(take=plan.take)
        for lease in plan.leases:
            worker = SimWorker(self, lease)
            self.workers[lease.lease_key] = worker
            worker.start()
        if plan.steal is not None:
            sim.stats["steal"] += 1
        if plan.leases:
            self.recently_ended.clear()
        self._cycle_token += 1
        token = self._cycle_token
        self.schedule(config.cycle * self.rng.uniform(0.8, 1.2), lambda: self.run_cycle(token))


def _lease_everything(initial: Checkpoint, shards, leases) -> list[Lease]:
    have = {lease.lease_key for lease in leases}
    return [Lease(s.shard_id, initial, parent_shard_ids=s.parent_ids) for s in shards if s.shard_id not in have]


# -- the simulation -------------------------------------------------------------------------------

class FleetSim:
    def __init__(self, config: SimConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, SimConsumer | None, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self.stream = SimStream(self.rng, config.initial_shards)
        self.table = SimTable(self)
        self.delivered: dict[str, set[tuple[int, str, int]]] = {}
        self.prefix: dict[str, int] = {}  # per shard: how many of its first records were all delivered
        self.deliveries = 0
        self.steps = 0
        self.stats: Counter[str] = Counter()
        total = config.consumers + config.late_joiners
        self.consumers = [SimConsumer(self, f"consumer-{i}") for i in range(total)]

    # events
    def schedule(self, delay: float, consumer: SimConsumer | None, incarnation: int, action: Callable[[], None]):
        heapq.heappush(self._queue, (self.now + delay, next(self._order), consumer, incarnation, action))

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (time, next(self._order), None, 0, action))

    def violation(self, message: str) -> Violation:
        return Violation(f"seed {self.config.seed} t={self.now:.2f}: {message}")

    def run(self) -> "FleetSim":
        config, rng = self.config, self.rng
        for consumer in self.consumers[: config.consumers]:
            consumer.start()
        for consumer in self.consumers[config.consumers:]:
            self.at(rng.uniform(20, config.chaos_until), consumer.start)
        self._every(1.0, self.stream.produce, until=config.chaos_until)
        self._every(5.0, self._trim, until=config.end)
        for _ in range(config.reshards):
            self.at(rng.uniform(10, config.chaos_until - 30), self._reshard)
        for _ in range(config.crashes):
            self.at(rng.uniform(10, config.chaos_until - 20), self._crash_one)
        for _ in range(config.graceful_stops):
            self.at(rng.uniform(10, config.chaos_until - 20), self._stop_one)
        for _ in range(config.pauses):
            self.at(rng.uniform(10, config.chaos_until - 40), self._pause_one)

        while self._queue and self._queue[0][0] <= config.end:
            time, _, consumer, incarnation, action = heapq.heappop(self._queue)
            if consumer is not None:
                if not consumer.alive or consumer.incarnation != incarnation:
                    continue
                if time < consumer.paused_until:  # a frozen process runs nothing until it wakes
                    heapq.heappush(self._queue, (consumer.paused_until, next(self._order), consumer,
                                                 incarnation, action))
                    continue
            self.now = time
            self.steps += 1
            action()
        self.now = config.end
        self.check_final()
        return self

    def _every(self, period: float, action: Callable[[], None], until: float) -> None:
        def tick():
            action()
            if self.now + period <= until:
                self.at(self.now + period, tick)
        self.at(period, tick)

    def _reshard(self) -> None:
        self.stats[self.stream.reshard(self.now)] += 1

    def _trim(self) -> None:
        self.stats["trimmed"] += self.stream.trim(self.now, self.config.retention)

    def _live(self) -> list[SimConsumer]:
        return [c for c in self.consumers if c.alive]

    def _crash_one(self) -> None:
        live = self._live()
        if len(live) < 2:
            return  # keep one consumer alive: a fleet of none reads nothing
        victim = self.rng.choice(live)
        victim.crash()
        self.stats["crash"] += 1
        if self.rng.random() < self.config.restart_probability:
            self.stats["restart"] += 1
            self.at(self.now + self.rng.uniform(1, 30), victim.start)

    def _stop_one(self) -> None:
        live = self._live()
        if len(live) >= 2:
            self.rng.choice(live).stop_gracefully()
            self.stats["graceful stop"] += 1

    def _pause_one(self) -> None:
        live = self._live()
        if live:
            victim = self.rng.choice(live)
            # Half the pauses outlast the expiry: the consumer must find its leases lost when it wakes.
            pause = self.rng.choice([self.rng.uniform(1, 8), self.rng.uniform(12, 35)])
            victim.paused_until = self.now + pause
            self.stats["pause beyond expiry" if pause > self.config.expiry else "short pause"] += 1

    # invariants checked as they happen
    def deliver(self, worker: SimWorker, shard: SimShard, key: tuple[int, str, int]) -> None:
        confirmed = self.table.confirmed.get(worker.serial)
        if confirmed is None or self.now - confirmed >= self.config.expiry:
            raise self.violation(
                f"{worker.consumer.worker_id} delivered {shard.shard_id} {key[1]}/{key[2]} with its ownership last "
                f"confirmed {'never' if confirmed is None else f'{self.now - confirmed:.1f}s ago'} "
                f"(expiry {self.config.expiry}s): another consumer may own the lease"
            )
        if not self.delivered.get(shard.shard_id):
            for parent_id in shard.parents:
                parent = self.stream.shards[parent_id]
                missing = len(parent.keys) - len(self.delivered.get(parent_id, ()))
                if parent.closed_at is None or missing:
                    fate = "was trimmed with" if parent.trimmed else "still has"
                    raise self.violation(
                        f"first record of {shard.shard_id} delivered while its parent {parent_id} {fate} "
                        f"{missing} undelivered records"
                    )
        delivered = self.delivered.setdefault(shard.shard_id, set())
        if key in delivered:
            self.stats["redelivered"] += 1
        delivered.add(key)
        prefix = self.prefix.get(shard.shard_id, 0)
        while prefix < len(shard.keys) and shard.keys[prefix] in delivered:
            prefix += 1
        self.prefix[shard.shard_id] = prefix
        self.deliveries += 1

    def on_write(self, key: str, lease: Lease) -> None:
        shard = self.stream.shards.get(key)
        if shard is None:
            raise self.violation(f"lease {key} written for a shard that never existed")
        delivered = self.delivered.get(key, set())
        if lease.checkpoint.is_shard_end:
            if shard.closed_at is None or len(delivered) != len(shard.keys):
                raise self.violation(f"{key} ended with {len(shard.keys) - len(delivered)} records undelivered")
        elif not lease.checkpoint.is_starting_sentinel:
            if bisect.bisect_right(shard.keys, lease.checkpoint.key()) > self.prefix.get(key, 0):
                raise self.violation(f"{key} checkpointed at {lease.checkpoint} past an undelivered record")

    # invariants at the end, once the chaos is over and the fleet has settled
    def check_final(self) -> None:
        for shard in self.stream.shards.values():
            missing = len(shard.keys) - len(self.delivered.get(shard.shard_id, ()))
            if missing:
                raise self.violation(f"{shard.shard_id} has {missing} of {len(shard.keys)} records never delivered")
        live = {c.worker_id: c for c in self._live()}
        counts = {worker_id: 0 for worker_id in live}
        listed = {s.shard_id for s in self.stream.list_shards()}
        for key in listed:
            lease = self.table.items.get(key)
            if lease is None:
                raise self.violation(f"shard {key} has no lease")
            if lease.is_ended:
                continue
            if lease.lease_owner not in live:
                raise self.violation(f"lease {key} is owned by {lease.lease_owner!r}, not by a live consumer")
            worker = live[lease.lease_owner].workers.get(key)
            if worker is None or worker.stale():
                raise self.violation(f"lease {key} is owned by {lease.lease_owner} but nobody works it there")
            counts[lease.lease_owner] += 1
        stale_leases = sorted(set(self.table.items) - listed)
        if stale_leases:
            raise self.violation(f"leases of trimmed shards were never deleted: {stale_leases}")
        if counts and max(counts.values()) - min(counts.values()) > 1:
            raise self.violation(f"fleet unbalanced after settling: {counts}")
