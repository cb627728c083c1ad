"""What the Java-peer tests share: the peer's build and process, the project's own producer (KPL aggregates per
shard), and what both kinds of consumer delivered (the Java peer's output file, our JSONL sinks), judged by payload
digest."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from kcl_pipeline.local.producer import ProduceReport, produce
from kcl_pipeline_tests.kcl.fleet_support import json_lines

PEER_DIR = Path(__file__).resolve().parent.parent / "java_peer"
KCL_VERSIONS = {"kcl2": "2.7.2", "kcl3": "3.5.1"}


def missing_tools() -> str | None:
    """Why the Java peer cannot be built here (None: it can)."""
    absent = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    return f"the Java KCL peer needs {' and '.join(absent)} on PATH" if absent else None


@dataclass(frozen=True)
class PeerBuild:
    """One build of the peer: its jar and the resolved dependency classpath (jars in the Maven cache)."""

    kcl_version: str
    directory: Path

    @property
    def classpath(self) -> str:
        deps = (self.directory / "classpath.txt").read_text().strip()
        return f"{self.directory / 'kcl-peer.jar'}{os.pathsep}{deps}"

    def command(self, args: Sequence[str]) -> list[str]:
        return ["java", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Daws.cborEnabled=false",
                "-cp", self.classpath, "kcl_pipeline.peer.Peer", *args]


def build_peer(profile: str, target: Path) -> PeerBuild:
    """`mvn -q -B package -P<profile>` into target/kcl-<version>/ (dependencies from Maven Central into the cache)."""
    version = KCL_VERSIONS[profile]
    done = subprocess.run(["mvn", "-q", "-B", "package", f"-P{profile}", f"-Dpeer.target={target}"],
                          cwd=PEER_DIR, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"building the Java peer (KCL {version}) failed:\n"
                           f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return PeerBuild(version, target / f"kcl-{version}")


@dataclass
class JavaPeer:
    """A running peer: its process (own session), output, events and log files."""

    worker_id: str
    process: subprocess.Popen
    output: Path
    events_path: Path
    log: Path

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the peer shuts the Scheduler down gracefully) and wait; SIGKILL past `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the Java peer {self.worker_id} did not stop within {timeout:.0f}s:\n"
                                 f"{self.log_tail()}") from None

    def kill(self) -> None:
        """kill -9, as a crashed host."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def records(self) -> list[dict]:
        return json_lines(self.output)

    def events(self) -> list[dict]:
        return json_lines(self.events_path)

    def initialized(self, shard_id: str) -> bool:
        return any(e["event"] == "initialize" and e["shard_id"] == shard_id for e in self.events())

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def exceptions(self) -> list[str]:
        """Lines of the log that name an exception or an error (the stack frames left out)."""
        return [line for line in self.log_text().splitlines()
                if ("Exception" in line or " ERROR " in line) and not line.lstrip().startswith("at ")]


