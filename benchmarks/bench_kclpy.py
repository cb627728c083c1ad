"""kclpy side by side: the official Python interface (amazon-kclpy: Java KCL's MultiLangDaemon and one Python
record processor per shard) against `kcl-pipeline consume`, on the same stream of the same local emulators
(kinesis-local + dynalite), in the same run.

    .venv/bin/python benchmarks/bench_kclpy.py [--shards 4] [--records 48000] [--skip-failover]

Both sides do the same work: read a KPL-aggregated stream by polling GetRecords from TRIM_HORIZON, deaggregate
(the MultiLangDaemon's KCL deaggregates for the kclpy processor; ours deaggregates in its lease worker), land
every user record as Parquet in a local directory (the same 8 columns, zstd; a batch is written to a temporary
file, fsynced and renamed) and checkpoint after each landed batch (the kclpy processor with the retry loop of
kclpy's sample app). Parquet on both sides, not the jsonl sink: the work kclpy's users do (and the issue names)
is appending Parquet with pyarrow, and our jsonl sink fsyncs each shard's file per delivery, which is not what
a kclpy processor would do. Ours lands through its exactly-once landing (`--landing DIR`): a put-if-absent link
claimed before each batch and a listing of the shard's minute — work the kclpy processor does not do, so the
comparison leans against us. Batches flush at --batch-mb or after --batch-seconds on both sides.

Measured per side (one side at a time, each on its own lease table and output directory):

1. throughput: the stream holds --records user records (--record-bytes each, --aggregate per KPL aggregate,
   put once before either side starts); a consumer starts from TRIM_HORIZON; the clock and the CPU counters
   start when its lease table shows every shard owned, and stop when every record is landed (rows counted in
   the Parquet footers). records/s; CPU-seconds per million records, summed over every process of the side
   (utime+stime from /proc/<pid>/stat, children included: the JVM daemon and its Python processors; our
   manager, forkserver, resource tracker and lease workers); memory per shard: PSS (/proc/<pid>/smaps_rollup)
   summed over the side's process tree every 0.5 s while it drains, once every shard has landed a batch (every
   processor is up), divided by the shards (median and max);
   the whole run's CPU from process start (JVM start-up, KCL's table creation) beside it.
2. take-over: a fresh application from LATEST while a trickle of records runs; instance A starts, then a
   second instance B of the same kind; once B has run --failover-wait seconds, A's whole process group is
   SIGKILLed, and the clock runs until each shard A held has landed a batch again (B, the only one left,
   wrote it). Both at a 10 s lease expiry: KCL's failoverTimeMillis default (10000) and ours with
   --java-compatible (heartbeat 3 s, expiry 10 s).

kclpy is installed on first use into its own venv under ~/.cache/kcl_pipeline/bench_kclpy (not into
requirements.lock: it is a peer, not a dependency), and the MultiLangDaemon's jars into the Maven cache
(~/.m2) with `mvn dependency:build-classpath` over kclpy's own pom.xml; the daemon runs on that classpath. The
version: Maven Central here serves amazon-kinesis-client(-multilang) 3.1.3 but not 3.5.3, which amazon-kclpy
3.2.0's pom names, so the kclpy used is 3.1.3 — its pom names KCL 3.1.3 (and AWS SDK 2.33.0), all served — whose
Python package is byte-identical to 3.2.0's. The daemon needs for the emulators: `kinesisEndpoint` and
`dynamoDBEndpoint` in its properties (both set the SDK clients' endpointOverride), `metricsLevel = NONE` (no
CloudWatch), `retrievalMode = POLLING`, and -Daws.cborEnabled=false; with those, plain http to kinesis-local and
dynalite worked with no further setting. Two emulator gaps are worked around on kclpy's side: its lease
table is created here with KCL 3.x's LeaseOwnerToLeaseKeyIndex (dynalite refuses the UpdateTable KCL adds it
with), and GetRecords asks for --kclpy-max-records 40 (~2 MB of aggregates, as our 2 MiB prefetch) every
--kclpy-idle-ms 200 (our pacing): KCL's default 10,000 made kinesis-local time out on every call.

KCL 3.x assigns leases from one leader (a DynamoDB lock) every 2 × failoverTimeMillis: the instance killed is
the first one started, which is the leader, so its take-over includes the survivor winning the lock. A
kclpy instance takes ~1.5–2 min from start to its first lease here (table creation, a wait, the leader's first
assignment): the default run takes ~10 min, most of it kclpy starting. Ratios are ours / kclpy's, same run.
No figure here is a test.
"""
from __future__ import annotations

