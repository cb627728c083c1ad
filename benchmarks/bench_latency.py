"""Record → transformed latency in the demo profile (p50, p95), against the window length.

Runs `kcl-pipeline demo` (emulators, producer, dagster dev) for a few minutes, then, for every record in
the transformed output, latency = the time its window's `transformed_records` materialisation was recorded
minus the record's ApproximateArrivalTimestamp. Peer: none (the figure is read against the window length).

    .venv/bin/python benchmarks/bench_latency.py [--minutes 6] [--window-minutes 1]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.aws_settings import AwsSettings  # noqa: E402
from kcl_pipeline.transform.job import read_output  # noqa: E402
from kcl_pipeline.zone.store import S3Options  # noqa: E402

OUTPUT = "s3://kcl-pipeline/output"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=6)
    ap.add_argument("--window-minutes", type=int, default=1)
    ap.add_argument("--rate", type=float, default=20)
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp()) / "state"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "kcl_pipeline.cli", "demo", "--port", str(port), "--state-dir",
                             str(state), "--window-minutes", str(args.window_minutes), "--shards", "2", "--rate",
                             str(args.rate)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(2)
        time.sleep(args.minutes * 60)
        env = dict(line.removeprefix("export ").split("=", 1) for line in (state / "env.sh").read_text().splitlines())
        from dagster import AssetKey, DagsterInstance

        instance = DagsterInstance.from_config(str(state / "dagster_home"))
        records = instance.fetch_materializations(AssetKey("transformed_records"), limit=10_000).records
        materialised_at = {}
        for r in records:
            materialised_at[r.partition_key] = min(materialised_at.get(r.partition_key, float("inf")), r.timestamp)
        aws = AwsSettings(region=env.get("AWS_REGION"), endpoint_urls={"s3": env["AWS_ENDPOINT_URL_S3"]})
        os.environ.setdefault("AWS_ACCESS_KEY_ID", env.get("AWS_ACCESS_KEY_ID", "test"))
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", env.get("AWS_SECRET_ACCESS_KEY", "test"))
        s3 = S3Options.from_aws_settings(aws, env_credentials=True)
        from datetime import datetime, timezone

        from kcl_pipeline.windows.keys import PARTITION_FMT

        latencies = []
        for key, at in materialised_at.items():
            start_ms = int(datetime.strptime(key, PARTITION_FMT).replace(tzinfo=timezone.utc).timestamp() * 1000)
            out = read_output(None, OUTPUT, start_ms, s3=s3).transformed
            for ts in out.column("approximate_arrival_timestamp").to_pylist():
                latencies.append(at - ts.timestamp())
        if not latencies:
            raise SystemExit("no transformed records yet: run longer (--minutes)")
        latencies.sort()
        p50 = statistics.median(latencies)
        p95 = latencies[int(0.95 * (len(latencies) - 1))]
        w = args.window_minutes * 60
        print(f"{len(latencies)} records in {len(materialised_at)} windows of {w} s: "
              f"p50 {p50:.1f} s ({p50 / w:.2f}x window), p95 {p95:.1f} s ({p95 / w:.2f}x window)")
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(120)


if __name__ == "__main__":
    main()
