"""KCL 3.5 coexistence in the deterministic simulation: a Java KCL 3.x peer (sim/actors/java3.py) beside the shipped
consumers — a leader assigning and evicting without counter conditions, graceful hand-offs with Java's
renew/checkpoint/assign sequence, the migration state flipping mid-run (the leader's readiness flip, an operator's
rollback and roll-forward, a joining worker writing CLIENT_VERSION_3X) — every invariant holding. The 2,000-seed
figure is `python -m kcl_pipeline.sim.java3_runs --seeds 2000` (docs/kcl3.md); here a small batch, which must also run
each of those paths."""
from __future__ import annotations

from collections import Counter

from kcl_pipeline.sim import java3_runs
from kcl_pipeline.sim.actors import java3
from kcl_pipeline.sim.runtime.scenario import Scenario
from kcl_pipeline.sim.world import World

SEEDS = range(24)


def test_worlds_with_a_kcl_3x_peer_hold_every_invariant_and_run_each_path_of_the_coexistence():
    stats: Counter = Counter()
    for seed in SEEDS:
        result = java3_runs.simulate(seed, 1000)
        assert result.violations == [], (seed, result.violations[0], result.trace[-25:])
        stats.update(result.stats)
    assert stats["client version -> CLIENT_VERSION_3X_WITH_ROLLBACK"]  # the leader's flip: every owner publishes
    assert stats["client version -> CLIENT_VERSION_2X"]                # an operator's rollback
    assert stats["client version -> CLIENT_VERSION_3X"]                # a joining worker, or a roll-forward
    assert stats["java 3.x leader assigned (unassigned)"] and stats["java 3.x leader assigned (expired)"]
    assert stats["java 3.x leader hand-offs"] and stats["worker handed_off"]  # our holders answer the leader
    assert stats["java 3.x hand-offs completed"]  # a Java holder's renew/checkpoint/assign, completed
    assert stats["java 3.x leases discovered"] and stats["java 3.x takes"]


def test_a_write_of_the_fleets_leader_lock_by_anyone_but_the_java_worker_is_a_violation():
    world = World(Scenario.generate(3, 200))
    world.java3_forced = True
    peer = java3.join(world)
    assert peer is not None and "Migration3.0" not in world.checker.foreign  # the stand-in gave way to the state
    world.dynamodb.execute("put_item", {"TableName": world.table_name, "Item": {
        "leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": "consumer-0"}}},
        actor="consumer-0's manager")
    assert world.checker.violations and "Leader" in world.checker.violations[0]


def test_a_world_without_the_fault_kind_or_with_a_landing_pipeline_has_no_kcl_3x_peer():
    assert not java3.chosen(World(Scenario.generate(5, 100, faults=("crash",))))
    with_pipeline = next(s for s in range(50) if Scenario.generate(s, 100).pipeline_period is not None)
    assert not java3.chosen(World(Scenario.generate(with_pipeline, 100)))


def test_a_world_forced_to_have_a_kcl_3x_peer_never_starts_at_latest():
    """java3 run, seeds 235, 310, 597, 732: the peer was forced in after the world had chosen a LATEST start, which
    it never pairs with a 3.x peer (whose leases start at TRIM_HORIZON); the LATEST floor then owed records the
    peer's leases do not, and the run reported them never delivered."""
    latest = next(seed for seed in range(200) if Scenario.generate(seed, 1000).initial_position == "LATEST")
    assert java3_runs.simulate(latest, 1000).scenario.initial_position == "TRIM_HORIZON"
    for seed in (235, 732):
        assert java3_runs.simulate(seed, 1000).violations == []