def start_peer(build: PeerBuild, env: dict, directory: Path, *, stream: str | Sequence[str], application: str,
               worker_id: str, failover_ms: int = 6000, shard_sync_ms: int = 5000, extra: Sequence[str] = ()
               ) -> JavaPeer:
    streams = [stream] if isinstance(stream, str) else list(stream)
    output, events, log = (directory / f"{worker_id}.{suffix}" for suffix in ("jsonl", "events", "log"))
    args = [*(a for s in streams for a in ("--stream", s)), "--application", application, "--worker-id", worker_id,
            "--output", str(output), "--events", str(events), "--failover-millis", str(failover_ms),
            "--shard-sync-millis", str(shard_sync_ms), *extra]
    process = subprocess.Popen(build.command(args), env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    return JavaPeer(worker_id, process, output, events, log)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the project's own producer ----------------------------------------------------------------------------------

def payload(n: int) -> bytes:
    return json.dumps({"id": n}).encode()


class KplProducer:
    """Puts JSON payloads {"id": n} with the project's own producer (`kcl-pipeline produce`'s
    kcl_pipeline.local.producer.produce): plain records, or KPL aggregates of up to `aggregate_size` user records,
    each holding only records of the one shard it is put to (Java KCL drops an aggregate holding a user record
    outside the receiving shard's hash key range). Payload digests of every record put are kept in `produced`."""

    def __init__(self, kinesis_client: Any, stream: str, seed: int = 7):
        self.kinesis = kinesis_client
        self.stream = stream
        self.next_id = 0
        self.produced: dict[str, int] = {}  # digest -> id
        self.seed = seed

    def put(self, count: int, aggregate_size: int = 1) -> ProduceReport:
        first, self.seed = self.next_id, self.seed + 1
        report = produce(self.kinesis, self.stream, count, aggregate=aggregate_size, payload=payload, first_id=first,
                         seed=self.seed)
        self.next_id += count
        self.produced.update((digest(payload(n)), n) for n in range(first, first + count))
        return report


# -- what both kinds delivered ------------------------------------------------------------------------------------

@dataclass
class Delivery:
    """One delivered user record."""

    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    digest: str
    by: str  # worker id (Java) or our consumer's name
    kind: str  # "java" or "ours"
    at_ms: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.shard_id, self.sequence_number, self.sub_sequence_number

    @property
    def position(self) -> tuple[int, int]:
        return int(self.sequence_number), self.sub_sequence_number


@dataclass
class Deliveries:
    records: list[Delivery] = field(default_factory=list)

    @classmethod
    def collect(cls, java_peers: Iterable[JavaPeer] = (), our_dirs: dict[str, Path] | None = None) -> "Deliveries":
        out = cls()
        for peer in java_peers:
            for r in peer.records():
                out.records.append(Delivery(r["shard_id"], r["sequence_number"], r["sub_sequence_number"],
                                            r["sha256"], r["worker_id"], "java", r["delivered_at_ms"]))
        for name, directory in (our_dirs or {}).items():
            for f in sorted(Path(directory).glob("*.jsonl")):
                for r in json_lines(f):
                    out.records.append(Delivery(r["shard_id"], r["sequence_number"], r["sub_sequence_number"],
                                                digest(base64.b64decode(r["data_base64"])), name, "ours",
                                                r["delivered_at_ms"]))
        return out

    def digests(self) -> set[str]:
        return {d.digest for d in self.records}

    def missing(self, produced: dict[str, int]) -> list[int]:
        """Ids of produced records nobody delivered."""
        seen = self.digests()
        return sorted(n for d, n in produced.items() if d not in seen)

    def duplicates(self) -> dict[tuple[str, str, int], list[Delivery]]:
        """Records delivered more than once (by anyone), by (shard, sequence, sub-sequence)."""
        by_key: dict[tuple[str, str, int], list[Delivery]] = {}
        for d in self.records:
            by_key.setdefault(d.key, []).append(d)
        return {k: v for k, v in by_key.items() if len(v) > 1}

    def of_shard(self, shard_id: str, by: str | None = None) -> list[Delivery]:
        return [d for d in self.records if d.shard_id == shard_id and (by is None or d.by == by)]

    def holders(self) -> dict[str, set[str]]:
        """Who delivered records of each shard."""
        out: dict[str, set[str]] = {}
        for d in self.records:
            out.setdefault(d.shard_id, set()).add(d.by)
        return out


def lease_state(item: dict, now: float) -> tuple | None:
    """A lease item as (time, owner, counter, checkpoint); None for an item that is no lease."""
    if "leaseKey" not in item or ("entityType" in item and item["entityType"].get("S") != "LEASE"):
        return None
    return (now, item.get("leaseOwner", {}).get("S"), int(item.get("leaseCounter", {}).get("N", "0")),
            item.get("checkpoint", {}).get("S", ""))


class LeaseWatch(threading.Thread):
    """Scans the lease table every 0.2 s (consistent reads); keeps each lease's history of distinct samples:
    `sample(item, now)` (None: no lease; default `lease_state`), two samples the same when `state` of them is."""

    def __init__(self, dynamodb_client: Any, table: str, sample: Callable[[dict, float], Any] = lease_state,
                 state: Callable[[Any], Any] = lambda sample: sample[1:], clock: Callable[[], float] = time.monotonic):
        super().__init__(daemon=True)
        self.client = dynamodb_client
        self.table = table
        self.sample, self.state, self.clock = sample, state, clock
        self.halt = threading.Event()
        self.history: dict[str, list[Any]] = {}
        self.items: dict[str, dict] = {}

    def scan(self) -> list[dict]:
        items, kwargs = [], {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = self.client.scan(**kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                items = self.scan()
            except Exception:  # noqa: BLE001 - the table may not exist yet
                self.halt.wait(0.2)
                continue
            now = self.clock()
            for item in items:
                sample = self.sample(item, now)
                if sample is None:
                    continue
                key = item["leaseKey"]["S"]
                self.items[key] = item
                hist = self.history.setdefault(key, [])
                if not hist or self.state(hist[-1]) != self.state(sample):
                    hist.append(sample)
            self.halt.wait(0.2)

    def owners(self) -> dict[str, str | None]:
        return {k: h[-1][1] for k, h in self.history.items()}

    def checkpoint(self, key: str) -> str:
        return self.history[key][-1][3]

    def __enter__(self) -> "LeaseWatch":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.join(5)
