"""Balance after a failover: three `kcl-pipeline consume` processes (heartbeat 1 s, expiry 3 s, cycle 2 s) on a
4-shard stream; the one holding most leases is killed with SIGKILL. Reports the time until the survivors hold every
lease, until they hold 2 / 2, and whether they stay so for 10 s. Issue 31, item 8: before the back-off of overtaken
hand-offs the survivors stayed 3 / 1 for 25-40 s.

Usage: python benchmarks/bench_balance_after_failover.py [--trials N]   (kinesis-local + dynalite started here)
No figure here is a test.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.kcl.shells.shards import wait_stream_active  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline_tests.kcl.fleet_support import consume_process  # noqa: E402

CONSUMERS = ("c1", "c2", "c3")


def owners(table: LeaseTable) -> list[str | None]:
    try:
        return [lease.lease_owner for lease in table.scan()]
    except Exception:  # noqa: BLE001 - the table may not exist yet
        return []


def wait_for(predicate, seconds: float) -> float | None:
    """Seconds until `predicate()` held (polled every 0.2 s), None when it never did within `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.2)
    return None


def trial(n: int, endpoints, work: Path) -> str:
    settings = endpoints.aws_settings()
    kinesis, dynamodb = client("kinesis", settings), client("dynamodb", settings)
    stream, app = f"balance{n}", f"balanceapp{n}"
    kinesis.create_stream(StreamName=stream, ShardCount=4)
    wait_stream_active(kinesis, stream)
    env = {**os.environ, **endpoints.env(), "PYTHONUNBUFFERED": "1"}
    procs = {w: consume_process(env, stream, app, w, work / f"{n}-{w}", work / f"{n}-{w}.log",
                                heartbeat=1.0, expiry=3.0, cycle=2.0) for w in CONSUMERS}
    table = LeaseTable(app, dynamodb)
    try:
        wait_for(lambda: set(owners(table)) == set(CONSUMERS) and len(owners(table)) == 4, 90)
        held = owners(table)
        victim = max(CONSUMERS, key=held.count)
        os.killpg(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        survivors = [w for w in CONSUMERS if w != victim]
        killed = time.monotonic()
        taken = wait_for(lambda: len(owners(table)) == 4 and set(owners(table)) <= set(survivors), 90)
        even = wait_for(lambda: sorted(owners(table).count(w) for w in survivors) == [2, 2], 90)
        balanced = None if even is None else time.monotonic() - killed
        stayed = wait_for(lambda: sorted(owners(table).count(w) for w in survivors) != [2, 2], 10) is None
        return (f"trial {n}: killed {victim} (held {held.count(victim)} of 4); every lease taken "
                f"{taken if taken is None else round(taken, 1)} s, 2 / 2 at "
                f"{balanced if balanced is None else round(balanced, 1)} s after the kill; stayed 10 s: {stayed}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    work = Path(tempfile.mkdtemp(prefix="bench-balance-"))
    stack = EmulatorStack(work / "logs")
    endpoints = stack.start()
    try:
        for n in range(args.trials):
            print(trial(n, endpoints, work), flush=True)
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
