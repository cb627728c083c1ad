"""Spark transform throughput on local[2]: records/s for one window of landed records, and peak memory.

    .venv/bin/python benchmarks/bench_transform.py [--records 1000000] [--repeat 3] [--decoders json,json_spark]
    .venv/bin/python benchmarks/bench_transform.py --gb 5 --record-bytes 1024 --overlap-percent 0 --repeat 0

--gb sizes the window by its user payload bytes (records = gb / record-bytes); --overlap-percent 0 is what
fenced landing produces (no batch keys overlap, so dedupe shuffles nothing). Peak memory is sampled every
0.2 s from /proc: the Spark JVM (driver and local executors) and the Python workers, summed.

Generates the window's landing batches with pyarrow into a temporary local directory (4 shards × 5 arrival
minutes, batches of --batch-rows, ~100-byte JSON objects, 1% of records landed twice, 0.1% poison), then
times transform_window end to end (list, read, dedupe, decode, quarantine, write both partitions) on a warm
SparkSession. records/s = rows_in / wall seconds; every run is checked for exact counts.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.transform.job import build_local_session, transform_window
from kcl_pipeline.zone.layout import BatchKey

T0 = 1_714_564_800_000
MINUTES = 5
SHARDS = 4
STREAM = "bench"


def sequence(shard: int, i: int) -> str:
    return f"4959{shard:04d}{i:048d}"  # 56 digits, like AWS


_PAD = os.urandom(1 << 20).hex().encode()  # half-compressible padding, like real payload text


def payload(rnd: random.Random, i: int, size: int = 0) -> bytes:
    body = (b'{"id":%d,"user":"u%06d","event":"click","amount":%d.%02d,"ts":"2024-05-01T12:00:00Z","ok":true'
            % (i, rnd.randrange(10**6), rnd.randrange(1000), rnd.randrange(100)))
    pad = size - len(body) - 10
    if pad > 0:
        at = rnd.randrange(len(_PAD) - pad)
        body += b',"pad":"' + _PAD[at:at + pad] + b'"'
    return body + b"}"


def generate(root: Path, records: int, batch_rows: int, seed: int = 7, record_bytes: int = 0,
             overlap_percent: float = 1.0) -> tuple[int, int, int]:
    """Write the window's batches; returns (rows landed, duplicate rows, poison rows)."""
    rnd = random.Random(seed)
    per_cell = records // (SHARDS * MINUTES)
    landed = duplicates = poison = 0
    for shard in range(SHARDS):
        shard_id = f"shardId-{shard:012d}"
        i = 0
        for minute in range(MINUTES):
            minute_ms = T0 + minute * 60_000
            for start in range(0, per_cell, batch_rows):
                n = min(batch_rows, per_cell - start)
                # 1% of records re-landed: the batch also starts with the previous batch's last records.
                overlap = min(i, int(n * overlap_percent / 100))
                idx = list(range(i - overlap, i + n))
                data = []
                for j in idx:
                    bad = j % 1000 == 999
                    data.append(b'{"id":%d,"broken"' % j if bad else payload(rnd, j, record_bytes))
                poison += sum(1 for j in idx[overlap:] if j % 1000 == 999)
                table = pa.table({
                    "stream": pa.array([STREAM] * len(idx)),
                    "shard_id": pa.array([shard_id] * len(idx)),
                    "sequence_number": pa.array([sequence(shard, j) for j in idx]),
                    "sub_sequence_number": pa.array([0] * len(idx), pa.int64()),
                    "partition_key": pa.array([f"pk{j % 97}" for j in idx]),
                    "explicit_hash_key": pa.array([None] * len(idx), pa.string()),
                    "approximate_arrival_timestamp": pa.array([minute_ms + (j % 60_000) for j in idx],
                                                              pa.timestamp("ms", tz="UTC")),
                    "data": pa.array(data, pa.binary()),
                })
                key = BatchKey(STREAM, shard_id, minute_ms, Checkpoint(sequence(shard, idx[0])),
                               Checkpoint(sequence(shard, idx[-1]))).key()
                path = root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, path, compression="zstd")
                landed += len(idx)
                duplicates += overlap
                i += n
    return landed, duplicates, poison


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def _descendants(pid: int) -> list[int]:
    children = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(c) for c in f.read().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