import os
import sys
import time

# -- the kclpy record processor (runs in the kclpy venv, one process per shard, started by the daemon) -------------

def processor_main() -> None:
    """A kclpy record processor doing our lease worker's work: land the (already deaggregated) user records as
    Parquet batches in $BENCH_KCLPY_OUT/<shard>/, checkpoint after each landed batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from amazon_kclpy import kcl
    from amazon_kclpy.v3 import processor

    out = os.environ["BENCH_KCLPY_OUT"]
    stream = os.environ["BENCH_KCLPY_STREAM"]
    max_bytes = int(float(os.environ["BENCH_KCLPY_BATCH_MB"]) * 1024 * 1024)
    max_age = float(os.environ["BENCH_KCLPY_BATCH_SECONDS"])
    schema = pa.schema([
        pa.field("stream", pa.string(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("explicit_hash_key", pa.string(), nullable=True),
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
    ])

    class LandingProcessor(processor.RecordProcessorBase):
        def initialize(self, initialize_input):
            self.shard = initialize_input.shard_id
            self.directory = os.path.join(out, self.shard)
            os.makedirs(self.directory, exist_ok=True)
            self.reset()

        def reset(self):
            self.seqs, self.subs, self.keys, self.arrivals, self.data = [], [], [], [], []
            self.size, self.since = 0, None

        def process_records(self, process_records_input):
            for record in process_records_input.records:
                payload = record.binary_data
                self.seqs.append(record.sequence_number)
                self.subs.append(record.sub_sequence_number or 0)
                self.keys.append(record.partition_key)
                self.arrivals.append(record.timestamp_millis)
                self.data.append(payload)
                self.size += len(payload)
            if self.seqs and self.since is None:
                self.since = time.monotonic()
            if self.seqs and (self.size >= max_bytes or time.monotonic() - self.since >= max_age):
                self.land(process_records_input.checkpointer)

        def land(self, checkpointer):
            n = len(self.seqs)
            table = pa.Table.from_arrays([
                pa.array([stream] * n, pa.string()), pa.array([self.shard] * n, pa.string()),
                pa.array(self.seqs, pa.string()), pa.array(self.subs, pa.int64()),
                pa.array(self.keys, pa.string()), pa.nulls(n, pa.string()),
                pa.array(self.arrivals, pa.timestamp("ms", tz="UTC")), pa.array(self.data, pa.binary()),
            ], schema=schema)
            name = f"{self.seqs[0]}_{self.subs[0]}-{self.seqs[-1]}_{self.subs[-1]}.parquet"
            path = os.path.join(self.directory, name)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            last = (self.seqs[-1], self.subs[-1])
            self.reset()
            self.checkpoint(checkpointer, *last)

        def checkpoint(self, checkpointer, sequence_number=None, sub_sequence_number=None):
            # As kclpy's sample app: a few tries, giving up on a shutdown, sleeping on throttling.
            for attempt in range(5):
                try:
                    checkpointer.checkpoint(sequence_number, sub_sequence_number)
                    return
                except kcl.CheckpointError as e:
                    if e.value == "ShutdownException":
                        return
                    sys.stderr.write(f"checkpoint failed ({e.value}), attempt {attempt + 1}\n")
                time.sleep(1)

        def lease_lost(self, lease_lost_input):
            self.reset()  # not ours any more: the next holder re-reads from the checkpoint

        def shard_ended(self, shard_ended_input):
            if self.seqs:
                self.land(shard_ended_input.checkpointer)
            shard_ended_input.checkpointer.checkpoint()

        def shutdown_requested(self, shutdown_requested_input):
            if self.seqs:
                self.land(shutdown_requested_input.checkpointer)

    kcl.KCLProcess(LandingProcessor()).run()


if __name__ == "__main__" and sys.argv[1:2] == ["processor"]:
    processor_main()
    sys.exit(0)


# -- the benchmark ------------------------------------------------------------------------------------------------

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_memory import tree  # noqa: E402 - the process tree, as the memory benchmark walks it

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

MiB = 1024 * 1024
TICK = os.sysconf("SC_CLK_TCK")
KCLPY_VERSION = "3.1.3"  # the newest amazon-kclpy whose pom's jars Maven Central serves here (3.2.0 wants KCL 3.5.3)
DAEMON = "software.amazon.kinesis.multilang.MultiLangDaemon"


def cache_dir() -> Path:
    base = os.environ.get("KCL_PIPELINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kcl_pipeline")
    return Path(base) / "bench_kclpy"


def ensure_kclpy(log) -> tuple[Path, str]:
    """(the kclpy venv's python, the daemon's classpath), installing both on first use."""
    import pyarrow

    root = cache_dir()
    venv = root / f"venv-{KCLPY_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".bench-installed"
    mvn_dir = root / f"mvn-{KCLPY_VERSION}"
    classpath_file = mvn_dir / "classpath.txt"
    want = f"amazon-kclpy=={KCLPY_VERSION} pyarrow=={pyarrow.__version__}"
    if marker.exists() and marker.read_text() == want and classpath_file.exists():
        return python, classpath_file.read_text().strip()
    root.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        log(f"kclpy: creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # kclpy's pom.xml (in its sdist) lists the daemon's jars; Maven resolves them into ~/.m2.
    sdist_dir = root / "sdist"
    sdist = sdist_dir / f"amazon_kclpy-{KCLPY_VERSION}.tar.gz"
    if not sdist.exists():
        log("kclpy: downloading its sdist (for pom.xml)")
        subprocess.run([str(python), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"amazon-kclpy=={KCLPY_VERSION}", "-d", str(sdist_dir)], check=True)
    import tarfile

    with tarfile.open(sdist) as tar:
        pom = tar.extractfile(f"amazon_kclpy-{KCLPY_VERSION}/pom.xml").read().decode()
    # kclpy's pom has no coordinates of its own (setup.py only reads its dependency list): give it some.
    pom = pom.replace("<modelVersion>4.0.0</modelVersion>", "<modelVersion>4.0.0</modelVersion>"
                      "<groupId>bench</groupId><artifactId>kclpy-daemon</artifactId><version>1</version>", 1)
    mvn_dir.mkdir(parents=True, exist_ok=True)
    (mvn_dir / "pom.xml").write_text(pom)
    log("kclpy: resolving the MultiLangDaemon's jars with Maven (into ~/.m2)")
    # Only the jars kclpy lists (its setup.py downloads exactly those, no transitive ones).
    subprocess.run(["mvn", "-B", "-q", "dependency:build-classpath", "-DexcludeTransitive=true",
                    f"-Dmdep.outputFile={classpath_file}"], cwd=mvn_dir, check=True)
    # kclpy's setup.py downloads the same jars again at install (and fails without them): from the Maven cache.
    repo = Path(os.path.expanduser("~/.m2/repository"))
    log(f"kclpy: pip install {want} into {venv}")
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"amazon-kclpy=={KCLPY_VERSION}",
                    f"pyarrow=={pyarrow.__version__}"], check=True,
                   env={**os.environ, "KCL_MVN_REPO_SEARCH_URL": repo.as_uri() + "/"})
    marker.write_text(want)
    return python, classpath_file.read_text().strip()


# -- /proc --------------------------------------------------------------------------------------------------------

def cpu_seconds(pids: list[int]) -> float:
    """utime+stime of each process and of its reaped children (cutime+cstime): a reaped descendant counted
    once, in the parent that waited for it."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])
        except (OSError, IndexError, ValueError):
            continue
    return total / TICK


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


