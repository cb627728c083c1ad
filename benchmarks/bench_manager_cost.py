"""The lease manager's cost per cycle, counted in what it controls: requests and its own CPU.

The shipped manager (`LeaseManager` over production's `Processes` transport: its real clients, its cycle of
kcl/core/fleet/cycle.py and planner.py) runs against kinesis-local and dynalite over HTTP on 127.0.0.1, holding
every lease of an N-shard stream (8, 64, 256 by default). No worker process runs: a worker's cost is its own
process's, not the manager's, and spawning N of them would put N processes' polls on the same two cores as the
cycle being measured. The transport's `start_worker` is the one thing replaced: it hands back a stand-in that
stays alive, and the benchmark does what the lease's worker would do to the table, with a client of its own
that is not counted — it takes the lease after the cycle that spawned it, and renews it (with a checkpoint
and a throughput, as a worker's heartbeat carries them) before every measured cycle, so that each scan sees
every counter moved, as a live fleet's does.

The manager's clock is a virtual one that advances one `cycle_seconds` (20 s, the default) per cycle, so the
once-a-minute reads (KCL 3.x's coordinator state) come as often as at the default cadence; the cycles run back
to back in wall time.

Per cycle:
  * requests, by operation, from the call log every AWS client of the package writes
    (KCL_PIPELINE_AWS_CALL_LOG, kcl/shells/aws.py's `instrument`: one line per API call, so one per page of
    a paginated scan or listing; botocore's retries of a call are not lines), the manager's clients only;
  * the manager's own CPU: `time.thread_time()` around `run_cycle` — every request is sent on that thread
    (transport.Blocking), so this is its decoding, deciding and botocore's signing, serialising and parsing;
    not the emulator's;
  * wall time, which is the emulators' (kinesis-local's ListShards, dynalite's scan): reported beside, labelled.

Ratios are against the 8-lease size measured in the same run. Peer, same run: the same manager with its scans'
items decoded by botocore's parser (the package's JSON decoding of them switched off: the code before it), its
cycles alternating with the shipped ones (`--no-peer` skips it). The lease count at which DynamoDB's 1 MB scan
page forces a second page is computed from the measured items' sizes (DynamoDB's item-size rules), labelled
computed.

    .venv/bin/python benchmarks/bench_manager_cost.py [--leases 8,64,256] [--cycles 10] [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.aws_settings import AWS_CALL_LOG_ENV, AwsSettings  # noqa: E402
from kcl_pipeline.kcl.config import ConsumerConfig  # noqa: E402
from kcl_pipeline.kcl.core.lease import effects as fx  # noqa: E402
from kcl_pipeline.kcl.core.model import Checkpoint  # noqa: E402
from kcl_pipeline.kcl.shells.aws import ITEM_PAGES, ITEMS_FROM_JSON_HOOK, client, decode_items_from_json  # noqa: E402
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager, Processes  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.kcl.shells.shards import wait_stream_active  # noqa: E402
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec  # noqa: E402

SEQUENCE = 49590338271490256608559692538361571095921575989136588898  # a realistic 56-digit sequence number
DYNAMODB_PAGE_BYTES = 1024 * 1024  # a Scan page holds at most 1 MB of items
KINESIS_PAGE_SHARDS = 1000  # ListShards' page on Kinesis (its default and largest MaxResults)
EMULATOR_PAGE_SHARDS = 100  # kinesis-local's page, whatever MaxResults asks (kcl_pipeline_tests/kcl/test_shards.py)
WORKER_ID = "bench-manager"


class StandIn:
    """A lease's worker as the manager sees it, without a process: alive until stopped."""

    pid = None

    def __init__(self) -> None:
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.exitcode = 0

    def kill(self) -> None:
        self.exitcode = -9

    def join(self, timeout: float | None = None) -> None:
        pass


