"""A checkpoint run and a fresh sensor cursor on day 7 cost what they cost on day 1 (issue 20, §10).

An S3 output location on the moto server (over HTTP) holds N committed one-minute windows (each commit names
48 batches: 4 shards, a batch every 5 s); the landing zone holds the last five windows of 4 shards, landed by
the live writer (links and all), the newest two not transformed yet. The leases are checkpointed through the
oldest landed window, and the frontier the last checkpoint run stored says so. Measured, each in a fresh
process (the median of --trials runs; the peer, slow, once):

* a checkpoint run (`commit_checkpoints`: plan and commit for 4 shards): wall time, the process's resident
  size before the run and its peak (VmHWM), and the run's own peak Python allocation (tracemalloc);
* a sensor tick's stream work from a fresh cursor (`start_reports`: where reports start, past the committed
  windows; then the two complete windows found and reported from their listings, as the tick does).

Each beside its peer, today's approach before issue 20 in the same run on the same zone: every commit listed
and read (`read_materialised`), and a fresh cursor skipping from the zone's first window over all commits.
N = 1,000 and 10,000 side by side.

    .venv/bin/python benchmarks/bench_history.py [--sizes 1000 10000] [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.aws_settings import AwsSettings  # noqa: E402
from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard  # noqa: E402
from kcl_pipeline.kcl.core.streams import StreamScope  # noqa: E402
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput  # noqa: E402
from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.windows.checkpoints import run as checkpoint_commit  # noqa: E402
from kcl_pipeline.windows.checkpoints.record import CheckpointRecord, write_checkpoint_record  # noqa: E402
from kcl_pipeline.windows.manifest import WindowCommit, commit_key, read_materialised  # noqa: E402
from kcl_pipeline.windows.report import list_window  # noqa: E402
from kcl_pipeline.windows.scan import complete_windows  # noqa: E402
from kcl_pipeline.windows.tick import report_start  # noqa: E402
from kcl_pipeline.zone.chain import list_batches  # noqa: E402
from kcl_pipeline.zone.layout import MINUTE_MS  # noqa: E402
from kcl_pipeline.zone.progress import ShardProgress, progress_from_leases  # noqa: E402
from kcl_pipeline.zone.sink import LandingProcessor  # noqa: E402
from kcl_pipeline.zone.store import open_store  # noqa: E402
from kcl_pipeline.zone.stream_slice import StreamSlice  # noqa: E402
from kcl_pipeline_tests.landing.helpers import RecordingCheckpointer, make_records  # noqa: E402

STREAM = "orders"
W = MINUTE_MS
T_END = 1_795_316_400_000  # 2026-11-22T03:00Z: the first window not committed but two landed before it
SHARDS = [f"shardId-{i:012d}" for i in range(4)]
LANDED = range(T_END - 3 * W, T_END + 2 * W, W)  # the landing zone's five windows
NOW = T_END + 3 * W


# -- the zone ------------------------------------------------------------------------------------------------

def filler(window: int) -> frozenset[str]:
    """48 batch keys of a busy window (4 shards, one batch every 5 s): what a real commit names."""
    day = time.strftime("dt=%Y-%m-%d/hh=%H/mm=%M", time.gmtime(window / 1000))
    return frozenset(f"{STREAM}/{day}/{shard}/{window + 12 * i:056d}_0-{window + 12 * i + 11:056d}_0.parquet"
                     for shard in SHARDS for i in range(12))


def build(settings: AwsSettings, bucket: str, n: int) -> dict[str, Checkpoint]:
    """The zone and output for `n` committed windows; returns each shard's lease checkpoint."""
    for name in (f"{bucket}-landing", f"{bucket}-out"):
        client("s3", settings).create_bucket(Bucket=name)
    zone, output = stores(settings, bucket)
    checkpoints: dict[str, Checkpoint] = {}
    for i, shard in enumerate(SHARDS):
        records = make_records(50, shard=shard, start_ms=LANDED[0], per_minute=10, seed=i)
        sink = LandingProcessor(zone, STREAM, max_batch_records=10, clock=lambda: NOW / 1000)
        sink.initialize(InitializationInput(shard, "bench", Checkpoint("TRIM_HORIZON")))
        cp = RecordingCheckpointer()
        for m in range(5):
            sink.process_records(ProcessRecordsInput(records[10 * m:10 * m + 10], 0, cp))
        sink.shutdown_requested(cp)
        checkpoints[shard] = records[9].checkpoint  # through the first landed window

    def commit(window: int) -> None:
        names = filler(window)
        if window >= LANDED[0]:
            names |= {b.key() for b in list_batches(zone, STREAM, window, window + W)}
        datasets = {name: {"rows": 480, "files": ["part-0.parquet"]} for name in ("transformed", "quarantine")}
        output.put(commit_key(window), WindowCommit(window, window + W, f"run-{window}", names, datasets).to_json())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(commit, range(T_END - n * W, T_END, W)))
    return checkpoints


def stores(settings: AwsSettings, bucket: str):
    """The landing zone and the output location, in buckets of their own: moto lists a prefix by scanning its
    bucket's every key (S3 does not), so the 10,000 commits must not slow the landing zone's listings."""
    return (open_store(f"s3://{bucket}-landing/landing", settings), open_store(f"s3://{bucket}-out/out", settings))


def reset_frontier(settings: AwsSettings, bucket: str) -> None:
    """What the last checkpoint run stored (every run writes it: each measured run starts from the same)."""
    write_checkpoint_record(stores(settings, bucket)[1], CheckpointRecord({s: LANDED[0] for s in SHARDS}),
                            replaces_legacy=False)


# -- one measured run, in a fresh process ----------------------------------------------------------------------