# -- the two sides ------------------------------------------------------------------------------------------------

def our_starter(endpoints, args, extra: list[str]):
    env = {**os.environ, **endpoints.env()}

    def start(stream: str, application: str, worker: str, out: Path, position: str, log: Path):
        cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application",
               application, "--worker-id", worker, "--landing", str(out), "--initial-position", position,
               "--batch-mb", str(args.batch_mb), "--batch-seconds", str(args.batch_seconds),
               "--leases-to-acquire", str(args.shards), *extra]
        return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)
    return start


def precreate_kcl_lease_table(dynamodb, name: str) -> None:
    """KCL 3.x's lease table with its LeaseOwnerToLeaseKeyIndex (leaseOwner HASH, leaseKey RANGE, KEYS_ONLY), made
    here: KCL adds the index to its on-demand table with an UpdateTable that gives the index no
    ProvisionedThroughput, which dynalite refuses ("Value null at
    'globalSecondaryIndexUpdates.1.member.create.provisionedThroughput'"), and KCL retries its initialisation
    forever. Given an existing table whose index is ACTIVE, KCL uses both as they are."""
    throughput = {"ReadCapacityUnits": 1000, "WriteCapacityUnits": 1000}
    dynamodb.create_table(
        TableName=name, KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"},
                              {"AttributeName": "leaseOwner", "AttributeType": "S"}],
        ProvisionedThroughput=throughput,
        GlobalSecondaryIndexes=[{"IndexName": "LeaseOwnerToLeaseKeyIndex",
                                 "KeySchema": [{"AttributeName": "leaseOwner", "KeyType": "HASH"},
                                               {"AttributeName": "leaseKey", "KeyType": "RANGE"}],
                                 "Projection": {"ProjectionType": "KEYS_ONLY"},
                                 "ProvisionedThroughput": throughput}])
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300})


