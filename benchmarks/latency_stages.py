"""Where a record's seconds go, from its arrival to its checkpoint: the stage times of bench_latency.py, pure.

The inputs are what a deployment has too, not the benchmark's own clocks:

* a record's arrival: its ApproximateArrivalTimestamp, a column of its landing batch;
* landed: when the batch holding it was written (the object's modification time; S3's LastModified);
* the window complete: the sensor's `landed_records` materialisation of the window (it reports a window when
  the completeness rule passes it, in the tick that requests its run);
* the run launched and started: the window run's RUN_STARTING event (the daemon took it from the queue and
  launched its process) and RUN_START (the run worker process began executing);
* the transform step started, transformed and checkpointed: the run's STEP_START of `transformed_records`, the
  `transformed_records` and `kinesis_checkpoints` materialisations of the window (Dagster's event log).

Per record: produced → landed, landed → window complete, and the totals from produced. Per window: window end →
complete, complete → launched → run started → transform step started → transformed → checkpointed. A window counts
only with every stage recorded. Percentiles are nearest-rank (p99 of fewer than 100 windows is their maximum).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class LandedBatch:
    """A landing batch: the window it belongs to, when it was written (epoch s) and its records' arrivals (ms)."""

    window_start_ms: int
    landed_s: float
    arrivals_ms: Sequence[int]


@dataclass(frozen=True)
class WindowTimes:
    """One window's events (epoch seconds; None: not recorded, and the window is left out)."""

    start_ms: int
    end_ms: int
    complete_s: float | None = None
    launched_s: float | None = None
    run_started_s: float | None = None
    step_started_s: float | None = None
    transformed_s: float | None = None
    checkpointed_s: float | None = None

    @property
    def recorded(self) -> bool:
        return None not in (self.complete_s, self.launched_s, self.run_started_s, self.step_started_s,
                            self.transformed_s, self.checkpointed_s)


# (name, per): the rows of the report, in the order of the critical path; then the totals.
STAGES: tuple[tuple[str, str], ...] = (
    ("produced → landed", "record"),
    ("landed → window complete", "record"),
    ("window end → complete", "window"),
    ("complete → run launched", "window"),
    ("launched → run started", "window"),
    ("run started → transform step", "window"),
    ("transform step → transformed", "window"),
    ("transformed → checkpointed", "window"),
    ("produced → window complete", "record"),
    ("produced → transformed", "record"),
    ("produced → checkpointed", "record"),
)


def stage_samples(windows: Iterable[WindowTimes], batches: Iterable[LandedBatch]) -> dict[str, list[float]]:
    """Every stage's samples in seconds: one per record of a recorded window (per-record stages), one per
    recorded window (per-window stages)."""
    by_start = {w.start_ms: w for w in windows if w.recorded}
    out: dict[str, list[float]] = {name: [] for name, _ in STAGES}
    for w in sorted(by_start.values(), key=lambda w: w.start_ms):
        assert w.complete_s is not None and w.launched_s is not None and w.run_started_s is not None
        assert w.step_started_s is not None and w.transformed_s is not None and w.checkpointed_s is not None
        out["window end → complete"].append(w.complete_s - w.end_ms / 1000)
        out["complete → run launched"].append(w.launched_s - w.complete_s)
        out["launched → run started"].append(w.run_started_s - w.launched_s)
        out["run started → transform step"].append(w.step_started_s - w.run_started_s)
        out["transform step → transformed"].append(w.transformed_s - w.step_started_s)
        out["transformed → checkpointed"].append(w.checkpointed_s - w.transformed_s)
    for batch in batches:
        w = by_start.get(batch.window_start_ms)
        if w is None:
            continue
        assert w.complete_s is not None and w.transformed_s is not None and w.checkpointed_s is not None
        for arrival_ms in batch.arrivals_ms:
            produced = arrival_ms / 1000
            out["produced → landed"].append(batch.landed_s - produced)
            out["landed → window complete"].append(w.complete_s - batch.landed_s)
            out["produced → window complete"].append(w.complete_s - produced)
            out["produced → transformed"].append(w.transformed_s - produced)
            out["produced → checkpointed"].append(w.checkpointed_s - produced)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile q (0 < q <= 100) of `values` (not empty)."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(samples: Mapping[str, Sequence[float]]) -> dict[str, tuple[int, float, float, float] | None]:
    """Per stage: (samples, p50, p95, p99), None without samples."""
    return {name: (len(v), percentile(v, 50), percentile(v, 95), percentile(v, 99)) if v else None
            for name, v in samples.items()}


def render(by_mode: Mapping[str, Mapping[str, Sequence[float]]]) -> str:
    """A Markdown table, one column group per mode (warm, cold), side by side."""
    modes = list(by_mode)
    stats = {mode: summary(by_mode[mode]) for mode in modes}
    head = "| stage | per | " + " | ".join(f"{m} n | {m} p50 | {m} p95 | {m} p99" for m in modes) + " |"
    rule = "|---|---|" + "---:|" * (4 * len(modes))
    rows = [head, rule]
    for name, per in STAGES:
        cells = []
        for mode in modes:
            s = stats[mode].get(name)
            cells += ["0", "–", "–", "–"] if s is None else [f"{s[0]:,}", f"{s[1]:.1f}", f"{s[2]:.1f}", f"{s[3]:.1f}"]
        rows.append(f"| {name} | {per} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
