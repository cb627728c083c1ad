"""Ours against the real Java KCL 2.7.2, in the same run: lease writes per lease-minute, and failover after kill -9.

The Java side is the test peer (kcl_pipeline_tests/java_peer: the real KCL `Scheduler`, built by Maven), run as a
process against the same local emulators (kinesis-local + dynalite) as `kcl-pipeline consume`.

1. Writes per lease-minute (like bench_lease_writes.py): one fleet per configuration, each on its own 4-shard stream
   and lease table, with a producer keeping records flowing, and its own counting proxy (kcl_pipeline_tests/
   fault_proxy.py) in front of dynalite: every DynamoDB request the fleet makes goes through it. Once every lease is
   held (and a settle), requests are counted for --measure-seconds. UpdateItems are told apart by what they set:
   `checkpoint` (a checkpoint; ours carry theirs on the renewal), `leaseOwner` (a take or release), else a renewal.
   The fleets: ours at its defaults (10 s heartbeat / 30 s expiry) and at --java-compatible (3 s / 10 s), Java at
   its default failoverTimeMillis 10000 (like for like with --java-compatible: same expiry) and at 30000 (like for
   like with our defaults: same expiry). Java renews every failover / 3 and checkpoints as its application says:
   the peer here checkpoints at most every --java-checkpoint-millis (60000: the KCL sample processor's
   CHECKPOINT_INTERVAL_MILLIS) after a batch with records; those UpdateItems are counted separately.
   All fleets run at once (request counts do not depend on the machine's load).

2. Failover after kill -9 (like bench_failover.py): two members of one kind on a 4-shard stream with records
   flowing; once both hold leases (and a settle of one expiry), the whole process group of one holding leases is
   SIGKILLed, and the clock runs until the survivor (a) owns every orphaned lease in the table and (b) has delivered,
   for every orphaned shard, a record put after the kill (read from its output: the Java peer's file, our JSONL
   sink). Like-for-like timings: Java failoverTimeMillis = our --lease-expiry-seconds × 1000 (10 s), Java's lease
   taker at its real cadence (every 2 × (failover + 25 ms) = 20.05 s); ours at --java-compatible timings with a
   20 s cycle, as bench_failover.py. Results in multiples of the expiry. Trials of both kinds run at once.

    .venv/bin/python benchmarks/bench_java_peer.py [--measure-seconds 90] [--trials 2] [--peer-build DIR]

Needs `java` (17) and `mvn` (the peer is built into a temporary directory, its jars from the local Maven cache or
Maven Central), or --peer-build pointing at a built kcl-2.7.2 directory (kcl-peer.jar + classpath.txt).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease  # noqa: E402
from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline_tests.fault_proxy import FaultProxy  # noqa: E402
from kcl_pipeline_tests.java.peer_support import (  # noqa: E402
    KCL_VERSIONS,
    KplProducer,
    PeerBuild,
    build_peer,
    digest,
    missing_tools,
)

WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
JAVA_EPSILON_MS = 25


# -- counting, by what a request does ------------------------------------------------------------------------------

def _updated_attributes(body: bytes) -> set[str]:
    try:
        request = json.loads(body)
    except ValueError:
        return set()
    attrs = set(request.get("AttributeUpdates", {}))
    names = request.get("ExpressionAttributeNames", {})
    expression = request.get("UpdateExpression", "")
    for token in re.findall(r"#?[A-Za-z_][A-Za-z0-9_]*", expression):
        if token.upper() not in ("SET", "REMOVE", "ADD", "DELETE", "IF_NOT_EXISTS", "LIST_APPEND"):
            attrs.add(names.get(token, token))
    return attrs


def classify(operation: str, body: bytes) -> str:
    """UpdateItems by what they set: `owner` (a take or a release), `renewal` (the counter alone),
    `renewal+checkpoint` (counter and checkpoint: our heartbeat carrying the checkpoint, or a Java checkpoint, which
    moves the counter too), `checkpoint` (the checkpoint alone)."""
    if operation != "UpdateItem":
        return operation
    attrs = _updated_attributes(body)
    if "leaseOwner" in attrs:
        return "UpdateItem:owner"
    if "checkpoint" in attrs:
        return "UpdateItem:renewal+checkpoint" if "leaseCounter" in attrs else "UpdateItem:checkpoint"
    return "UpdateItem:renewal"


class CountingPolicy:
    """A fault-proxy policy that injects nothing and counts requests by `classify` while `counting` is set."""

    def __init__(self):
        self.counting = False
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, operation: str, body: bytes):
        if self.counting:
            kind = classify(operation, body)
            with self.lock:
                self.counts[kind] += 1
        return None


# -- members of a fleet: ours and the Java peer ---------------------------------------------------------------------

@dataclass
class Member:
    name: str
    kind: str  # "ours" | "java"
    process: subprocess.Popen
    output: Path  # Java: a file; ours: the JSONL sink's directory
    log: Path

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self, timeout: float = 25) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def deliveries(self) -> list[tuple[str, str, int]]:
        """(shard id, payload digest, delivered_at_ms) of every record this member wrote out."""
        files = [self.output] if self.kind == "java" else sorted(self.output.glob("*.jsonl"))
        out = []
        for f in files:
            if not f.exists():
                continue
            for line in f.read_text(errors="replace").splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line torn by kill -9, or still being written
                d = r["sha256"] if self.kind == "java" else digest(base64.b64decode(r["data_base64"]))
                out.append((r["shard_id"], d, int(r["delivered_at_ms"])))
        return out


def start_ours(env: dict, directory: Path, stream: str, app: str, name: str, flags: list[str],
               acquire: int = 4) -> Member:
    out, log = directory / name, directory / f"{name}.log"
    p = subprocess.Popen(
        [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
         "--worker-id", name, "--sink", f"jsonl:{out}", "--leases-to-acquire", str(acquire), *flags],
        env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    return Member(name, "ours", p, out, log)


def start_java(build: PeerBuild, env: dict, directory: Path, stream: str, app: str, name: str, failover_ms: int,
               extra: list[str]) -> Member:
    out, log = directory / f"{name}.jsonl", directory / f"{name}.log"
    args = ["--stream", stream, "--application", app, "--worker-id", name, "--output", str(out),
            "--events", str(directory / f"{name}.events"), "--failover-millis", str(failover_ms),
            "--shutdown-timeout-millis", "5000", *extra]
    env = {k: v for k, v in env.items() if not k.startswith("PEER_")}
    p = subprocess.Popen(build.command(args), env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    return Member(name, "java", p, out, log)


def lease_owners(dynamodb, table: str) -> dict[str, str | None]:
    items, kwargs = [], {"TableName": table, "ConsistentRead": True}
    try:
        while True:
            page = dynamodb.scan(**kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except Exception:  # noqa: BLE001 - the table may not exist yet
        return {}
    return {i["leaseKey"]["S"]: i.get("leaseOwner", {}).get("S") for i in items
            if "leaseKey" in i and i.get("entityType", {}).get("S", "LEASE") == "LEASE"}


class Producer(threading.Thread):
    """Puts `per_tick` plain records every `interval` seconds (random partition keys: every shard gets some)."""

    def __init__(self, kinesis, stream: str, per_tick: int, interval: float):
        super().__init__(daemon=True)
        self.kpl = KplProducer(kinesis, stream)
        self.per_tick, self.interval = per_tick, interval
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.errors = 0

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with self.lock:
                    self.kpl.put(self.per_tick)
            except Exception:  # noqa: BLE001 - a busy emulator: try again next tick
                self.errors += 1
            self.halt.wait(self.interval)

    def mark(self) -> int:
        """The id of the next record put: records with ids >= it were put after this call."""
        with self.lock:
            return self.kpl.next_id


@dataclass
class Context:
    endpoints: object
    build: PeerBuild | None
    directory: Path
    args: argparse.Namespace
    load: list[float] = field(default_factory=list)


def _new_stream(ctx: Context, prefix: str, shards: int) -> tuple[object, object, str]:
    settings = ctx.endpoints.aws_settings()
    kinesis, dynamodb = client("kinesis", settings), client("dynamodb", settings)
    stream = f"{prefix}-{time.time_ns()}"
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_stream_active(kinesis, stream)
    return kinesis, dynamodb, stream


def fill_lease_table(kinesis, dynamodb, stream: str, app: str) -> None:
    """Create the lease table and one ownerless TRIM_HORIZON lease per shard, as a consumer of ours would: a KCL
    2.x worker that finds the table empty waits (~30 s) before it creates them itself; on a filled table it starts
    taking at once. Only the time to be ready changes, no measured figure."""
    table = LeaseTable(app, dynamodb)
    table.ensure_table()
    for shard in list_shards(kinesis, stream):
        hkr = shard.hash_key_range
        table.create(Lease(shard.shard_id, Checkpoint(TRIM_HORIZON), starting_hash_key=hkr and hkr.starting_hash_key,
                           ending_hash_key=hkr and hkr.ending_hash_key))


# -- 1. writes per lease-minute -------------------------------------------------------------------------------------

def measure_writes(ctx: Context, label: str, kind: str, flags: list[str], failover_ms: int = 10000) -> dict:
    a = ctx.args
    kinesis, dynamodb, stream = _new_stream(ctx, f"w-{label}", a.leases)
    app = f"app-{stream}"
    policy = CountingPolicy()
    proxy = FaultProxy(ctx.endpoints.dynamodb, policy=policy).start()
    proxy.counting = False
    producer = Producer(kinesis, stream, per_tick=4 * a.leases, interval=1.0)
    producer.start()
    env = {**os.environ, **ctx.endpoints.env(), "AWS_ENDPOINT_URL_DYNAMODB": proxy.url, "PYTHONUNBUFFERED": "1"}
    directory = ctx.directory / f"w-{label}"
    directory.mkdir()
    members = []
    if kind == "java":
        fill_lease_table(kinesis, dynamodb, stream, app)
    try:
        for i in range(a.workers):
            name = f"{label}-{i}"
            members.append(start_ours(env, directory, stream, app, name, flags) if kind == "ours" else
                           start_java(ctx.build, env, directory, stream, app, name, failover_ms,
                                      ["--checkpoint-interval-millis", str(a.java_checkpoint_millis)]))
        started = time.monotonic()
        while True:
            owners = lease_owners(dynamodb, app)
            if len(owners) == a.leases and all(owners.values()) and \
                    len(set(owners.values())) == min(a.workers, a.leases):
                break
            if time.monotonic() - started > a.ready_timeout:
                raise RuntimeError(f"{label}: leases not all held after {a.ready_timeout:.0f}s: {owners}\n"
                                   + members[0].log.read_text(errors="replace")[-3000:])
            dead = [m.name for m in members if m.process.poll() is not None]
            if dead:
                raise RuntimeError(f"{label}: {dead} exited\n" + members[0].log.read_text(errors="replace")[-3000:])
            time.sleep(1)
        ready = time.monotonic() - started
        time.sleep(a.settle_seconds)
        owners_before = lease_owners(dynamodb, app)
        policy.counting = True
        time.sleep(a.measure_seconds)
        policy.counting = False
        owners_after = lease_owners(dynamodb, app)
    finally:
        producer.halt.set()
        for m in members:
            m.stop()
        proxy.stop()
    counts = dict(sorted(policy.counts.items()))
    minutes = a.leases * a.measure_seconds / 60

    def per(n: float) -> float:
        return round(n / minutes, 2)

    carried = counts.get("UpdateItem:renewal+checkpoint", 0)
    if kind == "ours":  # the checkpoint rides on the heartbeat: those are renewals
        renewals, checkpoints = counts.get("UpdateItem:renewal", 0) + carried, counts.get("UpdateItem:checkpoint", 0)
    else:  # Java's renewer writes the counter alone; each checkpoint is a write of its own (counter included)
        renewals, checkpoints = counts.get("UpdateItem:renewal", 0), carried + counts.get("UpdateItem:checkpoint", 0)
        carried = 0
    writes = sum(n for op, n in counts.items() if op.split(":")[0] in WRITES)
    return {"label": label, "kind": kind, "flags": flags, "failover_ms": failover_ms if kind == "java" else None,
            "workers": a.workers, "leases": a.leases, "seconds": a.measure_seconds, "ready_after_s": round(ready),
            "by_operation": counts, "writes_per_lease_minute": per(writes),
            "writes_without_checkpoints_per_lease_minute": per(writes - checkpoints),
            "renewals_per_lease_minute": per(renewals), "renewals_carrying_checkpoint_per_lease_minute": per(carried),
            "checkpoint_writes_per_lease_minute": per(checkpoints),
            "scans_per_lease_minute": per(counts.get("Scan", 0)),
            "owners_changed": owners_before != owners_after, "producer_errors": producer.errors}


# -- 2. failover after kill -9 --------------------------------------------------------------------------------------

def failover_trial(ctx: Context, label: str, kind: str, expiry: float, trial_no: int) -> dict:
    a = ctx.args
    kinesis, dynamodb, stream = _new_stream(ctx, f"f-{label}", a.failover_shards)
    app = f"app-{stream}"
    producer = Producer(kinesis, stream, per_tick=2 * a.failover_shards, interval=0.5)
    producer.start()
    env = {**os.environ, **ctx.endpoints.env(), "PYTHONUNBUFFERED": "1"}
    directory = ctx.directory / f"f-{label}-{trial_no}"
    directory.mkdir()
    names = [f"{label}{trial_no}-{i}" for i in range(2)]
    if kind == "ours":
        flags = ["--heartbeat-seconds", str(a.heartbeat_seconds), "--lease-expiry-seconds", str(expiry),
                 "--cycle-seconds", str(a.cycle_seconds)]
        members = {n: start_ours(env, directory, stream, app, n, flags, acquire=max(1, a.failover_shards // 2))
                   for n in names}
    else:
        fill_lease_table(kinesis, dynamodb, stream, app)
        members = {n: start_java(ctx.build, env, directory, stream, app, n, int(expiry * 1000), [])
                   for n in names}
    try:
        started = time.monotonic()
        while True:
            owners = lease_owners(dynamodb, app)
            if len(owners) == a.failover_shards and all(owners.values()) and set(owners.values()) == set(names):
                break
            if time.monotonic() - started > a.ready_timeout:
                raise RuntimeError(f"{label} trial {trial_no}: did not settle in {a.ready_timeout:.0f}s: {owners}")
            time.sleep(0.5)
        ready = time.monotonic() - started
        time.sleep(expiry + 1)  # every survivor has seen every lease's counter move
        # Where the kill falls in the lease taker's period decides the failover (Java: taken at the second taker run
        # after the kill, 2-4 expiries): trials started together would share one, so each waits a part of that period
        # of its own (stratified: trial i of n somewhere in the i-th n-th of it).
        u = random.Random(f"{a.seed}-{kind}-{trial_no}").random()
        jitter = a.kill_jitter_seconds * (trial_no + u) / a.trials
        time.sleep(jitter)
        owners = lease_owners(dynamodb, app)
        victim = max(names, key=lambda n: (sum(o == n for o in owners.values()), n == names[0]))
        survivor = next(n for n in names if n != victim)
        orphans = {k for k, o in owners.items() if o == victim}
        # A lease key is the shard id (single stream).
        if not orphans:
            raise RuntimeError(f"{label} trial {trial_no}: the victim holds nothing")
        new_from = producer.mark()
        members[victim].kill()
        killed_wall, killed = time.time(), time.monotonic()
        taken_at: float | None = None
        delivered: dict[str, float] = {}
        while True:
            now = time.monotonic()
            if taken_at is None:
                o = lease_owners(dynamodb, app)
                if o and all(o.get(k) == survivor for k in orphans):
                    taken_at = now - killed
            produced = producer.kpl.produced
            for shard, d, at_ms in members[survivor].deliveries():
                if shard in orphans and shard not in delivered and produced.get(d, -1) >= new_from:
                    delivered[shard] = at_ms / 1000 - killed_wall
            if taken_at is not None and set(delivered) >= orphans:
                break
            if now - killed > a.failover_timeout:
                raise RuntimeError(f"{label} trial {trial_no}: no failover in {a.failover_timeout:.0f}s "
                                   f"(taken: {taken_at}, delivered: {delivered}, orphans: {sorted(orphans)})")
            time.sleep(0.2)
    finally:
        producer.halt.set()
        for m in members.values():
            m.stop()
    delivery = max(delivered.values())
    return {"label": label, "kind": kind, "trial": trial_no, "expiry": expiry, "ready_after_s": round(ready),
            "kill_jitter_s": round(jitter, 1),
            "orphans": len(orphans), "taken_s": round(taken_at, 1), "delivered_s": round(delivery, 1),
            "taken_x": round(taken_at / expiry, 2), "delivered_x": round(delivery / expiry, 2)}


# -- the run ---------------------------------------------------------------------------------------------------------

class LoadSampler(threading.Thread):
    def __init__(self, into: list[float]):
        super().__init__(daemon=True)
        self.into, self.halt = into, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.into.append(os.getloadavg()[0])
            self.halt.wait(10)


def _run_all(jobs: list, parallel: bool) -> list:
    if not parallel:
        return [f() for f in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [f.result() for f in [pool.submit(j) for j in jobs]]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-build", type=Path, help="a built peer directory (kcl-peer.jar + classpath.txt) "
                    "[default: build KCL 2.7.2 with Maven into a temporary directory]")
    ap.add_argument("--skip", choices=["writes", "failover"], action="append", default=[],
                    help="leave a part out (repeatable)")
    ap.add_argument("--sequential", action="store_true",
                    help="one fleet at a time (lower load, about 3x longer) [default: the fleets of a part at once]")
    w = ap.add_argument_group("writes per lease-minute")
    w.add_argument("--leases", type=int, default=4, help="shards, hence leases, per fleet [4]")
    w.add_argument("--workers", type=int, default=1, help="members per fleet [1: one holds every lease]")
    w.add_argument("--settle-seconds", type=float, default=10, help="after every lease is held [10]")
    w.add_argument("--measure-seconds", type=float, default=90, help="counted interval [90]")
    w.add_argument("--java-checkpoint-millis", type=int, default=60000,
                   help="the Java peer checkpoints at most this often, after a batch with records [60000, the KCL "
                        "sample's CHECKPOINT_INTERVAL_MILLIS; 0: after every batch]")
    f = ap.add_argument_group("failover after kill -9")
    f.add_argument("--trials", type=int, default=3, help="per kind, all at once [3]")
    f.add_argument("--failover-shards", type=int, default=4, help="[4]")
    f.add_argument("--expiry-seconds", type=float, default=10.0,
                   help="ours: --lease-expiry-seconds; Java: failoverTimeMillis / 1000 [10]")
    f.add_argument("--heartbeat-seconds", type=float, default=3.0, help="ours [3, as --java-compatible]")
    f.add_argument("--cycle-seconds", type=float, default=20.0, help="ours [20, as bench_failover.py]")
    f.add_argument("--kill-jitter-seconds", type=float, default=20.05,
                   help="trial i of n kills after a random wait in the i-th n-th of 0..this, so trials sample "
                        "where the kill falls in the takers' periods [20.05: one Java taker period at 10 s]")
    f.add_argument("--seed", type=int, default=1, help="of the kill jitter [1]")
    f.add_argument("--failover-timeout", type=float, default=150.0, help="[150]")
    ap.add_argument("--ready-timeout", type=float, default=180.0, help="for a fleet to hold every lease [180]")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    t0 = time.monotonic()
    loads: list[float] = []
    sampler = LoadSampler(loads)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="bench-java-") as tmp:
        tmp = Path(tmp)
        if args.peer_build:
            build = PeerBuild(KCL_VERSIONS["kcl2"], args.peer_build)
        else:
            reason = missing_tools()
            if reason:
                sys.exit(reason)
            b0 = time.monotonic()
            build = build_peer("kcl2", tmp / "peer")
            print(f"# built the Java peer (KCL {build.kcl_version}) in {time.monotonic() - b0:.0f}s", flush=True)
        logs = tmp / "emulators"
        logs.mkdir()
        runs = tmp / "runs"
        runs.mkdir()
        with EmulatorStack(str(logs), services=("kinesis", "dynamodb")) as endpoints:
            ctx = Context(endpoints, build, runs, args)
            writes: list[dict] = []
            failovers: list[dict] = []
            if "writes" not in args.skip:
                p0 = time.monotonic()
                writes = _run_all([
                    lambda: measure_writes(ctx, "ours-defaults", "ours", []),
                    lambda: measure_writes(ctx, "ours-java-compatible", "ours", ["--java-compatible"]),
                    lambda: measure_writes(ctx, "java-10s", "java", [], failover_ms=10000),
                    lambda: measure_writes(ctx, "java-30s", "java", [], failover_ms=30000),
                ], not args.sequential)
                for r in writes:
                    print(json.dumps(r), flush=True)
                print(f"# writes: {time.monotonic() - p0:.0f}s, load average {min(loads):.1f}-{max(loads):.1f}",
                      flush=True)
            if "failover" not in args.skip:
                p0, n0 = time.monotonic(), len(loads)
                jobs = []
                for i in range(args.trials):
                    jobs.append(lambda i=i: failover_trial(ctx, "java", "java", args.expiry_seconds, i))
                    jobs.append(lambda i=i: failover_trial(ctx, "ours", "ours", args.expiry_seconds, i))
                failovers = _run_all(jobs, not args.sequential)
                for r in failovers:
                    print(json.dumps(r), flush=True)
                part = loads[n0:] or loads
                print(f"# failover: {time.monotonic() - p0:.0f}s, load average {min(part):.1f}-{max(part):.1f}",
                      flush=True)
    sampler.halt.set()
    print(f"# KCL {build.kcl_version} (the real Java KCL, test peer); total {time.monotonic() - t0:.0f}s; "
          f"load average {min(loads):.1f}-{max(loads):.1f} (1-min, sampled every 10 s)")
    if writes:
        by = {r["label"]: r for r in writes}
        for ours, java in (("ours-java-compatible", "java-10s"), ("ours-defaults", "java-30s")):
            o, j = by[ours], by[java]
            ow, jw = o["writes_per_lease_minute"], j["writes_per_lease_minute"]
            print(f"writes/lease-minute at the same expiry: {ours} {ow} (renewals {o['renewals_per_lease_minute']}, "
                  f"{o['renewals_carrying_checkpoint_per_lease_minute']} of them carrying the checkpoint; checkpoint "
                  f"writes of their own {o['checkpoint_writes_per_lease_minute']}) vs {java} {jw} (renewals "
                  f"{j['renewals_per_lease_minute']} + checkpoint writes {j['checkpoint_writes_per_lease_minute']}, "
                  f"at most every {args.java_checkpoint_millis} ms); ours/Java: all writes {_ratio(ow, jw)}, vs "
                  f"Java's renewals alone {_ratio(ow, j['renewals_per_lease_minute'])}; Scans "
                  f"{o['scans_per_lease_minute']} vs {j['scans_per_lease_minute']}")
        o, j = by["ours-defaults"], by["java-10s"]
        print(f"defaults vs defaults: ours {o['writes_per_lease_minute']} vs Java 2.7.2 (failover 10 s) "
              f"{j['writes_per_lease_minute']} -> {_ratio(o['writes_per_lease_minute'], j['writes_per_lease_minute'])}"
              f" (vs Java's renewals alone {_ratio(o['writes_per_lease_minute'], j['renewals_per_lease_minute'])}); "
              f"goal <= 6.5: {'met' if o['writes_per_lease_minute'] <= 6.5 else 'MISSED'}")
    if failovers:
        for metric in ("taken_x", "delivered_x"):
            ours = [r[metric] for r in failovers if r["kind"] == "ours"]
            java = [r[metric] for r in failovers if r["kind"] == "java"]
            print(f"failover after kill -9, {metric} (multiples of the {args.expiry_seconds:g} s expiry): ours {ours} "
                  f"(median {statistics.median(ours):.2f}) vs Java 2.7.2 {java} (median {statistics.median(java):.2f})"
                  f" -> ours/Java {_ratio(statistics.median(ours), statistics.median(java))}; goal ours <= Java: "
                  f"{'met' if statistics.median(ours) <= statistics.median(java) else 'NOT met'}")


if __name__ == "__main__":
    main()
