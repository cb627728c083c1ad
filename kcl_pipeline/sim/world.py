"""One seeded world: a stream, a lease table shared with other applications, a landing zone, hosts with
drifting clocks, our consumers (and maybe a Java KCL 2.x peer), and faults at chosen steps (scenario.py).

A run has two phases. The main phase runs `steps` steps (events of the system under test) while records
are produced and faults strike. Then every fault heals, production stops, and the fleet must settle:
every record delivered and landed, every lease worked, the consumers balanced. Invariants are checked at
every step (checker.py); the first violation ends the run with a trace of the last events.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from ..kcl.config import ConsumerConfig
from ..kcl.shells.lease_table import LeaseTable
from . import mutations
from .checker import Checker
from .consumer import SimConsumer, SimWorker
from .dynamodb import NetworkFaults, SimDynamoDB, SimDynamoDBClient
from .engine import Host
from .java import JavaPeer
from .kinesis import SimStream
from .landing import SimPipeline, SimZoneStore
from .scenario import FAULTS, FaultEvent, Scenario
from .stage import Stage

STREAM = "simstream"
APPLICATION = "simapp"

# The main phase ends after `steps` steps or this much virtual time per step, whichever comes first.
MAX_SECONDS_PER_STEP = 0.5

# Items of other applications sharing the table: never to be changed.
FOREIGN_ITEMS = (
    {"leaseKey": {"S": "123456789012:orders:1700000000:shardId-000000000000"}, "leaseCounter": {"N": "3"},
     "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
     "checkpointSubSequenceNumber": {"N": "0"}, "streamName": {"S": "orders"}},
    {"leaseKey": {"S": "shardId-000000009999"}, "leaseCounter": {"N": "9"}, "checkpoint": {"S": "TRIM_HORIZON"},
     "checkpointSubSequenceNumber": {"N": "0"}},
    {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"}, "cs": {"S": "KCL_3X_COMPATIBLE"}},
)


@dataclass
class Result:
    scenario: Scenario
    steps: int
    settle_steps: int
    virtual_seconds: float
    violations: list[str]
    stats: Counter
    trace: list[str]
    records: int = 0
    deliveries: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def base_config(worker_id: str, leases_to_acquire: int) -> ConsumerConfig:
    # Java-compatible timings (3 s heartbeat, 10 s expiry; margin a tenth), a 10 s cycle, small batches.
    return ConsumerConfig(stream=STREAM, application=APPLICATION, worker_id=worker_id, heartbeat_seconds=3.0,
                          lease_expiry_seconds=10.0, cycle_seconds=10.0, polling_interval_seconds=1.0,
                          idle_interval_seconds=2.0, max_records_per_call=10, leases_to_acquire=leases_to_acquire)


class World(Stage):
    def __init__(self, scenario: Scenario, mutation: str | None = None):
        super().__init__(scenario.seed)
        self.scenario = scenario
        self.mutation = mutation
        self.ages_stamped_at_cycle_start = False  # set by a mutation (mutations.py)
        self.config = base_config("template", scenario.leases_to_acquire)
        self.table_name = self.config.lease_table
        self.stats: Counter = Counter()
        self.steal_times: list[float] = []  # when a manager planned a steal (virtual seconds)
        self.worker_metrics: dict[str, float] = {}  # the worker metrics table: worker id → last update
        self._serials = 0
        self.dynamodb = SimDynamoDB()
        LeaseTable(self.table_name, SimDynamoDBClient(self.dynamodb, self.child_rng())).ensure_table()
        table = self.dynamodb.tables[self.table_name]
        foreign = {item["leaseKey"]["S"]: item for item in FOREIGN_ITEMS}
        table.items.update(foreign)
        self.reader = SimDynamoDBClient(self.dynamodb, self.child_rng())  # instant, faultless reads (the sim's)
        self.stream = SimStream(STREAM, self.child_rng(), scenario.shards, lambda: self.now, scenario.retention)
        self.store = SimZoneStore(STREAM)
        self.consumers: list[SimConsumer] = []
        self.java_peers: list[JavaPeer] = []
        self.workers: list[SimWorker] = []
        # The checker sees the stream, the store, the table's items and this world as a fleet view (fleet.py).
        self.checker = Checker(stream=self.stream, store=self.store, items=table.items, foreign=foreign, fleet=self,
                               config=self.config, liveness_slack=scenario.liveness_slack, now=lambda: self.now,
                               note=self.note)
        self.dynamodb.observers.append(self.checker.on_write)
        self.store.on_land = self.checker.on_land
        self.producing = True
        self.settling = False
        self._restores: list = []

    # -- the cast ------------------------------------------------------------------------------------------
    def next_serial(self) -> int:
        self._serials += 1
        return self._serials

    def new_host(self, name: str) -> Host:
        drift = self.scenario.drift
        faults = NetworkFaults()
        if self.scenario.noise:
            faults.lost_response, faults.silent_loss, faults.lost_request, faults.throttle = 0.01, 0.0, 0.005, 0.01
        host = Host(self, name, 1.0 + self.rng.uniform(-drift, drift), self.rng.uniform(0, 1e6), faults)
        host.baseline = replace(faults)
        return host

    def add_consumer(self, worker_id: str | None = None, host: Host | None = None, delay: float = 0.0) -> SimConsumer:
        index = len(self.consumers)
        worker_id = worker_id or f"consumer-{index}"
        consumer = SimConsumer(self, host or self.new_host(f"host-{index}"), worker_id,
                               replace(self.config, worker_id=worker_id), f"c{index}")
        self.consumers.append(consumer)
        consumer.start(delay)
        self.note(f"start {consumer!r}")
        return consumer

    # -- the fleet, as the checker sees it (fleet.FleetView) -----------------------------------------------
    def workers_by_key(self, key: str) -> list[SimWorker]:
        return [w for w in self.workers if w.key == key and not w.finished]

    def worker_of(self, actor: object) -> SimWorker | None:
        return actor if isinstance(actor, SimWorker) else None

    def live_worker_ids(self) -> set[str]:
        return {c.worker_id for c in self.consumers if c.alive() and not c.stopping}

    def landing_checked(self) -> bool:
        return not self.java_peers  # a Java peer's records are delivered, not landed

    # -- running -------------------------------------------------------------------------------------------
    def run(self) -> Result:
        with mutations.active(self.mutation, self):
            return self._run()

    def _run(self) -> Result:
        sc = self.scenario
        for _ in range(sc.consumers):
            self.add_consumer(delay=self.rng.uniform(0.0, 3.0))
        if sc.java:
            peer = JavaPeer(self, self.new_host("java-host"), "java-peer-0")
            self.java_peers.append(peer)
            peer.start(self.rng.uniform(0.0, 5.0))
        self.every(1.0, self.produce)
        self.every(5.0, self._trim)
        self.every(2.0, self.checker.audit)
        if sc.pipeline_period is not None:
            pipeline = SimPipeline(self.store, LeaseTable(self.table_name, SimDynamoDBClient(
                self.dynamodb, self.child_rng(), actor="pipeline")), self.stream)
            self.every(sc.pipeline_period, pipeline.commit)
        events = list(sc.events)
        violated = lambda: bool(self.checker.violations)  # noqa: E731
        # Steps count the system's own events; when it has none left to run (every consumer stopped for
        # good), virtual time still bounds the main phase.
        horizon = sc.steps * MAX_SECONDS_PER_STEP
        over = lambda: violated() or self.now >= horizon  # noqa: E731
        while not over() and self.steps < sc.steps and not self.idle():
            due = min(events[0].step if events else sc.steps, sc.steps)
            self.run_until(lambda due=due: over() or self.steps >= due)  # bound: the stop of this round only
            while events and events[0].step <= self.steps and not violated():
                self._strike(events.pop(0))
        main_steps = self.steps
        if not violated():
            self._settle()
        return Result(sc, main_steps, self.steps - main_steps, self.now, list(self.checker.violations), self.stats,
                      list(self.trace), self.stream.user_records, self.checker.deliveries)

    def every(self, period: float, action: Callable[[], None]) -> None:
        """Run `action` every `period` virtual seconds from now on (a tick of the world, not of a process)."""
        def tick():
            action()
            self.at(self.now + period, tick)
        self.at(self.now + period, tick)

    def produce(self) -> None:
        """One second of the stream's traffic, while the main phase lasts."""
        if self.producing:
            self.stream.produce(self.scenario.rate, self.scenario.hot)

    def _trim(self) -> None:
        for shard_id in self.stream.trim():
            self.stats["shards trimmed"] += 1
            self.checker.on_trim(shard_id)

    def _settle(self) -> None:
        """Faults stop; the fleet must converge within the settle time."""
        self.settling = True
        self.producing = False
        for restore in self._restores:
            restore()
        self._restores.clear()
        for consumer in self.consumers:
            consumer.group.frozen_until = min(consumer.group.frozen_until, self.now)
            consumer.heartbeat_slowness = 1.0
        for worker in self.workers:
            worker.scope.frozen_until = min(worker.scope.frozen_until, self.now)
        if not any(c.alive() and not c.stopping for c in self.consumers):
            self.add_consumer()
        deadline = self.now + self.scenario.settle_seconds
        state = {"quiet": 0}

        def look():
            problems = self.checker.settled()
            state["quiet"] = state["quiet"] + 1 if not problems else 0
            state["problems"] = problems
            if self.now < deadline:
                self.at(self.now + 5.0, look)
        self.at(self.now + 5.0, look)
        self.run_until(lambda: bool(self.checker.violations) or state["quiet"] >= 2 or self.now > deadline)
        if not self.checker.violations and state["quiet"] < 2:
            problems = self.checker.settled()
            if problems:
                self.checker.violation(f"the fleet did not settle within {self.scenario.settle_seconds:.0f}s "
                                       f"after the faults stopped: {problems[0]}"
                                       + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

    # -- faults --------------------------------------------------------------------------------------------
    def _strike(self, event: FaultEvent) -> None:
        rng = random.Random(f"{self.seed}-{event.step}-{event.draw}")
        live = [c for c in self.consumers if c.alive() and not c.stopping]
        kind = event.kind
        self.stats[kind] += 1
        self.note(f"FAULT {kind}")
        if kind == "reshard":
            self.stats[self.stream.reshard()] += 1
            return
        if kind in ("crash", "graceful-stop") and self.java_peers and self.java_peers[0].alive() and rng.random() < 0.2:
            self.java_peers[0].crash()
            self.note("the Java peer crashed (it releases nothing)")
            return
        if not live:
            return
        victim = rng.choice(live)
        # The fleet is never left empty for good: an operator (or the orchestrator) starts a consumer again
        # before the stream's retention runs out.
        last = len(live) == 1
        if kind == "crash":
            victim.kill(whole_group=rng.random() < 0.6)
            if last or rng.random() < 0.8:
                same = "restart-same-id" in self.scenario.faults and rng.random() < 0.5
                self.stats["restart with the same id" if same else "restart with a new id"] += 1
                self.at(self.now + rng.uniform(1.0, 20.0),
                        lambda: self.add_consumer(victim.worker_id if same else None, victim.host))
        elif kind == "graceful-stop":
            victim.graceful_stop()
            if last or rng.random() < 0.7:
                self.at(self.now + rng.uniform(1.0, 20.0), lambda: self.add_consumer(host=victim.host))
        elif kind == "freeze-consumer":
            seconds = rng.choice([rng.uniform(1.0, 5.0), rng.uniform(1.2, 3.0) * self.config.lease_expiry_seconds])
            victim.group.frozen_until = self.now + seconds
            self.note(f"{victim!r} frozen for {seconds:.1f}s")
        elif kind == "freeze-worker":
            workers = [w for w in victim.workers.values() if not w.finished]
            if workers:
                worker = rng.choice(workers)
                seconds = rng.uniform(1.2, 3.0) * self.config.lease_expiry_seconds
                worker.scope.frozen_until = self.now + seconds
                self.note(f"{worker!r} frozen for {seconds:.1f}s")
        elif kind == "duplicate-id":
            self.add_consumer(victim.worker_id)
            self.note(f"a second process runs under {victim.worker_id}")
        else:
            self._network_fault(kind, victim, rng)

    def _network_fault(self, kind: str, victim: SimConsumer, rng: random.Random) -> None:
        faults = victim.host.faults
        # Healing restores the host's baseline, and only what this fault changed: faults overlap.
        baseline = victim.host.baseline
        seconds = rng.uniform(5.0, 35.0)
        if kind == "partition":
            changed = {"partitioned": True}
        elif kind == "slow-dynamodb":
            changed = {"slow": rng.uniform(20.0, 250.0), "throttle": 0.3}
        elif kind == "lost-responses":
            changed = {"lost_response": rng.uniform(0.05, 0.3), "silent_loss": rng.choice([0.0, 0.2])}
        elif kind == "throttling":
            changed = {"throttle": rng.uniform(0.2, 0.6)}
        elif kind == "slow-heartbeats":
            changed = {}
            victim.heartbeat_slowness = rng.uniform(1.5, 3.5)
        else:
            raise ValueError(f"unknown fault {kind}")
        for name, value in changed.items():
            setattr(faults, name, value)

        def restore():
            for name in changed:
                setattr(faults, name, getattr(baseline, name))
            faults.healthy_since = self.now
            if kind == "slow-heartbeats":
                victim.heartbeat_slowness = 1.0
        self._restores.append(restore)

        def heal():
            if restore in self._restores:
                self._restores.remove(restore)
                restore()
        self.at(self.now + seconds, heal)


def simulate(seed: int, steps: int, faults: Iterable[str] = FAULTS, mutation: str | None = None) -> Result:
    return World(Scenario.generate(seed, steps, faults), mutation).run()


__all__ = ["Result", "World", "simulate"]
