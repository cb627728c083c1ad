"""Enhanced fan-out vs polling on the same loopback endpoint: records/s and record → landed latency p50/p95.

Both retrievals read through one endpoint process (kcl_pipeline_tests/fanout_endpoint.py) in front of
kinesis-local: polling's GetRecords are proxied by it, fan-out's SubscribeToShard is served by it (events
pushed from its own GetRecords on kinesis-local every `--endpoint-poll` seconds: on loopback that interval,
not Kinesis, sets how soon a record is pushed). The consumer is a LeaseWorker in this process with the
shipped defaults (polling: 0.2 s between GetRecords, 2 s when caught up, a 2 MiB prefetch), landing into a
local zone with `--batch-seconds` batches (the CLI's --batch-seconds) and checkpointing after each flush.

* records/s: `--records` plain user records of `--record-bytes` put once beforehand; each run reads them all from
  the start under an application of its own, from the worker's start (its lease) to the last one landed; the
  fan-out consumer is registered before (a one-time cost). Polling asks each GetRecords for about 2 MiB (the
  shipped prefetch), 0.2 s apart; the endpoint sends events of at most `--records-per-event` records, back to
  back. kinesis-local bounds both: it slows down as a shard grows (its PutRecords take longer and longer: hence
  a modest backlog, put once).
* latency: `--rate` records/s produced for `--seconds` (by a `kcl-pipeline produce` process) while the worker
  is caught up; per record, delivered = the time the processor got it, landed = its batch file's mtime, each
  minus the record's ApproximateArrivalTimestamp (kinesis-local stamps it with this host's clock).

    .venv/bin/python benchmarks/bench_fanout.py [--records 10000] [--record-bytes 1024] [--rate 100] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")

import pyarrow.parquet as pq  # noqa: E402

from kcl_pipeline.kcl.aws_settings import AwsSettings  # noqa: E402
from kcl_pipeline.kcl.config import FANOUT, POLLING, ConsumerConfig  # noqa: E402
from kcl_pipeline.kcl.core.lease.effects import Spawn  # noqa: E402
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease  # noqa: E402
from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.kcl.shells.read.fanout import ensure_consumer  # noqa: E402
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active  # noqa: E402
from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline.local.producer import produce  # noqa: E402
from kcl_pipeline.zone.sink import LandingProcessor  # noqa: E402


class Timed(LandingProcessor):
    """The landing sink, noting when each delivered record reached it (ms after its arrival)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delivered_ms: list[int] = []
        self.calls = 0

    def process_records(self, batch) -> None:
        self.calls += 1
        records = batch.records
        if records:
            now_ms = int(time.time() * 1000)
            if hasattr(records, "run_arrival_ms"):
                for arrival, length in zip(records.run_arrival_ms, records.run_lengths, strict=True):
                    self.delivered_ms.extend([now_ms - arrival] * length)
        super().process_records(batch)


def _landed_latencies_ms(zone: Path) -> list[float]:
    out: list[float] = []
    for path in zone.rglob("*.parquet"):
        landed_ms = path.stat().st_mtime_ns / 1e6
        column = pq.read_table(path, columns=["approximate_arrival_timestamp"]).column(0)
        out.extend(landed_ms - ts.timestamp() * 1000 for ts in column.to_pylist())
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