class StandInWorkers(Processes):
    """Production's transport, its clients and queue included, with workers replaced by stand-ins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spawned: list[fx.Spawn] = []

    def start_worker(self, spawn: fx.Spawn) -> StandIn:
        self.spawned.append(spawn)
        return StandIn()


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cycle:
    requests: Counter[str]
    cpu_s: float
    wall_s: float


@dataclass
class SizeResult:
    leases: int
    items_by: str = "json"  # who decodes the scan's items: "json" (shipped) or "botocore" (the peer)
    cycles: list[Cycle] = field(default_factory=list)
    item_bytes: list[int] = field(default_factory=list)  # each lease item's size by DynamoDB's rules

    def requests_per_cycle(self) -> dict[str, float]:
        """Mean requests per cycle, by operation."""
        total: Counter[str] = Counter()
        for cycle in self.cycles:
            total.update(cycle.requests)
        return {op: n / len(self.cycles) for op, n in sorted(total.items())}

    def median_cpu_s(self) -> float:
        return statistics.median(c.cpu_s for c in self.cycles)

    def min_cpu_s(self) -> float:
        """The floor: the cycle least disturbed by other work on the host."""
        return min(c.cpu_s for c in self.cycles)

    def median_wall_s(self) -> float:
        return statistics.median(c.wall_s for c in self.cycles)


def attribute_bytes(value: dict[str, Any]) -> int:
    """An attribute value's size by DynamoDB's rules (strings and binaries their length, numbers about one byte
    per two digits plus one, containers 3 bytes plus their elements)."""
    (kind, v), = value.items()
    if kind == "S":
        return len(v.encode())
    if kind == "B":
        return len(v)
    if kind == "N":
        digits = Decimal(v).normalize().as_tuple().digits
        return (len(digits) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(attribute_bytes({kind[0]: e}) for e in v)
    if kind == "L":
        return 3 + sum(1 + attribute_bytes(e) for e in v)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + attribute_bytes(e) for k, e in v.items())
    raise ValueError(f"unknown DynamoDB type {kind}")


def item_bytes(item: dict[str, dict[str, Any]]) -> int:
    return sum(len(name.encode()) + attribute_bytes(value) for name, value in item.items())


class CallLog:
    """The lines the package's clients append to KCL_PIPELINE_AWS_CALL_LOG, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_calls(self) -> Counter[str]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line is one write: whole, but read only once it ended
        self.offset += end
        return Counter(json.loads(line)["call"] for line in data[:end].splitlines() if line)


