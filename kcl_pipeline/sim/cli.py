"""`kcl-pipeline simulate`: the deterministic simulation of the shipped consumer, from the command line."""
from __future__ import annotations

import sys

import click

from .judge.mutations import MUTATIONS
from .runner import (
    DEFAULT_MIX_LIMIT,
    SeedOutcome,
    coverage_report,
    quiet,
    replay_command,
    run_mutation,
    run_seed,
    run_seeds,
)
from .runtime.scenario import FAULTS, KNOWN_FAULTS, OPT_IN_FAULTS


def _faults(text: str | None) -> tuple[str, ...]:
    if not text:
        return FAULTS
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(chosen) - set(KNOWN_FAULTS))
    if unknown:
        raise click.BadParameter(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KNOWN_FAULTS)}",
                                 param_hint="--faults")
    return chosen


def _report(outcome: SeedOutcome, steps: int, faults, mutation) -> None:
    click.echo(f"seed {outcome.seed} ({outcome.describe}): {outcome.violation}", err=True)
    for line in outcome.trace:
        click.echo(f"    {line}", err=True)
    click.echo(f"  replay: {replay_command(outcome.seed, steps, faults, mutation)}", err=True)


@click.command("simulate")
@click.option("--seeds", type=click.IntRange(min=1), default=100, show_default=True, help="How many seeds to run.")
@click.option("--first-seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Replay this one seed (prints its trace even when it passes).")
@click.option("--steps", type=click.IntRange(min=10), default=1000, show_default=True,
              help="Steps (events of the consumers) per seed before the faults stop and the fleet must settle.")
@click.option("--faults", default=None, metavar="KIND,…",
              help=f"Fault kinds to inject [default: all: {', '.join(FAULTS)}; opt-in: {', '.join(OPT_IN_FAULTS)}].")
@click.option("--mutation", type=click.Choice(sorted(MUTATIONS)), default=None,
              help="Run with one seeded bug (it must be caught).")
@click.option("--mutations", "all_mutations", is_flag=True,
              help="Run the mutation set: each seeded bug must be caught within its stated number of seeds with its "
                   f"own fault kinds, and within {DEFAULT_MIX_LIMIT} with the default mix.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Processes [default: one per CPU].")
@click.option("--coverage", "show_coverage", is_flag=True,
              help="Report the effects the shells answered and the named branches of the lease life, the cycle "
                   "and the shells the run took; exit 1 when a required branch was not taken.")
def simulate(seeds, first_seed, seed, steps, faults, mutation, all_mutations, jobs, show_coverage):
    """Drive the shipped lease manager and workers through a seeded virtual world (DynamoDB with lost
    responses, late-applied writes and throttling, Kinesis with resharding and retention, drifting clocks,
    pauses, crashes, freezes, partitions, a Java KCL peer) and check every invariant at every step. Exit 1
    on any violation."""
    fault_kinds = _faults(faults)
    if all_mutations:
        missed = 0
        for name, m in MUTATIONS.items():
            outcome = run_mutation(name, steps, jobs)
            click.echo(f"mutation {name}: own kinds {outcome.own.verdict()} (limit {outcome.own.within}), default "
                       f"mix {outcome.default.verdict()} (limit {outcome.default.within}) — {m.defect}")
            for mix, catch in (("own kinds", outcome.own), ("default mix", outcome.default)):
                if catch.violation:
                    click.echo(f"    {mix}: {catch.violation[:300]}")
            missed += not outcome.ok
        click.echo(f"mutations: {len(MUTATIONS) - missed} of {len(MUTATIONS)} caught within their limits (own kinds "
                   f"and default mix)")
        sys.exit(1 if missed else 0)
    if seed is not None:
        quiet()
        outcome = run_seed(seed, steps, fault_kinds, mutation)
        if outcome.violation:
            _report(outcome, steps, fault_kinds, mutation)
        else:
            from .world import simulate as simulate_one
            result = simulate_one(seed, steps, fault_kinds, mutation)
            click.echo(f"seed {seed} ({result.scenario.describe()}): no violation; last events:")
            for line in result.trace[-25:]:
                click.echo(f"    {line}")
        click.echo(f"simulated 1 seeds × {steps} steps: {1 if outcome.violation else 0} violations")
        sys.exit(1 if outcome.violation else 0)
    shown = 0

    def progress(outcome: SeedOutcome) -> None:
        nonlocal shown
        if outcome.violation and shown < 5:
            shown += 1
            _report(outcome, steps, fault_kinds, mutation)

    summary = run_seeds(range(first_seed, first_seed + seeds), steps, fault_kinds, mutation, jobs, progress)
    click.echo(f"{summary.steps:,} steps in {summary.seconds:.1f}s ({summary.steps_per_second:,.0f} steps/s)",
               err=True)
    missing = False
    if show_coverage:
        for line in coverage_report(summary):
            click.echo(line)
        missing = bool(summary.missing_branches())
    click.echo(summary.line())
    sys.exit(1 if summary.failures or missing else 0)


__all__ = ["simulate"]
