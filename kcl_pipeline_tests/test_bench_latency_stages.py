"""benchmarks/latency_stages.py (the stage times bench_latency.py reports) on a small synthetic input: which
sample each stage takes from which event, which windows count, and the table. Counted, never timed."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[1] / "benchmarks" / "latency_stages.py"


@pytest.fixture(scope="module")
def stages():
    spec = importlib.util.spec_from_file_location("latency_stages", MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


T0 = 1_800_000_000_000  # a whole minute, epoch ms
W = 60_000


def window(stages, start_ms, **times):
    """A window whose events come at the given seconds after its end."""
    end_s = (start_ms + W) / 1000
    return stages.WindowTimes(start_ms, start_ms + W, **{k: end_s + v for k, v in times.items()})


FULL = dict(complete_s=4, launched_s=5, run_started_s=7, step_started_s=9, transformed_s=12, checkpointed_s=14)


def test_each_stage_takes_its_samples_from_its_events(stages):
    windows = [window(stages, T0, **FULL)]
    batches = [stages.LandedBatch(T0, (T0 + 31_000) / 1000, [T0 + 10_000, T0 + 30_000]),
               stages.LandedBatch(T0, (T0 + W + 1_000) / 1000, [T0 + 59_000])]
    samples = stages.stage_samples(windows, batches)
    assert samples["produced → landed"] == [21, 1, 2]
    assert samples["landed → window complete"] == [33, 33, 3]
    assert samples["window end → complete"] == [4]
    assert samples["complete → run launched"] == [1]
    assert samples["launched → run started"] == [2]
    assert samples["run started → transform step"] == [2]
    assert samples["transform step → transformed"] == [3]
    assert samples["transformed → checkpointed"] == [2]
    assert samples["produced → window complete"] == [54, 34, 5]
    assert samples["produced → transformed"] == [62, 42, 13]
    assert samples["produced → checkpointed"] == [64, 44, 15]
    assert set(samples) == {name for name, _ in stages.STAGES}


def test_a_window_without_every_stage_recorded_is_left_out_with_its_records(stages):
    partial = {**FULL, "checkpointed_s": None}
    windows = [window(stages, T0, **FULL), window(stages, T0 + W, **{k: v for k, v in partial.items() if v})]
    batches = [stages.LandedBatch(T0, (T0 + 61_000) / 1000, [T0 + 1_000]),
               stages.LandedBatch(T0 + W, (T0 + 2 * W) / 1000, [T0 + W + 1_000]),
               stages.LandedBatch(T0 + 5 * W, (T0 + 6 * W) / 1000, [T0 + 5 * W])]  # a window not measured
    samples = stages.stage_samples(windows, batches)
    assert samples["window end → complete"] == [4]
    assert samples["produced → landed"] == [60]


def test_percentiles_are_nearest_rank(stages):
    values = list(range(1, 101))
    assert [stages.percentile(values, q) for q in (50, 95, 99, 100)] == [50, 95, 99, 100]
    assert stages.percentile([3, 1, 2], 99) == 3 and stages.percentile([7], 50) == 7
    with pytest.raises(ValueError):
        stages.percentile([], 50)


def test_the_table_puts_the_modes_side_by_side(stages):
    warm = stages.stage_samples([window(stages, T0, **FULL)], [stages.LandedBatch(T0, (T0 + W) / 1000, [T0])])
    cold = {name: [] for name, _ in stages.STAGES}
    table = stages.render({"warm": warm, "cold": cold}).splitlines()
    assert table[0].startswith("| stage | per | warm n | warm p50 |") and "cold p99" in table[0]
    row = next(line for line in table if line.startswith("| produced → transformed |"))
    assert row == "| produced → transformed | record | 1 | 72.0 | 72.0 | 72.0 | 0 | – | – | – |"
    assert len(table) == 2 + len(stages.STAGES)
