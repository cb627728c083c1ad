"""How long one lease-manager decision takes on a large stream: 10,000 shards, 100 consumers.

A decision is what a consumer computes every cycle once the table is scanned and the shards listed:
`leases_to_delete` + `leases_to_create` + `LeaseAges.observe` + `leases_to_acquire`. The goal is 50 ms.

Scenarios:
  steady  - 10,000 listed shards (2,000 ended parents split into 4,000 children, 4,000 never resharded),
            every lease owned by one of 100 live consumers, one of them holding 3 more than the rest:
            nothing to create, nothing free, the decision is a steal.
  churn   - the same, with 5 % of the leases expired (a consumer died) and 100 children not yet leased.
  cold    - an empty table: 10,000 leases to create and all of them free to take.

Run: .venv/bin/python benchmarks/bench_planner.py [--repeats N]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from kcl_pipeline.kcl.core.fleet.planner import LeaseAges, leases_to_acquire
from kcl_pipeline.kcl.core.lineage import leases_to_create, leases_to_delete
from kcl_pipeline.kcl.core.model import SHARD_END, TRIM_HORIZON, Checkpoint, HashKeyRange, Lease, Shard

SHARDS = 10_000
CONSUMERS = 100
GOAL_MS = 50.0


def sid(i: int) -> str:
    return f"shardId-{i:012d}"


def build_stream() -> list[Shard]:
    shards: list[Shard] = []
    parents = 2_000
    for i in range(parents):  # closed parents, listed before their children as ListShards does
        shards.append(Shard(sid(i), hash_key_range=HashKeyRange(str(i * 10), str(i * 10 + 9)),
                            starting_sequence_number="1", ending_sequence_number="2" * 56))
    for i in range(SHARDS - 3 * parents):  # shards never resharded
        j = parents + i
        shards.append(Shard(sid(j), hash_key_range=HashKeyRange(str(j * 10), str(j * 10 + 9)),
                            starting_sequence_number="1"))
    nxt = SHARDS - 2 * parents
    for i in range(parents):  # two children per parent
        for _half in range(2):
            shards.append(Shard(sid(nxt), parent_shard_id=sid(i), starting_sequence_number="3" * 56))
            nxt += 1
    assert len(shards) == SHARDS
    return shards


def build_leases(shards: list[Shard], rng: random.Random, unleased_children: int) -> list[Lease]:
    leases = []
    consumers = [f"consumer-{c:03d}" for c in range(CONSUMERS)]
    children = [s.shard_id for s in shards if s.parent_shard_id]
    skip = set(rng.sample(children, unleased_children))
    owner_index = 0
    for shard in shards:
        if shard.shard_id in skip:
            continue
        if shard.ending_sequence_number is not None:
            leases.append(Lease(shard.shard_id, Checkpoint(SHARD_END), lease_counter=40))
            continue
        owner = consumers[owner_index % CONSUMERS]
        owner_index += 1
        leases.append(Lease(shard.shard_id, Checkpoint("4" * 56, 3), owner, rng.randint(1, 1000),
                            parent_shard_ids=shard.parent_ids))
    # consumer-001 holds three more than anyone: a steal is due.
    for lease in leases[-3:]:
        lease.lease_owner = "consumer-001"
    return leases


def decide(worker: str, shards, leases, ages: LeaseAges, now: float, rng: random.Random):
    gone = set(leases_to_delete(leases, shards))
    remaining = [lease for lease in leases if lease.lease_key not in gone]
    created = leases_to_create(Checkpoint(TRIM_HORIZON), shards, remaining)
    remaining.extend(created)
    ages.observe(remaining, now)
    plan = leases_to_acquire(worker, remaining, ages.ages(now), expiry_seconds=10.0, leases_to_acquire=1,
                             max_leases=1_000, recently_ended_by_us=(), locally_worked=(), rng=rng)
    return created, plan


def measure(name: str, shards, leases, expired_fraction: float, repeats: int) -> list[float]:
    rng = random.Random(1)
    ages = LeaseAges()
    ages.observe(leases, 0.0)
    # Age the table: everything unchanged for 30 s except what keeps heartbeating.
    keys = [lease.lease_key for lease in leases if lease.lease_owner]
    dead = set(rng.sample(keys, int(len(keys) * expired_fraction)))
    for lease in leases:
        if lease.lease_owner and lease.lease_key not in dead:
            lease.lease_counter += 1
    ages.observe(leases, 25.0)
    timings = []
    created, plan = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        created, plan = decide("consumer-000", shards, leases, ages, 30.0, rng)
        timings.append((time.perf_counter() - start) * 1000)
    timings.sort()
    median = statistics.median(timings)
    p95 = timings[min(len(timings) - 1, int(round(0.95 * (len(timings) - 1))))]
    print(f"{name:7s} shards={len(shards)} leases={len(leases)} created={len(created)} "
          f"take={len(plan.take)} steal={'yes' if plan.steal else 'no'} | "
          f"min {timings[0]:6.2f} ms  median {median:6.2f} ms  p95 {p95:6.2f} ms  | "
          f"median / goal = {median / GOAL_MS:.2f}  p95 / goal = {p95 / GOAL_MS:.2f}")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    shards = build_stream()
    rng = random.Random(0)
    print(f"planner decision (delete + create + ages + acquire), {SHARDS} shards x {CONSUMERS} consumers, "
          f"{args.repeats} repeats, goal {GOAL_MS:.0f} ms")
    measure("steady", shards, build_leases(shards, rng, 0), 0.0, args.repeats)
    measure("churn", shards, build_leases(shards, rng, 100), 0.05, args.repeats)
    measure("cold", shards, [], 0.0, args.repeats)


if __name__ == "__main__":
    main()
