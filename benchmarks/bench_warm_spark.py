"""One window run's transform, cold (a run starts its own local session) vs warm (a run attaches to the
long-lived Spark Connect server the demo and `local up` start), in the demo's shape: an s3:// zone on the moto
emulator read by the Python data source, 4 shards, the demo producer's rate over one 2-minute window.

    .venv/bin/python benchmarks/bench_warm_spark.py [--records 4800] [--repeat 3]

Each run is a fresh Python process, as a Dagster run is: it imports the transform, builds its session
(`build_local_session` with the master a deployment configures: local[*], or sc://… with local[*] as its
fallback) and transforms the window. Cold and warm runs alternate, so both see the same host load. Printed:
the server's own start, each run's wall time (process start to report) and its session and transform parts,
and the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline.local.spark_connect import FALLBACK_MASTER, SparkConnectServer  # noqa: E402
from kcl_pipeline_tests.transform.landing_batches import MINUTE, T0, Rec, seq, write_s3  # noqa: E402

RUN = """
import json, sys, time
started = time.monotonic()
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.transform.job import build_local_session, transform_window
from kcl_pipeline.zone.store import S3Options
master, fallback, s3_endpoint, zone, out, t0, t1 = sys.argv[1:8]
imported = time.monotonic()
spark = build_local_session(master, "bench-warm", fallback_master=fallback or None)
session = time.monotonic()
s3 = S3Options.from_aws_settings(AwsSettings(endpoint_urls={"s3": s3_endpoint}), env_credentials=True)
report = transform_window(spark, zone=zone, stream="s1", window_start_ms=int(t0), window_end_ms=int(t1),
                          output_uri=out, s3_options=s3)
done = time.monotonic()
spark.stop()
print(json.dumps({"import_s": imported - started, "session_s": session - imported, "transform_s": done - session,
                  "rows_in": report.rows_in, "rows_out": report.rows_out}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=4800, help="records in the window (demo: 40/s × 120 s)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    with EmulatorStack(work / "logs", services=("s3",)) as endpoints:
        s3_client = boto3.client("s3", endpoint_url=endpoints.s3, region_name=endpoints.region,
                                 aws_access_key_id="test", aws_secret_access_key="test")
        s3_client.create_bucket(Bucket="bench")
        per_shard, per_batch = args.records // args.shards, 100
        for shard in range(args.shards):
            shard_id = f"shardId-{shard:012d}"
            for first in range(0, per_shard, per_batch):
                write_s3(s3_client, "bench", "zone", "s1",
                         [Rec(shard_id, seq(shard * 10_000_000 + i), b'{"i":%d}' % i,
                              T0 + (i * 2 * MINUTE) // per_shard) for i in range(first, min(first + per_batch,
                                                                                            per_shard))])
        began = time.monotonic()
        server = SparkConnectServer(work / "logs", env=endpoints.env())
        server.start()
        try:
            server.wait_ready()
            print(f"Spark Connect server ready in {time.monotonic() - began:.1f} s ({server.url})", flush=True)
            env = {**server.environment(), **endpoints.env()}
            results: dict[str, list[dict]] = {"cold": [], "warm": []}
            for i in range(args.repeat):
                for mode, master, fallback in (("cold", FALLBACK_MASTER, ""), ("warm", server.url, FALLBACK_MASTER)):
                    start = time.monotonic()
                    done = subprocess.run([sys.executable, "-c", RUN, master, fallback, endpoints.s3,
                                           "s3://bench/zone", f"s3://bench/{mode}{i}", str(T0), str(T0 + 2 * MINUTE)],
                                          env=env, capture_output=True, cwd=REPO, timeout=900)
                    wall = time.monotonic() - start
                    if done.returncode:
                        print(done.stderr.decode(errors="replace")[-3000:], file=sys.stderr)
                        return 1
                    run = {**json.loads(done.stdout.decode().strip().splitlines()[-1]), "wall_s": wall}
                    results[mode].append(run)
                    print(f"{mode} #{i + 1}: wall {wall:.1f} s (imports {run['import_s']:.1f}, session "
                          f"{run['session_s']:.1f}, transform {run['transform_s']:.1f}); {run['rows_in']} rows in, "
                          f"{run['rows_out']} out", flush=True)
        finally:
            server.stop()
    print()
    print("| run | wall (median) | session start | transform |")
    print("|---|---|---|---|")
    for mode in ("cold", "warm"):
        runs = results[mode]
        print(f"| {mode} | {statistics.median(r['wall_s'] for r in runs):.1f} s "
              f"| {statistics.median(r['session_s'] for r in runs):.1f} s "
              f"| {statistics.median(r['transform_s'] for r in runs):.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
