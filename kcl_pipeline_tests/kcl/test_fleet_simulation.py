"""The lease protocol under chaos: a deterministic fleet simulation over many seeds (see fleet_sim.py).

Each seed draws its own fleet (consumers, late joiners, shards, splits and merges, crashes with or without
restart, graceful stops, pauses shorter and longer than the expiry) and runs the real planner and lease
rules. Checked as it happens: no worker delivers with its ownership last confirmed an expiry ago or more
(so two owners never both believe they hold a lease past an expiry), no checkpoint goes back or passes
an undelivered record, SHARD_END only after every record, no child record before all its parents'
records. Checked at the end, after the chaos stops and the fleet settles: every record delivered at
least once, every shard leased, every open lease owned and worked by a live consumer, leases of trimmed
shards deleted, live consumers balanced within one lease.
"""
from __future__ import annotations

import functools
from collections import Counter

import pytest

from .fleet_sim import FleetSim, Mutation, SimConfig, Violation

SEEDS = range(200)


@functools.lru_cache(maxsize=None)
def run(seed: int, mutation: Mutation = Mutation()) -> FleetSim | Violation:
    try:
        return FleetSim(SimConfig.random(seed, mutation)).run()
    except Violation as violation:
        return violation


@pytest.mark.parametrize("seed", SEEDS)
def test_fleet_keeps_every_invariant(seed):
    result = run(seed)
    if isinstance(result, Violation):
        raise result
    assert result.deliveries >= sum(len(shard.keys) for shard in result.stream.shards.values())


def test_the_same_seed_replays_the_same_history():
    a, b = FleetSim(SimConfig.random(7)).run(), FleetSim(SimConfig.random(7)).run()
    assert (a.steps, a.deliveries, a.stats) == (b.steps, b.deliveries, b.stats)
    assert {k: (v.lease_owner, v.checkpoint) for k, v in a.table.items.items()} == \
        {k: (v.lease_owner, v.checkpoint) for k, v in b.table.items.items()}


def test_the_seeds_cover_every_hazard():
    """The invariants above are only worth something if the histories actually hit the hard cases."""
    seen: Counter[str] = Counter()
    for seed in SEEDS:
        result = run(seed)
        if isinstance(result, FleetSim):
            seen.update(name for name, count in result.stats.items() if count)
    for hazard in ("split", "merge", "crash", "restart", "graceful stop", "released", "pause beyond expiry",
                   "short pause", "steal", "stopped: heartbeat failed", "stopped: no heartbeat within expiry",
                   "checkpoint refused", "redelivered", "shard ended", "child created by the ending worker",
                   "trimmed", "lease deleted"):
        assert seen[hazard] >= 10, f"only {seen[hazard]} of {len(SEEDS)} seeds exercise {hazard!r}"


# Each deliberate bug must be caught on some seed, with the invariant it breaks named in the message.
@pytest.mark.parametrize(
    "mutation, message",
    [
        (Mutation(deliver_after_expiry=True), "ownership last confirmed"),
        (Mutation(children_early=True), "still has"),
        (Mutation(checkpoint_backwards=True), "went back"),
        (Mutation(no_steal=True), "unbalanced"),
        (Mutation(never_expire=True), "undelivered records"),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(
        name for name, on in vars(value).items() if on),
)
def test_the_checks_catch_a_broken_protocol(mutation, message):
    caught = []
    for seed in range(60):
        result = run(seed, mutation)
        if isinstance(result, Violation):
            caught.append(str(result))
    assert any(message in text for text in caught), f"{mutation} went unnoticed on 60 seeds"
