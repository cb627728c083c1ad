"""Backfill wall time: shards read in parallel (the shipped default pace) against shard after shard.

On kinesis-local over HTTP: a stream of --shards shards holding --records user records (KPL aggregates and
plain), one range backfilled into a local zone twice from scratch: with `BackfillPace()` (the default the
landed_records asset uses: 8 shards at once, 1 GetRecords/s and 1 MiB/s per shard) and with the same pace at
parallelism 1 (the peer: the previous code path read shard after shard). Also prints the busiest shard's
GetRecords rate, which must stay within the pace (the live consumer keeps the rest of the shard's 5/s).

    .venv/bin/python benchmarks/bench_backfill.py [--shards 8] [--records 8000]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline.local.producer import produce  # noqa: E402
from kcl_pipeline.windows.backfill import BackfillPace, backfill_range  # noqa: E402
from kcl_pipeline.zone.layout import MINUTE_MS, minute_of  # noqa: E402


class TimedCalls:
    """The client, recording when each GetRecords call was made, per shard iterator's shard."""

    def __init__(self, kinesis):
        self._kinesis = kinesis
        self.calls: dict[str, list[float]] = collections.defaultdict(list)
        self._shard_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._kinesis, name)

    def get_shard_iterator(self, **kw):
        resp = self._kinesis.get_shard_iterator(**kw)
        with self._lock:
            self._shard_of[resp["ShardIterator"]] = kw["ShardId"]
        return resp

    def get_records(self, **kw):
        with self._lock:
            shard = self._shard_of.get(kw["ShardIterator"], "?")
            self.calls[shard].append(time.monotonic())
        resp = self._kinesis.get_records(**kw)
        if resp.get("NextShardIterator"):
            with self._lock:
                self._shard_of[resp["NextShardIterator"]] = shard
        return resp

    def busiest_rate(self) -> float:
        """The most GetRecords calls any shard saw in one sliding second."""
        best = 0
        for times in self.calls.values():
            for i, t in enumerate(times):
                best = max(best, sum(1 for u in times[i:] if u - t < 1.0))
        return float(best)


def trial(kinesis, stream: str, start: int, end: int, pace: BackfillPace) -> tuple[float, int, float]:
    calls = TimedCalls(kinesis)
    with tempfile.TemporaryDirectory() as zone:
        began = time.perf_counter()
        report = backfill_range(stream, start, end, zone, kinesis=calls, create_zone=True, pace=pace)
        took = time.perf_counter() - began
    assert report.complete, report.shards
    return took, report.records_landed, calls.busiest_rate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--records", type=int, default=8000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as logs, EmulatorStack(logs, services=("kinesis",)) as endpoints:
        os.environ.update(endpoints.env())
        kinesis = client("kinesis", endpoints.aws_settings())
        stream = f"bench-backfill-{os.getpid()}"
        before = int(time.time() * 1000)
        half = args.records // 2
        produce(kinesis, stream, half, aggregate=4, create_shards=args.shards, seed=1)
        produce(kinesis, stream, args.records - half, aggregate=1, first_id=half, seed=2)
        after = int(time.time() * 1000)
        start, end = minute_of(before), minute_of(after) + 2 * MINUTE_MS
        pace = BackfillPace()
        parallel = trial(kinesis, stream, start, end, pace)
        sequential = trial(kinesis, stream, start, end, BackfillPace(parallelism=1))
    print(f"{args.shards} shards, {args.records} user records, pace {pace}")
    for label, (took, landed, rate) in (("parallel (shipped)", parallel), ("shard after shard (peer)", sequential)):
        print(f"  {label:26s} {took:7.2f} s  {landed} records landed  busiest shard {rate:.0f} GetRecords/s")
    print(f"  speed-up: {sequential[0] / parallel[0]:.1f}x")


if __name__ == "__main__":
    main()