class Bench:
    def __init__(self, stack_urls: dict[str, str], endpoint: str, region: str, workdir: Path, batch_seconds: float):
        # kinesis-local slows down as a shard grows: a PutRecords of 500 may take longer than the default 20 s.
        self.direct = client("kinesis", AwsSettings(region=region, endpoint_urls=stack_urls), read_timeout=120)
        self.aws = AwsSettings(region=region, endpoint_urls={**stack_urls, "kinesis": endpoint})
        self.dynamodb = client("dynamodb", self.aws)
        self.region = region
        self.workdir = workdir
        self.batch_seconds = batch_seconds
        self.runs = 0

    def stream(self) -> str:
        self.runs += 1
        name = f"bench-{self.runs}-{os.getpid()}"
        self.direct.create_stream(StreamName=name, ShardCount=1)
        wait_stream_active(self.direct, name)
        return name

    def _setup(self, retrieval: str, stream: str | None = None) -> tuple[str, LeaseWorker, Timed, Path]:
        """A worker of a new application (its lease table, zone and, for fan-out, stream consumer) on `stream`
        (default: a new, empty stream)."""
        stream = stream or self.stream()
        self.runs += 1
        app = f"app-{retrieval}-{self.runs}-{os.getpid()}"
        table = LeaseTable(app, self.dynamodb)
        table.ensure_table()
        shard = list_shards(self.direct, stream)[0].shard_id
        table.create(Lease(shard, Checkpoint(TRIM_HORIZON)))
        zone = self.workdir / app
        zone.mkdir()
        config = ConsumerConfig(stream=stream, application=app, worker_id="bench", retrieval=retrieval, aws=self.aws)
        processor = Timed(str(zone), stream, checkpoint_after_flush=True, max_batch_age_seconds=self.batch_seconds)
        return stream, LeaseWorker(config, Spawn(table.get(shard)), processor), processor, zone

    def throughput(self, retrieval: str, backlog: str, records: int) -> float:
        """Read `backlog` (a stream holding `records` records) from its start."""
        _, worker, processor, _ = self._setup(retrieval, backlog)
        if retrieval == FANOUT:  # registered beforehand: a one-time cost, not the retrieval's
            ensure_consumer(client("kinesis", self.aws), backlog, worker.config.application)
        thread = threading.Thread(target=worker.run, daemon=True)
        started = time.monotonic()
        thread.start()
        while processor.stats.rows_written < records:
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        worker.stop.set()
        thread.join(60)
        return records / elapsed

    def latency(self, retrieval: str, rate: float, seconds: float) -> tuple[list[int], list[float], int]:
        name, worker, processor, zone = self._setup(retrieval)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        while processor.calls < 2:  # reading (subscribed, or polled) and caught up
            time.sleep(0.05)
        time.sleep(2.5)  # past the first idle interval
        count = int(rate * seconds)
        env = {**os.environ, "AWS_ENDPOINT_URL_KINESIS": self.direct.meta.endpoint_url, "AWS_REGION": self.region}
        subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "produce", "--stream", name, "--count", str(count),
                        "--rate", str(rate), "--no-progress"], env=env, check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while processor.stats.rows_written < count and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop.set()
        thread.join(60)
        return processor.delivered_ms, _landed_latencies_ms(zone), processor.stats.rows_written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000, help="backlog for records/s")
    ap.add_argument("--record-bytes", type=int, default=1024, help="payload size of the backlog's records")
    ap.add_argument("--records-per-event", type=int, default=1000,
                    help="the endpoint's Limit per event (Kinesis' own event sizes are not known here)")
    ap.add_argument("--rate", type=float, default=100.0, help="records/s produced for the latency run")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the latency run")
    ap.add_argument("--batch-seconds", type=float, default=0.5, help="landing batch age (the CLI's --batch-seconds)")
    ap.add_argument("--endpoint-poll", type=float, default=0.05, help="the endpoint's GetRecords interval")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    stack = EmulatorStack(workdir / "logs", services=("kinesis", "dynamodb"))
    endpoints = stack.start()
    endpoint = subprocess.Popen([sys.executable, "-m", "kcl_pipeline_tests.fanout_endpoint", "--upstream",
                                 endpoints.kinesis, "--poll-interval", str(args.endpoint_poll),
                                 "--records-per-event", str(args.records_per_event)],
                                stdout=subprocess.PIPE, text=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
    try:
        url = endpoint.stdout.readline().strip()
        bench = Bench(endpoints.endpoint_urls(), url, endpoints.region, workdir, args.batch_seconds)
        backlog = bench.stream()
        payload = b"x" * args.record_bytes
        # Once: every run reads it under its own application.
        produce(bench.direct, backlog, count=args.records, payload=lambda _n: payload)
        rates: dict[str, list[float]] = {POLLING: [], FANOUT: []}
        lat: dict[str, tuple[list[int], list[float]]] = {POLLING: ([], []), FANOUT: ([], [])}
        for round_ in range(args.repeat):
            order = (POLLING, FANOUT) if round_ % 2 == 0 else (FANOUT, POLLING)
            for retrieval in order:
                rates[retrieval].append(bench.throughput(retrieval, backlog, args.records))
                delivered, landed, rows = bench.latency(retrieval, args.rate, args.seconds)
                lat[retrieval][0].extend(delivered)
                lat[retrieval][1].extend(landed)
                print(f"round {round_ + 1} {retrieval}: {rates[retrieval][-1]:,.0f} records/s; latency run "
                      f"{rows} records landed", flush=True)
        print(f"\n1 shard; backlog {args.records:,} records of {args.record_bytes:,} B; latency at {args.rate:g} "
              f"records/s for {args.seconds:g} s; batches of {args.batch_seconds:g} s; endpoint: GetRecords every "
              f"{args.endpoint_poll:g} s, events of <= {args.records_per_event} records; {args.repeat} rounds")
        print("| retrieval | records/s (best, median) | delivered p50 / p95 | landed p50 / p95 |")
        print("|---|---|---|---|")
        for retrieval in (POLLING, FANOUT):
            r = rates[retrieval]
            delivered, landed = lat[retrieval]
            print(f"| {retrieval} | {max(r):,.0f}, {statistics.median(r):,.0f} | "
                  f"{_pct(delivered, 0.5):.0f} / {_pct(delivered, 0.95):.0f} ms | "
                  f"{_pct(landed, 0.5):.0f} / {_pct(landed, 0.95):.0f} ms |")
        ratio = statistics.median(rates[FANOUT]) / statistics.median(rates[POLLING])
        print(f"\nfan-out / polling records/s (medians): {ratio:.2f}x; landed p50: "
              f"{_pct(lat[FANOUT][1], 0.5) / _pct(lat[POLLING][1], 0.5):.2f}x")
    finally:
        endpoint.send_signal(signal.SIGTERM)
        endpoint.wait(30)
        stack.stop()


if __name__ == "__main__":
    main()