def kclpy_starter(endpoints, args, python: Path, classpath: str, work: Path):
    from kcl_pipeline.kcl.shells.aws import client

    dynamodb = client("dynamodb", endpoints.aws_settings())
    env = {**os.environ, **endpoints.env(), "BENCH_KCLPY_BATCH_MB": str(args.batch_mb),
           "BENCH_KCLPY_BATCH_SECONDS": str(args.batch_seconds)}

    def start(stream: str, application: str, worker: str, out: Path, position: str, log: Path):
        try:
            precreate_kcl_lease_table(dynamodb, application)
        except dynamodb.exceptions.ResourceInUseException:
            pass  # a second instance of the application
        props_dir = work / f"props-{application}-{worker}"
        props_dir.mkdir(parents=True, exist_ok=True)
        props = props_dir / "app.properties"
        props.write_text("\n".join([
            f"executableName = {python} {HERE} processor",
            f"streamName = {stream}",
            f"applicationName = {application}",
            f"workerId = {worker}",
            "AwsCredentialsProvider = DefaultCredentialsProvider",
            "processingLanguage = python/3",
            f"initialPositionInStream = {position.upper()}",
            f"regionName = {endpoints.region}",
            f"kinesisEndpoint = {endpoints.kinesis}",
            f"dynamoDBEndpoint = {endpoints.dynamodb}",
            "metricsLevel = NONE",
            "retrievalMode = POLLING",
            "failoverTimeMillis = 10000",
            "callProcessRecordsEvenForEmptyRecordList = true",
            # Like ours (2 MiB per GetRecords, 0.2 s apart): KCL's default Limit (10,000 records: the whole
            # ~12 MB of a shard here) made kinesis-local answer past the SDK's read timeout, every call.
            f"maxRecords = {args.kclpy_max_records}",
            f"idleTimeBetweenReadsInMillis = {args.kclpy_idle_ms}",
        ]) + "\n")
        cmd = ["java", "-Daws.cborEnabled=false", "-cp", f"{classpath}:{props_dir}", DAEMON,
               "--properties-file", str(props)]
        if os.environ.get("BENCH_KCLPY_LOGBACK"):  # a logback.xml of one's own (e.g. DEBUG for a failing daemon)
            cmd += ["--log-configuration", os.environ["BENCH_KCLPY_LOGBACK"]]
        return subprocess.Popen(cmd, env={**env, "BENCH_KCLPY_OUT": str(out), "BENCH_KCLPY_STREAM": stream},
                                cwd=props_dir, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)
    return start


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group: a daemon's Python processors too
    except ProcessLookupError:
        pass
    proc.wait()