def measure(settings: AwsSettings, leases: int, cycles: int, work_dir: Path, *, cycle_seconds: float = 20.0,
            name: str | None = None, peer: bool = False) -> tuple[SizeResult, SizeResult | None]:
    """The manager holding every lease of a fresh `leases`-shard stream: `cycles` measured cycles after two
    (creating and taking the leases, then the first steady one) that are not. With `peer`, as many again,
    alternating with them, of the peer: the scan's items decoded by botocore's parser (the client's hook off),
    as before; alternating cycle by cycle, both meet the same load."""
    name = name or f"bench-cost-{leases}-{time.time_ns()}"
    kinesis = client("kinesis", settings)
    kinesis.create_stream(StreamName=name, ShardCount=leases)
    wait_stream_active(kinesis, name, timeout=120)
    config = ConsumerConfig(stream=name, application=name, worker_id=WORKER_ID, max_leases=leases,
                            leases_to_acquire=leases, cycle_seconds=cycle_seconds, aws=settings)
    # The manager's clients write the call log; the stand-in workers' client (made after) does not.
    log_path = work_dir / f"{name}.calls.jsonl"
    log_path.touch()
    before = os.environ.get(AWS_CALL_LOG_ENV)
    os.environ[AWS_CALL_LOG_ENV] = str(log_path)
    try:
        clock = VirtualClock()
        spec = ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink", {"directory": str(work_dir / name)})
        transport = StandInWorkers(config, spec, None, logging.WARNING)
        manager = LeaseManager(config, spec, clock=clock, transport=transport)
    finally:
        if before is None:
            os.environ.pop(AWS_CALL_LOG_ENV, None)
        else:
            os.environ[AWS_CALL_LOG_ENV] = before

    def decode_items_by(who: str) -> None:
        """The shipped decoding of the manager's scans ("json"), or botocore's (its hook off: the peer)."""
        for operation in ITEM_PAGES:
            manager.table.client.meta.events.unregister(f"before-parse.dynamodb.{operation}",
                                                        unique_id=ITEMS_FROM_JSON_HOOK.format(operation=operation))
        if who == "json":
            decode_items_from_json(manager.table.client)

    workers = LeaseTable(config.lease_table, client("dynamodb", settings))
    calls = CallLog(log_path)
    manager.start()
    counters: dict[str, int] = {}

    def take_spawned() -> None:
        """What each spawned lease's worker does first: take the lease."""
        for spawn in transport.spawned:
            lease = spawn.lease
            taken = workers.acquire(lease.lease_key, WORKER_ID, lease.lease_owner, lease.lease_counter)
            if taken is None:
                raise RuntimeError(f"the stand-in worker could not take {lease.lease_key}")
            counters[lease.lease_key] = taken.lease_counter
        transport.spawned.clear()

    def renew(n: int) -> None:
        """What each worker's heartbeat does between two cycles."""
        for key, counter in counters.items():
            if not workers.heartbeat(key, WORKER_ID, counter, checkpoint=Checkpoint(str(SEQUENCE + n)),
                                     throughput_kbps=12.5):
                raise RuntimeError(f"the stand-in worker lost {key}")
            counters[key] = counter + 1

    result, peer_result = SizeResult(leases), SizeResult(leases, "botocore")
    for n in range(cycles * (2 if peer else 1) + 2):
        measured = result if not peer or n % 2 == 0 else peer_result
        decode_items_by(measured.items_by)
        if n:
            renew(n)
            clock.now += cycle_seconds
        calls.new_calls()  # the previous cycle's and anything since: not this cycle's
        began, cpu = time.perf_counter(), time.thread_time()
        report = manager.run_cycle()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - began
        requests = calls.new_calls()
        take_spawned()
        if n >= 2:
            if report.spawned or report.created or report.deleted or len(manager.workers) != leases:
                raise RuntimeError(f"cycle {n} at {leases} leases is not steady: {report.summary()}")
            measured.cycles.append(Cycle(requests, cpu, wall))
    if len(counters) != leases:
        raise RuntimeError(f"{len(counters)} of {leases} leases taken")
    items = workers.client.scan(TableName=config.lease_table, ConsistentRead=True)["Items"]
    result.item_bytes = peer_result.item_bytes = [item_bytes(item) for item in items]
    manager.shutdown(timeout=5)
    kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
    workers.client.delete_table(TableName=config.lease_table)
    return result, peer_result if peer else None


