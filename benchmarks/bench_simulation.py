"""How fast the deterministic simulation runs: seeds × steps of the shipped consumer fleet in virtual time.

The goal (the simulation issue): 10,000 seeds × 1,000 steps in under 30 minutes on 2 cores, so a developer
can run the full sweep before a release and CI can run 500 seeds on every change. The figure is for the code
path CI and `kcl-pipeline simulate` run (`runner.run_seeds`, one process per core). There is no peer
simulator of this consumer to compare against: the ratio printed is the projected 10,000-seed wall time
against the 30-minute budget.

Run: .venv/bin/python benchmarks/bench_simulation.py [--seeds N] [--steps M] [--jobs J]
"""
from __future__ import annotations

import argparse
import os

from kcl_pipeline.sim.runner import run_seeds

BUDGET_SECONDS = 30 * 60
FULL_SWEEP = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    summary = run_seeds(range(args.seeds), args.steps, jobs=args.jobs)
    per_seed = summary.seconds / summary.seeds
    projected = per_seed * FULL_SWEEP
    print(summary.line())
    print(f"{summary.steps:,} steps in {summary.seconds:.1f}s on {args.jobs} processes: "
          f"{summary.steps_per_second:,.0f} steps/s, {per_seed * 1000:.1f} ms per seed")
    print(f"projected {FULL_SWEEP:,} seeds: {projected / 60:.1f} min = {projected / BUDGET_SECONDS:.2f}× the "
          f"30-minute budget")


if __name__ == "__main__":
    main()
