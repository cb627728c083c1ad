"""Sensor tick, window reporting, for a wide stream: 1,000 shards, one-minute windows, on the S3 emulator.

The zone is real: every shard lands one batch per minute (the live landing writer, `LandingProcessor`) into
an S3 zone on moto server over HTTP. A tick's window reporting is then timed as the sensor runs it: the scan
for complete windows (`scan_windows` + `window_complete` over 1,000 shards' landing progress) and, for each
complete window, its report from the listing (`list_window`, the shipped path). The peer is the previous
code path, measured in the same run on the same zone: one footer GET per batch (`summarise_window`).

Not timed here: the lease manager's cycle (one table scan and one shard listing per tick, whatever the zone
holds; see bench_planner.py and bench_lease_writes.py).

    .venv/bin/python benchmarks/bench_sensor_tick.py [--shards 1000] [--minutes 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard  # noqa: E402
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput  # noqa: E402
from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline.windows.completeness import window_complete  # noqa: E402
from kcl_pipeline.windows.report import list_window, summarise_window  # noqa: E402
from kcl_pipeline.windows.scan import scan_windows  # noqa: E402
from kcl_pipeline.zone.layout import MINUTE_MS  # noqa: E402
from kcl_pipeline.zone.progress import ShardProgress, progress_from_leases  # noqa: E402
from kcl_pipeline.zone.sink import LandingProcessor  # noqa: E402
from kcl_pipeline.zone.store import open_store  # noqa: E402
from kcl_pipeline_tests.landing.helpers import RecordingCheckpointer, make_records  # noqa: E402

STREAM = "wide"
T0 = 1_795_316_400_000  # a whole hour


def shard_id(i: int) -> str:
    return f"shardId-{i:012d}"


def land_shard(store, i: int, minutes: int) -> Checkpoint:
    """One batch per minute for shard i; returns its last position."""
    records = make_records(5 * minutes, shard=shard_id(i), per_minute=5, seed=i)
    sink = LandingProcessor(store, STREAM, max_batch_records=5, clock=lambda: (T0 + 10 * MINUTE_MS) / 1000)
    sink.initialize(InitializationInput(shard_id(i), "bench", Checkpoint("TRIM_HORIZON")))
    cp = RecordingCheckpointer()
    for m in range(minutes):
        sink.process_records(ProcessRecordsInput(records[5 * m:5 * m + 5], 0, cp))
    sink.shutdown_requested(cp)
    return records[-1].checkpoint


def tick(store, shards, leases, windows: int, report) -> float:
    progress = progress_from_leases(leases)
    began = time.perf_counter()
    scan = scan_windows(T0, MINUTE_MS, T0 + (windows + 5) * MINUTE_MS,
                        lambda t0, t1: window_complete(t0, t1, shards, progress, leases, 10_000), limit=windows)
    assert len(scan.complete) == windows, scan
    for status in scan.complete:
        report(store, STREAM, status.window_start_ms, status.window_end_ms)
    return (time.perf_counter() - began) / windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--minutes", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as logs, EmulatorStack(logs, services=("s3",)) as endpoints:
        os.environ.update(endpoints.env())
        settings = endpoints.aws_settings()
        client("s3", settings).create_bucket(Bucket="zone")
        store = open_store("s3://zone/landing", settings)
        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            lasts = list(pool.map(lambda i: land_shard(store, i, args.minutes), range(args.shards)))
        print(f"landed {args.shards} shards x {args.minutes} one-minute batches in {time.perf_counter() - began:.0f} s")
        shards = [Shard(shard_id(i)) for i in range(args.shards)]
        done_at = T0 + (args.minutes + 1) * MINUTE_MS
        leases = [Lease(shard_id(i), Checkpoint("TRIM_HORIZON"), lease_owner="live", extra={
            k: v for k, v in ShardProgress(shard_id(i), lasts[i], done_at).to_attributes().items() if v is not None})
            for i in range(args.shards)]
        shipped = [tick(store, shards, leases, args.minutes, list_window) for _ in range(args.trials)]
        peer = [tick(store, shards, leases, args.minutes, summarise_window) for _ in range(args.trials)]
    s, p = statistics.median(shipped), statistics.median(peer)
    print(f"{args.shards} shards, one-minute windows, {args.shards} batches per window (median of {args.trials})")
    print(f"  per window, listing only (shipped):     {s:6.2f} s")
    print(f"  per window, footer GET per batch (peer): {p:6.2f} s")
    print(f"  ratio: {p / s:.1f}x")


if __name__ == "__main__":
    main()
