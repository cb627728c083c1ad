"""Lease workers' memory as one consumer grows: 8, 32 and 64 leases (64 is the default max_leases), with a steady
trickle of records and with every lease in backlog, on moto server (Kinesis and DynamoDB over HTTP); both worker
start methods in the same run, the previous one first.

    .venv/bin/python benchmarks/bench_memory.py [--sizes 8,32,64] [--backlog-mib 12] [--single-records 100000]
        [--emulators moto|local|mixed]

Per size and start method, one consumer (a LeaseManager driven as `kcl-pipeline consume` drives it, landing into a
local directory, checkpointing after each batch) takes every lease of an N-shard stream:

1. idle: 1 KB records trickle in (one per shard per second); after the workers settle, PSS and USS of every
   lease worker and of the consumer's whole process tree (manager, forkserver, resource tracker, workers: the
   host total) are sampled each second; the manager's cycle time is each `run_cycle`'s wall time;
2. backlog: the trickle pauses and every shard gets --backlog-mib of 1 KB records in KPL aggregates (~48 per
   50 KB aggregate) at once; sampled each second until every lease's checkpoint reached its shard's last record;
   each worker's peak RSS (VmHWM) is read then;
3. idle again after the backlog (what a worker keeps).

The cycle is reported with what of it waited for the lease table's scan and the shard listing (the manager's own
calls, timed where it makes them). --emulators: moto (the default), local (kinesis-local and dynalite) or mixed
(Kinesis on moto, DynamoDB on dynalite).

Then one worker alone drains a --single-records backlog (1 KB records, the issue's "100k-record backlog") and its
peak RSS is read. moto answers a GetRecords with as many records as its Limit asks, past the 10 MiB a Kinesis
response may hold: the code from before prefetch_bytes (Limit 10,000) reads a whole 100 MiB backlog in one
response there, which Kinesis would cap (as the 10 MiB prefetch of "previous" does).

Configurations: "previous" is the previous start method, spawn, with a 10 MiB prefetch (what a GetRecords
response may hold, as the reader read before prefetch_bytes); "forkserver" is the default (a preloaded
forkserver, 2 MiB prefetch); for the single worker also forkserver with a 10 MiB prefetch, which separates the
two changes. Both share this change's other gains (one botocore loader per process, the heap given back when
caught up); "original" (--configs original,previous,forkserver --original-tree DIR) runs the code from before
this change, unpacked in DIR, as the consumer.

By default the consumer runs as on a core install (`pip install kcl_pipeline`: no numpy, no pandas; a
sitecustomize on its PYTHONPATH hides them from it, its forkserver and its workers); --dev-extras lets them load
(pyarrow then imports pandas on a worker's first flush). Figures are MiB (2^20 bytes); ratios are
forkserver / previous, measured in the same run. No figure here is a test.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

MiB = 1024 * 1024
RECORD_BYTES = 1024
PER_AGGREGATE = 48  # 1 KB user records per KPL aggregate (~50 KB, the KPL's default aggregation size)
REGION = "us-east-1"
CONFIGS = {  # name -> (worker_start_method, prefetch_bytes)
    "previous": ("spawn", 10 * MiB),
    "forkserver": ("forkserver", 2 * MiB),
    "forkserver-10MiB": ("forkserver", 10 * MiB),
    "forkserver-1MiB": ("forkserver", 1 * MiB),
    "original": ("spawn", 10 * MiB),  # the code of --original-tree (before this change): spawn, Limit 10000
}
HIDE_DEV_EXTRAS = '''import sys


class _CoreInstall:
    """numpy and pandas are not installed (as on `pip install kcl_pipeline`)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numpy", "pandas"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _CoreInstall())
