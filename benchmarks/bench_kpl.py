"""KPL deaggregation throughput: kcl_pipeline.kcl.kpl vs aws-kinesis-agg 1.2.3, on the same aggregates.

    .venv/bin/python benchmarks/bench_kpl.py [--repeat 5] [--scale 1.0]

Both deaggregate GetRecords-shaped records (boto3: Data is bytes; the peer is called with
data_format="Boto3", its only mode for such records). Records/s are user records out per second,
best of --repeat runs, on one core. "floor" is MD5 + upb parse alone: the part no deaggregator
verifying the format can skip.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import time
from datetime import datetime, timezone

from kcl_pipeline.kcl import kpl, kpl_pb2

SHARD = "shardId-000000000000"
FIRST_SEQUENCE = 49545115243490985018280067714973144582180062593244200961


def make_records(aggregates: int, per_aggregate: int, size: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    arrival = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    out = []
    for n in range(aggregates):
        users = [(f"{rnd.getrandbits(64):016x}", None, rnd.randbytes(size)) for _ in range(per_aggregate)]
        out.append({
            "SequenceNumber": str(FIRST_SEQUENCE + n * 1000),
            "ApproximateArrivalTimestamp": arrival,
            "Data": kpl.aggregate(users),
            "PartitionKey": users[0][0],
        })
    return out


def ours(records: list[dict]) -> int:
    return len(kpl.deaggregate_batch(records, SHARD, None, kpl.KplStats()))


def peer(records: list[dict]) -> int:
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    return len(list(iter_deaggregate_records(records, data_format="Boto3")))


def floor(records: list[dict]) -> int:
    n = 0
    for r in records:
        body = r["Data"][4:-16]
        assert hashlib.md5(body).digest() == r["Data"][-16:]
        agg = kpl_pb2.AggregatedRecord()
        agg.ParseFromString(body)
        n += len(agg.records)
    return n


def best_rate(fn, records: list[dict], repeat: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn(records)
        best = min(best, time.perf_counter() - t0)
    return n / best, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default aggregate counts")
    args = parser.parse_args()
    cases = [(2000, 100, 100), (2000, 10, 1024), (2000, 500, 20)]
    print(f"{'case':<28}{'ours rec/s':>14}{'peer rec/s':>14}{'ratio':>8}{'floor rec/s':>14}")
    for aggregates, per, size in cases:
        records = make_records(max(1, int(aggregates * args.scale)), per, size)
        rate_ours, n_ours = best_rate(ours, records, args.repeat)
        rate_peer, n_peer = best_rate(peer, records, args.repeat)
        rate_floor, _ = best_rate(floor, records, args.repeat)
        assert n_ours == n_peer == len(records) * per, (n_ours, n_peer)
        label = f"{len(records)} x {per} x {size} B"
        print(f"{label:<28}{rate_ours:>14,.0f}{rate_peer:>14,.0f}{rate_ours / rate_peer:>8.2f}{rate_floor:>14,.0f}")


if __name__ == "__main__":
    main()
