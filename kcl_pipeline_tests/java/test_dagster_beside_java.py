"""The Dagster-hosted consumer beside a real Java KCL 2.7.2 worker, once, end to end (issue 31).

One 4-shard stream on the session's emulators, KPL-aggregated and plain records; the pipeline as the Dagster
tests run it in process — a real Dagster instance (SQLite in a temporary DAGSTER_HOME), the `kinesis_consumer`
sensor hosting the lease workers (ticked by a thread, as the daemon would), the window job executed in process
on the session's local SparkSession — and a Java KCL 2.7.2 worker (kcl_pipeline_tests/java_peer) on the same
application and lease table. Java-compatible timings on our side (heartbeat 3 s, expiry 10 s), Java's
failoverTimeMillis 10 s.

The run: ours takes the four leases and lands the first window (W0); once the sensor has reported W0 complete,
the Java worker joins and steals two leases (maxLeasesToStealAtOneTime 2); more records are produced (Java
delivers and checkpoints its shards past W0); only then is W0's run (transform + `kinesis_checkpoints`)
executed, so the checkpoint asset's ownerless commit meets two Java-held leases. Finally the hosted consumer
shuts down (its workers release their leases) and Java takes them and reads on from our checkpoints.

Judged: the union of Java's output and our transformed output covers every produced record; a record
delivered (landed, or output by Java) by both kinds only inside a hand-over window (after the checkpoint the
Java tenure started from, landed by us no later than an expiry after that tenure began); W0 materialised and
our commits moved the checkpoints of the shards we held to W0's last landed record; on every lease sample whose
owner is the Java worker the checkpoint is one Java wrote (a position Java delivered) or the one it inherited,
and never moves back; no lease of ours is ever seen ownerless and un-ended while we run, and the leases we
release at shutdown are all taken by Java.

Only W0 can materialise here: a window completes when every shard has passed it, and a Java-held shard's
records are delivered by Java, never landed, so the windows after Java's take wait on its shards (see the
test's final message and the report of issue 31).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("dagster")
pytest.importorskip("pyspark")

from dagster import AssetKey, AssetMaterialization, build_sensor_context, instance_for_test  # noqa: E402
from dagster_aws.s3 import S3Resource  # noqa: E402

from kcl_pipeline.defs.kinesis import definitions as definitions_module  # noqa: E402
from kcl_pipeline.defs.kinesis.definitions import build_definitions  # noqa: E402
from kcl_pipeline.defs.kinesis.fleet_hosting import CONSUMER_SENSOR, consumer_name, shutdown_hosted  # noqa: E402
from kcl_pipeline.defs.kinesis.partitions import partition_key  # noqa: E402
from kcl_pipeline.defs.kinesis.resources import (  # noqa: E402
    AwsResource,
    KinesisConsumerResource,
    SparkResource,
    spark_config,
)
from kcl_pipeline.defs.kinesis.settings import PipelineSettings  # noqa: E402
from kcl_pipeline.kcl.shells.shards import wait_stream_active  # noqa: E402
from kcl_pipeline.landing.batch import decode_batch  # noqa: E402
from kcl_pipeline.landing.store import open_store  # noqa: E402
from kcl_pipeline.landing.verify import list_batches  # noqa: E402
from kcl_pipeline.transform.job import read_partition  # noqa: E402
from kcl_pipeline_tests.transform.conftest import spark  # noqa: E402, F401 - the session's SparkSession

from ..kcl.fleet_support import wait_until  # noqa: E402
from .peer_support import KplProducer, start_peer  # noqa: E402

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.emulator]

W = 60_000
HEARTBEAT, EXPIRY = 3.0, 10.0  # ours: --java-compatible
FAILOVER_MS = 10_000  # Java's failoverTimeMillis (renews every ~3.3 s, takes every 2 x (failover + 25 ms))
TAKER_INTERVAL = 2 * (FAILOVER_MS + 25) / 1000
SENSOR_INTERVAL = 5  # the manager cycle; the workers' keep-alive is 3 intervals
TICK_EVERY = 2.0
OURS, JAVA = "dagster-ours", "j1"

Position = tuple[int, int]  # (sequence number, sub-sequence number); sentinels are (-1, 0)


def _position(checkpoint: str, sub: int | str | None) -> Position:
    return (int(checkpoint), int(sub or 0)) if checkpoint.isdigit() else (-1, 0)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ours(owner: str | None) -> bool:
    return bool(owner) and consumer_name(owner) == OURS


# -- what runs beside the test -----------------------------------------------------------------------------------

class Ticker(threading.Thread):
    """The sensor daemon: evaluates `kinesis_consumer` every TICK_EVERY s, keeps its cursor, collects the windows
    it reported and the runs it requested (the test decides when a requested run executes)."""

    def __init__(self, sensor, resources, instance):
        super().__init__(daemon=True)
        self.sensor, self.resources, self.instance = sensor, resources, instance
        self.halt = threading.Event()
        self.cursor: str | None = None
        self.reported: Counter = Counter()  # (asset, partition) -> times reported
        self.requests: list = []  # every run request, in order
        self.errors: list[str] = []
        self.last_skip = ""
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                with build_sensor_context(cursor=self.cursor, resources=self.resources,
                                          instance=self.instance) as context:
                    result = self.sensor(context)
                with self.lock:
                    self.cursor = result.cursor
                    for event in result.asset_events or []:
                        if isinstance(event, AssetMaterialization):
                            self.reported[(event.asset_key.path[-1], event.partition)] += 1
                    self.requests += result.run_requests or []
                    self.last_skip = (result.skip_reason.skip_message if result.skip_reason else "") or ""
            except Exception as exc:  # noqa: BLE001 - judged at the end
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.halt.wait(TICK_EVERY)

    def reported_windows(self) -> set[str]:
        with self.lock:
            return {p for (asset, p) in self.reported if asset == "landed_records"}


@dataclass(frozen=True)
class Sample:
    at: float  # wall clock
    owner: str | None
    counter: int
    checkpoint: str
    sub: int
    claim_owner: str | None

    @property
    def position(self) -> Position:
        return _position(self.checkpoint, self.sub)


class Sampler(threading.Thread):
    """Scans the lease table every 0.2 s (consistent reads); keeps each lease's distinct states in order."""

    def __init__(self, dynamodb, table: str):
        super().__init__(daemon=True)
        self.client, self.table = dynamodb, table
        self.halt = threading.Event()
        self.history: dict[str, list[Sample]] = {}

    def scan(self) -> list[dict]:
        items, kwargs = [], {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = self.client.scan(**kwargs)
            items += page.get("Items", [])
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
            now = time.time()
            for item in items:
                if "leaseKey" not in item or "leaseCounter" not in item:
                    continue
                s = Sample(now, item.get("leaseOwner", {}).get("S"), int(item["leaseCounter"]["N"]),
                           item.get("checkpoint", {}).get("S", ""),
                           int(item.get("checkpointSubSequenceNumber", {}).get("N", "0")),
                           item.get("leaseClaimOwner", {}).get("S"))
                hist = self.history.setdefault(item["leaseKey"]["S"], [])
                if not hist or (hist[-1].owner, hist[-1].counter, hist[-1].checkpoint, hist[-1].sub) != (
                        s.owner, s.counter, s.checkpoint, s.sub):
                    hist.append(s)
            self.halt.wait(0.2)

    def owners(self) -> dict[str, str | None]:
        return {k: h[-1].owner for k, h in self.history.items()}

    def last(self, key: str) -> Sample:
        return self.history[key][-1]


# -- the test ----------------------------------------------------------------------------------------------------

@pytest.fixture
def hosted(emulators, aws_settings, kinesis_client, dynamodb_client, kcl2_peer, unique_name, tmp_path, monkeypatch,
           spark):  # noqa: F811 - the imported session-wide fixture
    stream, app = unique_name("dagjava"), unique_name("dagjavaapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=4)
    wait_stream_active(kinesis_client, stream)
    now = int(time.time() * 1000)
    settings = PipelineSettings(
        stream=stream, application=app, window_minutes=1,
        partitions_start=datetime.fromtimestamp((now - now % W) / 1000 - 3600, tz=timezone.utc),
        landing_uri=str(tmp_path / "zone"), output_uri=str(tmp_path / "out"), create_zones=True, host_workers=True,
        sensor_interval_seconds=SENSOR_INTERVAL, heartbeat_seconds=HEARTBEAT, lease_expiry_seconds=EXPIRY,
        grace_seconds=1.0, worker_id=OURS)
    consumer = KinesisConsumerResource.from_settings(settings)
    resources = {
        "consumer": KinesisConsumerResource(**{**consumer.model_dump(), "leases_to_acquire": 4}),
        "aws": AwsResource(region=emulators.region, kinesis_endpoint_url=emulators.kinesis,
                           dynamodb_endpoint_url=emulators.dynamodb, s3_endpoint_url=emulators.s3,
                           cloudwatch_endpoint_url=emulators.cloudwatch),
        "s3": S3Resource(endpoint_url=emulators.s3, region_name=emulators.region),
        "pyspark": SparkResource(spark_config=spark_config(settings)),
    }
    monkeypatch.setattr(definitions_module, "build_resources", lambda _settings, env=None: resources)
    defs = build_definitions(settings)
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    (tmp_path / "dagster_home").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster_home")) as instance:
        ticker = Ticker(defs.get_sensor_def(CONSUMER_SENSOR), resources, instance)
        sampler = Sampler(dynamodb_client, app)
        peers: list = []

        def start_java(*extra: str):
            peer = start_peer(kcl2_peer, env, tmp_path, stream=stream, application=app, worker_id=JAVA,
                              failover_ms=FAILOVER_MS, shard_sync_ms=10_000, extra=extra)
            peers.append(peer)
            return peer

        try:
            yield dict(settings=settings, defs=defs, instance=instance, ticker=ticker, sampler=sampler,
                       producer=KplProducer(kinesis_client, stream), start_java=start_java, tmp=tmp_path)
        finally:
            ticker.halt.set()
            ticker.join(60)
            shutdown_hosted(timeout=20)
            sampler.halt.set()
            sampler.join(5)
            for peer in peers:
                if peer.process.poll() is None:
                    try:
                        peer.stop(30)
                    except AssertionError:
                        pass  # killed by stop()


def _landed(store, stream: str) -> list[dict]:
    """Every landed row: shard, position, payload digest, and when its batch file was written."""
    rows = []
    for batch in list_batches(store, stream):
        path = store.local_path(batch.key())
        table = decode_batch(store.get(batch.key()), batch.key())
        mtime = os.path.getmtime(path)
        for shard, seq, sub, data in zip(table.column("shard_id").to_pylist(),
                                         table.column("sequence_number").to_pylist(),
                                         table.column("sub_sequence_number").to_pylist(),
                                         table.column("data").to_pylist(), strict=True):
            rows.append({"shard_id": shard, "position": (int(seq), int(sub)), "digest": _digest(data),
                         "landed_at": mtime, "window": batch.minute_ms - batch.minute_ms % W})
    return rows


_SEQ = re.compile(r"SequenceNumber: (\w+)")
_SUB = re.compile(r"SubsequenceNumber: (\d+)")


def _tenures(peer) -> list[tuple[str, float, Position]]:
    """Java's shard tenures: (shard, when its processor was initialised, the checkpoint it started from)."""
    out = []
    for e in peer.events():
        if e["event"] != "initialize":
            continue
        detail = e.get("detail") or ""
        seq, sub = _SEQ.search(detail), _SUB.search(detail)
        start = _position(seq.group(1) if seq else "", sub.group(1) if sub else 0)
        out.append((e["shard_id"], float(e["time"]), start))
    return out


def test_dagster_hosted_consumer_beside_a_java_kcl2_worker(hosted):
    h = hosted
    settings, ticker, sampler, producer = h["settings"], h["ticker"], h["sampler"], h["producer"]
    instance, defs = h["instance"], h["defs"]
    stream = settings.stream
    store = open_store(settings.landing_uri)
    began = time.monotonic()

    def log(what: str) -> None:
        print(f"{time.monotonic() - began:6.1f}s {what}", flush=True)

    # W0 in one window: not in the last seconds of a minute (the records, the leases and the first polls in it).
    into = time.time() % 60
    if into > 45:
        time.sleep(61 - into)
    w0 = int(time.time() * 1000) // W * W
    producer.put(200, 1)
    producer.put(400, 10)
    assert int(time.time() * 1000) // W * W == w0, "the first records straddled a window boundary"
    first_batch = dict(producer.produced)
    sampler.start()
    ticker.start()

    wait_until(lambda: len(sampler.owners()) == 4 and all(_ours(o) for o in sampler.owners().values()), 60,
               "the hosted consumer holding the four leases")
    log("ours holds the four leases")
    w0_key = partition_key(w0)
    wait_until(lambda: w0_key in ticker.reported_windows(), (w0 + W) / 1000 - time.time() + 45,
               f"the sensor reporting {w0_key} complete", interval=0.5)
    log(f"{w0_key} reported complete; run requests held: {[r.partition_key for r in ticker.requests]}")
    landed_w0 = _landed(store, stream)
    assert {r["digest"] for r in landed_w0} == set(first_batch), "W0 reported before its records landed"

    # The Java worker joins and steals two leases (its target: 4 leases / 2 workers).
    java = h["start_java"]("--leases-to-steal", "2")
    wait_until(lambda: list(sampler.owners().values()).count(JAVA) == 2, TAKER_INTERVAL + 40,
               "the Java worker stealing two leases")
    java_shards = sorted(k for k, o in sampler.owners().items() if o == JAVA)
    our_shards = sorted(k for k, o in sampler.owners().items() if _ours(o))
    log(f"Java holds {java_shards}, ours {our_shards}")
    assert len(our_shards) == 2

    # More records while Java holds two shards: Java delivers and checkpoints past W0 on them.
    producer.put(100, 1)
    producer.put(200, 10)
    second_batch = {d: n for d, n in producer.produced.items() if d not in first_batch}

    def java_checkpointed_its_shards() -> bool:
        delivered: dict[str, list[Position]] = {}
        for r in java.records():
            delivered.setdefault(r["shard_id"], []).append((int(r["sequence_number"]), r["sub_sequence_number"]))
        java_digests = {r["sha256"] for r in java.records()}
        new_on_java = {d for d in second_batch if d in java_digests}
        return bool(new_on_java) and all(
            delivered.get(k) and sampler.last(k).position == max(delivered[k]) for k in java_shards)

    wait_until(java_checkpointed_its_shards, 40, "Java delivering the new records and checkpointing them")
    log("Java delivered and checkpointed its shards past W0")

    # Now the window run the sensor requested for W0: transform, then the ownerless checkpoint commits.
    executed: list[str] = []

    def execute_requested() -> None:
        with ticker.lock:
            pending = ticker.requests[len(executed):]
        for request in pending:
            job = defs.resolve_job_def(request.job_name)
            result = job.execute_in_process(partition_key=request.partition_key, instance=instance,
                                            tags=request.tags, raise_on_error=False)
            executed.append(f"{request.job_name}[{request.partition_key}]:{'ok' if result.success else 'FAILED'}")
            assert result.success, executed

    execute_requested()
    committed_at = time.time()
    log(f"runs executed: {executed}")
    assert w0_key in instance.get_materialized_partitions(AssetKey("transformed_records"))
    assert w0_key in instance.get_materialized_partitions(AssetKey("kinesis_checkpoints"))

    # Our commits advanced the shards we hold to W0's last landed record; Java's kept Java's checkpoints.
    last_w0 = {}
    for r in landed_w0:
        last_w0[r["shard_id"]] = max(last_w0.get(r["shard_id"], (-1, 0)), r["position"])
    wait_until(lambda: all(sampler.last(k).position == last_w0[k] for k in our_shards), 10,
               "the checkpoints of our shards at W0's last landed records")
    time.sleep(2 * TICK_EVERY)  # a few more ticks (and their follow-up requests) beside the Java holder
    execute_requested()
    log(f"runs executed: {executed}; last tick: {ticker.last_skip[:300]}")

    # Ours shuts down (the code server stops): its workers release their leases; Java takes them and reads on.
    ticker.halt.set()
    ticker.join(60)
    stopped = time.time()
    shutdown_hosted(timeout=20)
    log("hosted consumer shut down")
    wait_until(lambda: all(o == JAVA for o in sampler.owners().values()), TAKER_INTERVAL + 15,
               "the Java worker taking the leases ours released")
    log(f"Java took the released leases {time.time() - stopped:.1f}s after our shutdown")

    transformed = read_partition(settings.output_uri, "transformed", w0)[0]
    transformed_ids = {json.loads(p)["id"] for p in transformed.column("payload").to_pylist()}

    def covered() -> bool:
        java_ids = {producer.produced[r["sha256"]] for r in java.records()}
        return set(producer.produced.values()) <= java_ids | transformed_ids

    wait_until(covered, 40, "Java's output and our transformed output covering every produced record")
    time.sleep(1)
    assert java.stop(40) == 0, java.log_tail()
    sampler.halt.set()
    sampler.join(5)
    log("Java stopped")

    # -- judged ------------------------------------------------------------------------------------------------
    assert not ticker.errors, ticker.errors
    landed = _landed(store, stream)
    keys = [(r["shard_id"], r["position"]) for r in landed]
    assert len(keys) == len(set(keys)), "a record landed twice"
    assert {r["digest"] for r in landed} <= set(producer.produced)
    assert transformed_ids == set(first_batch.values()), "W0's output is not the first records exactly once"
    java_rows = java.records()
    java_keys = [(r["shard_id"], (int(r["sequence_number"]), r["sub_sequence_number"])) for r in java_rows]
    assert len(java_keys) == len(set(java_keys)), "Java delivered a record twice"

    # A record delivered by both kinds lies in a hand-over window: after the checkpoint a Java tenure of its shard
    # started from, landed by us no later than an expiry after that tenure began.
    tenures = _tenures(java)
    ours_at = {(r["shard_id"], r["position"]): r["landed_at"] for r in landed}
    outside = []
    for key in set(java_keys) & set(ours_at):
        shard, position = key
        if not any(s == shard and start < position and ours_at[key] <= began_at + EXPIRY
                   for s, began_at, start in tenures):
            outside.append((key, ours_at[key], [t for t in tenures if t[0] == shard]))
    assert not outside, f"records delivered by both kinds outside a hand-over window: {outside[:5]}"

    # Under the Java holder, the checkpoint is only ever one Java wrote (a position it delivered) or the one its
    # tenure inherited, and it never moves back.
    java_positions: dict[str, set[Position]] = {}
    for shard, position in java_keys:
        java_positions.setdefault(shard, set()).add(position)
    violations = []
    for key, hist in sampler.history.items():
        inherited, previous = None, None
        for i, s in enumerate(hist):
            if s.owner != JAVA:
                inherited, previous = None, None
                continue
            if inherited is None:
                inherited = hist[i - 1].position if i else (-1, 0)
                previous = inherited
            if s.position != inherited and s.position not in java_positions.get(key, set()):
                violations.append((key, "a value Java never wrote", s, inherited))
            if s.position < previous:
                violations.append((key, "moved back", s, previous))
            previous = max(previous, s.position)
    assert not violations, violations

    # No lease left ownerless and un-ended while we ran: once owned, a lease always had an owner until our shutdown.
    ownerless = [(k, s) for k, hist in sampler.history.items()
                 for i, s in enumerate(hist)
                 if s.at < stopped and not s.owner and s.checkpoint != "SHARD_END" and any(p.owner for p in hist[:i])]
    assert not ownerless, ownerless

    # Our commit never landed under Java: after the run, Java's leases carried no position of ours past theirs.
    for k in java_shards:
        after = [s for s in sampler.history[k] if committed_at <= s.at < stopped]
        assert all(s.owner == JAVA for s in after), after
    assert all(e["event"] not in ("checkpointFailed",) for e in java.events())
    exceptions = java.exceptions()
    print(f"{len(landed)} rows landed, {len(java_rows)} delivered by Java, {len(set(java_keys) & set(ours_at))} by "
          f"both (hand-overs); runs: {executed}; Java tenures: {tenures}; Java log lines naming an exception: "
          f"{len(exceptions)}")
    assert exceptions == [], "\n".join(exceptions[:20])
    log(f"done; windows reported: {sorted(ticker.reported_windows())}")
    Path(h["tmp"] / "summary.json").write_text(json.dumps({"executed": executed}))
