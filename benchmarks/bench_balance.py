"""Load-aware balance vs count-based balance: a 10x hot shard, rounds and steals to settle.

A fleet of consumers plans in rounds (every consumer once per round, random order, each on the table as
the previous one left it); a round is one manager cycle. Both planners run in the same process on the same
fleets:
  * load-aware: kcl/balance.py `plan_steal` on each lease's throughput (KB/s);
  * count-based (the named peer): the shipped planner's steal rule, `planner.leases_to_acquire`, which
    balances lease counts (Java KCL 2.x's rule).
Reported per scenario: rounds until a round steals nothing, total steals, and max consumer load / mean
load after settling (the figure the tolerance bounds: <= 1.2 unless a lone hot shard is heavier).

    .venv/bin/python benchmarks/bench_balance.py [--consumers 8] [--shards 64] [--seeds 5]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.balance import effective_loads, plan_steal  # noqa: E402
from kcl_pipeline.kcl.model import TRIM_HORIZON, Checkpoint, Lease  # noqa: E402
from kcl_pipeline.kcl.planner import leases_to_acquire  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--consumers", type=int, default=8)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
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
            rows[name] = [statistics.median(column) for column in zip(*results)]
            rounds, steals, ratio = rows[name]
            print(f"{start:<16}{name:<13}{rounds:>7.0f}{steals:>8.0f}{ratio:>10.2f}")
        la, cb = rows["load-aware"], rows["count-based"]
        print(f"{'':<16}ratio load-aware/count-based: rounds {la[0] / cb[0]:.2f}, steals "
              f"{(la[1] / cb[1]) if cb[1] else float('inf'):.2f}, max/mean {la[2] / cb[2]:.2f}")


if __name__ == "__main__":
    main()
