"""One seeded world: a stream, a lease table shared with other applications, a landing zone, hosts with
drifting clocks, our consumers (and maybe a Java KCL 2.x peer), and faults at chosen steps (runtime/scenario.py).

A run has two phases. The main phase runs `steps` steps (events of the system under test) while records
are produced and faults strike. Then every fault heals, production stops, and the fleet must settle:
every record delivered and landed, every lease worked, the consumers balanced. Invariants are checked at
every step (judge/checker.py); the first violation ends the run with a trace of the last events.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from ..kcl.config import ConsumerConfig, InitialPosition
from ..kcl.core import coverage
from ..kcl.core.lease.lease_life import handoff_timeout
from ..kcl.core.model import LATEST, Checkpoint
from ..kcl.core.table.lease_codec import lease_from_item
from ..kcl.core.table.lease_rules import HANDOFF_ATTRIBUTE
from ..kcl.core.table.worker_metrics import HASH_KEY as METRICS_HASH_KEY
from ..kcl.core.table.worker_metrics import worker_metrics_table
from ..kcl.shells.fleet.manager import shutdown_timeout
from ..kcl.shells.lease_table import LeaseTable
from ..windows.backfill import BackfillPace, backfill_range
from ..zone.errors import LandingError
from ..zone.layout import BatchKey, link_key, parse_batch_key
from .actors import java3
from .actors.consumer import SimConsumer, SimWorkerProcess
from .actors.java import JavaPeer
from .actors.pipeline import PIPELINE_CRASHES, SimPipeline
from .actors.stage import Stage
from .aws.dynamodb import NetworkFaults, SimDynamoDB, SimDynamoDBClient, SimTable
from .aws.kinesis import SimKinesisClient, SimStream
from .aws.landing import CRASH_POINTS, STALL_POINTS, SimCrash, SimZone
from .judge import mutations
from .judge.checker import Checker
from .runtime.engine import EPOCH, Host
from .runtime.pauses import Pauses
from .runtime.scenario import FAULTS, FaultEvent, Scenario

STREAM = "simstream"
APPLICATION = "simapp"

# The main phase ends after `steps` steps or this much virtual time per step, whichever comes first.
MAX_SECONDS_PER_STEP = 0.5
# The pipeline's windows (sim/actors/pipeline.py): one minute, the completeness rule's grace 15 s (a shard caught up
# that long after a window's end has passed it), stalled 2 minutes after their end.
WINDOW_MS = 60_000
WINDOW_GRACE_MS = 15_000
WINDOW_OVERDUE_MS = 120_000
# The operator's promise for freezes, as for crashes and stops ("an operator starts a consumer again before the
# stream's retention runs out"): within any span of the stream's retention, the fleet (a consumer able to take a
# lease, or a Java peer) runs this many cycles in one piece — long enough to take its leases again after a freeze
# past the expiry cost it all of them (`World.freeze_allowance`; docs/simulation.md has the seeds that showed it).
# A cycle that spawns a worker is blocked for the spawn (`slow-spawns`), so the stretch counts one per cycle.
FLEET_RUN_CYCLES = 3
# A freeze the promise would cut shorter than this is not struck at all.
SHORTEST_FREEZE_SECONDS = 1.0

# Items of other applications sharing the table: never to be changed. The leases are written as Java writes them
# (a KCL 2.x peer's listing reads them); the non-lease entity only where no KCL 2.x peer shares the table, since
# its listing would fail on it (java.java2_rejects), as a real one's would.
FOREIGN_LEASES = (
    {"leaseKey": {"S": "123456789012:orders:1700000000:shardId-000000000000"}, "leaseCounter": {"N": "3"},
     "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
     "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "0"},
     "streamName": {"S": "orders"}},
    {"leaseKey": {"S": "shardId-000000009999"}, "leaseCounter": {"N": "9"}, "checkpoint": {"S": "TRIM_HORIZON"},
     "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "0"}},
)
FOREIGN_ENTITY = {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"},
                  "cs": {"S": "KCL_3X_COMPATIBLE"}}
FOREIGN_ITEMS = (*FOREIGN_LEASES, FOREIGN_ENTITY)


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
    branches: Counter = field(default_factory=Counter)  # named branches hit (core/coverage.py)
    effects: Counter = field(default_factory=Counter)   # (driver, effect) answered by the shells

    @property
    def ok(self) -> bool:
        return not self.violations


def base_config(worker_id: str, leases_to_acquire: int) -> ConsumerConfig:
    # Java-compatible timings (3 s heartbeat, 10 s expiry; margin a tenth), a 10 s cycle, small batches.
    return ConsumerConfig(stream=STREAM, application=APPLICATION, worker_id=worker_id, heartbeat_seconds=3.0,
                          lease_expiry_seconds=10.0, cycle_seconds=10.0, polling_interval_seconds=1.0,
                          idle_interval_seconds=2.0, max_records_per_call=10, leases_to_acquire=leases_to_acquire)


class World(Stage):
    def __init__(self, scenario: Scenario, mutation: str | None = None, pauses: Pauses | None = None):
        super().__init__(scenario.seed)
        self.scenario = scenario
        self.mutation = mutation
        self.config = base_config("template", scenario.leases_to_acquire)
        self.table_name = self.config.lease_table
        self.stats: Counter = Counter()
        self.effects_handled: Counter = Counter()
        self.steal_times: list[float] = []  # when a manager planned a steal (virtual seconds)
        self._serials = 0
        self.pauses = pauses if pauses is not None else (
            Pauses(self.child_rng(), scenario.drift) if scenario.pauses else Pauses.none())
        self.dynamodb = SimDynamoDB()
        LeaseTable(self.table_name, SimDynamoDBClient(self.dynamodb, self.child_rng())).ensure_table()
        table = self.dynamodb.tables[self.table_name]
        foreign = {item["leaseKey"]["S"]: item for item in (FOREIGN_LEASES if scenario.java else FOREIGN_ITEMS)}
        table.items.update(foreign)
        # KCL 3.x's worker metrics table, which the managers read and write (kcl3_tables, as they ship).
        metrics_table = worker_metrics_table(self.config.application)
        self.dynamodb.tables[metrics_table] = SimTable(metrics_table, METRICS_HASH_KEY)
        self.reader = SimDynamoDBClient(self.dynamodb, self.child_rng())  # instant, faultless reads (the sim's)
        # The service's clock is the wall clock's epoch (arrival minutes name the landed batches' keys).
        self.stream = SimStream(STREAM, self.child_rng(), scenario.shards, lambda: EPOCH + self.now,
                                scenario.retention)
        self.zone = SimZone(self.stream, str(scenario.seed))
        self.zone.clock = lambda: self.now
        self.consumers: list[SimConsumer] = []
        self.java_peers: list[JavaPeer] = []
        self.workers: list[SimWorkerProcess] = []
        # The checker sees the stream, the store, the table's items and this world as a fleet view (judge/fleet.py).
        self.checker = Checker(stream=self.stream, zone=self.zone, items=table.items, foreign=foreign, fleet=self,
                               config=self.config, liveness_slack=scenario.liveness_slack, now=lambda: self.now,
                               note=self.note, spawn_seconds=scenario.spawn_seconds,
                               start_seconds=scenario.longest_start)
        # The world's own reaction first: it needs the holder as it was before the write.
        self.dynamodb.observers.append(self._on_handoff_asked)
        self.dynamodb.observers.append(self.checker.on_write)
        self.zone.on_land = self.checker.on_land
        self.zone.on_relanded = self.checker.on_relanded
        # `latest-start`: the application starts at LATEST (never beside a KCL 3.x peer, whose leases start at
        # TRIM_HORIZON); the checker then owes a shard's records from its chain's first (checker._floor).
        self.latest = scenario.initial_position == LATEST and not java3.chosen(self)
        self._first_claims: dict[str, bool] = {}  # shard -> its start link is there
        self._start_rng = random.Random(f"{scenario.seed}-latest-start")
        if self.latest:
            self.config = replace(self.config, initial_position=InitialPosition(LATEST))
            self.checker.latest_start = True
        self.pipeline: SimPipeline | None = None
        self.producing = True
        self.settling = False
        self._restores: list = []
        self._repairs: dict[str, float] = {}  # damaged batch -> when the operator repairs it
        # The freezes' promise (`freeze_allowance`): since when the fleet has been able to work without a break, and
        # when it last had been for `_fleet_run` seconds (the start counts as such a moment).
        self._fleet_run = FLEET_RUN_CYCLES * (self.config.cycle_seconds + scenario.spawn_seconds)
        self._able_since: float | None = None
        self._ran_until = 0.0

    # -- the cast ------------------------------------------------------------------------------------------
    def next_serial(self) -> int:
        self._serials += 1
        return self._serials

    def new_host(self, name: str) -> Host:
        drift = self.scenario.drift
        faults = NetworkFaults()
        if self.scenario.noise:
            faults.lost_response, faults.silent_loss, faults.lost_request, faults.throttle = 0.01, 0.0, 0.005, 0.01
        faults.late_application = self.scenario.late_application
        # Clock rates up to the documented tolerance (core/tolerance.py), a third of the hosts at its edges.
        rate = 1.0 + (self.rng.choice([-drift, drift]) if self.rng.random() < 0.33 else self.rng.uniform(-drift, drift))
        host = Host(self, name, rate, self.rng.uniform(0, 1e6), faults, skew=self.rng.uniform(-0.5, 0.5))
        host.baseline = replace(faults)
        return host

    def add_consumer(self, worker_id: str | None = None, host: Host | None = None, delay: float = 0.0) -> SimConsumer:
        index = len(self.consumers)
        worker_id = worker_id or f"consumer-{index}"
        # A hosted consumer (the Dagster sensor's) gives its workers a keep-alive: 3 sensor intervals.
        keepalive = 3 * self.config.cycle_seconds if self.scenario.hosted else None
        consumer = SimConsumer(self, host or self.new_host(f"host-{index}"), worker_id,
                               replace(self.config, worker_id=worker_id), f"c{index}", keepalive_timeout=keepalive)
        self.consumers.append(consumer)
        consumer.start(delay)
        self.note(f"start {consumer!r}")
        return consumer

    def apply_later(self, delay: float, apply: Callable[[], None]) -> None:
        """DynamoDB applies a request its client gave up on, `delay` seconds from now."""
        self.stats["writes applied late"] += 1
        self.at(self.now + delay, apply)

    def consumer_exited(self, consumer: SimConsumer) -> None:
        """Its `consume` returned after a graceful stop: the shutdown invariant is checked now."""
        self.checker.on_consumer_exit(consumer)

    def consumer_failed(self, consumer: SimConsumer) -> None:
        """It died of an error (a start that could not reach the services): an orchestrator starts it again."""
        if not consumer.stopping and (self.producing or self.settling):
            self.at(self.now + self.rng.uniform(5.0, 20.0), lambda: self.add_consumer(host=consumer.host))

    def _on_handoff_asked(self, table: str, key: str, before: dict | None, after: dict | None, actor: Any,
                          sent_at: float) -> None:
        """A holder asked for a hand-off is often the one that answers late or never: it is overloaded (that
        is why its lease is moved), its heartbeat starved, or it freezes. The world makes it so, often
        enough that every path of the hand-off runs in most hundred-seed batches."""
        if after is None or HANDOFF_ATTRIBUTE not in after or (before is not None and HANDOFF_ATTRIBUTE in before):
            return
        holder = self.checker.holder.get(key)
        if not isinstance(holder, SimWorkerProcess) or holder.finished:
            return  # most hand-offs come while the fleet settles, rebalancing: they get late holders too
        timeout = handoff_timeout(holder.worker.settings)
        draw = self.rng.random()
        if draw < 0.35:
            holder.heartbeat_pause_until = self.now + self.rng.uniform(0.5, 2.5) * timeout
            self.stats["hand-off holders answering late"] += 1
        elif self.settling:
            pass  # once the faults stopped, a late answer at most: the fleet must converge
        elif draw < 0.5:
            holder.scope.frozen_until = max(holder.scope.frozen_until,
                                            self.now + self.rng.uniform(0.6, 2.5) * self.config.lease_expiry_seconds)
            self.stats["hand-off holders frozen"] += 1
        lease = lease_from_item(after)
        self.note(f"hand-off of {key} asked of {holder!r} by {lease.lease_owner if lease else '?'}")
        asker = actor.consumer if isinstance(actor, SimWorkerProcess) else None
        if asker is None:
            return
        if self.rng.random() < 0.25 and "freeze-consumer" in self.scenario.faults and not self.settling:
            # The asker's whole process freezes while it waits: on thaw the lease may have been taken by
            # expiry meanwhile (the hand-off overtaken), and a zombie asker must take nothing.
            seconds = self._promised([asker], self.rng.uniform(1.5, 3.0) * self.config.lease_expiry_seconds,
                                     "while it waits for a hand-off")
            if seconds:
                asker.group.frozen_until = max(asker.group.frozen_until, self.now + seconds)
                self.stats["hand-off askers frozen"] += 1
                self.note(f"{asker!r} frozen for {seconds:.1f}s while it waits for a hand-off")
        else:
            self.stop_while_taking(asker, 1.0, 0.3)  # most often before the holder has answered

    # -- the fleet, as the checker sees it (fleet.FleetView) -----------------------------------------------
    def workers_by_key(self, key: str) -> list[SimWorkerProcess]:
        return [w for w in self.workers if w.key == key and not w.finished]

    def worker_of(self, actor: object) -> SimWorkerProcess | None:
        return actor if isinstance(actor, SimWorkerProcess) else None

    def workers_of(self, consumer: object) -> list[SimWorkerProcess]:
        return [w for w in self.workers if w.consumer is consumer]

    def live_worker_ids(self) -> set[str]:
        return {c.worker_id for c in self.consumers if c.alive() and not c.stopping}

    def landing_checked(self) -> bool:
        return not self.java_peers  # a Java peer's records are delivered, not landed

    # -- running -------------------------------------------------------------------------------------------
    def run(self) -> Result:
        try:
            with mutations.active(self.mutation, self), coverage.recording() as branches:
                result = self._run()
        finally:
            self.zone.drop()  # the memory zones live in this process: a seed's objects go with it
            if self.pipeline is not None:
                self.pipeline.drop()
        result.branches = Counter(branches)
        result.effects = Counter(self.effects_handled)
        return result

    def _run(self) -> Result:
        sc = self.scenario
        for _ in range(sc.consumers):
            self.add_consumer(delay=self.rng.uniform(0.0, 3.0))
        if sc.java:
            peer = JavaPeer(self, self.new_host("java-host"), "java-peer-0")
            self.java_peers.append(peer)
            peer.start(self.rng.uniform(0.0, 5.0))
        java3.join(self)  # a KCL 3.x peer, in the worlds whose seed gives one (sim/actors/java3.py)
        self.every(1.0, self.produce)
        self.every(1.0, self._watch_fleet)
        self.every(5.0, self._trim)
        self.every(2.0, self.checker.audit)
        if self.latest and "landing-crash" in sc.faults:
            self.every(0.5, self._kill_first_claimers)
        if sc.pipeline_period is not None:
            self.pipeline = pipeline = self._pipeline()
            pipeline.period_ms = int(sc.pipeline_period * 1000)

            def tick() -> None:
                pipeline.tick(self._wall_ms())
                self.checker.on_pipeline_tick(pipeline)
            self.every(sc.pipeline_period, tick)
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
        if not violated() and self.landing_checked():
            self._audit_at_end()
        self.stats["writes applied late (took effect)"] += sum(
            getattr(c.client, "late_attempts", 0) for c in [*self.consumers, *self.workers])
        return Result(sc, main_steps, self.steps - main_steps, self.now, list(self.checker.violations), self.stats,
                      list(self.trace), self.stream.user_records, self.checker.deliveries)

    def _wall_ms(self) -> int:
        """The world's wall clock now, in epoch milliseconds (what the pipeline, the audits and backfills read)."""
        return int((EPOCH + self.now) * 1000)

    def _audit_at_end(self) -> None:
        """The seed's last word: the shipped audit and verify over the whole zone (checker.audit_at_end)."""
        store = self.zone.view("auditor")
        if self.pipeline is None:
            self.checker.verify_at_end(store, STREAM)
            return
        self.checker.audit_at_end(self.pipeline, store, STREAM, self._wall_ms(),
                                  WINDOW_OVERDUE_MS + self.pipeline.period_ms)

    def _pipeline(self) -> SimPipeline:
        """The pipeline process (sim/actors/pipeline.py): its own view of the zone, the real LeaseTable on the simulated
        DynamoDB, the stream listed through the simulated Kinesis."""
        first = int(EPOCH * 1000) // WINDOW_MS * WINDOW_MS
        table = LeaseTable(self.table_name, SimDynamoDBClient(self.dynamodb, self.child_rng(), actor="pipeline"))
        return SimPipeline(store=self.zone.view("pipeline"), output_name=f"{self.zone.name}-output", table=table,
                           kinesis=SimKinesisClient(self.stream, self.child_rng()), stream=STREAM, window_ms=WINDOW_MS,
                           first_window_ms=first, grace_ms=WINDOW_GRACE_MS, overdue_ms=WINDOW_OVERDUE_MS,
                           retention_ms=int(self.scenario.retention * 1000), rng=self.child_rng(), note=self.note)

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
        self.pauses.calm = True
        for restore in self._restores:
            restore()
        self._restores.clear()
        for consumer in self.consumers:
            consumer.group.frozen_until = min(consumer.group.frozen_until, self.now)
            consumer.manager_scope.frozen_until = min(consumer.manager_scope.frozen_until, self.now)
            consumer.heartbeat_slowness = 1.0
        for worker in self.workers:
            worker.scope.frozen_until = min(worker.scope.frozen_until, self.now)
            worker.heartbeat_pause_until = min(worker.heartbeat_pause_until, self.now)
        if not any(c.alive() and not c.stopping for c in self.consumers):
            self.add_consumer()
        deadline = self.now + self.scenario.settle_seconds
        state = {"quiet": 0}

        if self.pipeline is not None:
            self.pipeline.heal()
            for name in sorted(self._repairs):
                self._repair(name)
            # A lost batch is asked for again now (seed 1147: the batch stayed lost, its shard could not end, and
            # its children were never read).
            for name, kind in sorted(self.zone.damaged.items()):
                if kind == "lost" and name not in self._repairs:
                    self._refill(name)

        def look():
            problems = self.settled()
            state["quiet"] = state["quiet"] + 1 if not problems else 0
            state["problems"] = problems
            if self.now < deadline:
                self.at(self.now + 5.0, look)
        self.at(self.now + 5.0, look)
        self.run_until(lambda: bool(self.checker.violations) or state["quiet"] >= 2 or self.now > deadline)
        if not self.checker.violations and state["quiet"] < 2:
            problems = self.settled()
            if problems:
                self.checker.violation(f"the fleet did not settle within {self.scenario.settle_seconds:.0f}s "
                                       f"after the faults stopped: {problems[0]}"
                                       + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))

    def _strike_pipeline(self, kind: str, rng: random.Random) -> None:
        pipeline = self.pipeline
        if pipeline is None:
            return
        # A window still to run (the next ones the sensor reports), or one already run (a re-run's).
        window = pipeline.cursor + rng.randint(-2, 2) * WINDOW_MS
        if kind == "transform-fails":
            how = "for good" if rng.random() < 0.3 else "once"
            (pipeline.faults.fail_always if how == "for good" else pipeline.faults.fail_once).add(window)
            self.note(f"window {window}'s run will fail {how}")
        elif kind == "pipeline-crash":
            point = rng.choice(PIPELINE_CRASHES)
            pipeline.faults.crash[window] = point
            self.note(f"window {window}'s run will crash {point}")
        elif kind == "transform-drops-rows":
            window = pipeline.cursor + rng.randint(0, 1) * WINDOW_MS
            pipeline.faults.drop_row.add(window)
            self.note(f"window {window}'s next run will drop a row it read")
        else:
            deleted = pipeline.delete_newest_commit(self._wall_ms())
            self.note(f"window {deleted}'s commit deleted" if deleted is not None else "no commit to delete")

    def _kill_first_claimers(self) -> None:
        """`latest-start` with `landing-crash`: half the shards' first holders are killed right after they claim
        the start link (`after=LATEST`), before their first batch is written. The next holder's LATEST gives
        other first records: it must adopt the claimed batch (sink._follow_chain), never stop there for good."""
        if not self.producing or all(self._first_claims.get(s, False) for s, shard in self.stream.shards.items()
                                     if not shard.parents):
            return
        for worker in self.workers:
            shard = self.stream.shards.get(worker.key)
            if worker.finished or shard is None or shard.parents or self._first_claims.get(worker.key):
                continue
            if self.zone.store.exists(link_key(STREAM, 0, worker.key, Checkpoint(LATEST))):
                self._first_claims[worker.key] = True
                continue
            if worker.key not in self._first_claims:
                self._first_claims[worker.key] = False
                if self._start_rng.random() < 0.5 and worker not in self.zone.crashes:
                    self.zone.crashes[worker] = "after-link"
                    self.stats["first holders killed after the start link"] += 1
                    self.note(f"{worker!r} will be killed after-link of its first landing (LATEST)")

    # -- damage to the landing zone ------------------------------------------------------------------------
    def _damage(self, kind: str, rng: random.Random, newest: bool = False) -> None:
        """A batch lost (deleted after it landed), corrupted (its bytes altered in place), or lost and refilled a
        little later through the shipped backfill path while the workers keep landing (`refill`). The batch is
        one that another follows in its shard (so its loss is a hole in the chain), most often a recent one (its
        window not run yet: the checkpoint must stop at the hole); a refill's, half the time, the first batch of
        its minute (the refill's predecessor then comes from the live links alone).

        `newest` (a third of the refills): a shard's newest batch instead, lost while its holder keeps landing
        after it (issue 20's race of a refill beside the live writer; the backfill leaves the shard to the live
        side until its progress shows the minute landed, and must then land exactly the lost batch)."""
        if self.pipeline is None:
            return
        zone = self.zone
        newest_of: dict[str, BatchKey] = {}
        for key in zone.batches.values():
            top = newest_of.get(key.shard_id)
            if top is None or key.last.key() > top.last.key():
                newest_of[key.shard_id] = key
        candidates = sorted((k for k in zone.batches.values()
                             if newest_of[k.shard_id] is not k and k.key() not in zone.ever_damaged),
                            key=lambda k: (k.minute_ms, k.key()))
        now_ms = self._wall_ms()
        if newest:
            candidates = sorted((k for k in newest_of.values() if k.key() not in zone.ever_damaged
                                 and k.minute_ms >= now_ms - 180_000), key=lambda k: (k.minute_ms, k.key()))
            self.stats["newest batches refilled"] += 1 if candidates else 0
        elif kind == "refill":
            candidates = [k for k in candidates if k.minute_ms >= now_ms - 180_000]
            if rng.random() < 0.5:
                firsts: dict[tuple[str, int], BatchKey] = {}
                for k in candidates:
                    if (k.shard_id, k.minute_ms) not in firsts:
                        firsts[(k.shard_id, k.minute_ms)] = k
                candidates = [k for k in candidates if firsts[(k.shard_id, k.minute_ms)] is k] or candidates
        if not candidates:
            self.note(f"no batch to damage ({kind})")
            return
        recent = candidates[-6:] if rng.random() < 0.7 else candidates
        name = rng.choice(recent).key()
        if kind == "corrupt-batch":
            # Damage after a commit named it, as a loss is: the operator moves the batch away later, when a re-run
            # may have withdrawn that commit (seed 3368 under `mixed-batch-sizes`).
            self.checker.on_batch_lost(name, self.pipeline)
            zone.corrupt(name)
            self.stats["batches corrupted"] += 1
            self.note(f"batch {name} corrupted")
        else:
            self.checker.on_batch_lost(name, self.pipeline)
            zone.lose(name)
            self.stats["batches lost"] += 1
            self.note(f"batch {name} lost")
        if kind == "refill":
            self.at(self.now + rng.uniform(1.0, 30.0), lambda: self._refill(name))
        else:
            self._repairs[name] = self.now + rng.uniform(40.0, 100.0)
            self.at(self._repairs[name], lambda: self._repair(name))

    def _repair(self, name: str) -> None:
        """The operator's answer to damage: the shipped audit (the whole history, incrementally, and the windowed
        audit) and verify must first report it FAILED, naming its window; then a corrupted batch is moved away
        and, like a lost one, refilled (at the latest when the faults stop)."""
        if self._repairs.pop(name, None) is None or name not in self.zone.damaged or self.checker.violations:
            return
        pipeline = self.pipeline
        assert pipeline is not None
        self.checker.audit_damage(pipeline, self.zone.view("auditor"), STREAM, self._wall_ms(),
                                  WINDOW_OVERDUE_MS + pipeline.period_ms)
        if self.checker.violations:
            return
        if self.zone.damaged.get(name) == "corrupt":
            self.zone.lose(name)  # moved away: lost, to be refilled (the checker knew of the damage at the strike)
        self._refill(name)

    def _refill(self, name: str) -> None:
        """An operator refills the lost batch's minute with the shipped backfill (windows/backfill.py), beside the
        live workers; a shard the live side is not done with is left to it: asked again 15 s later, until the
        batch is back. (Before, four or eight tries and then not until the faults stopped: seeds 1485 and 3161 of
        the opt-in kinds, a parent shard's lost batch left to its frozen holder until the tries ran out and then
        for good, while the parent's children, which wait for its end, left the stream with their retention.)"""
        key = parse_batch_key(name)
        if key is None or name not in self.zone.damaged or self.checker.violations:
            return
        leases = [lease_from_item(item) for k, item in self.dynamodb.tables[self.table_name].items.items()
                  if k in self.stream.shards]
        ticks = iter(range(0, 10**9, 100))
        try:
            report = backfill_range(STREAM, key.minute_ms, key.minute_ms + 60_000, self.zone.view("refill"),
                                    leases=leases, kinesis=SimKinesisClient(self.stream, self.child_rng()),
                                    now_ms=self._wall_ms(), pace=BackfillPace(parallelism=1),
                                    monotonic=lambda: float(next(ticks)),
                                    application_start=self.config.initial_position.checkpoint())
        except (LandingError, SimCrash) as exc:
            self.note(f"refill of {name} failed: {exc}")
            # The error names a corrupted batch the operator has yet to answer (another of the minute's batches): the
            # operator moves it away now, refilling it, and asks again for this one: waiting for the corrupted one's
            # own answer held the lost batch, and with it the parent shard's end, while its children's records could
            # leave the stream with their retention, never read.
            named = [other for other in sorted(self._repairs) if other in str(exc)]
            for other in named:
                self._repair(other)
            if named and name in self.zone.damaged:
                self.at(self.now + 15.0, lambda: self._refill(name))
            return
        self.checker.on_refilled(name)
        shard = report.shards.get(key.shard_id)
        self.stats["refills"] += 1
        back = "back" if name in self.zone.batches else "not back"
        self.note(f"refill of {key.minute_ms}: {key.shard_id} {shard.stopped_by if shard else '?'}, "
                  f"{report.records_landed} records landed, {name} {back}")
        if name not in self.zone.damaged and self.pipeline is not None:
            # The window's runs may have failed on the damage until the sensor gave up: the operator re-runs it.
            self.pipeline.rerun_by_hand(key.minute_ms - key.minute_ms % WINDOW_MS)
        if name in self.zone.damaged:
            self.at(self.now + 15.0, lambda: self._refill(name))

    def _slow_holders(self, live: list[SimConsumer], rng: random.Random) -> None:
        """Holders too slow for their window: a consumer (half the time every live one) frozen until the window
        of the current minute has run and a little beyond, so what it had read but not landed lands after the
        window's run (a late batch: the checkpoint run reports it, the sensor runs the window again)."""
        if not live:
            return
        now_ms = self._wall_ms()
        closes = now_ms - now_ms % WINDOW_MS + WINDOW_MS + WINDOW_GRACE_MS
        period = self.pipeline.period_ms if self.pipeline is not None else 0
        seconds = (closes - now_ms + period) / 1000 + rng.uniform(1.0, 10.0)
        victims = live if rng.random() < 0.5 else [rng.choice(live)]
        wanted, seconds = seconds, self._promised(victims, seconds, "past its window's run")
        if not seconds:
            return
        for victim in victims:
            victim.group.frozen_until = max(victim.group.frozen_until, self.now + seconds)
            if seconds == wanted:
                self.note(f"{victim!r} frozen for {seconds:.1f}s, past its window's run")

    # -- the operator's promise for freezes -----------------------------------------------------------------
    def _fleet_able(self) -> bool:
        """Some consumer could take a lease now (consumer.able: alive, not frozen, not stopping, reaching DynamoDB),
        or a Java peer runs."""
        return any(c.able() for c in self.consumers) or any(peer.alive() for peer in self.java_peers)

    def _watch_fleet(self) -> None:
        """Every second: since when the fleet has been able to work without a break, and when it last had been so
        for the promised stretch (`_fleet_run`)."""
        if not self._fleet_able():
            self._able_since = None
            return
        if self._able_since is None:
            self._able_since = self.now
        if self.now - self._able_since >= self._fleet_run:
            self._ran_until = self.now

    def freeze_allowance(self, victims: Iterable[Any], seconds: float) -> float:
        """How long the world may freeze `victims` (their whole processes, or their managers: none takes a lease
        meanwhile) from now, at most `seconds`; 0: not at all.

        The world's promise: within any span of the stream's retention R, the fleet runs `_fleet_run` seconds (X)
        in one piece. A fleet that ran so until b must run so again from b + R - 2X at the latest (then every span
        of R holds such a stretch); a freeze that leaves no consumer able to work is cut to end by then. Freezes
        come by steps, and a frozen fleet makes no steps: without the promise a lone consumer could be frozen for
        most of the time a closed shard had left (each freeze past the expiry costing it every lease, one lease
        taken a cycle between them), and the shard leave the stream unread."""
        if not self.producing:
            return seconds
        self._watch_fleet()
        if any(peer.alive() for peer in self.java_peers):
            return seconds
        victims = list(victims)
        back = math.inf  # when another consumer is able to work again (a frozen one: at its thaw)
        for consumer in self.consumers:
            if consumer in victims or not consumer.alive() or consumer.stopping:
                continue
            thaw = max(consumer.group.thaw_time(), consumer.manager_scope.thaw_time())
            back = min(back, self.now if consumer.able() else thaw if thaw > self.now else math.inf)
        latest = self._ran_until + self.scenario.retention - 2 * self._fleet_run
        if back <= max(self.now, latest):
            return seconds
        return max(0.0, min(seconds, latest - self.now))

    def _promised(self, victims: list[Any], seconds: float, why: str = "") -> float:
        """`freeze_allowance`, noted when it cuts a freeze (0: not struck, under SHORTEST_FREEZE_SECONDS)."""
        allowed = self.freeze_allowance(victims, seconds)
        if allowed >= seconds:
            return seconds
        allowed = allowed if allowed >= SHORTEST_FREEZE_SECONDS else 0.0
        self.stats["freezes cut by the operator's promise"] += 1
        who = ", ".join(repr(v) for v in victims)
        cut = f"frozen for {allowed:.1f}s of {seconds:.1f}s" if allowed else f"not frozen for {seconds:.1f}s"
        self.note(f"{who} {cut}{' ' + why if why else ''}, by the operator's promise: the fleet runs "
                  f"{self._fleet_run:.0f}s in one piece within any {self.scenario.retention:.0f}s of the retention")
        return allowed

    def settled(self) -> list[str]:
        """What keeps the world from having settled: the fleet's, and the pipeline's."""
        problems = self.checker.settled()
        if self.pipeline is not None:
            problems += self.checker.pipeline_settled(self.pipeline)
        return problems

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
        peers = [p for p in self.java_peers if isinstance(p, JavaPeer) and p.alive()]
        if kind in ("partition", "slow-dynamodb", "lost-responses", "throttling") and peers and rng.random() < 0.3:
            # The Java KCL 2.x peer's path to DynamoDB fails too: its renewals fail, and it keeps its leases
            # (and delivers) until its last renewal is an expiry old.
            self.note("the Java peer's network fails")
            self._network_fault(kind, peers[0], rng)
            return
        if kind in ("transform-fails", "pipeline-crash", "deleted-commit", "transform-drops-rows"):
            self._strike_pipeline(kind, rng)
            return
        if kind in ("lost-batch", "corrupt-batch", "refill"):
            # A third of the refills aim at a shard's newest batch (decided by a draw of its own, so the other
            # refills, and every other fault, draw as they did before).
            aim = random.Random(f"{self.seed}-{event.step}-{event.draw}-newest")
            newest = kind == "refill" and aim.random() < 1 / 3
            self._damage(kind, rng, newest=newest)
            return
        if kind == "late-batch":
            self._slow_holders(live, rng)
            return
        if kind == "zone-refuses":
            # Access to the zone denied (a policy change rolled back, a full disk freed) for a while: every worker's
            # write fails, its lease is held through a back-off and retried until the zone takes writes again.
            seconds = rng.uniform(2.0, 40.0)
            self.zone.refusing_until = max(self.zone.refusing_until, self.now + seconds)
            self.note(f"the zone refuses the workers' writes for {seconds:.1f}s")
            return
        if not live:
            return
        victim = rng.choice(live)
        if kind == "landing-crash":
            # Killed at one step of a landing: after its link was claimed, while its batch was uploaded (the
            # put never shows), or right after the batch was written (sim/aws/landing.py).
            workers = [w for w in victim.workers.values() if not w.finished]
            if workers:
                worker = rng.choice(workers)
                point = rng.choice(CRASH_POINTS)
                self.zone.crashes[worker] = point
                self.note(f"{worker!r} will be killed {point} of its next landing")
            return
        if kind == "zombie-flush":
            # Paused inside its next flush, at the put of a link or a batch (past the check that let the
            # delivery start: a GC pause), longer than the expiry: its lease is taken meanwhile, and at its thaw
            # it goes on with the flush, beside the new holder (sim/aws/landing.py, sim/runtime/pauses.py InsideCall).
            workers = [w for w in victim.workers.values() if not w.finished]
            if workers:
                worker = rng.choice(workers)
                point = rng.choice(STALL_POINTS)
                seconds = rng.uniform(1.1, 3.0) * self.config.lease_expiry_seconds
                whole, until_taken = rng.random() < 0.7, rng.random() < 0.5
                self.zone.stalls[worker] = (point, seconds, whole, until_taken)
                self.note(f"{worker!r} will pause {seconds:.1f}s at the {point} put of its next flush"
                          f"{', with its whole consumer' if whole else ''}"
                          f"{', or until its lease is taken' if until_taken else ''}")
            return
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
            if rng.random() < 0.25:
                # One of its workers hangs (a long GC, a stuck processor) past the shutdown's timeout: the
                # manager's shutdown must kill it rather than wait for ever.
                workers = [w for w in victim.workers.values() if w.is_alive()]
                if workers:
                    hung = rng.choice(workers)
                    hung.scope.frozen_until = self.now + rng.uniform(1.1, 2.0) * shutdown_timeout(victim.config)
                    self.note(f"{hung!r} hangs through its consumer's shutdown")
            self._stop_gracefully(victim, rng, last)
        elif kind == "freeze-consumer":
            seconds = rng.choice([rng.uniform(1.0, 5.0), rng.uniform(1.2, 3.0) * self.config.lease_expiry_seconds])
            if rng.random() < 0.3:
                # Its manager alone (a code server stuck in a long tick): its workers go on until the keep-alive
                # goes stale, when it has one. It takes no lease meanwhile: the promise counts it as frozen.
                seconds = self._promised([victim], rng.uniform(1.0, 6.0) * self.config.cycle_seconds, "(its manager)")
                if seconds:
                    victim.manager_scope.frozen_until = self.now + seconds
                    self.note(f"{victim!r}'s manager frozen for {seconds:.1f}s")
            elif seconds := self._promised([victim], seconds):
                victim.group.frozen_until = self.now + seconds
                self.note(f"{victim!r} frozen for {seconds:.1f}s")
        elif kind == "freeze-worker":
            workers = [w for w in victim.workers.values() if not w.finished]
            if workers:
                worker = rng.choice(workers)
                seconds = rng.uniform(1.2, 3.0) * self.config.lease_expiry_seconds * rng.choice([1, 1, 2])
                worker.scope.frozen_until = self.now + seconds
                self.note(f"{worker!r} frozen for {seconds:.1f}s")
        elif kind == "duplicate-id":
            self.add_consumer(victim.worker_id)
            self.note(f"a second process runs under {victim.worker_id}")
        else:
            self._network_fault(kind, victim, rng)

    def _stop_gracefully(self, victim: SimConsumer, rng: random.Random, last: bool) -> None:
        """SIGTERM; an operator (an orchestrator) usually starts another consumer on the host."""
        victim.graceful_stop()
        if last or rng.random() < 0.7:
            self.at(self.now + rng.uniform(1.0, 20.0), lambda: self.add_consumer(host=victim.host))

    def stop_while_taking(self, consumer: SimConsumer, within: float, probability: float) -> None:
        """A consumer that just started to take a lease (a hand-off asked, a steal waiting out its expiry) is
        sometimes stopped right then: a rolling deploy meets a rebalance. Its taker must give the lease back
        (withdraw the hand-off, release unsettled)."""
        if "graceful-stop" not in self.scenario.faults or not self.producing or self.rng.random() >= probability:
            return
        rng = random.Random(f"{self.seed}-stop-while-taking-{self.now}")
        self.stats["stopped while taking a lease"] += 1

        def stop() -> None:
            if consumer.alive() and not consumer.stopping and self.producing:
                live = [c for c in self.consumers if c.alive() and not c.stopping]
                self.note(f"FAULT graceful-stop of {consumer!r} while it takes a lease")
                self._stop_gracefully(consumer, rng, len(live) == 1)
        self.at(self.now + rng.uniform(0.2, within), stop)

    def _network_fault(self, kind: str, victim: Any, rng: random.Random) -> None:
        faults = victim.host.faults
        # Healing restores the host's baseline, and only what this fault changed: faults overlap.
        baseline = victim.host.baseline
        seconds = rng.uniform(5.0, 35.0)
        if kind == "partition":
            changed = {"partitioned": True}
        elif kind == "slow-dynamodb":
            changed = {"slow": rng.uniform(20.0, 250.0), "throttle": 0.3}
        elif kind == "lost-responses":
            changed = {"lost_response": rng.uniform(0.05, 0.3), "silent_loss": rng.choice([0.2, 0.5, 1.0])}
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
