"""Every seed's world with a Java KCL 3.x peer (sim/actors/java3.py), whatever the seed draws:
`python -m kcl_pipeline.sim.java3_runs --seeds N`. Apart from actors/java3.py, which the world imports to add its peer,
so that the peer's module never imports the world back."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .runtime.scenario import Scenario
from .world import World


def simulate(seed: int, steps: int) -> Any:
    """One seed with a KCL 3.x peer whatever the seed draws (and so no KCL 2.x peer, no landing pipeline, and
    leases from TRIM_HORIZON: the peer's start there, and the world never starts at LATEST beside one)."""
    scenario = replace(Scenario.generate(seed, steps), java=False, pipeline_period=None,
                       initial_position="TRIM_HORIZON")
    world = World(scenario)
    world.java3_forced = True  # type: ignore[attr-defined]
    return world.run()


def _run_one(args: tuple[int, int]) -> tuple[int, str | None, str]:
    seed, steps = args
    try:
        result = simulate(seed, steps)
    except Exception as exc:  # the shipped code raised where it must not: the seed's failure
        return seed, f"the simulation raised {type(exc).__name__}: {exc}", ""
    return seed, (result.violations[0] if result.violations else None), result.scenario.describe()


def main(argv: list[str] | None = None) -> int:
    """`python -m kcl_pipeline.sim.java3_runs --seeds N [--first-seed S] [--steps K] [--jobs J]`: every world with a
    KCL 3.x peer; prints the violations and the summary line."""
    import argparse
    import logging
    import multiprocessing

    parser = argparse.ArgumentParser(prog="python -m kcl_pipeline.sim.java3_runs")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)
    work = [(seed, args.steps) for seed in range(args.first_seed, args.first_seed + args.seeds)]
    failures = []
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs, initializer=logging.disable,
                                                       initargs=(logging.CRITICAL,)) as pool:
            outcomes = list(pool.imap(_run_one, work, chunksize=4))
    else:
        outcomes = [_run_one(item) for item in work]
    for seed, violation, describe in outcomes:
        if violation:
            failures.append(seed)
            print(f"seed {seed} ({describe}): {violation}")
    print(f"simulated {len(work)} seeds × {args.steps} steps with a KCL 3.x peer: {len(failures)} violations")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
