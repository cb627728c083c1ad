"""The simulated pipeline's sensor is the shipped one: its tick's decisions (windows/tick/decisions.py), its cursor
serialised between ticks, and the completeness rule (windows/completeness.py), on the world's evidence."""
from __future__ import annotations

from kcl_pipeline.sim.actors.pipeline import SimPipeline
from kcl_pipeline.sim.runner import run_seed
from kcl_pipeline.sim.world import Result, simulate
from kcl_pipeline.windows.tick.cursor import Cursor

PIPELINE_SEED = 9  # a world with the pipeline (docs/simulation.md: the mutation's first catching seed)


def test_the_simulated_sensor_takes_the_shipped_ticks_cursor_and_the_completeness_rule():
    result: Result = simulate(PIPELINE_SEED, 1000)
    assert result.scenario.pipeline_period is not None and not result.violations
    assert result.branches["sensor.cursor-past-complete-windows"] > 0  # windows reported, the cursor moved on
    assert result.branches["completeness.waits-on-a-shard"] > 0  # and windows held back until shards passed them


def test_the_sensors_cursor_is_kept_serialised_between_ticks_as_dagster_keeps_it(monkeypatch):
    kept: list[str | None] = []
    tick = SimPipeline.tick

    def watched(self, now_ms):
        tick(self, now_ms)
        kept.append(self.sensor_cursor)
    monkeypatch.setattr(SimPipeline, "tick", watched)
    simulate(PIPELINE_SEED, 1000)
    texts = [text for text in kept if text is not None]
    assert texts and all(isinstance(text, str) for text in texts)
    cursors = [Cursor.parse(text) for text in texts]
    decided = [c.next_window_ms for c in cursors if c.next_window_ms is not None]
    assert decided and decided == sorted(decided) and len(set(decided)) > 1  # it only moves forward, and moves


def test_a_window_reported_before_a_shard_passed_it_is_caught_when_its_records_have_not_landed():
    """The completeness rule with its caught-up clause unbounded in time (`completeness-caught-up-any-time`): a shard
    idle once before the window's end counts as done, and the window is reported while records that arrived in it
    are still on their way to the zone. The checker holds every reported window to every record of it landed."""
    outcome = run_seed(PIPELINE_SEED, 1000, mutation="completeness-caught-up-any-time")
    assert outcome.violation is not None and "the sensor reported window" in outcome.violation
    assert run_seed(PIPELINE_SEED, 1000).violation is None
