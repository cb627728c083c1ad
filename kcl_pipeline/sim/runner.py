"""Running many seeds: a process pool over `simulate`, the summary line, the replay of one seed, and the
mutation set (each seeded bug must be caught within its stated number of seeds)."""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from .mutations import MUTATIONS
from .scenario import FAULTS
from .world import Result, simulate


@dataclass(frozen=True)
class SeedOutcome:
    seed: int
    steps: int
    violation: str | None
    trace: tuple[str, ...] = ()
    describe: str = ""


@dataclass
class RunSummary:
    seeds: int
    steps_per_seed: int
    steps: int = 0
    seconds: float = 0.0
    failures: list[SeedOutcome] = field(default_factory=list)

    def line(self) -> str:
        return f"simulated {self.seeds} seeds × {self.steps_per_seed} steps: {len(self.failures)} violations"

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def replay_command(seed: int, steps: int, faults: Iterable[str], mutation: str | None = None) -> str:
    faults = tuple(faults)
    parts = ["./run.sh simulate", f"--seed {seed}", f"--steps {steps}"]
    if set(faults) != set(FAULTS):
        parts.append(f"--faults {','.join(faults)}")
    if mutation:
        parts.append(f"--mutation {mutation}")
    return " ".join(parts)


def run_seed(seed: int, steps: int, faults: Sequence[str] = FAULTS, mutation: str | None = None) -> SeedOutcome:
    """One seed, in this process. A crash of the simulated code is a violation too (with its traceback)."""
    try:
        result: Result = simulate(seed, steps, faults, mutation)
    except Exception as exc:  # the shipped code raised where it must not: report it as the seed's failure
        import traceback
        return SeedOutcome(seed, 0, f"the simulation raised {type(exc).__name__}: {exc}",
                           tuple(traceback.format_exc().splitlines()[-12:]))
    violation = result.violations[0] if result.violations else None
    return SeedOutcome(seed, result.steps + result.settle_steps, violation,
                       tuple(result.trace[-25:]) if violation else (), result.scenario.describe())


def quiet() -> None:
    logging.disable(logging.CRITICAL)  # the shipped code logs every lost lease: millions of lines


def _run_one(args: tuple) -> SeedOutcome:
    return run_seed(*args)


def run_seeds(seeds: Iterable[int], steps: int, faults: Sequence[str] = FAULTS, mutation: str | None = None,
              jobs: int | None = None, progress: Callable[[SeedOutcome], None] | None = None,
              stop_at_first: bool = False) -> RunSummary:
    seeds = list(seeds)
    jobs = max(1, jobs or os.cpu_count() or 1)
    summary = RunSummary(len(seeds), steps)
    started = time.perf_counter()
    work = [(seed, steps, tuple(faults), mutation) for seed in seeds]
    if jobs == 1 or len(seeds) < 4:
        quiet()
        outcomes: Iterable[SeedOutcome] = map(_run_one, work)
        pool = None
    else:
        # spawn, not fork: a caller with threads (a test runner, a JVM gateway) can hold a lock at fork time
        # and leave the forked workers hung. Each seed is independent and deterministic.
        pool = multiprocessing.get_context("spawn").Pool(jobs, initializer=quiet)
        outcomes = pool.imap(_run_one, work, chunksize=max(1, min(16, len(seeds) // (jobs * 8) or 1)))
    ran = 0
    try:
        for outcome in outcomes:
            ran += 1
            summary.steps += outcome.steps
            if outcome.violation:
                summary.failures.append(outcome)
            if progress is not None:
                progress(outcome)
            if stop_at_first and outcome.violation:
                break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    summary.seconds = time.perf_counter() - started
    summary.seeds = ran
    return summary


@dataclass(frozen=True)
class MutationOutcome:
    name: str
    within: int
    caught_at: int | None  # the first seed whose run violated an invariant
    violation: str | None

    @property
    def ok(self) -> bool:
        return self.caught_at is not None and self.caught_at < self.within


def run_mutation(name: str, steps: int = 1000, jobs: int | None = None) -> MutationOutcome:
    mutation = MUTATIONS[name]
    faults = mutation.faults or FAULTS
    summary = run_seeds(range(mutation.within), steps, faults, name, jobs=jobs, stop_at_first=True)
    first = min(summary.failures, key=lambda o: o.seed) if summary.failures else None
    return MutationOutcome(name, mutation.within, first.seed if first else None, first.violation if first else None)


__all__ = ["MutationOutcome", "RunSummary", "SeedOutcome", "quiet", "replay_command", "run_mutation", "run_seed",
           "run_seeds"]
