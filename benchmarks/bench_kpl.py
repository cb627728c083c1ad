"""KPL deaggregation throughput: kcl_pipeline.kcl.records.kpl vs aws-kinesis-agg 1.2.3, on the same aggregates,
same run.

    .venv/bin/python benchmarks/bench_kpl.py [--repeat 5] [--scale 1.0] [--batch-mb 1]

Every contender deaggregates the same GetRecords-shaped records (boto3: Data is bytes; the peer is called
with data_format="Boto3", its only mode for such records) and verifies the MD5 of every aggregate, one
GetRecords response at a time: the records are cut into batches of about --batch-mb MB (a response holds
at most 10 MB; a shard serves 2 MB/s) and each batch's output is dropped before the next, as a worker
does. Records/s are user records out per second, best of --repeat runs, on one core:

  peer      aws-kinesis-agg's iter_deaggregate_records, consumed into a list (one dict per user record)
  objects   ours, materialising one UserRecord per user record (what a RecordProcessor iterates)
  columnar  ours, deaggregate_batch -> UserRecordBatch with every column read (per user record: partition
            key, explicit hash key, data; per Kinesis record: sequence number, arrival time, aggregated,
            first sub-sequence, count): everything the landing path consumes, no UserRecord built
  arrow     columnar + to_arrow(stream): the pyarrow Table in the landing schema
  floor     MD5 + upb parse alone: the part no deaggregator verifying the format can skip

Before timing, each case checks that all contenders agree record for record (and that to_arrow rows equal
the UserRecords). The 1 KB case is bound by MD5 itself (hashlib/OpenSSL, ~1.5 us per KB here): no
verifying deaggregator can exceed peer time / MD5 time there.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import random
import time
from datetime import datetime, timezone

from kcl_pipeline.kcl.records import kpl, kpl_pb2

SHARD = "shardId-000000000000"
STREAM = "bench-stream"
FIRST_SEQUENCE = 49545115243490985018280067714973144582180062593244200961


def make_records(aggregates: int, per_aggregate: int, size: int, seed: int = 7, distinct_keys: int | None = None,
                 hash_keys: bool = False) -> list[dict]:
    """GetRecords-shaped aggregates. Partition keys are random per user record (as with UUID keys), or
    drawn from `distinct_keys` keys; `hash_keys` gives every user record an explicit hash key."""
    rnd = random.Random(seed)
    arrival = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    keys = [f"key-{i:04d}" for i in range(distinct_keys or 0)]
    out = []
    for n in range(aggregates):
        users = []
        for _ in range(per_aggregate):
            pk = rnd.choice(keys) if keys else f"{rnd.getrandbits(64):016x}"
            ehk = str(rnd.getrandbits(128)) if hash_keys else None
            users.append((pk, ehk, rnd.randbytes(size)))
        out.append({
            "SequenceNumber": str(FIRST_SEQUENCE + n * 1000),
            "ApproximateArrivalTimestamp": arrival,
            "Data": kpl.aggregate(users),
            "PartitionKey": users[0][0],
        })
    return out


def peer_list(records: list[dict]) -> list[dict]:
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    return list(iter_deaggregate_records(records, data_format="Boto3"))


def peer(records: list[dict]) -> int:
    return len(peer_list(records))


def objects(records: list[dict]) -> int:
    return len(list(kpl.deaggregate_batch(records, SHARD, None, kpl.KplStats())))


def columnar(records: list[dict]) -> int:
    batch = kpl.deaggregate_batch(records, SHARD, None, kpl.KplStats())
    columns = (batch.partition_keys, batch.explicit_hash_keys, batch.data, batch.run_sequence_numbers,
               batch.run_arrival_ms, batch.run_aggregated, batch.run_first_sub_sequence_numbers, batch.run_lengths)
    assert len(columns[0]) == len(columns[1]) == len(columns[2]) == sum(columns[-1])
    return len(columns[2])


def arrow(records: list[dict]) -> int:
    return kpl.deaggregate_batch(records, SHARD, None, kpl.KplStats()).to_arrow(STREAM).num_rows


def floor(records: list[dict]) -> int:
    n = 0
    for r in records:
        body = r["Data"][4:-16]
        assert hashlib.md5(body).digest() == r["Data"][-16:]
        agg = kpl_pb2.AggregatedRecord()
        agg.ParseFromString(body)
        n += len(agg.records)
    return n


def check_agreement(records: list[dict]) -> None:
    """All contenders deliver the same user records (compared on a prefix of the aggregates)."""
    sample = records[:50]
    theirs = [r["kinesis"] for r in peer_list(sample)]
    batch = kpl.deaggregate_batch(sample, SHARD)
    ours = list(batch)
    assert [(k["sequenceNumber"], k["subSequenceNumber"], k["partitionKey"], k["explicitHashKey"],
             base64.b64decode(k["data"])) for k in theirs] == [
        (r.sequence_number, r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data) for r in ours]
    table = batch.to_arrow(STREAM).to_pylist()
    assert [(t["sequence_number"], t["sub_sequence_number"], t["partition_key"], t["explicit_hash_key"], t["data"],
             round(t["approximate_arrival_timestamp"].timestamp() * 1000)) for t in table] == [
        (r.sequence_number, r.sub_sequence_number, r.partition_key, r.explicit_hash_key, r.data,
         r.approximate_arrival_timestamp_ms) for r in ours]


def responses(records: list[dict], batch_bytes: int) -> list[list[dict]]:
    """`records` cut into GetRecords-sized batches of about `batch_bytes` of data each."""
    out: list[list[dict]] = [[]]
    size = 0
    for r in records:
        if size >= batch_bytes:
            out.append([])
            size = 0
        out[-1].append(r)
        size += len(r["Data"])
    return out


def best_rate(fn, batches: list[list[dict]], repeat: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = sum(fn(batch) for batch in batches)
        best = min(best, time.perf_counter() - t0)
    return n / best, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default aggregate counts")
    parser.add_argument("--batch-mb", type=float, default=1.0, help="data per GetRecords response (MB)")
    args = parser.parse_args()
    # (aggregates, user records per aggregate, bytes per user record, distinct partition keys, hash keys)
    cases = [(2000, 100, 100, None, False), (2000, 10, 1024, None, False), (2000, 500, 20, None, False),
             (2000, 100, 100, 8, True)]
    contenders = [("peer", peer), ("objects", objects), ("columnar", columnar), ("arrow", arrow), ("floor", floor)]
    print(f"user records/s (x = ratio to the peer); responses of {args.batch_mb:g} MB")
    print(f"{'case':<34}" + "".join(f"{name:>18}" for name, _ in contenders))
    for aggregates, per, size, distinct, hash_keys in cases:
        records = make_records(max(1, int(aggregates * args.scale)), per, size, distinct_keys=distinct,
                               hash_keys=hash_keys)
        check_agreement(records)
        batches = responses(records, int(args.batch_mb * 1024 * 1024))
        rates = {}
        for name, fn in contenders:
            rates[name], n = best_rate(fn, batches, args.repeat)
            assert n == len(records) * per, (name, n)
        label = f"{len(records)} x {per} x {size} B" + (f", {distinct} keys + EHK" if distinct else "")
        cells = [f"{rates['peer']:>18,.0f}"] + [
            f"{rates[name]:>11,.0f} {rates[name] / rates['peer']:>5.2f}x" for name, _ in contenders[1:]]
        print(f"{label:<34}" + "".join(cells))


if __name__ == "__main__":
    main()