class PeakMemory:
    """Peak RSS of this process's Spark JVM and of the Python workers (sampled; MiB)."""

    def __init__(self) -> None:
        self.jvm = self.workers = self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            jvm = workers = 0
            for pid in _descendants(os.getpid()):
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        name = f.read().strip()
                except OSError:
                    continue
                if name == "java":
                    jvm += _rss_kib(pid)
                elif name.startswith("python"):
                    workers += _rss_kib(pid)
            self.jvm, self.workers = max(self.jvm, jvm >> 10), max(self.workers, workers >> 10)
            self.total = max(self.total, (jvm + workers) >> 10)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decoders", default="json,json_spark")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--master", default="local[2]", help="local[N] or spark://host:port (a standalone cluster)")
    ap.add_argument("--gb", type=float, default=0.0, help="size the window by payload bytes (overrides --records)")
    ap.add_argument("--record-bytes", type=int, default=0, help="pad each JSON payload to this size (0: ~100 B)")
    ap.add_argument("--overlap-percent", type=float, default=1.0,
                    help="records landed twice per batch (0: fenced landing, nothing to dedupe)")
    ap.add_argument("--landing-reader", default="auto", choices=("auto", "native", "datasource"),
                    help="auto: Spark's own Parquet reader for this directory zone; datasource: the Python data source")
    args = ap.parse_args()
    if args.gb:
        args.records = int(args.gb * 1e9 / max(args.record_bytes, 100))

    tmp = Path(tempfile.mkdtemp(prefix="bench-transform-"))
    try:
        zone, out = tmp / "zone", tmp / "out"
        t = time.perf_counter()
        landed, duplicates, poison = generate(zone, args.records, args.batch_rows, record_bytes=args.record_bytes,
                                              overlap_percent=args.overlap_percent)
        size = sum(p.stat().st_size for p in zone.rglob("*.parquet"))
        payload_bytes = landed * max(args.record_bytes, 100)
        print(f"generated {landed:,} rows ({duplicates:,} duplicates, {poison:,} poison), "
              f"~{payload_bytes / 1e9:.2f} GB "
              f"of payloads, in {len(list(zone.rglob('*.parquet')))} batches, {size / 1e6:.1f} MB landed, "
              f"{time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        spark = build_local_session(args.master, "bench-transform", **{"spark.driver.memory": args.driver_memory})
        print(f"SparkSession {args.master} started in {time.perf_counter() - t:.1f} s")
        decoders = args.decoders.split(",")
        best: dict[str, float] = {}

        def timed(decoder: str, label: str) -> None:
            t = time.perf_counter()
            with PeakMemory() as peak:
                report = transform_window(spark, zone=str(zone), stream=STREAM, window_start_ms=T0,
                                          window_end_ms=T0 + MINUTES * 60_000, output_uri=str(out), decoder=decoder,
                                          landing_reader=args.landing_reader)
            wall = time.perf_counter() - t
            assert report.rows_in == landed, (report.rows_in, landed)
            assert report.duplicates_dropped == duplicates, (report.duplicates_dropped, duplicates)
            assert report.quarantined == poison, (report.quarantined, poison)
            assert report.rows_in == report.rows_out + report.duplicates_dropped + report.quarantined
            rate = report.rows_in / wall
            best[decoder] = max(best.get(decoder, 0.0), rate) if label != "cold" else best.get(decoder, 0.0)
            print(f"{label:<6} reader={args.landing_reader} decoder={decoder:<10} {report.rows_in:,} records in "
                  f"{wall:5.1f} s = {rate:9,.0f} "
                  f"records/s (out {report.rows_out:,}, duplicates {report.duplicates_dropped:,}, "
                  f"quarantined {report.quarantined:,}); {payload_bytes / wall / 1e6:.1f} MB/s of payloads; peak RSS "
                  f"JVM {peak.jvm:,} MiB, Python workers {peak.workers:,} MiB, together {peak.total:,} MiB",
                  flush=True)

        try:
            # The first transform on a fresh session pays for JIT warm-up (a Dagster run starts its own session).
            timed(decoders[0], "cold")
            for run in range(1, args.repeat + 1):
                for decoder in decoders:  # interleaved, so machine load affects both alike
                    timed(decoder, f"warm{run}")
            print("best warm: " + ", ".join(f"{d} {r:,.0f} records/s" for d, r in best.items()))
        finally:
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
