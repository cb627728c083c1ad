"""Deaggregate + land as Parquet: the landing path that runs vs aws-kinesis-agg 1.2.3 + the same Parquet write.

    .venv/bin/python benchmarks/bench_landing_agg.py [--records 200000] [--repeat 3]

Both sides get the same GetRecords responses (KPL aggregates of ≤ 50 KB, ≤ 10 MB per response, arrivals at
a shard's 2 MB/s, built by bench_landing.responses) and write Parquet batches of the landing schema (zstd,
the same dictionary and statistics columns) to a local directory, on one core (time.process_time):

  ours   kpl.deaggregate_batch + LandingProcessor.process_records — the production path of a lease worker
         (minute/size cuts, exclusion listing, link + batch put-if-absent, fsync), from the columnar
         UserRecordBatch straight to Arrow
  peer   aws_kinesis_agg.deaggregator.iter_deaggregate_records (one dict per user record, base64 data, its
         only mode for boto3 records) + a pyarrow Table built from those dicts every 8 MB + pq.write_table —
         what a consumer built on the peer would run, without any exactly-once bookkeeping

Goals (issue 9): ≥ 3× the peer for 100-byte records, ≥ 2× for 1 KB, ≥ 150 MB/s of user data per CPU-second.
"""
from __future__ import annotations

import argparse
import base64
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_landing import SHARD, STREAM, best_of, land, responses  # noqa: E402

from kcl_pipeline.kcl.records.record_batch import arrow_schema  # noqa: E402

PEER_BATCH_BYTES = 8 * 1024 * 1024  # the landing default (DEFAULT_MAX_BATCH_BYTES)


def peer_land(replay, zone: str) -> dict:
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    schema = arrow_schema()
    rows: list[dict] = []
    size = files = records = data_bytes = 0
    cpu0 = time.process_time()

    def write() -> None:
        nonlocal rows, size, files
        table = pa.table({
            "stream": [STREAM] * len(rows),
            "shard_id": [SHARD] * len(rows),
            "sequence_number": [r["sequenceNumber"] for r in rows],
            "sub_sequence_number": pa.array([r["subSequenceNumber"] for r in rows], pa.int64()),
            "partition_key": [r["partitionKey"] for r in rows],
            "explicit_hash_key": pa.array([r["explicitHashKey"] for r in rows], pa.string()),
            "approximate_arrival_timestamp": pa.array([r["approximateArrivalTimestamp"] for r in rows],
                                                      pa.timestamp("ms", tz="UTC")),
            "data": pa.array([r["data"] for r in rows], pa.binary()),
        }, schema=schema)
        pq.write_table(table, os.path.join(zone, f"peer-{files:05d}.parquet"), compression="zstd",
                       use_dictionary=["stream", "shard_id", "partition_key", "explicit_hash_key"],
                       write_statistics=["sequence_number", "approximate_arrival_timestamp"], store_schema=False)
        files += 1
        rows, size = [], 0

    for response in replay:
        for user in iter_deaggregate_records(response, data_format="Boto3"):
            k = user["kinesis"]
            k["data"] = base64.b64decode(k["data"])
            rows.append(k)
            size += len(k["data"])
            records += 1
            data_bytes += len(k["data"])
            if size >= PEER_BATCH_BYTES:
                write()
    if rows:
        write()
    return {"cpu": time.process_time() - cpu0, "records": records, "bytes": data_bytes, "files": files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    mb = 1024 * 1024
    print("user records per CPU-second, deaggregate + Parquet (zstd) to a local directory, best of "
          f"{args.repeat}; ratio = ours / peer, same responses, same run")
    for record_bytes in (100, 1024):
        replay = list(responses(args.records, record_bytes))
        ours = best_of(land, replay, args.repeat)
        peer = best_of(peer_land, replay, args.repeat)
        assert ours["records"] == peer["records"] == args.records, (ours["records"], peer["records"])
        ours_rate, peer_rate = ours["records"] / ours["cpu"], peer["records"] / peer["cpu"]
        print(f"  {record_bytes:>5} B records: ours {ours_rate:>10,.0f}/s "
              f"({ours['bytes'] / mb / ours['cpu']:6.1f} MB/s), "
              f"peer {peer_rate:>10,.0f}/s ({peer['bytes'] / mb / peer['cpu']:6.1f} MB/s)  "
              f"-> {ours_rate / peer_rate:.2f}x")


if __name__ == "__main__":
    main()