def report(results: list[SizeResult], peers: list[SizeResult] = ()) -> list[str]:
    lines = []
    operations = sorted({op for r in results for op in r.requests_per_cycle()})
    base = results[0]
    lines.append(f"{'leases':>6}  " + "  ".join(f"{op:>22}" for op in operations)
                 + f"  {'all':>5}  {'manager CPU, median (min)':>25}  {'wall (emulators)':>16}")
    for r in results:
        per = r.requests_per_cycle()
        lines.append(f"{r.leases:>6}  " + "  ".join(f"{per.get(op, 0.0):>22.2f}" for op in operations)
                     + f"  {sum(per.values()):>5.2f}  {r.median_cpu_s() * 1000:>14.1f} ms "
                     + f"({r.min_cpu_s() * 1000:.1f} ms)"
                     + f"  {r.median_wall_s() * 1000:>13.1f} ms")
    for r in results[1:]:
        ratio_requests = sum(r.requests_per_cycle().values()) / sum(base.requests_per_cycle().values())
        lines.append(f"{r.leases} vs {base.leases} leases, same run: requests per cycle {ratio_requests:.2f}x, "
                     f"manager CPU per cycle {r.median_cpu_s() / base.median_cpu_s():.2f}x "
                     f"(min {r.min_cpu_s() / base.min_cpu_s():.2f}x); "
                     f"wall time (the emulators', kinesis-local + dynalite) "
                     f"{r.median_wall_s() / base.median_wall_s():.2f}x")
    for r in results:
        per = r.requests_per_cycle()
        pages = -(-r.leases // EMULATOR_PAGE_SHARDS)
        lines.append(f"{r.leases} leases: Scan {per.get('dynamodb:Scan', 0):.2f} a cycle (one page), ListShards "
                     f"{per.get('kinesis:ListShards', 0):.2f} a cycle = {pages} page(s) of kinesis-local's "
                     f"{EMULATOR_PAGE_SHARDS} shards (Kinesis: {-(-r.leases // KINESIS_PAGE_SHARDS)} of 1,000)")
    largest = max(max(r.item_bytes) for r in results)
    lines.append(f"lease items {min(min(r.item_bytes) for r in results)}-{largest} bytes (DynamoDB's size rules): "
                 f"a second Scan page from about {DYNAMODB_PAGE_BYTES // largest} leases (computed from DynamoDB's "
                 f"1 MB page); a second ListShards page from {KINESIS_PAGE_SHARDS + 1} shards on Kinesis")
    by_size = {p.leases: p for p in peers}
    for r in results:
        peer = by_size.get(r.leases)
        if peer is not None:
            lines.append(f"{r.leases} leases, same run: manager CPU per cycle {r.median_cpu_s() * 1000:.1f} ms "
                         f"(min {r.min_cpu_s() * 1000:.1f}) vs {peer.median_cpu_s() * 1000:.1f} ms "
                         f"(min {peer.min_cpu_s() * 1000:.1f}) with botocore decoding the scan's items (the peer): "
                         f"{r.median_cpu_s() / peer.median_cpu_s():.2f}x")
    if len(peers) > 1:
        lines.append(f"the peer, {peers[1].leases} vs {peers[0].leases} leases: manager CPU per cycle "
                     f"{peers[1].median_cpu_s() / peers[0].median_cpu_s():.2f}x "
                     f"(min {peers[1].min_cpu_s() / peers[0].min_cpu_s():.2f}x)")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", default="8,64,256", help="comma-separated lease counts; the first is the peer")
    parser.add_argument("--cycles", type=int, default=10, help="measured cycles per size")
    parser.add_argument("--no-peer", action="store_true",
                        help="skip the peer (cycles with botocore decoding the scan's items, alternating with ours)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.leases.split(",")]
    from kcl_pipeline.local.emulators import EmulatorStack

    work_dir = Path(tempfile.mkdtemp(prefix="bench-manager-cost-"))
    stack = EmulatorStack(work_dir, services=("kinesis", "dynamodb"), shard_limit=max(1000, sum(sizes)))
    endpoints = stack.start()
    os.environ.update(endpoints.env())
    try:
        results, peers = [], []
        for n in sizes:
            shipped, peer = measure(endpoints.aws_settings(), n, args.cycles, work_dir, peer=not args.no_peer)
            results.append(shipped)
            if peer is not None:
                peers.append(peer)
    finally:
        stack.stop()
    for r in results + peers:
        cpu = sorted(c.cpu_s * 1000 for c in r.cycles)
        print(f"{r.leases} leases, items by {r.items_by}: CPU per cycle {', '.join(f'{x:.1f}' for x in cpu)} ms",
              file=sys.stderr)
    print("\n".join(report(results, peers)))


if __name__ == "__main__":
    main()
