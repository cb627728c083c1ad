"""Failover after SIGKILL, in multiples of the lease expiry.

Three `kcl-pipeline consume` processes share a 6-shard stream on kinesis-local + dynalite. Once the fleet
has settled (every lease owned, ages observed), one consumer's whole process group is SIGKILLed (a host
dying) and the clock runs until every lease it held is owned by a survivor.

Peer: the real Java KCL 2.7.2 (its lease taker every 2 × (failover + 25 ms)), killed and timed the same way at
the same expiry in the same run as ours, is `bench_java_peer.py`; this script measures ours alone.

    .venv/bin/python benchmarks/bench_failover.py [--trials 3]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.kcl.shells.shards import wait_stream_active  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402


def trial(endpoints, label: str, heartbeat: float, expiry: float, cycle: float) -> float:
    settings = endpoints.aws_settings()
    kinesis = client("kinesis", settings)
    stream = f"fo-{label}-{time.time_ns()}"
    kinesis.create_stream(StreamName=stream, ShardCount=6)
    wait_stream_active(kinesis, stream)
    table = LeaseTable(f"app-{stream}", client("dynamodb", settings))
    env = {**os.environ, **endpoints.env()}
    tmp = tempfile.mkdtemp()
    procs = {f"c{i}": subprocess.Popen(
        [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", f"app-{stream}",
         "--worker-id", f"c{i}", "--sink", f"jsonl:{tmp}/c{i}", "--leases-to-acquire", "2",
         "--heartbeat-seconds", str(heartbeat), "--lease-expiry-seconds", str(expiry), "--cycle-seconds", str(cycle)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True) for i in range(3)}
    try:
        deadline = time.monotonic() + 4 * cycle + 2 * expiry + 30
        while time.monotonic() < deadline:
            try:
                leases = table.scan()
            except Exception:
                leases = []
            if len(leases) == 6 and {lease.lease_owner for lease in leases} >= {"c0", "c1", "c2"}:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the fleet did not settle")
        time.sleep(expiry + 1)  # every survivor has observed every lease's counter moving
        victims = {lease.lease_key for lease in table.scan() if lease.lease_owner == "c0"}
        os.killpg(procs["c0"].pid, signal.SIGKILL)
        killed = time.monotonic()
        while True:
            owners = {lease.lease_key: lease.lease_owner for lease in table.scan()}
            if all(owners.get(k) not in (None, "c0") for k in victims):
                return time.monotonic() - killed
            if time.monotonic() - killed > 10 * expiry + 60:
                raise RuntimeError("failover did not happen")
            time.sleep(0.1)
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs.values():
            p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--skip-defaults", action="store_true", help="only the Java-compatible timings (faster)")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    configs = [("java-compatible", 3.0, 10.0, 20.0)] + ([] if args.skip_defaults else [("defaults", 10.0, 30.0, 20.0)])
    with tempfile.TemporaryDirectory() as logs, EmulatorStack(logs, services=("kinesis", "dynamodb")) as endpoints:
        for label, hb, expiry, cycle in configs:
            times = [trial(endpoints, label, hb, expiry, cycle) for _ in range(args.trials)]
            ratios = [t / expiry for t in times]
            print(json.dumps({"label": label, "heartbeat": hb, "expiry": expiry, "cycle": cycle,
                              "failover_seconds": [round(t, 1) for t in times],
                              "multiples_of_expiry": [round(r, 2) for r in ratios],
                              "median_multiple": round(statistics.median(ratios), 2),
                              "max_multiple": round(max(ratios), 2), "goal": 1.5}))
    print("Java KCL 2.7.2 at the same expiry, measured: benchmarks/bench_java_peer.py")


if __name__ == "__main__":
    main()
