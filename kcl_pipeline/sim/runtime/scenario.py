"""What a seeded world is made of: how many consumers and shards, the traffic, the clocks' drift, and the
faults that strike at chosen steps. The seed decides it all (`Scenario.generate`), so the seed is the replay.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable

from ...kcl.core.fleet.planner import START_PATIENCE_EXPIRIES
from ...kcl.core.tolerance import CLOCK_RATE_TOLERANCE

FAULTS = ("crash", "restart-same-id", "graceful-stop", "freeze-consumer", "freeze-worker", "partition",
          "slow-dynamodb", "slow-heartbeats", "duplicate-id", "lost-responses", "throttling", "clock-drift",
          "java-peer", "reshard", "late-writes", "pauses", "latest-start",
          # the landing and the pipeline (sim/aws/landing.py, sim/actors/pipeline.py)
          "landing-crash", "transform-fails", "pipeline-crash", "deleted-commit",
          # damage to the landing zone and the transform's word, in the pipeline's worlds only (drawn from a
          # stream of their own, so the faults above strike every seed as they did before these existed)
          "lost-batch", "corrupt-batch", "late-batch", "refill", "transform-drops-rows",
          # a zombie holder landing beside the new one: paused inside a flush at the zone's put, past its
          # validity check, longer than the expiry (drawn from a stream of its own, like the damage)
          "zombie-flush",
          # starting a worker process blocks its manager for seconds, and the worker starts late (a busy host; a
          # consumer's worker server starting): drawn from a stream of its own, like the damage
          "slow-spawns",
          # a rolling change of the landing's batch size (8 records to 3) rolling out while a zombie is paused inside
          # its flush: the workers started meanwhile cut at the new size, and the lease's new holder, cutting smaller
          # than the zombie, reads short at first (the race of the stale predecessor: its poll ends inside the
          # zombie's batch). Only worlds that cut 8 and pause a zombie change, from the pause on
          "rolling-change")
# Opt-in (`--faults`): their 10,000-seed run passes, but in the default set `mixed-batch-sizes` would replace every
# world's own batch size, and with it the single-record batches (docs/simulation.md, "Opt-in faults"). Each draws
# from a stream of its own, so they change nothing when absent.
OPT_IN_FAULTS = (
    # Kinesis answering a GetRecords with fewer records than the shard holds past the iterator (as it may, even
    # none): a poll ends short of what a zombie still lands
    "short-reads",
    # each worker process cutting batches at the old or the new size of a rolling change: two writers of a shard
    # cut its records at different places
    "mixed-batch-sizes",
    # the zone refusing the workers' writes for a while (S3 access denied, a full disk): their sinks fail, and
    # each failed lease is held through its back-off and retried (kcl/core/fleet/retry.py)
    "zone-refuses")
KNOWN_FAULTS = FAULTS + OPT_IN_FAULTS
# Faults drawn from their own stream, and only where the pipeline runs (its audit judges them).
PIPELINE_DAMAGE = ("lost-batch", "corrupt-batch", "late-batch", "refill", "transform-drops-rows")


@dataclass(frozen=True, order=True)
class FaultEvent:
    step: int
    kind: str
    draw: float  # a random number of its own, so its parameters do not depend on the history


@dataclass(frozen=True)
class Scenario:
    seed: int
    steps: int
    faults: frozenset[str]
    consumers: int
    java: bool
    shards: int
    rate: float
    retention: float
    drift: float
    leases_to_acquire: int
    flush_records: int
    kinesis_throttle: float
    noise: bool
    events: tuple[FaultEvent, ...]
    scan_page_items: int | None = None  # items per scan page (small: a scan of a big table)
    pipeline_period: float | None = None  # the pipeline commits checkpoints every so often (None: workers do)
    liveness_slack: float = 6.0
    settle_seconds: float = 240.0
    hot: int = 1  # the first shard's traffic, in multiples of the others' (load-aware balance)
    report_throughput: bool = True  # holders write throughputKBps (False: Java KCL 2.x's count balance)
    hosted: bool = False  # consumers hosted by the Dagster sensor: their workers have a keep-alive
    pauses: bool = False  # GC-like pauses and processing time in our processes (sim/runtime/pauses.py)
    late_application: float = 0.0  # of timed-out DynamoDB attempts, those applied late (after the retry)
    batch_age: float = 5.0  # the landing sink's max_batch_age_seconds
    initial_position: str = "TRIM_HORIZON"  # where the application's new leases start (LATEST: `latest-start`)
    short_reads: float = 0.0  # of GetRecords calls, those answered with a random prefix of their records
    mixed_batch_sizes: bool = False  # each worker process draws its own max_batch_records (else flush_records)
    spawn_seconds: float = 0.0  # how long starting a worker process blocks its manager (`slow-spawns`)
    # How long every worker process takes to start on a host loaded past its manager's first start patience (a
    # third of the lone consumer's `slow-spawns` worlds): each start takes 1-START_SPREAD times this.
    start_seconds: float = 0.0

    @classmethod
    def generate(cls, seed: int, steps: int, faults: Iterable[str] = FAULTS) -> "Scenario":
        faults = frozenset(faults)
        unknown = faults - set(KNOWN_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))} (known: {', '.join(KNOWN_FAULTS)})")
        rng = random.Random(f"scenario-{seed}")
        strike = [k for k in FAULTS if k in faults
                  and k not in ("clock-drift", "java-peer", "restart-same-id", "late-writes", "pauses", "latest-start")
                  and k not in PIPELINE_DAMAGE and k not in ("zombie-flush", "slow-spawns", "rolling-change")]
        count = rng.randint(0, 6) if strike else 0
        events = sorted(FaultEvent(rng.randint(steps // 10, max(steps // 10, steps * 6 // 10)),
                                   rng.choice(strike), rng.random()) for _ in range(count))
        if "reshard" in faults:
            events = sorted(events + [FaultEvent(rng.randint(steps // 20, steps * 7 // 10), "reshard", rng.random())
                                      for _ in range(rng.randint(0, 3))])
        java = "java-peer" in faults and rng.random() < 0.25
        # The landing pipeline commits checkpoints in half the worlds; never beside a Java peer, which reads
        # shards without landing them (a pipeline waiting for those records would wait for ever).
        pipeline_period = rng.choice([None, rng.uniform(3.0, 20.0)])
        damage = [k for k in PIPELINE_DAMAGE if k in faults]
        if damage and pipeline_period is not None and not java:
            own = random.Random(f"scenario-{seed}-damage")
            events = sorted(events + [FaultEvent(own.randint(steps // 10, max(steps // 10, steps * 6 // 10)),
                                                 own.choice(damage), own.random())
                                      for _ in range(own.randint(0, 3))])
        if "zone-refuses" in faults:
            own = random.Random(f"scenario-{seed}-refuses")
            events = sorted(events + [FaultEvent(own.randint(steps // 10, max(steps // 10, steps * 6 // 10)),
                                                 "zone-refuses", own.random())
                                      for _ in range(own.randint(1, 3))])
        if "zombie-flush" in faults:
            own = random.Random(f"scenario-{seed}-zombie")
            events = sorted(events + [FaultEvent(own.randint(steps // 10, max(steps // 10, steps * 6 // 10)),
                                                 "zombie-flush", own.random())
                                      for _ in range(own.randint(0, 3))])
        scenario = cls(seed=seed, steps=steps, faults=faults, consumers=rng.randint(1, 4),
                   java=java, shards=rng.randint(1, 6),
                   rate=rng.uniform(0.2, 0.9), retention=rng.uniform(150.0, 300.0),
                   drift=CLOCK_RATE_TOLERANCE if "clock-drift" in faults else 0.0,
                   leases_to_acquire=rng.choice([1, 1, 2]),
                   flush_records=rng.choice([1, 3, 8]), kinesis_throttle=rng.choice([0.0, 0.0, 0.05]),
                   noise="lost-responses" in faults and rng.random() < 0.5, events=tuple(events),
                   scan_page_items=rng.choice([None, None, 1, 2]),
                   pipeline_period=None if java else pipeline_period, hot=rng.choice([1, 1, 1, 5]),
                   hosted=rng.random() < 0.3, pauses="pauses" in faults,
                   late_application=0.5 if "late-writes" in faults else 0.0,
                   batch_age=rng.choice([2.0, 5.0, 20.0]),
                   # From a stream of its own (the draws above stay what they were): a quarter of the worlds
                   # without a Java peer start their application at LATEST.
                   initial_position="LATEST" if "latest-start" in faults and not java and random.Random(
                       f"scenario-{seed}-start").random() < 0.25 else "TRIM_HORIZON",
                   # Half the worlds, from a stream of their own: a third of their reads come back short.
                   short_reads=0.3 if "short-reads" in faults and random.Random(
                       f"scenario-{seed}-short").random() < 0.5 else 0.0,
                   mixed_batch_sizes="mixed-batch-sizes" in faults,
                   # A quarter of the worlds, from a stream of their own: each spawn blocks its manager for up to
                   # an expiry of the world's consumers.
                   spawn_seconds=_slow_spawns(seed) if "slow-spawns" in faults else 0.0)
        # Long starts make every lease a consumer takes cost a start patience and a start (about 50 s): only where
        # a lone consumer takes them and the stream reshards once at most. A second generation of children waits
        # on such takes of its parents, and the lone consumer takes one lease a cycle: with more reshards a merged
        # child's records left the stream with its retention while the shipped manager did as it should.
        if ("slow-spawns" in faults and scenario.lone_consumer
                and sum(1 for e in events if e.kind == "reshard") <= 1):
            scenario = replace(scenario, start_seconds=_long_starts(seed))
        return scenario

    @property
    def lone_consumer(self) -> bool:
        """One consumer of ours and no Java peer of either version (a KCL 3.x one joins only where there may be a
        Java peer, no 2.x one and no pipeline: actors/java3.py `chosen`)."""
        return self.consumers == 1 and not self.java and (
            "java-peer" not in self.faults or self.pipeline_period is not None)

    def worker_start(self, rng: random.Random) -> float:
        """How long a worker process takes to start (true seconds from its spawn's return)."""
        if self.start_seconds:
            return self.start_seconds * rng.uniform(1.0, START_SPREAD)
        return rng.uniform(0.2, 1.0) + (self.spawn_seconds * rng.random() if self.spawn_seconds else 0.0)

    @property
    def longest_start(self) -> float:
        """The longest start past the first start patience (0: none outlasts it)."""
        return self.start_seconds * START_SPREAD

    def describe(self) -> str:
        kinds = Counter(e.kind for e in self.events)
        return (f"{self.consumers} consumer(s){' + a Java peer' if self.java else ''}, {self.shards} shard(s)"
                f"{' from LATEST' if self.initial_position != 'TRIM_HORIZON' else ''}"
                f"{f' (one {self.hot}x hot)' if self.hot > 1 else ''}"
                f"{f', spawns blocking {self.spawn_seconds:.1f}s' if self.spawn_seconds else ''}"
                f"{f', worker starts {self.start_seconds:.1f}s+' if self.start_seconds else ''}, "
                f"faults: {', '.join(f'{k}×{n}' for k, n in sorted(kinds.items())) or 'none'}")


def _slow_spawns(seed: int) -> float:
    own = random.Random(f"scenario-{seed}-spawns")
    return own.uniform(2.0, 10.0) if own.random() < 0.25 else 0.0


# The world's consumers' first start patience (planner.start_patience before any kill: two 10-s expiries).
FIRST_START_PATIENCE_SECONDS = START_PATIENCE_EXPIRIES * 10.0
# How much longer than its base a single worker's start may take (`Scenario.start_seconds`).
START_SPREAD = 1.15


def _long_starts(seed: int) -> float:
    """A third of the lone consumer's worlds whose spawns are slow (a stream of their own): every worker's start
    outlasts its manager's first start patience — 1.15-1.4 times it, each start up to START_SPREAD times that, so
    always within the patience doubled once. A manager that kills such a worker before its take and gives the next
    one the same patience kills every respawn the same way, and the lease is never worked (the respawn livelock)."""
    if not _slow_spawns(seed):
        return 0.0
    own = random.Random(f"scenario-{seed}-starts")
    return own.uniform(1.15, 1.4) * FIRST_START_PATIENCE_SECONDS if own.random() < 1 / 3 else 0.0


__all__ = ["FAULTS", "KNOWN_FAULTS", "OPT_IN_FAULTS", "PIPELINE_DAMAGE", "FaultEvent", "Scenario"]
