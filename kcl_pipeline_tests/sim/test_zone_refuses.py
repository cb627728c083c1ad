"""The opt-in `zone-refuses` fault: the zone refuses the workers' writes for a while; each failed lease is held
through its back-off and retried, and the world is judged as any other (docs/simulation.md)."""
from __future__ import annotations

import dataclasses

import pytest

from kcl_pipeline.sim.runner import run_seed
from kcl_pipeline.sim.runtime.scenario import FAULTS, OPT_IN_FAULTS, Scenario

KIND = "zone-refuses"


def test_it_is_opt_in():
    assert KIND in OPT_IN_FAULTS and KIND not in FAULTS


@pytest.mark.parametrize("seed", range(20))
def test_a_world_without_it_draws_what_it_drew_before(seed):
    without = Scenario.generate(seed, 1000, FAULTS)
    every = Scenario.generate(seed, 1000, (*FAULTS, KIND))
    own = tuple(event for event in every.events if event.kind != KIND)
    assert len(own) < len(every.events)  # one to three refusals in every world that names it
    assert dataclasses.replace(every, faults=without.faults, events=own) == without


@pytest.mark.parametrize("seed", [2, 5])
def test_worlds_whose_zone_refuses_writes_hold_and_retry_the_failed_leases_without_a_violation(seed):
    """Seed 2 is the world beside a KCL 3.x leader where the held lease was renewed for ever and never worked again
    (`test_under_a_kcl3_leader_a_held_lease_is_retried_by_its_own_manager`)."""
    outcome = run_seed(seed, 1000, (*FAULTS, KIND))
    assert outcome.violation is None, "\n".join([outcome.violation or "", *outcome.trace[-40:]])
    branches, effects = dict(outcome.branches), dict(outcome.effects)
    assert branches.get("cycle.failed-lease-backs-off") and branches.get("cycle.failed-lease-retried")
    assert effects.get(("manager", "RenewHeld")), "no lease was held through its back-off"
