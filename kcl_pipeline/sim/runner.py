"""Running many seeds: a process pool over `simulate`, the summary line, the replay of one seed, and the
mutation set (each seeded bug must be caught within its stated number of seeds)."""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..kcl.core import coverage
from ..kcl.core.lease import effects as fx
from .judge.mutations import MUTATIONS, check_planted
from .runtime.scenario import FAULTS
from .world import Result, simulate


@dataclass(frozen=True)
class SeedOutcome:
    seed: int
    steps: int
    violation: str | None
    trace: tuple[str, ...] = ()
    describe: str = ""
    branches: tuple[tuple[str, int], ...] = ()  # named branches hit (core/coverage.py)
    effects: tuple[tuple[tuple[str, str], int], ...] = ()  # (driver, effect) answered by the shells


@dataclass
class RunSummary:
    seeds: int
    steps_per_seed: int
    steps: int = 0
    seconds: float = 0.0
    failures: list[SeedOutcome] = field(default_factory=list)
    branches: Counter = field(default_factory=Counter)        # hits over the run
    branch_seeds: Counter = field(default_factory=Counter)    # seeds that hit each branch
    effects: Counter = field(default_factory=Counter)         # (driver, effect) answers over the run

    def add(self, outcome: SeedOutcome) -> None:
        self.steps += outcome.steps
        if outcome.violation:
            self.failures.append(outcome)
        for name, hits in outcome.branches:
            self.branches[name] += hits
            self.branch_seeds[name] += 1
        for key, hits in outcome.effects:
            self.effects[key] += hits

    def missing_branches(self) -> list[str]:
        """The required branches (core/coverage.REQUIRED) this run never took."""
        return [name for name in coverage.REQUIRED if not self.branches.get(name)]

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
                       tuple(result.trace[-25:]) if violation else (), result.scenario.describe(),
                       tuple(sorted(result.branches.items())), tuple(sorted(result.effects.items())))


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
            summary.add(outcome)
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


def _effect_families() -> dict[str, list[str]]:
    """Every effect each shell must answer, by driver (the names the simulated processes count)."""
    found: set[type] = set()
    stack: list[type] = [fx.Effect]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if dataclasses.is_dataclass(sub):
                found.add(sub)
    return {"worker": sorted(e.__name__ for e in found if issubclass(e, fx.LifeEffect)),
            "manager": sorted(e.__name__ for e in found if issubclass(e, fx.CycleEffect))}


def coverage_report(summary: RunSummary) -> list[str]:
    """What `--coverage` prints: the effects each shell answered, and the named branches taken."""
    lines = [f"coverage over {summary.seeds} seeds:", "effects answered by the shells (worker.py, manager.py):"]
    for driver, names in _effect_families().items():
        counts = [(name, summary.effects.get((driver, name), 0)) for name in names]
        lines.append(f"  {driver}: " + ", ".join(f"{name} {n:,}" for name, n in counts if n))
        never = [name for name, n in counts if not n]
        lines.append(f"  {driver}, never: " + (", ".join(never) if never else "none"))
    lines.append("branches (core/coverage.py; * required: hits in seeds):")
    for name in sorted(set(coverage.REQUIRED) | set(summary.branches)):
        mark = "*" if name in coverage.REQUIRED else " "
        hits = summary.branches.get(name, 0)
        lines.append(f"  {mark} {name:58s} {hits:>7,} in {summary.branch_seeds.get(name, 0):>4} seeds"
                     if hits else f"  {mark} {name:58s} NOT HIT")
    missing = summary.missing_branches()
    lines.append(f"required branches not hit: {', '.join(missing) if missing else 'none'}")
    return lines


# Every mutation must also be caught by the default fault mix, not only by the kinds it names: a mix that needs
# to be told where a bug lives finds none that nobody thought of.
DEFAULT_MIX_LIMIT = 400


@dataclass(frozen=True)
class Catch:
    """One fault mix's run of a mutation: the first seed whose history violated an invariant (None: no seed of
    the run did), and the limit it must be below."""
    within: int
    caught_at: int | None
    violation: str | None

    @property
    def ok(self) -> bool:
        return self.caught_at is not None and self.caught_at < self.within

    def verdict(self) -> str:
        return (f"caught at seed {self.caught_at}" if self.caught_at is not None
                else f"NOT caught in {self.within} seeds")


@dataclass(frozen=True)
class MutationOutcome:
    name: str
    own: Catch      # with the mutation's own fault kinds (`Mutation.faults`), within its `within`
    default: Catch  # with the default mix (`FAULTS`), within DEFAULT_MIX_LIMIT

    @property
    def ok(self) -> bool:
        return self.own.ok and self.default.ok


def _first_catch(name: str, faults: Sequence[str], within: int, steps: int, jobs: int | None) -> Catch:
    summary = run_seeds(range(within), steps, faults, name, jobs=jobs, stop_at_first=True)
    first = min(summary.failures, key=lambda o: o.seed) if summary.failures else None
    return Catch(within, first.seed if first else None, first.violation if first else None)


def run_mutation(name: str, steps: int = 1000, jobs: int | None = None) -> MutationOutcome:
    """Run mutation `name` on seeds 0, 1, … until one catches it, twice: with its own fault kinds (within its
    `within`) and with the default mix (within DEFAULT_MIX_LIMIT); histories of `steps` steps, or of the
    mutation's own `steps` when it needs longer ones."""
    mutation = MUTATIONS[name]
    check_planted(name)  # a stale mutation raises here instead of "failing" every seed
    steps = max(steps, mutation.steps)
    if not mutation.faults or set(mutation.faults) == set(FAULTS):
        # Its own kinds are the default mix: one run to the larger limit answers both.
        seen = _first_catch(name, FAULTS, max(mutation.within, DEFAULT_MIX_LIMIT), steps, jobs)
        return MutationOutcome(name, dataclasses.replace(seen, within=mutation.within),
                               dataclasses.replace(seen, within=DEFAULT_MIX_LIMIT))
    return MutationOutcome(name, _first_catch(name, mutation.faults, mutation.within, steps, jobs),
                           _first_catch(name, FAULTS, DEFAULT_MIX_LIMIT, steps, jobs))


__all__ = ["DEFAULT_MIX_LIMIT", "Catch", "MutationOutcome", "RunSummary", "SeedOutcome", "coverage_report", "quiet",
           "replay_command", "run_mutation", "run_seed", "run_seeds"]
