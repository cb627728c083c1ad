"""How the fleet balances a hot shard, measured in the simulated world (the shipped manager and workers).

No faults: consumers start together on one stream whose first shard carries `hot` times the traffic of
each other shard, production never stops, and the run reports when the last steal happened, how many
steals it took, how many happened in the last third (steady state: there should be none) and each
consumer's share of the true traffic at the end (from the stream's own production rates, not from the
reports the balance acted on). `load_aware=False` runs the same world with holders writing no
`throughputKBps`, which leaves the planner with Java KCL 2.x's count balance: the peer it is compared to.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..kcl.core.fleet.balance import BalanceSettings
from .runtime.scenario import Scenario
from .world import World

RATE = 0.3  # a record per shard every ~3 s (1-4 user records of 200 B each); the hot shard `hot`× that


@dataclass(frozen=True)
class BalanceRun:
    seed: int
    load_aware: bool
    consumers: int
    shards: int
    hot: int
    seconds: float
    steals: int
    handoffs: int               # leases handed over gracefully (the holder checkpointed and stepped aside)
    last_steal_at: float | None
    steady_steals: int          # steals in the last third of the run
    worsening_moves: int        # moves after which the true spread (sum of squared shares) grew: noise-driven
    within_since: float | None  # since when the true loads have stayed within the tolerance
    shares: dict[str, float]    # each live consumer's true traffic, in multiples of one plain shard's
    violations: tuple[str, ...]

    @property
    def max_over_mean(self) -> float:
        mean = sum(self.shares.values()) / len(self.shares)
        return max(self.shares.values()) / mean

    def within_tolerance(self, settings: BalanceSettings = BalanceSettings()) -> bool:
        return self.max_over_mean <= 1 + settings.tolerance


def simulate_balance(seed: int, *, consumers: int = 3, shards: int = 24, hot: int = 10, load_aware: bool = True,
                     seconds: float = 900.0) -> BalanceRun:
    scenario = Scenario(seed=seed, steps=10**9, faults=frozenset(), consumers=consumers, java=False, shards=shards,
                        rate=RATE, retention=3600.0, drift=0.0, leases_to_acquire=2, flush_records=8,
                        kinesis_throttle=0.0, noise=False, events=(), hot=hot, report_throughput=load_aware)
    world = World(scenario)
    for _ in range(consumers):
        world.add_consumer(delay=world.rng.uniform(0.0, 3.0))
    world.every(1.0, world.produce)
    world.every(2.0, world.checker.audit)
    hottest = min(world.stream.open_shards(), key=lambda s: s.lo).shard_id
    tolerance = 1 + BalanceSettings().tolerance
    track = {"spread": None, "worse": 0, "within": None}

    def true_shares() -> dict[str, float]:
        shares = {worker_id: 0.0 for worker_id in world.live_worker_ids()}
        for key, _shard, lease in world.checker.owned_leases():
            if lease.lease_owner in shares and not lease.is_ended:
                shares[lease.lease_owner] += hot if key == hottest else 1.0
        return shares

    def look() -> None:
        shares = true_shares()
        if sum(shares.values()) < shards - 1 + hot:
            return  # leases still being taken at the start
        spread = sum(v * v for v in shares.values())
        if track["spread"] is not None and spread > track["spread"] + 1e-9:
            track["worse"] += 1
        track["spread"] = spread
        within = max(shares.values()) <= tolerance * sum(shares.values()) / len(shares)
        track["within"] = (track["within"] or world.now) if within else None
    world.every(1.0, look)
    world.run_until(lambda: bool(world.checker.violations) or world.now >= seconds)
    steals = world.steal_times
    return BalanceRun(seed, load_aware, consumers, shards, hot, world.now, len(steals),
                      world.stats["worker handed_off"], steals[-1] if steals else None,
                      sum(1 for t in steals if t >= seconds * 2 / 3), track["worse"], track["within"], true_shares(),
                      tuple(world.checker.violations))


__all__ = ["BalanceRun", "simulate_balance"]
