"""Load-aware balance vs count-based balance: a 10x hot shard, rounds and steals to settle.

A fleet of consumers plans in rounds (every consumer once per round, random order, each on the table as
the previous one left it); a round is one manager cycle. Both planners run in the same process on the same
fleets:
  * load-aware: kcl/core/fleet/balance.py `plan_steal` on each lease's throughput (KB/s);
  * count-based (the named peer): the shipped planner's steal rule, `planner.leases_to_acquire`, which
    balances lease counts (Java KCL 2.x's rule).
Reported per scenario: rounds until a round steals nothing, total steals, and max consumer load / mean
load after settling (the figure the tolerance bounds: <= 1.2 unless a lone hot shard is heavier).

`--world` runs the code path production runs instead: the simulated world (kcl_pipeline.sim.balance) drives
the shipped manager cycles and workers on a stream whose first of 24 shards carries 10x the traffic, with
holders writing their smoothed `throughputKBps` on heartbeats (noisy, as real reports are) and the
manager's patience; the peer is the same world with no reports (the count balance). Figures are virtual
seconds of the simulation (LABEL: simulated, not wall time): when the true loads entered the tolerance
for good, steals, of which handed over gracefully, moves that made the true balance worse, steals in the
last third, final max/mean.

    .venv/bin/python benchmarks/bench_balance.py [--consumers 8] [--shards 64] [--seeds 5]
    .venv/bin/python benchmarks/bench_balance.py --world [--seeds 20] [--seconds 900]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.core.fleet.balance import effective_loads, plan_steal  # noqa: E402
from kcl_pipeline.kcl.core.fleet.planner import leases_to_acquire  # noqa: E402
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease  # noqa: E402

MAX_ROUNDS = 500


def load_aware(me, assignment, rng):
    others = {o: leases for o, leases in assignment.items() if o != me and leases}
    idle = sum(1 for o, leases in assignment.items() if o != me and not leases)
    steal = plan_steal(me, assignment[me], others, idle_consumers=idle)
    return None if steal is None else (steal.lease_key, steal.owner)


def count_based(me, assignment, rng):
    leases = [Lease(key, Checkpoint(TRIM_HORIZON), owner, 1) for owner, held in assignment.items() for key in held]
    plan = leases_to_acquire(me, leases, {lease.lease_key: 0.0 for lease in leases}, expiry_seconds=10.0,
                             leases_to_acquire=1, max_leases=10_000, locally_worked=list(assignment[me]), rng=rng)
    return None if plan.steal is None else (plan.steal.lease_key, plan.steal.lease_owner)


def settle(planner, assignment, rng):
    steals = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        moved = 0
        for me in rng.sample(sorted(assignment), len(assignment)):
            move = planner(me, assignment, rng)
            if move is not None:
                key, owner = move
                assignment[me][key] = assignment[owner].pop(key)
                moved += 1
        steals += moved
        if not moved:
            return rounds, steals
    return MAX_ROUNDS, steals


def fleet(consumers, shards, seed, start):
    rng = random.Random(seed)
    reported = {f"shardId-{i:012d}": rng.uniform(80, 120) for i in range(shards)}
    reported["shardId-000000000000"] *= 10
    loads = effective_loads(reported)
    assignment = {f"c{j}": {} for j in range(consumers)}
    for i, key in enumerate(sorted(loads)):
        owner = "c0" if start == "all-on-one" else f"c{i % consumers}"
        assignment[owner][key] = loads[key]
    return assignment


def spread(assignment):
    totals = [sum(leases.values()) for leases in assignment.values()]
    return max(totals) / statistics.mean(totals)


def _world_run(job):
    from kcl_pipeline.sim.balance import simulate_balance
    seed, load_aware, seconds = job
    return simulate_balance(seed, load_aware=load_aware, seconds=seconds)


def world(seeds: int, seconds: float) -> None:
    import logging
    from multiprocessing import Pool
    logging.disable(logging.WARNING)
    print(f"simulated world: 3 consumers, 24 shards, shard 0 at 10x, {seeds} seeds x {seconds:.0f} virtual s")
    print(f"{'planner':<13}{'within tol. since (median/max s)':>33}{'steals':>8}{'handed':>8}{'worse':>7}"
          f"{'late':>6}{'max/mean':>10}{'seeds in tol.':>15}")
    medians = {}
    for name, load_aware in (("load-aware", True), ("count-based", False)):
        with Pool(os.cpu_count() or 1) as pool:
            runs = pool.map(_world_run, [(seed, load_aware, seconds) for seed in range(seeds)])
        since = [r.within_since for r in runs if r.within_since is not None]
        since_text = f"{statistics.median(since):.0f} / {max(since):.0f}" if since else "never"
        medians[name] = statistics.median(r.max_over_mean for r in runs)
        print(f"{name:<13}{since_text:>33}{statistics.mean(r.steals for r in runs):>8.1f}"
              f"{statistics.mean(r.handoffs for r in runs):>8.1f}"
              f"{sum(r.worsening_moves for r in runs):>7}{sum(r.steady_steals for r in runs):>6}"
              f"{medians[name]:>10.2f}{sum(r.within_tolerance() for r in runs):>9} of {seeds}")
        violations = [v for r in runs for v in r.violations]
        if violations:
            print(f"  VIOLATIONS: {violations[:3]}")
    print(f"ratio load-aware/count-based max/mean: {medians['load-aware'] / medians['count-based']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--world", action="store_true", help="the simulated world (shipped manager and workers)")
    parser.add_argument("--seconds", type=float, default=900.0, help="virtual seconds per world run")
    args = parser.parse_args()
    if args.world:
        world(args.seeds, args.seconds)
        return
    print(f"{args.consumers} consumers, {args.shards} shards at 80-120 KB/s, shard 0 at 10x; "
          f"median over {args.seeds} seeds")
    print(f"{'start':<16}{'planner':<13}{'rounds':>7}{'steals':>8}{'max/mean':>10}")
    for start in ("count-balanced", "all-on-one"):
        rows = {}
        for name, planner in (("load-aware", load_aware), ("count-based", count_based)):
            results = []
            for seed in range(args.seeds):
                assignment = fleet(args.consumers, args.shards, seed, start)
                rounds, steals = settle(planner, assignment, random.Random(seed))
                results.append((rounds, steals, spread(assignment)))
            rows[name] = [statistics.median(column) for column in zip(*results, strict=True)]
            rounds, steals, ratio = rows[name]
            print(f"{start:<16}{name:<13}{rounds:>7.0f}{steals:>8.0f}{ratio:>10.2f}")
        la, cb = rows["load-aware"], rows["count-based"]
        print(f"{'':<16}ratio load-aware/count-based: rounds {la[0] / cb[0]:.2f}, steals "
              f"{(la[1] / cb[1]) if cb[1] else float('inf'):.2f}, max/mean {la[2] / cb[2]:.2f}")


if __name__ == "__main__":
    main()
