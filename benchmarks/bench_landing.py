"""Landing throughput of one worker, and its peak RSS under a backlog.

    .venv/bin/python benchmarks/bench_landing.py [--records 100000] [--record-bytes 1024] [--repeat 3]

Replays synthetic GetRecords responses — KPL aggregates (≤ 50 KB, the KPL's default aggregation size) of
1 KB JSON-like user records, ≤ 10 MB per response (GetRecords' limit), arrivals at 2 MB/s (Kinesis' per-shard read
limit) —
through kpl.deaggregate_batch and a LandingProcessor with its default settings (8 MB / 30 s batches,
zstd) writing to a local directory. No emulator in the loop. Rates are per CPU-second of the process
(time.process_time, all threads: pyarrow's encoders included): goal ≥ 20 MB/s of user data per core.

Peak RSS: a fresh `spawn`ed process (what a lease worker is) imports the worker module, then lands a
backlog of --records records read as GetRecords responses built on the fly (a backlog lives in Kinesis,
not in the worker); its ru_maxrss is the worker's peak. Goal ≤ 150 MB.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput
from kcl_pipeline.kcl.records import kpl

SHARD = "shardId-000000000000"
STREAM = "bench"
FIRST_SEQUENCE = 49545115243490985018280067714973144582180062593244200961
T0_MS = 1_795_316_400_000
READ_RATE = 2 * 1024 * 1024  # bytes/s: arrival spacing of the replayed shard
AGGREGATE_BYTES = 50 * 1024
RESPONSE_BYTES = 10 * 1024 * 1024  # GetRecords returns at most 10 MB


class _NoCheckpoints:
    def checkpoint(self, sequence_number=None, sub_sequence_number=0) -> bool:
        return True

    def end_shard(self) -> None:
        pass


def user_payload(rnd: random.Random, n: int, size: int) -> bytes:
    """A JSON-ish record: some structure, some entropy (compresses about as well as real events)."""
    head = (f'{{"id":{n},"user":"u{rnd.randrange(100000)}","event":"{rnd.choice(["view", "click", "buy"])}",'
            f'"amount":{rnd.random() * 100:.2f},"blob":"').encode()
    body = rnd.randbytes(max(0, (size - len(head) - 2) // 2)).hex().encode()
    return (head + body + b'"}').ljust(size, b" ")[:size]


def responses(total_records: int, record_bytes: int, seed: int = 11):
    """GetRecords responses (lists of boto3-shaped records), generated lazily."""
    rnd = random.Random(seed)
    per_aggregate = max(1, AGGREGATE_BYTES // (record_bytes + 30))
    per_response = max(1, RESPONSE_BYTES // (per_aggregate * record_bytes))
    n = 0
    kinesis_index = 0
    while n < total_records:
        batch = []
        for _ in range(per_response):
            if n >= total_records:
                break
            count = min(per_aggregate, total_records - n)
            users = [(f"pk-{rnd.getrandbits(32):08x}", None, user_payload(rnd, n + i, record_bytes))
                     for i in range(count)]
            arrival_ms = T0_MS + (n * record_bytes * 1000) // READ_RATE
            batch.append({
                "SequenceNumber": str(FIRST_SEQUENCE + kinesis_index * 1000),
                "ApproximateArrivalTimestamp": datetime.fromtimestamp(arrival_ms / 1000, tz=timezone.utc),
                "Data": kpl.aggregate(users),
                "PartitionKey": users[0][0],
            })
            n += count
            kinesis_index += 1
        yield batch


def land(replay, zone: str) -> dict:
    """Deaggregate and land every response; CPU and wall time of the loop only."""
    from kcl_pipeline.zone.sink import LandingProcessor

    sink = LandingProcessor(zone, STREAM, create_zone=True)
    sink.initialize(InitializationInput(SHARD, "bench", Checkpoint("TRIM_HORIZON")))
    stats = kpl.KplStats()
    checkpointer = _NoCheckpoints()
    records = data_bytes = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for response in replay:
        users = kpl.deaggregate_batch(response, SHARD, None, stats)
        records += len(users)
        data_bytes += sum(map(len, users.data))
        sink.process_records(ProcessRecordsInput(users, 60_000, checkpointer))
    sink.shutdown_requested(checkpointer)
    return {"cpu": time.process_time() - cpu0, "wall": time.perf_counter() - wall0, "records": records,
            "bytes": data_bytes, "batches": sink.stats.batches_written, "landed_bytes": sink.stats.bytes_written}


def throughput(args) -> None:
    replay = [r for r in responses(args.records, args.record_bytes)]  # built before timing
    mb = 1024 * 1024
    r = best_of(land, replay, args.repeat)
    print(f"landing throughput, one worker, {r['records']} records of {args.record_bytes} B "
          f"({r['bytes'] / mb:.0f} MB), {len(replay)} responses -> {r['batches']} batches "
          f"({r['landed_bytes'] / mb:.1f} MB Parquet, zstd), best of {args.repeat}")
    print(f"  per CPU-second: {r['bytes'] / mb / r['cpu']:.1f} MB/s, {r['records'] / r['cpu']:,.0f} records/s "
          f"(goal >= 20 MB/s per core)")
    print(f"  wall clock:     {r['bytes'] / mb / r['wall']:.1f} MB/s, {r['records'] / r['wall']:,.0f} records/s "
          f"(local disk, fsync per batch)")


def _vm_hwm_kb() -> int | None:
    """This process's own peak RSS (Linux VmHWM: reset at exec, unlike ru_maxrss which keeps the forking
    parent's size)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class _NoPandas:
    """A meta path finder for which pandas is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _rss_child(records: int, record_bytes: int, zone: str, out, without_pandas: bool = False) -> None:
    import kcl_pipeline.kcl.shells.workers.worker  # noqa: F401 - everything a lease worker process imports
    import kcl_pipeline.zone.sink  # noqa: F401

    if without_pandas:
        # What a core install (no pandas) sees: pyarrow imports pandas on its first list conversion when
        # pandas is installed (the [connect] and [dev] extras bring it), ~45 MB more per worker.
        sys.meta_path.insert(0, _NoPandas())
    baseline = _vm_hwm_kb()
    result = land(responses(records, record_bytes), zone)
    out.put((baseline, _vm_hwm_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, result))


def peak_rss(args, without_pandas: bool = False) -> None:
    """Run first, from a small parent: a spawned child's ru_maxrss starts at its parent's RSS."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    zone = tempfile.mkdtemp(prefix="bench-landing-rss-")
    try:
        proc = ctx.Process(target=_rss_child, args=(args.records, args.record_bytes, zone, queue, without_pandas))
        proc.start()
        baseline, hwm, maxrss, result = queue.get(timeout=900)
        proc.join(60)
    finally:
        shutil.rmtree(zone)
    own = f"{hwm / 1024:.0f} MB (VmHWM), " if hwm else ""
    print(f"worker peak RSS{' (pandas not installed)' if without_pandas else ''}, "
          f"backlog of {result['records']} records ({result['bytes'] / 2**20:.0f} MB): "
          f"{own}{maxrss / 1024:.0f} MB (ru_maxrss); after imports {(baseline or 0) / 1024:.0f} MB; goal <= 150 MB")


def best_of(fn, replay, repeat: int) -> dict:
    """The run with the least CPU of `repeat` runs of `fn(replay, zone)`, each into a fresh zone."""
    best = None
    for _ in range(repeat):
        zone = tempfile.mkdtemp(prefix="bench-landing-")
        try:
            result = fn(replay, zone)
        finally:
            shutil.rmtree(zone)
        if best is None or result["cpu"] < best["cpu"]:
            best = result
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()
    print(f"python {os.sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if not args.skip_rss:
        peak_rss(args)
        peak_rss(args, without_pandas=True)
    throughput(args)


if __name__ == "__main__":
    main()
