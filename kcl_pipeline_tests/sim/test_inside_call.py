"""InsideCall (sim/runtime/pauses.py): a call that pauses part-way (zombie-flush: a GC pause at the zone's put)
and goes on later, or ends when its process died meanwhile."""
from __future__ import annotations

import pytest

from kcl_pipeline.sim.aws.landing import SimCrash
from kcl_pipeline.sim.runtime.pauses import InsideCall
from kcl_pipeline.sim.runtime.scenario import Scenario
from kcl_pipeline.sim.world import World


def test_a_call_paused_part_way_goes_on_where_it_stopped():
    seen = []

    def call():
        seen.append("before")
        InsideCall.current.pause(7.5)
        seen.append("after")
        return 42

    inside = InsideCall(call)
    assert inside.step() == ("pause", 7.5) and seen == ["before"] and InsideCall.current is None
    assert inside.step() == ("done", 42) and seen == ["before", "after"]


def test_a_call_abandoned_while_paused_runs_nothing_after_the_pause():
    seen = []

    def call():
        InsideCall.current.pause(1.0)
        seen.append("after")

    inside = InsideCall(call)
    inside.step()
    inside.abandon(SimCrash("killed while paused"))
    assert seen == [] and not inside.paused


def test_what_the_call_raises_is_raised_in_the_simulation():
    def call():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        InsideCall(call).step()


def test_zombie_flush_zombies_land_beside_the_new_holder_and_keep_every_invariant():
    stats = []
    for seed in (6, 29, 30):
        result = World(Scenario.generate(seed, 1000, ["zombie-flush"])).run()
        assert result.ok, result.violations
        stats.append(result.stats)
    assert sum(s["zombie-flush: landed after its thaw"] for s in stats)
    assert sum(s["zombie-flush: met another writer's batches"] for s in stats)