# -- helpers ------------------------------------------------------------------------------------------------------

def owners(dynamodb, table: str) -> dict[str, str | None]:
    """leaseKey -> leaseOwner of a lease table (both sides write Java KCL's attribute names); {} if missing."""
    try:
        items = []
        kwargs: dict = {"TableName": table, "ConsistentRead": True}
        while True:
            page = dynamodb.scan(**kwargs)
            items += page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}
    return {i["leaseKey"]["S"]: (i.get("leaseOwner") or {}).get("S") for i in items
            if i["leaseKey"]["S"].startswith("shardId-")}


class RowCounter:
    """Rows landed under a directory, from the Parquet footers (each file read once)."""

    def __init__(self, root: Path):
        self.root, self.seen, self.rows, self.shards = root, set(), 0, set()

    def count(self) -> int:
        import pyarrow.parquet as pq

        for path in self.root.rglob("*.parquet"):
            if path not in self.seen:
                try:
                    self.rows += pq.read_metadata(path).num_rows
                except Exception:
                    continue  # being renamed into place
                self.seen.add(path)
                self.shards.add(shard_of(path))
        return self.rows


class KplProducer:
    """KPL-faithful aggregates: the user records of one aggregate all hash into the shard it is put to (as the KPL
    packs them). Java KCL drops an aggregate's every user record when one of them hashes outside the shard
    (its deaggregation checks each record against the shard's hash range): aggregates of records with random
    partition keys — what `kcl-pipeline produce --aggregate` puts — reach a kclpy processor as nothing."""

    def __init__(self, kinesis, stream: str, record_bytes: int, aggregate: int):
        from kcl_pipeline.kcl.shells.shards import list_shards

        self.kinesis, self.stream, self.aggregate = kinesis, stream, aggregate
        self.make = payload_maker(record_bytes)
        self.ranges = sorted((int(s.hash_key_range.starting_hash_key), int(s.hash_key_range.ending_hash_key),
                              s.shard_id) for s in list_shards(kinesis, stream))
        self.next_key = 0

    def _keys(self, per_shard: int) -> dict[str, list[str]]:
        import hashlib

        keys: dict[str, list[str]] = {shard: [] for _, _, shard in self.ranges}
        while any(len(v) < per_shard for v in keys.values()):
            key = f"pk-{self.next_key}"
            self.next_key += 1
            h = int.from_bytes(hashlib.md5(key.encode()).digest(), "big")
            shard = next(s for lo, hi, s in self.ranges if lo <= h <= hi)
            if len(keys[shard]) < per_shard:
                keys[shard].append(key)
        return keys

    def put(self, count: int, first_id: int = 0) -> int:
        """About `count` user records, spread evenly over the shards; returns how many were put."""
        from kcl_pipeline.kcl.records.kpl import aggregate

        per_shard = max(1, count // len(self.ranges))
        keys = self._keys(per_shard)
        entries, n = [], first_id
        for shard_keys in keys.values():
            for i in range(0, per_shard, self.aggregate):
                chunk = shard_keys[i:i + self.aggregate]
                entries.append({"Data": aggregate([(k, None, self.make(n + j)) for j, k in enumerate(chunk)]),
                                "PartitionKey": chunk[0]})
                n += len(chunk)
        for i in range(0, len(entries), 60):  # ~50 KB aggregates: under PutRecords' 5 MB
            batch = entries[i:i + 60]
            while batch:
                resp = self.kinesis.put_records(StreamName=self.stream, Records=batch)
                batch = [e for e, r in zip(batch, resp["Records"], strict=True) if "ErrorCode" in r]
        return n - first_id


def shard_of(path: Path) -> str | None:
    return next((p for p in reversed(path.parts) if p.startswith("shardId-")), None)


def payload_maker(size: int):
    def make(n: int) -> bytes:
        head = f'{{"id":{n},"event":"click","blob":"'.encode()
        body = (n * 2654435761 % (1 << 32)).to_bytes(4, "big").hex().encode()
        return (head + body * ((size - len(head) - 2) // len(body) + 1))[:size - 2] + b'"}'
    return make


# -- phase 1: throughput, CPU, memory -----------------------------------------------------------------------------

def throughput(side: str, start, stream: str, args, endpoints, work: Path, log) -> dict:
    from kcl_pipeline.kcl.shells.aws import client

    dynamodb = client("dynamodb", endpoints.aws_settings())
    application = f"tp-{side}-{uuid.uuid4().hex[:6]}"
    out = work / f"out-{application}"
    out.mkdir()
    logfile = work / f"{application}.log"
    began = time.monotonic()
    proc = start(stream, application, "w0", out, "trim_horizon", logfile)
    counter = RowCounter(out)
    samples: list[tuple[bool, int]] = []  # (every shard has landed a batch: all processors up, PSS)
    r: dict = {"side": side}
    try:
        deadline = began + args.timeout
        while True:
            held = owners(dynamodb, application)
            if len(held) == args.shards and all(held.values()):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{side}: leases not held ({held}); exit {proc.poll()}; log {logfile}:\n"
                                   + tail(logfile))
            time.sleep(0.2)
        t0, cpu0 = time.monotonic(), cpu_seconds(tree(proc.pid))
        r["ready_s"] = t0 - began
        last_sample = 0.0
        while counter.count() < args.records:
            now = time.monotonic()
            if now - last_sample >= 0.5:
                samples.append((len(counter.shards) == args.shards, pss_bytes(tree(proc.pid))))
                last_sample = now
            if proc.poll() is not None or now > deadline:
                raise RuntimeError(f"{side}: {counter.rows} of {args.records} rows landed; exit {proc.poll()}; "
                                   f"log {logfile}:\n" + tail(logfile))
            time.sleep(0.2)
        t1, pids = time.monotonic(), tree(proc.pid)
        cpu1 = cpu_seconds(pids)
        steady = [pss for full, pss in samples if full] or [pss for _, pss in samples] or [pss_bytes(pids)]
        r.update(rows=counter.rows, drain_s=t1 - t0, records_per_s=args.records / (t1 - t0),
                 cpu_s=cpu1 - cpu0, cpu_s_per_million=(cpu1 - cpu0) / args.records * 1e6,
                 cpu_s_total=cpu1, processes=len(pids),
                 pss_per_shard_median=statistics.median(steady) / args.shards / MiB,
                 pss_per_shard_max=max(steady) / args.shards / MiB, pss_samples=len(steady),
                 load=os.getloadavg()[0])
    finally:
        stop(proc)
    return r


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- phase 2: take-over after kill -9 -----------------------------------------------------------------------------

def takeover(side: str, start, stream: str, args, endpoints, work: Path, log) -> dict:
    from kcl_pipeline.kcl.shells.aws import client

    settings = endpoints.aws_settings()
    kinesis, dynamodb = client("kinesis", settings), client("dynamodb", settings)
    application = f"fo-{side}-{uuid.uuid4().hex[:6]}"
    out = work / f"out-{application}"
    out.mkdir()
    halt = threading.Event()
    producer = KplProducer(kinesis, stream, args.record_bytes, 4)

    def trickle():  # 4 user records per shard every 0.25 s, one aggregate each
        n = 10_000_000
        while not halt.is_set():
            n += producer.put(4 * args.shards, first_id=n)
            halt.wait(0.25)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    a = start(stream, application, "A", out, "latest", work / f"{application}-A.log")
    b = None
    r: dict = {"side": side}
    try:
        deadline = time.monotonic() + args.timeout
        while sum(1 for o in owners(dynamodb, application).values() if o == "A") < args.shards:
            if a.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{side}: A never held every lease; log:\n" + tail(work / f"{application}-A.log"))
            time.sleep(0.5)
        b = start(stream, application, "B", out, "latest", work / f"{application}-B.log")
        # B waits: running, with a lease of its own once the fleet has balanced (it has then initialised fully).
        while True:
            held = owners(dynamodb, application)
            if "B" in held.values() and "A" in held.values():
                break
            if b.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{side}: B never took a lease beside A ({held}); log:\n"
                                   + tail(work / f"{application}-B.log"))
            time.sleep(0.5)
        time.sleep(args.failover_wait)
        held = owners(dynamodb, application)
        orphans = sorted(k for k, o in held.items() if o == "A")
        r["leases_before_kill"] = {"A": len(orphans), "B": sum(1 for o in held.values() if o == "B")}
        if not orphans:
            raise RuntimeError(f"{side}: A holds nothing to orphan: {held}")
        os.killpg(a.pid, signal.SIGKILL)
        killed_wall, killed = time.time(), time.monotonic()
        a.wait()
        delivered: dict[str, float] = {}
        owned: dict[str, float] = {}
        while len(delivered) < len(orphans):
            now = time.monotonic()
            for path in out.rglob("*.parquet"):
                shard = shard_of(path)
                if shard in orphans and shard not in delivered and path.stat().st_mtime > killed_wall:
                    delivered[shard] = path.stat().st_mtime - killed_wall
            for k, o in owners(dynamodb, application).items():
                if k in orphans and o == "B" and k not in owned:
                    owned[k] = now - killed
            if b.poll() is not None or now - killed > args.failover_timeout:
                raise RuntimeError(f"{side}: only {sorted(delivered)} of {orphans} delivered again after "
                                   f"{now - killed:.0f} s; B log:\n" + tail(work / f"{application}-B.log"))
            time.sleep(0.2)
        r.update(orphans=len(orphans), takeover_s=max(delivered.values()), first_s=min(delivered.values()),
                 lease_taken_s=max(owned.values()) if owned else None, load=os.getloadavg()[0])
    finally:
        halt.set()
        trickler.join(10)
        stop(a)
        if b is not None:
            stop(b)
    return r


# -- main ---------------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--records", type=int, default=24_000, help="user records in the stream (throughput phase)")
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--aggregate", type=int, default=48, help="user records per KPL aggregate (~50 KB)")
    ap.add_argument("--batch-mb", type=float, default=2.0, help="landing batch size, both sides")
    ap.add_argument("--batch-seconds", type=float, default=2.0, help="landing batch age, both sides")
    ap.add_argument("--kclpy-max-records", type=int, default=40,
                    help="kclpy's maxRecords (Kinesis records per GetRecords): 40 aggregates ~ our 2 MiB prefetch")
    ap.add_argument("--kclpy-idle-ms", type=int, default=200, help="kclpy's idleTimeBetweenReadsInMillis (ours: 0.2 s)")
    ap.add_argument("--failover-wait", type=float, default=15.0,
                    help="seconds A and B run side by side, each holding leases, before A is killed")
    ap.add_argument("--failover-timeout", type=float, default=300.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per phase")
    ap.add_argument("--sides", default="kclpy,ours")
    ap.add_argument("--skip-failover", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, landed files)")
    args = ap.parse_args()

    from kcl_pipeline.kcl.shells.aws import client
    from kcl_pipeline.kcl.shells.shards import wait_stream_active
    from kcl_pipeline.local.emulators import EmulatorStack
    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    run_began = time.monotonic()
    python, classpath = ensure_kclpy(log)
    work = Path(tempfile.mkdtemp(prefix="bench-kclpy-"))
    results: dict[str, dict] = {}
    loads = [os.getloadavg()]
    stack = EmulatorStack(work / "emulators", services=("kinesis", "dynamodb"))
    try:
        endpoints = stack.start()
        kinesis = client("kinesis", endpoints.aws_settings())
        stream = f"kclpy-{uuid.uuid4().hex[:6]}"
        kinesis.create_stream(StreamName=stream, ShardCount=args.shards)
        wait_stream_active(kinesis, stream)
        log(f"producing {args.records:,} × {args.record_bytes} B records in aggregates of {args.aggregate}")
        began = time.monotonic()
        put = KplProducer(kinesis, stream, args.record_bytes, args.aggregate).put(args.records)
        if put != args.records:
            raise SystemExit(f"--records must be a multiple of --shards ({put} put)")
        log(f"produced in {time.monotonic() - began:.0f} s")
        starters = {
            "kclpy": kclpy_starter(endpoints, args, python, classpath, work),
            "ours": our_starter(endpoints, args, []),
        }
        failover_starters = {
            "kclpy": starters["kclpy"],
            "ours": our_starter(endpoints, args, ["--java-compatible"]),
        }
        sides = args.sides.split(",")
        for side in sides:
            log(f"{side}: throughput")
            results.setdefault(side, {}).update(throughput(side, starters[side], stream, args, endpoints, work, log))
            loads.append(os.getloadavg())
            log(json.dumps(results[side]))
        if not args.skip_failover:
            for side in sides:
                log(f"{side}: take-over after kill -9")
                results[side]["failover"] = takeover(side, failover_starters[side], stream, args, endpoints,
                                                     work, log)
                loads.append(os.getloadavg())
                log(json.dumps(results[side]["failover"]))
    finally:
        stack.stop()
        if args.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args, loads, time.monotonic() - run_began)


def report(results: dict[str, dict], args, loads, wall: float) -> None:
    print(json.dumps(results))
    print(f"\n{args.shards} shards, {args.records:,} user records of {args.record_bytes} B in KPL aggregates of "
          f"{args.aggregate}; batches {args.batch_mb:g} MB / {args.batch_seconds:g} s; {os.cpu_count()} cores; "
          f"load average during the run {min(x[0] for x in loads):.1f}–{max(x[0] for x in loads):.1f}; "
          f"run {wall:.0f} s")
    print("| side | ready s | drain s | records/s | CPU s / M records | records / CPU-s | PSS / shard median (max) "
          "MiB | processes | take-over s (lease taken s) |")
    print("|" + "---|" * 9)
    for side, r in results.items():
        fo = r.get("failover") or {}
        taken = fo.get("lease_taken_s")
        print(f"| {side} | {r['ready_s']:.1f} | {r['drain_s']:.1f} | {r['records_per_s']:,.0f} | "
              f"{r['cpu_s_per_million']:,.0f} | {1e6 / r['cpu_s_per_million']:,.0f} | "
              f"{r['pss_per_shard_median']:.0f} ({r['pss_per_shard_max']:.0f}) | {r['processes']} | "
              + (f"{fo['takeover_s']:.1f} ({taken:.1f})" if fo else "-") + " |")
    k, o = results.get("kclpy"), results.get("ours")
    if k and o:
        per_cpu = k["cpu_s_per_million"] / o["cpu_s_per_million"]
        mem = o["pss_per_shard_median"] / k["pss_per_shard_median"]
        print(f"\nours / kclpy, same run: records/s {o['records_per_s'] / k['records_per_s']:.2f}×; "
              f"records per CPU-second {per_cpu:.2f}× (goal ≥ 2: {'met' if per_cpu >= 2 else 'NOT met'}); "
              f"PSS per shard {mem:.2f}× (goal ≤ 0.5: {'met' if mem <= 0.5 else 'NOT met'}); max "
              f"{o['pss_per_shard_max'] / k['pss_per_shard_max']:.2f}×")
        if k.get("failover") and o.get("failover"):
            print(f"take-over after kill -9 (both at a 10 s lease expiry): ours {o['failover']['takeover_s']:.1f} s, "
                  f"kclpy {k['failover']['takeover_s']:.1f} s "
                  f"({o['failover']['takeover_s'] / k['failover']['takeover_s']:.2f}×)")


if __name__ == "__main__":
    main()
