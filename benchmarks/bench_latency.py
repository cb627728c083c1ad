"""Record → checkpoint latency in the demo profile, per stage, warm Spark and cold side by side.

Runs `kcl-pipeline demo` (emulators, KPL producer, `dagster dev`; 1-minute windows, 2 shards, sensor every 10 s)
twice in one invocation, each from a fresh state directory: first as shipped (window runs attach to the demo's
Spark Connect server), then with `--cold-spark` (every run starts its own session). Each phase waits until
`--windows` windows have every stage recorded, then stops the demo. The first `--settle-windows` whole windows
after the UI answered are not measured: the demo starts with the windows of its start-up still to transform, one
Spark run at a time, and their queue is the start-up's, not the pipeline's. The stage times come from what a deployment
has too — the landing batches (their records' arrivals, their modification times), Dagster's event log (the
sensor's `landed_records` report, the run's launch and start events, the `transformed_records` step and
materialisations, the `kinesis_checkpoints` commit) — and are computed by latency_stages.py (unit-tested).

    .venv/bin/python benchmarks/bench_latency.py [--windows 10] [--window-minutes 1] [--rate 20] [--only warm|cold]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from latency_stages import LandedBatch, WindowTimes, render, stage_samples  # noqa: E402

from kcl_pipeline.zone.batch import decode_batch  # noqa: E402
from kcl_pipeline.zone.layout import parse_batch_key  # noqa: E402

LANDED, TRANSFORMED, CHECKPOINTS = "landed_records", "transformed_records", "kinesis_checkpoints"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_ui(port: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the demo exited ({proc.returncode}) before its UI answered")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).status == 200:
                return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"the demo's UI did not answer within {timeout:.0f} s")


def asset_events(instance, name: str) -> list:
    """Every materialisation of the asset whose key ends in `name` (the demo's one stream), oldest first."""
    from dagster import AssetKey

    keys = [k for k in instance.get_asset_keys() if k.path[-1] == name] or [AssetKey(name)]
    out = []
    for key in keys:
        cursor = None
        while True:  # pages of Dagster's largest (10,000 records)
            page = instance.fetch_materializations(key, limit=10_000, cursor=cursor, ascending=True)
            out += page.records
            if not page.has_more:
                break
            cursor = page.cursor
    return sorted(out, key=lambda r: r.timestamp)


def window_times(instance, starts: list[int], window_ms: int) -> dict[int, WindowTimes]:
    from dagster import DagsterEventType

    from kcl_pipeline.windows.keys import partition_key

    def first(events, key, after: float = 0.0):
        return next((e for e in events if e.partition_key == key and e.timestamp >= after), None)

    landed, transformed, checkpoints = (asset_events(instance, n) for n in (LANDED, TRANSFORMED, CHECKPOINTS))
    out = {}
    for start in starts:
        key = partition_key(start)
        times = WindowTimes(start, start + window_ms)
        complete = first(landed, key)
        done = first(transformed, key)
        if complete is not None and done is not None:
            logs = instance.all_logs(done.run_id, of_type={DagsterEventType.RUN_STARTING, DagsterEventType.RUN_START,
                                                           DagsterEventType.STEP_START})
            launched = next((e.timestamp for e in logs if e.dagster_event_type == DagsterEventType.RUN_STARTING), None)
            started = next((e.timestamp for e in logs if e.dagster_event_type == DagsterEventType.RUN_START), None)
            step = next((e.timestamp for e in logs if e.dagster_event_type == DagsterEventType.STEP_START
                         and (e.step_key or "").endswith(TRANSFORMED)), None)
            committed = first(checkpoints, key, done.timestamp)
            times = WindowTimes(start, start + window_ms, complete.timestamp, launched, started, step, done.timestamp,
                                committed.timestamp if committed else None)
        out[start] = times
    return out


def landed_batches(landing: Path, starts: set[int], window_ms: int) -> list[LandedBatch]:
    out = []
    for path in landing.rglob("*.parquet"):
        key = parse_batch_key(path.relative_to(landing).as_posix())
        if key is None:
            continue
        start = key.minute_ms - key.minute_ms % window_ms
        if start not in starts:
            continue
        table = decode_batch(path.read_bytes(), key.key())
        arrivals = [int(ts.timestamp() * 1000) for ts in table.column("approximate_arrival_timestamp").to_pylist()]
        out.append(LandedBatch(start, path.stat().st_mtime, arrivals))
    return out


def run_phase(mode: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from dagster import DagsterInstance

    window_ms = args.window_minutes * 60_000
    state = Path(tempfile.mkdtemp(prefix=f"bench-latency-{mode}-")) / "state"
    port = free_port()
    command = [sys.executable, "-m", "kcl_pipeline.cli", "demo", "--port", str(port), "--state-dir", str(state),
               "--window-minutes", str(args.window_minutes), "--shards", str(args.shards), "--rate", str(args.rate)]
    if mode == "cold":
        command.append("--cold-spark")
    log = open(state.parent / "demo.log", "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_ui(port, proc)
        now_ms = int(time.time() * 1000)
        first = now_ms - now_ms % window_ms + (1 + args.settle_windows) * window_ms
        starts = [first + i * window_ms for i in range(args.windows)]
        print(f"{mode}: measuring {args.windows} windows from {time.strftime('%H:%M:%S', time.gmtime(first / 1000))}"
              f" UTC (demo log {state.parent / 'demo.log'})", flush=True)
        deadline = (starts[-1] + window_ms) / 1000 + args.patience_minutes * 60
        times: dict[int, WindowTimes] = {}
        while time.time() < deadline:
            time.sleep(15)
            if proc.poll() is not None:
                raise SystemExit(f"{mode}: the demo exited ({proc.returncode}); see {state.parent / 'demo.log'}")
            if time.time() * 1000 < starts[-1] + window_ms:
                continue
            with DagsterInstance.from_config(str(state / "dagster_home")) as instance:
                times = window_times(instance, starts, window_ms)
            if all(t.recorded for t in times.values()):
                break
        missing = [s for s, t in times.items() if not t.recorded]
        if missing:
            print(f"{mode}: {len(missing)} of {len(starts)} windows without every stage recorded in time: left out",
                  flush=True)
        batches = landed_batches(state / "zones" / "landing", set(starts), window_ms)
        return stage_samples(times.values(), batches)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=10, help="windows measured per phase")
    ap.add_argument("--window-minutes", type=int, default=1)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--settle-windows", type=int, default=4,
                    help="whole windows after the UI answered that are not measured (the start-up's queue)")
    ap.add_argument("--only", choices=["warm", "cold"], default=None, help="one phase only")
    ap.add_argument("--patience-minutes", type=float, default=5,
                    help="how long after the last window's end its stages may take to be recorded")
    args = ap.parse_args()
    if args.windows < 1 or args.settle_windows < 0:
        raise SystemExit("--windows must be >= 1 and --settle-windows >= 0")
    print(f"load before: {os.getloadavg()}", flush=True)
    results = {}
    for mode in ("warm", "cold"):
        if args.only in (None, mode):
            results[mode] = run_phase(mode, args)
            print(f"{mode} done; load {os.getloadavg()}", flush=True)
    w = args.window_minutes * 60
    print(f"\n{args.windows} windows of {w} s per phase, {args.shards} shards at {args.rate:g} records/s; seconds\n")
    print(render(results))


if __name__ == "__main__":
    main()