class Table:
    def checkpoint(self, key: str, checkpoint: Checkpoint) -> bool:
        return True


def leases(checkpoints: dict[str, Checkpoint], last: dict[str, Checkpoint]) -> list[Lease]:
    out = []
    for shard in SHARDS:
        progress = ShardProgress(shard, last[shard], T_END + 2 * W - 1, NOW, 0)
        out.append(Lease(shard, checkpoints[shard], lease_owner="live",
                         extra={k: v for k, v in progress.to_attributes().items() if v is not None}))
    return out


def use_peer() -> None:
    """Today's approach before issue 20: every commit read; a fresh cursor skips from the zone's first window
    over all of them."""
    checkpoint_commit.read_materialised_from = lambda output, start, end: read_materialised(output)
    report_start.read_checkpoint_record = lambda output: None
    report_start.commit_windows = lambda output, begin, end: read_materialised(output).windows


def checkpoint_run(zone, output, lease_list) -> None:
    view = StreamSlice(StreamScope(STREAM), lease_list, [Shard(s) for s in SHARDS])
    report = checkpoint_commit.commit_checkpoints(
        Table(), view, zone, output, window_ms=W, first_window_ms=T_END - 30 * 1440 * W,
        initial=Checkpoint("TRIM_HORIZON"), grace_ms=0, now_ms=NOW)
    assert all(p.commit is not None for p in report.plan.shards.values()), report.plan_rows()


def fresh_tick(zone, output, lease_list) -> None:
    progress = progress_from_leases(lease_list)
    start = report_start.start_reports(zone, STREAM, output, lease_list, progress, window_ms=W, grace_ms=0,
                                       not_before_ms=T_END - 30 * 1440 * W, now_ms=NOW)
    assert start.start_ms == T_END, start
    scan = complete_windows(start.start_ms, W, NOW, [Shard(s) for s in SHARDS], progress, lease_list, 0, 12)
    assert [s.window_start_ms for s in scan.complete][:2] == [T_END, T_END + W], scan
    for status in scan.complete:
        list_window(zone, STREAM, status.window_start_ms, status.window_end_ms)


def child(args) -> None:
    settings = AwsSettings()  # the emulator endpoints, from the environment the parent gave
    zone, output = stores(settings, args.bucket)
    for store in (zone, output):
        store.get_optional("warm-up")  # the clients (botocore's data) are made before anything is measured
    if args.peer:
        use_peer()
    batches = list_batches(zone, STREAM)
    last = {s: max((b.last for b in batches if b.shard_id == s), key=lambda c: c.key()) for s in SHARDS}
    first = {s: Checkpoint(*json.loads(args.checkpoints)[s]) for s in SHARDS}
    lease_list = leases(first, last)
    run = checkpoint_run if args.child == "checkpoints" else fresh_tick
    before = memory("VmRSS")
    tracemalloc.start()
    began = time.perf_counter()
    run(zone, output, lease_list)
    seconds = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    print(json.dumps({"seconds": seconds, "alloc_mib": peak / 2**20, "rss_mib": memory("VmHWM"),
                      "rss_before_mib": before}))


def memory(field: str) -> float:
    """MiB from /proc/self/status: VmRSS now, VmHWM the peak of this process image (ru_maxrss is not: Linux
    carries the forking parent's resident size into it across exec)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def measure(env: dict[str, str], bucket: str, what: str, peer: bool, checkpoints: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", what, "--bucket", bucket, "--checkpoints", checkpoints]
    out = subprocess.run(cmd + (["--peer"] if peer else []), env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{what} ({'peer' if peer else 'shipped'}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--child", choices=["checkpoints", "tick"])
    ap.add_argument("--bucket")
    ap.add_argument("--checkpoints")
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--no-peer", action="store_true", help="measure the shipped code only (the peer is slow)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from kcl_pipeline.local.emulators import EmulatorStack

    rows = []
    with tempfile.TemporaryDirectory() as logs, EmulatorStack(logs, services=("s3",)) as endpoints:
        env = {**os.environ, **endpoints.env()}
        os.environ.update(endpoints.env())
        settings = endpoints.aws_settings()
        for n in args.sizes:
            bucket = f"history-{n}"
            began = time.perf_counter()
            checkpoints = build(settings, bucket, n)
            print(f"{n} committed windows written in {time.perf_counter() - began:.0f} s", flush=True)
            encoded = json.dumps({s: [c.sequence_number, c.sub_sequence_number] for s, c in checkpoints.items()})
            for what in ("checkpoints", "tick"):
                for peer in (False,) if args.no_peer else (False, True):
                    runs = []
                    for _ in range(1 if peer else args.trials):  # the peer is slow: one run of it
                        reset_frontier(settings, bucket)
                        runs.append(measure(env, bucket, what, peer, encoded))
                    rows.append((n, what, "peer (every commit)" if peer else "shipped",
                                 {k: statistics.median(r[k] for r in runs) for k in runs[0]}))
    print(f"\nshipped: median of {args.trials}, peer: one run; RSS: the measuring process's resident size before "
          f"the run (imports, boto3, pyarrow) and its peak; alloc: the run's own peak Python allocation")
    print(f"{'commits':>8}  {'what':<24} {'approach':<20} {'seconds':>8} {'RSS before':>10} {'RSS peak':>9} "
          f"{'alloc MiB':>10}")
    for n, what, approach, r in rows:
        label = "kinesis_checkpoints run" if what == "checkpoints" else "tick from a fresh cursor"
        print(f"{n:>8}  {label:<24} {approach:<20} {r['seconds']:>8.2f} {r['rss_before_mib']:>10.0f} "
              f"{r['rss_mib']:>9.0f} {r['alloc_mib']:>10.1f}")


if __name__ == "__main__":
    main()