'''


# -- the consumer (a child process) ------------------------------------------------------------------------------

def consumer_main() -> None:
    """Run one consumer from the JSON settings in argv[1]: print one JSON line per manager cycle, stop on SIGTERM."""
    import logging

    import kcl_pipeline
    from kcl_pipeline.kcl.aws_settings import AwsSettings
    from kcl_pipeline.kcl.config import ConsumerConfig
    from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
    from kcl_pipeline.kcl.shells.signals import stop_on_signals
    from kcl_pipeline.zone.sink import landing_spec

    s = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    known = {f.name for f in dataclasses.fields(ConsumerConfig)}  # an --original-tree has neither setting
    chosen = {"worker_start_method": s["method"], "prefetch_bytes": s["prefetch"]}
    config = ConsumerConfig(stream=s["stream"], application=s["application"], worker_id=s["worker_id"],
                            max_leases=s["leases"], leases_to_acquire=s["leases"], cycle_seconds=s["cycle"],
                            aws=AwsSettings(region=REGION, endpoint_urls=s["endpoints"]),
                            **{k: v for k, v in chosen.items() if k in known})
    manager = LeaseManager(config, landing_spec(s["zone"], s["stream"], aws=config.aws, standalone=True),
                           worker_log_level=logging.WARNING)
    manager.start()
    # The cycle's two calls to the services, timed where the manager makes them (wrapped, not changed): what of
    # its wall time is waiting for the emulator.
    waits: dict[str, float] = {}

    def timed(name, call):
        def run(*args, **kwargs):
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                waits[name] = waits.get(name, 0.0) + time.perf_counter() - began
        return run

    manager.table.scan = timed("scan", manager.table.scan)
    manager._list_shards = timed("list", manager._list_shards)
    stop = threading.Event()
    stop_on_signals(stop)
    while not stop.is_set():
        began, cpu = time.perf_counter(), time.thread_time()
        report = manager.run_cycle()
        took, cpu = time.perf_counter() - began, time.thread_time() - cpu
        processes = getattr(manager, "worker_processes", None)
        method = processes.start_method if processes is not None else None
        parts = dict(waits)
        waits.clear()
        print(json.dumps({"at": time.time(), "scan_s": parts.get("scan", 0.0), "list_s": parts.get("list", 0.0),
                          "code": os.path.dirname(os.path.dirname(kcl_pipeline.__file__)),
                          "cycle_s": took, "cycle_cpu_s": cpu, "spawned": len(report.spawned),
                          "pids": sorted(p.pid for p in manager.workers.values()),
                          "method": method.method if method else ("spawn" if processes is None else None)}),
              flush=True)
        stop.wait(config.cycle_seconds)
    manager.shutdown(timeout=60)


# -- the parent ---------------------------------------------------------------------------------------------------

@dataclass
class Consumer:
    proc: subprocess.Popen
    cycles: list[dict] = field(default_factory=list)

    def read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.cycles.append(json.loads(line))
            except ValueError:
                sys.stderr.write(line)

    @property
    def pids(self) -> list[int]:
        return self.cycles[-1]["pids"] if self.cycles else []


def start_consumer(settings: dict, env: dict) -> Consumer:
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); import bench_memory; bench_memory.consumer_main()"
    # In benchmarks/: `-c` puts the working directory first on sys.path, and the code must come from PYTHONPATH.
    proc = subprocess.Popen([sys.executable, "-c", code, str(HERE), json.dumps(settings)], env=env, cwd=HERE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    consumer = Consumer(proc)
    threading.Thread(target=consumer.read, daemon=True).start()
    return consumer


def stop_consumer(consumer: Consumer) -> None:
    if consumer.proc.poll() is None:
        consumer.proc.send_signal(signal.SIGTERM)
        try:
            consumer.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(consumer.proc.pid, signal.SIGKILL)
            consumer.proc.wait()


def tree(root: int) -> list[int]:
    """root and its descendants (by /proc/<pid>/stat's ppid); none when root is gone."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    if root not in parents:
        return []
    found, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in found]
        found.update(frontier)
    return sorted(found)


def vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Samples:
    worker_pss: list[float] = field(default_factory=list)  # mean per worker, each sample
    worker_uss: list[float] = field(default_factory=list)
    worker_pss_max: list[float] = field(default_factory=list)
    worker_uss_max: list[float] = field(default_factory=list)
    worker_rss_max: list[float] = field(default_factory=list)
    host_pss: list[float] = field(default_factory=list)

    def take(self, consumer: Consumer) -> None:
        from kcl_pipeline.kcl.shells.workers.memory import measure

        workers = measure(consumer.pids)
        host = measure(tree(consumer.proc.pid))
        if not workers.count:
            return
        self.worker_pss.append(workers.pss_sum / workers.count / MiB)
        self.worker_uss.append(workers.uss_sum / workers.count / MiB)
        self.worker_pss_max.append(workers.pss_max / MiB)
        self.worker_uss_max.append(workers.uss_max / MiB)
        self.worker_rss_max.append(workers.rss_max / MiB)
        self.host_pss.append(host.pss_sum / MiB)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Stream:
    """An N-shard stream on moto, with a trickle and a backlog aimed at each shard by its starting hash key."""

    def __init__(self, kinesis, name: str, shards: int):
        from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active

        self.kinesis, self.name = kinesis, name
        kinesis.create_stream(StreamName=name, ShardCount=shards)
        wait_stream_active(kinesis, name)
        self.shards = {s.shard_id: s.hash_key_range.starting_hash_key for s in list_shards(kinesis, name)}
        self.last: dict[str, str] = {}
        self._trickle = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle_loop, daemon=True)
        self._thread.start()

    def put(self, records: list[tuple[str, bytes]]) -> None:
        """(shard id, data) in PutRecords calls of at most 500 records and 4.5 MB."""
        batch: list[dict] = []
        size = 0
        for shard, data in records + [("", b"")]:
            if batch and (not shard or len(batch) == 500 or size + len(data) > 4_500_000):
                resp = self.kinesis.put_records(StreamName=self.name, Records=batch)
                if resp.get("FailedRecordCount"):
                    raise RuntimeError(f"moto refused {resp['FailedRecordCount']} records")
                for sent, got in zip(batch, resp["Records"], strict=True):
                    self.last[sent["ExplicitHashKey"]] = got["SequenceNumber"]
                batch, size = [], 0
            if shard:
                batch.append({"Data": data, "PartitionKey": "k", "ExplicitHashKey": self.shards[shard]})
                size += len(data)

    def last_sequence(self, shard: str) -> str | None:
        return self.last.get(self.shards[shard])

    def trickle(self, on: bool) -> None:
        (self._trickle.set if on else self._trickle.clear)()

    def _trickle_loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            if self._trickle.is_set():
                n += 1
                self.put([(shard, payload(n, i)) for i, shard in enumerate(self.shards)])
            self._stop.wait(1.0)

    def backlog(self, mib: float, aggregates: list[bytes]) -> None:
        per_shard = max(1, int(mib * MiB // (PER_AGGREGATE * RECORD_BYTES)))
        self.put([(shard, aggregates[(i + j) % len(aggregates)]) for j in range(per_shard)
                  for i, shard in enumerate(self.shards)])

    def delete(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.kinesis.delete_stream(StreamName=self.name, EnforceConsumerDeletion=True)


def payload(n: int, i: int) -> bytes:
    head = f'{{"n":{n},"shard":{i},"event":"click","blob":"'.encode()
    return (head + os.urandom((RECORD_BYTES - len(head) - 2) // 2).hex().encode() + b'"}').ljust(RECORD_BYTES)


def make_aggregates(count: int) -> list[bytes]:
    from kcl_pipeline.kcl.records.kpl import aggregate

    return [aggregate([(f"pk-{j}-{k}", None, payload(j, k)) for k in range(PER_AGGREGATE)]) for j in range(count)]


def owned(table, worker_id: str) -> int:
    from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableMissing

    try:
        return sum(1 for lease in table.scan() if lease.lease_owner == worker_id)
    except LeaseTableMissing:  # the consumer has not created it yet
        return 0


def drained(table, stream: Stream) -> bool:
    from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableMissing

    try:
        leases = {lease.lease_key: lease for lease in table.scan()}
    except LeaseTableMissing:  # the consumer has not created it yet
        return False
    for shard in stream.shards:
        last, lease = stream.last_sequence(shard), leases.get(shard)
        if last is not None and (lease is None or lease.checkpoint.sequence_number != last):
            return False
    return True


def wait(predicate, timeout: float, every: float = 1.0, on_tick=None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        if predicate():
            return True
        time.sleep(every)
    return False


def env_for(config: str, env: dict, args) -> dict:
    """The consumer's environment: the --original-tree's code first for "original"."""
    if config != "original":
        return env
    if not args.original_tree:
        raise SystemExit("the original config needs --original-tree DIR (e.g. `git archive <commit>` unpacked)")
    return {**env, "PYTHONPATH": os.pathsep.join([args.original_tree, env["PYTHONPATH"]])}


def run_size(n: int, config: str, args, settings, env: dict, aggregates: list[bytes]) -> dict:
    from kcl_pipeline.kcl.shells.aws import client
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    method, prefetch = CONFIGS[config]
    kinesis = client("kinesis", settings)
    name = f"mem-{n}-{config}-{uuid.uuid4().hex[:6]}"
    stream = Stream(kinesis, name, n)
    zone = tempfile.mkdtemp(prefix="bench-memory-zone-")
    worker_id = f"bench-{uuid.uuid4()}"
    consumer = start_consumer({"stream": name, "application": name, "leases": n, "cycle": args.cycle,
                               "method": method, "prefetch": prefetch, "endpoints": settings.endpoint_urls,
                               "zone": zone, "worker_id": worker_id}, env_for(config, env, args))
    table = LeaseTable(name, client("dynamodb", settings))
    out: dict = {"leases": n, "config": config}
    try:
        stream.trickle(True)
        began = time.monotonic()
        # Ready: every worker has started (imports, clients) and acquired its lease.
        if not wait(lambda: owned(table, worker_id) == n or consumer.proc.poll() is not None, 900):
            raise RuntimeError(f"{config}: {owned(table, worker_id)} of {n} leases acquired after 900 s")
        if consumer.proc.poll() is not None:
            raise RuntimeError(f"{config}: the consumer exited with {consumer.proc.returncode}")
        out["ready_s"] = time.monotonic() - began
        out["method"], out["code"] = consumer.cycles[-1]["method"], consumer.cycles[-1]["code"]
        time.sleep(args.settle)
        idle, first_idle_cycle = Samples(), len(consumer.cycles)
        for _ in range(args.samples):
            idle.take(consumer)
            time.sleep(1.0)
        cycles = [c for c in consumer.cycles[first_idle_cycle:] if not c["spawned"]]
        out.update(idle_pss=median(idle.worker_pss), idle_uss=median(idle.worker_uss),
                   idle_uss_max=max(idle.worker_uss_max), idle_rss_max=max(idle.worker_rss_max),
                   idle_host_pss=median(idle.host_pss), cycle_s=median([c["cycle_s"] for c in cycles]),
                   cycle_scan_s=median([c["scan_s"] for c in cycles]),
                   cycle_list_s=median([c["list_s"] for c in cycles]),
                   load=os.getloadavg()[0],
                   cycle_cpu_s=median([c["cycle_cpu_s"] for c in cycles]), cycles=len(cycles))
        # Backlog: every shard at once, the trickle paused (its last record is where each lease must reach).
        stream.trickle(False)
        time.sleep(1.5)
        backlog = Samples()
        filler = threading.Thread(target=stream.backlog, args=(args.backlog_mib, aggregates))
        began, first_backlog_cycle = time.monotonic(), len(consumer.cycles)
        filler.start()
        done = wait(lambda: not filler.is_alive() and drained(table, stream), args.drain_timeout,
                    on_tick=lambda: backlog.take(consumer))
        filler.join()
        cycles = [c["cycle_s"] for c in consumer.cycles[first_backlog_cycle:] if not c["spawned"]]
        peaks = [vm_hwm(pid) for pid in consumer.pids]
        out.update(backlog_drained=done, backlog_s=time.monotonic() - began,
                   backlog_host_pss=max(backlog.host_pss), backlog_pss_max=max(backlog.worker_pss_max),
                   backlog_uss_max=max(backlog.worker_uss_max), backlog_peak_rss=max(peaks) / MiB,
                   backlog_pss_mean=max(backlog.worker_pss), backlog_cycle_s=median(cycles))
        # Idle again: what a worker keeps after a backlog.
        stream.trickle(True)
        time.sleep(args.settle)
        after = Samples()
        for _ in range(args.samples):
            after.take(consumer)
            time.sleep(1.0)
        out.update(after_pss=median(after.worker_pss), after_uss=median(after.worker_uss),
                   after_host_pss=median(after.host_pss))
    finally:
        stream.trickle(False)
        stop_consumer(consumer)
        if "after_pss" in out:
            out.update(round_trips(table, kinesis, name))
        stream.delete()
        shutil.rmtree(zone, ignore_errors=True)
    return out


def round_trips(table, kinesis, stream: str) -> dict:
    """The two calls of every cycle, timed with the consumer stopped (moto otherwise idle): the table's scan and
    the shard listing grow with the leases on moto (it serves both item by item, in Python); on AWS each is
    one round trip at these sizes."""
    from kcl_pipeline.kcl.shells.shards import list_shards

    scans, lists = [], []
    for _ in range(5):
        began = time.perf_counter()
        table.scan()
        scans.append(time.perf_counter() - began)
        began = time.perf_counter()
        list_shards(kinesis, stream)
        lists.append(time.perf_counter() - began)
    return {"moto_scan_s": median(scans), "moto_list_s": median(lists)}


def run_single(config: str, args, settings, env: dict) -> dict:
    """One worker drains --single-records 1 KB records (KPL aggregates): its peak RSS (VmHWM)."""
    from kcl_pipeline.kcl.shells.aws import client
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    method, prefetch = CONFIGS[config]
    kinesis = client("kinesis", settings)
    name = f"mem-single-{config}-{uuid.uuid4().hex[:6]}"
    stream = Stream(kinesis, name, 1)
    aggregates = make_aggregates(64)
    stream.backlog(args.single_records * RECORD_BYTES / MiB, aggregates)
    zone = tempfile.mkdtemp(prefix="bench-memory-zone-")
    consumer = start_consumer({"stream": name, "application": name, "leases": 1, "cycle": args.cycle,
                               "method": method, "prefetch": prefetch, "endpoints": settings.endpoint_urls,
                               "zone": zone, "worker_id": f"bench-{uuid.uuid4()}"}, env_for(config, env, args))
    table = LeaseTable(name, client("dynamodb", settings))
    peak = [0]
    try:
        began = time.monotonic()
        done = wait(lambda: drained(table, stream), args.drain_timeout,
                    on_tick=lambda: peak.__setitem__(0, max([peak[0], *(vm_hwm(p) for p in consumer.pids)])))
        return {"config": config, "records": args.single_records, "drained": done, "s": time.monotonic() - began,
                "peak_rss": peak[0] / MiB}
    finally:
        stop_consumer(consumer)
        stream.delete()
        shutil.rmtree(zone, ignore_errors=True)


def ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,32,64", help="leases held by the one consumer, one run each")
    parser.add_argument("--configs", default="previous,forkserver")
    parser.add_argument("--backlog-mib", type=float, default=12.0, help="backlog per shard (1 KB records)")
    parser.add_argument("--single-records", type=int, default=100_000, help="0: skip the single-worker backlog")
    parser.add_argument("--single-configs", default="previous,forkserver,forkserver-10MiB")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before the idle samples")
    parser.add_argument("--samples", type=int, default=15, help="idle samples, one a second")
    parser.add_argument("--cycle", type=float, default=2.0, help="the consumer's cycle_seconds")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--emulators", choices=("moto", "local", "mixed"), default="moto",
                        help="moto: one moto server (Kinesis, DynamoDB); local: kinesis-local and dynalite (node); "
                             "mixed: Kinesis on moto, DynamoDB on dynalite (each the faster of the two at its call)")
    parser.add_argument("--dev-extras", action="store_true", help="let numpy and pandas load (default: hidden)")
    parser.add_argument("--original-tree", default=None,
                        help="the code before this change (a `git archive` of its commit), for the config original")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))  # here only: a consumer child imports the code its PYTHONPATH names

    from kcl_pipeline.kcl.aws_settings import AwsSettings
    from kcl_pipeline.local.emulators import EmulatorStack

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    scratch = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    paths = [str(REPO)]
    if not args.dev_extras:
        (scratch / "site").mkdir()
        (scratch / "site" / "sitecustomize.py").write_text(HIDE_DEV_EXTRAS)
        paths.insert(0, str(scratch / "site"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    services = {"moto": ("s3",), "local": ("kinesis", "dynamodb"), "mixed": ("s3", "dynamodb")}[args.emulators]
    stack = EmulatorStack(scratch / "logs", services=services)
    endpoints = stack.start()
    urls = {"kinesis": endpoints.kinesis or endpoints.moto, "dynamodb": endpoints.dynamodb or endpoints.moto}
    settings = AwsSettings(region=REGION, endpoint_urls=urls)
    print(f"{args.emulators}: {urls}; {os.cpu_count()} cores, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {'dev extras' if args.dev_extras else 'core install'}; "
          f"backlog {args.backlog_mib:g} MiB per shard; MiB", flush=True)
    results: list[dict] = []
    singles: list[dict] = []
    try:
        aggregates = make_aggregates(64)
        for n in [int(x) for x in args.sizes.split(",") if x]:
            for config in args.configs.split(","):
                r = run_size(n, config, args, settings, env, aggregates)
                results.append(r)
                print(json.dumps(r), flush=True)
        if args.single_records:
            for config in args.single_configs.split(","):
                r = run_single(config, args, settings, env)
                singles.append(r)
                print(json.dumps(r), flush=True)
    finally:
        stack.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(results, singles, args)


def report(results: list[dict], singles: list[dict], args) -> None:
    by = {(r["leases"], r["config"]): r for r in results}
    configs = args.configs.split(",")
    print()
    print("| leases | config | ready s | idle PSS/lease | idle USS/lease | idle host PSS | cycle s (idle) | "
          "cycle CPU s | backlog PSS max/lease | backlog peak RSS | backlog host PSS | cycle s (backlog) | "
          "after backlog USS/lease |")
    print("|" + "---|" * 13)
    for (n, config), r in by.items():
        print(f"| {n} | {config} ({r['method']}) | {r['ready_s']:.0f} | {r['idle_pss']:.1f} | {r['idle_uss']:.1f} | "
              f"{r['idle_host_pss']:.0f} | {r['cycle_s']:.3f} | {r['cycle_cpu_s']:.3f} | {r['backlog_pss_max']:.1f} | "
              f"{r['backlog_peak_rss']:.0f} | {r['backlog_host_pss']:.0f} | {r['backlog_cycle_s']:.3f} | "
              f"{r['after_uss']:.1f} |")
    old = "previous" if "previous" in configs else configs[0]
    for new in [c for c in configs if c != old]:
        print(f"\nratios {new} / {old}, same run:")
        for n in sorted({r["leases"] for r in results}):
            a, b = by.get((n, old)), by.get((n, new))
            if a and b:
                print(f"  {n} leases: PSS/lease {ratio(b['idle_pss'], a['idle_pss'])}, USS/lease "
                      f"{ratio(b['idle_uss'], a['idle_uss'])}, host idle "
                      f"{ratio(b['idle_host_pss'], a['idle_host_pss'])}, host backlog "
                      f"{ratio(b['backlog_host_pss'], a['backlog_host_pss'])}, cycle "
                      f"{ratio(b['cycle_s'], a['cycle_s'])}")
    print("\nthe idle cycle's wall time, of which waiting for the scan and the shard listing (median), load average:")
    for (n, config), r in by.items():
        print(f"  {n} leases ({config}): cycle {r['cycle_s']:.3f} s = scan {r['cycle_scan_s']:.3f} + list "
              f"{r['cycle_list_s']:.3f} + rest {r['cycle_s'] - r['cycle_scan_s'] - r['cycle_list_s']:.3f} s; "
              f"CPU {r['cycle_cpu_s'] * 1000:.0f} ms; load {r['load']:.1f}")
    print("\nthe emulator alone (consumer stopped), the cycle's scan and shard listing:")
    for (n, config), r in by.items():
        if "moto_scan_s" in r:
            print(f"  {n} leases ({config}): scan {r['moto_scan_s']:.3f} s, list shards {r['moto_list_s']:.3f} s")
    print("\nthe largest size against the smallest, each config:")
    for config in configs:
        sizes = sorted(n for (n, c) in by if c == config)
        if len(sizes) >= 2:
            first, last = by[(sizes[0], config)], by[(sizes[-1], config)]
            print(f"  {config}, {sizes[-1]} vs {sizes[0]} leases: PSS/lease "
                  f"{ratio(last['idle_pss'], first['idle_pss'])}, cycle {ratio(last['cycle_s'], first['cycle_s'])}"
                  f" (idle; its CPU {ratio(last['cycle_cpu_s'], first['cycle_cpu_s'])}), "
                  f"{ratio(last['backlog_cycle_s'], first['backlog_cycle_s'])} (backlog)")
    for s in singles:
        print(f"single worker, {s['records']:,} records backlog, {s['config']}: peak RSS {s['peak_rss']:.0f} MiB "
              f"(drained in {s['s']:.0f} s{'' if s['drained'] else ', NOT drained'})")


if __name__ == "__main__":
    main()
