"""The Dagster-hosted consumer beside a real Java KCL 2.7.2 worker, once, end to end (issue 31).

One 4-shard stream on the session's emulators, KPL-aggregated and plain records; the pipeline as the Dagster
tests run it in process — a real Dagster instance (SQLite in a temporary DAGSTER_HOME), the `kinesis_consumer`
sensor hosting the lease workers (ticked by a thread, as the daemon would), the window job executed in process
on the session's local SparkSession — and a Java KCL 2.7.2 worker (kcl_pipeline_tests/java_peer) on the same
application and lease table. Java-compatible timings on our side (heartbeat 3 s, expiry 10 s), Java's
failoverTimeMillis 10 s. The scenario runs once (module fixture); each test judges one part of it.

1. Ours takes the four leases and lands the first window, W0, which the sensor reports complete.
2. The Java worker joins and steals two leases (maxLeasesToStealAtOneTime 2) and delivers from their checkpoint
   (TRIM_HORIZON: W0 is not committed yet) plus new records; it checkpoints at most every 10 minutes, so here
   only when it shuts down, and the leases it holds keep the checkpoint its tenure inherited.
3. Only then does W0's run execute (transform, `kinesis_checkpoints`): its plan proposes a commit on all four
   leases; the ownerless write lands on our two and is refused on Java's two.
4. Ours shuts down (its workers release); Java takes the four leases and reads on from our checkpoints, so
   Java's output and our transformed W0 together hold every record produced so far.
5. Java stops (SIGTERM: checkpoints what it delivered); the pipeline comes back (a new incarnation, the sensor's
   cursor kept), takes the leases after Java's failover and lands on from Java's checkpoints.

Only W0 materialises: a window completes when every shard has passed it, and a Java-held shard's records are
delivered by Java, never landed, so windows after Java's take wait on its shards while it holds them. The landed
chain of a shard Java held and gave back has a gap (Java's records), which `landing verify` reports over the
whole history; the windows' chain checks pass.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

pytest.importorskip("dagster")
pytest.importorskip("pyspark")

from dagster import (  # noqa: E402
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    build_sensor_context,
    instance_for_test,
)
from dagster_aws.s3 import S3Resource  # noqa: E402

from kcl_pipeline.audit.lineage import audit_window  # noqa: E402
from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.defs.kinesis import definitions as definitions_module  # noqa: E402
from kcl_pipeline.defs.kinesis.definitions import build_definitions  # noqa: E402
from kcl_pipeline.defs.kinesis.resources import (  # noqa: E402
    AwsResource,
    KinesisConsumerResource,
    SparkResource,
    spark_config,
)
from kcl_pipeline.deployment.fleet_hosting import CONSUMER_SENSOR, consumer_name, shutdown_hosted  # noqa: E402
from kcl_pipeline.deployment.settings import PipelineSettings  # noqa: E402
from kcl_pipeline.kcl.shells.shards import wait_stream_active  # noqa: E402
from kcl_pipeline.transform.job import read_partition  # noqa: E402
from kcl_pipeline.windows.keys import partition_key  # noqa: E402
from kcl_pipeline.zone.batch import decode_batch  # noqa: E402
from kcl_pipeline.zone.chain import list_batches  # noqa: E402
from kcl_pipeline.zone.store import open_store  # noqa: E402
from kcl_pipeline_tests.transform.conftest import spark  # noqa: E402, F401 - the session's SparkSession

from ..kcl.fleet_support import wait_until  # noqa: E402
from .peer_support import KplProducer, LeaseWatch, start_peer  # noqa: E402

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


def _sample(item: dict, now: float) -> Sample | None:
    if "leaseKey" not in item or "leaseCounter" not in item:
        return None
    return Sample(now, item.get("leaseOwner", {}).get("S"), int(item["leaseCounter"]["N"]),
                  item.get("checkpoint", {}).get("S", ""),
                  int(item.get("checkpointSubSequenceNumber", {}).get("N", "0")),
                  item.get("leaseClaimOwner", {}).get("S"))


class Sampler(LeaseWatch):
    """The lease table's history as `Sample`s (wall-clock times, the sub-sequence and the claim owner too)."""

    def __init__(self, dynamodb, table: str):
        super().__init__(dynamodb, table, sample=_sample, state=lambda s: (s.owner, s.counter, s.checkpoint, s.sub),
                         clock=time.time)

    def owners(self) -> dict[str, str | None]:
        return {k: h[-1].owner for k, h in self.history.items()}

    def last(self, key: str) -> Sample:
        return self.history[key][-1]


# -- the scenario, run once for the module's judgements -----------------------------------------------------------

@dataclass
class Outcome:
    """What the scenario saw; each test below judges one part of it."""

    stream: str
    w0: int
    java_shards: list[str]
    our_shards: list[str]
    produced: dict[str, int]  # digest -> id, of every record produced before the pipeline came back
    first_batch: dict[str, int]
    all_produced: dict[str, int]  # digest -> id, with the records produced after the pipeline came back
    landed: list[dict]
    transformed_ids: set[int]
    java_rows: list[dict]
    tenures: list[tuple[str, float, Position]]
    history: dict[str, list[Sample]]
    executed: list[str]
    committed: list[dict]  # the W0 run's kinesis_checkpoints "committed" rows
    last_w0: dict[str, Position]
    checks: dict[str, list[tuple[bool, str]]]  # asset check name -> (passed, description) of each evaluation
    chains_after_return: dict[int, tuple[bool, str, tuple[str, ...]]]  # window -> chain check outcome
    gaps: dict[str, list]  # per shard, the gaps of its whole landed chain (landing verify)
    plan: dict  # the W0 run's checkpoint plan, per shard
    our_stops: list[float]  # wall times our hosted consumer was shut down
    java_stopped: float
    ticker_errors: list[str]
    java_exceptions: list[str]
    java_exit: int
    log: list[str]


@pytest.fixture(scope="module")
def scenario(emulators, kinesis_client, dynamodb_client, kcl2_peer, spark, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("dagster-beside-java")
    suffix = uuid.uuid4().hex[:10]
    stream, app = f"dagjava-{suffix}", f"dagjavaapp-{suffix}"
    kinesis_client.create_stream(StreamName=stream, ShardCount=4)
    wait_stream_active(kinesis_client, stream)
    now = int(time.time() * 1000)
    settings = PipelineSettings(
        stream=stream, application=app, window_minutes=1,
        partitions_start=datetime.fromtimestamp((now - now % W) / 1000 - 3600, tz=timezone.utc),
        landing_uri=str(tmp / "zone"), output_uri=str(tmp / "out"), create_zones=True, host_workers=True,
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
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    (tmp / "dagster_home").mkdir()
    tickers: list[Ticker] = []
    sampler = Sampler(dynamodb_client, app)
    java = None
    with pytest.MonkeyPatch.context() as mp, instance_for_test(temp_dir=str(tmp / "dagster_home")) as instance:
        mp.setattr(definitions_module, "build_resources", lambda _settings, env=None: resources)
        defs = build_definitions(settings)
        sensor = defs.get_sensor_def(CONSUMER_SENSOR)
        try:
            java_box: list = []
            outcome = _run(settings, defs, instance, sensor, resources, sampler, tickers, java_box,
                           KplProducer(kinesis_client, stream),
                           lambda *extra: start_peer(kcl2_peer, env, tmp, stream=stream, application=app,
                                                     worker_id=JAVA, failover_ms=FAILOVER_MS, shard_sync_ms=10_000,
                                                     extra=extra))
            java = java_box[0] if java_box else None
        finally:
            java = java or (java_box[0] if java_box else None)
            for ticker in tickers:
                ticker.halt.set()
                ticker.join(60)
            shutdown_hosted(timeout=20)
            sampler.halt.set()
            sampler.join(5)
            if java is not None and java.process.poll() is None:
                java.kill()
    yield outcome


def _run(settings, defs, instance, sensor, resources, sampler, tickers, java_box, producer, start_java) -> Outcome:
    stream = settings.stream
    store = open_store(settings.landing_uri)
    began = time.monotonic()
    said: list[str] = []

    def log(what: str) -> None:
        said.append(f"{time.monotonic() - began:6.1f}s {what}")
        print(said[-1], flush=True)

    def new_ticker(cursor: str | None) -> Ticker:
        ticker = Ticker(sensor, resources, instance)
        ticker.cursor = cursor
        tickers.append(ticker)
        ticker.start()
        return ticker

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
    ticker = new_ticker(None)

    wait_until(lambda: len(sampler.owners()) == 4 and all(_ours(o) for o in sampler.owners().values()), 60,
               "the hosted consumer holding the four leases")
    log("ours holds the four leases")
    w0_key = partition_key(w0)
    wait_until(lambda: w0_key in ticker.reported_windows(), (w0 + W) / 1000 - time.time() + 45,
               f"the sensor reporting {w0_key} complete", interval=0.5)
    log(f"{w0_key} reported complete; run requests held: {[r.partition_key for r in ticker.requests]}")
    landed_w0 = _landed(store, stream)
    assert {r["digest"] for r in landed_w0} == set(first_batch), "W0 reported before its records landed"
    last_w0: dict[str, Position] = {}
    for r in landed_w0:
        last_w0[r["shard_id"]] = max(last_w0.get(r["shard_id"], (-1, 0)), r["position"])

    # The Java worker joins and steals two leases (its target: 4 leases / 2 workers).
    # Java checkpoints at most every 10 minutes (KCL's samples checkpoint every minute): within the test only when
    # it shuts down, so while it holds a lease the lease keeps the checkpoint its tenure inherited.
    java = start_java("--leases-to-steal", "2", "--checkpoint-interval-millis", "600000")
    java_box.append(java)
    wait_until(lambda: list(sampler.owners().values()).count(JAVA) == 2, TAKER_INTERVAL + 40,
               "the Java worker stealing two leases")
    java_shards = sorted(k for k, o in sampler.owners().items() if o == JAVA)
    our_shards = sorted(k for k, o in sampler.owners().items() if _ours(o))
    log(f"Java holds {java_shards}, ours {our_shards}")

    # More records while Java holds two shards: Java delivers past W0 on them (and has not checkpointed yet).
    producer.put(100, 1)
    producer.put(200, 10)
    second_batch = {d for d in producer.produced if d not in first_batch}

    def java_delivered_its_shards() -> bool:
        rows = java.records()
        return {k for k in java_shards} <= {r["shard_id"] for r in rows if r["sha256"] in second_batch}

    wait_until(java_delivered_its_shards, 40, "Java delivering the new records of its shards")
    log(f"Java delivered its shards past W0; their checkpoints: {[sampler.last(k).checkpoint for k in java_shards]}")

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

    execute_requested()
    log(f"runs executed: {executed}")
    wait_until(lambda: all(sampler.last(k).position == last_w0[k] for k in our_shards), 10,
               "the checkpoints of our shards at W0's last landed records")
    time.sleep(2 * TICK_EVERY)  # a few more ticks (and any follow-up request) beside the Java holder
    execute_requested()
    log(f"runs executed: {executed}; last tick: {ticker.last_skip[:300]}")
    record = instance.fetch_materializations(AssetKey("kinesis_checkpoints"), limit=10).records
    w0_commit = next(r.asset_materialization.metadata for r in record if r.partition_key == w0_key)
    committed, plan = w0_commit["committed"].data, w0_commit["plan"].data
    log(f"W0's checkpoint plan: {plan}; committed: {committed}")

    # Ours shuts down (the code server stops): its workers release their leases; Java takes them and reads on.
    ticker.halt.set()
    ticker.join(60)
    our_stops = [time.time()]
    shutdown_hosted(timeout=20)
    log("hosted consumer shut down")
    wait_until(lambda: all(o == JAVA for o in sampler.owners().values()), TAKER_INTERVAL + 15,
               "the Java worker taking the leases ours released")
    log(f"Java took the released leases {time.time() - our_stops[0]:.1f}s after our shutdown")
    transformed = read_partition(settings.output_uri, "transformed", w0)[0]
    transformed_ids = {json.loads(p)["id"] for p in transformed.column("payload").to_pylist()}

    def covered() -> bool:
        java_ids = {producer.produced[r["sha256"]] for r in java.records()}
        return set(producer.produced.values()) <= java_ids | transformed_ids

    wait_until(covered, 40, "Java's output and our transformed output covering every produced record")
    produced_before_return = dict(producer.produced)

    # The Java worker leaves (SIGTERM: it checkpoints what it delivered); the pipeline comes back (a new code
    # server: a new incarnation of the same consumer, the sensor's cursor kept), takes the leases and lands on
    # from Java's checkpoints.
    time.sleep(1)
    java_exit = java.stop(40)
    java_stopped = time.time()
    log(f"Java stopped (exit {java_exit})")
    ticker = new_ticker(ticker.cursor)
    before_return = set(producer.produced)
    producer.put(40, 1)
    producer.put(80, 10)
    third_batch = set(producer.produced) - before_return
    wait_until(lambda: all(_ours(o) for o in sampler.owners().values()), EXPIRY + 4 * TICK_EVERY + 20,
               "the pipeline taking the leases back")
    log(f"ours took the leases back {time.time() - java_stopped:.1f}s after Java stopped")
    wait_until(lambda: third_batch <= {r["digest"] for r in _landed(store, stream)}, 40,
               "the pipeline landing the records produced after Java left")
    log("the records produced after Java left are landed")
    landed = _landed(store, stream)
    output = open_store(settings.output_uri)
    chains = {}
    for w in sorted({r["window"] for r in landed}):
        outcome = audit_window(store, output, stream, w, w + W, checks=("chain",))[0]
        chains[w] = (outcome.ok, outcome.summary, outcome.details)
    verified = verify_zone(settings.landing_uri, stream=stream)
    gaps = {shard: [(g.after, g.next_prev) for g in report.gaps] for shard, report in verified.streams[stream].items()}
    log(f"landing verify over the whole history: ok={verified.ok}; gaps: {gaps}")
    ticker.halt.set()
    ticker.join(60)
    our_stops.append(time.time())
    shutdown_hosted(timeout=20)
    log("hosted consumer shut down again")
    time.sleep(0.5)
    sampler.halt.set()
    sampler.join(5)

    checks = {}
    for asset, name in (("landed_records", "chain_unbroken"), ("transformed_records", "rows_reconcile"),
                        ("kinesis_checkpoints", "checkpoint_within_materialised")):
        history = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(asset), name), limit=100)
        checks[name] = [(e.passed, e.description or "") for e in (
            r.event.dagster_event.event_specific_data for r in history if r.event) if hasattr(e, "passed")]
    return Outcome(
        stream=stream, w0=w0, java_shards=java_shards, our_shards=our_shards, produced=produced_before_return,
        all_produced=dict(producer.produced),
        first_batch=first_batch, landed=landed, transformed_ids=transformed_ids, java_rows=java.records(),
        tenures=_tenures(java), history=sampler.history, executed=executed, committed=committed, last_w0=last_w0,
        checks=checks, chains_after_return=chains, gaps=gaps, plan=plan, our_stops=our_stops, java_stopped=java_stopped,
        ticker_errors=[e for t in tickers for e in t.errors], java_exceptions=java.exceptions(), java_exit=java_exit,
        log=said)


def _landed(store, stream: str) -> list[dict]:
    """Every landed row: shard, position, payload digest, and when its batch file was written."""
    rows = []
    for batch in list_batches(store, stream):
        table = decode_batch(store.get(batch.key()), batch.key())
        mtime = os.path.getmtime(store.local_path(batch.key()))
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


def _java_keys(o: Outcome) -> list[tuple[str, Position]]:
    return [(r["shard_id"], (int(r["sequence_number"]), r["sub_sequence_number"])) for r in o.java_rows]


# -- the judgements ----------------------------------------------------------------------------------------------

def test_every_record_delivered_by_one_kind_or_in_a_hand_over(scenario):
    """The union of Java's output and our transformed W0 holds every produced record; each kind delivers a record
    at most once (ours: landed once); a record both kinds delivered lies in a hand-over window: after the
    checkpoint a Java tenure of its shard started from, landed by us no later than an expiry after that tenure
    began (Java re-reads what we landed but had not committed: at-least-once, as between two Java workers)."""
    o = scenario
    print("\n".join(o.log))
    assert not o.ticker_errors, o.ticker_errors
    java_ids = {o.produced[r["sha256"]] for r in o.java_rows}
    assert set(o.produced.values()) <= java_ids | o.transformed_ids
    assert o.transformed_ids == set(o.first_batch.values()), "W0's output is not W0's records exactly once"
    keys = [(r["shard_id"], r["position"]) for r in o.landed]
    assert len(keys) == len(set(keys)), "a record landed twice"
    assert {r["digest"] for r in o.landed} <= set(o.all_produced)
    java_keys = _java_keys(o)
    assert len(java_keys) == len(set(java_keys)), "Java delivered a record twice"
    ours_at = {(r["shard_id"], r["position"]): r["landed_at"] for r in o.landed}
    both = set(java_keys) & set(ours_at)
    outside = [(key, ours_at[key], [t for t in o.tenures if t[0] == key[0]]) for key in sorted(both)
               if not any(s == key[0] and start < key[1] and ours_at[key] <= began_at + EXPIRY
                          for s, began_at, start in o.tenures)]
    assert not outside, f"records delivered by both kinds outside a hand-over window: {outside[:5]}"
    print(f"{len(o.landed)} rows landed, {len(o.java_rows)} delivered by Java, {len(both)} by both (hand-overs); "
          f"Java tenures {o.tenures}")


def test_our_window_materialises_and_our_commits_advance(scenario):
    """W0 (every shard ours while it landed) materialised; its commit moved the checkpoints of the shards we still
    held to W0's last landed record and was refused (conditional write not applied) on the two leases Java held,
    whose checkpoint was still the starting position then."""
    o = scenario
    print(o.plan, o.committed, sep="\n")
    assert o.executed and all(e.endswith(":ok") for e in o.executed), o.executed
    by_shard = {row["shard_id"]: row for row in o.committed}
    for shard in o.our_shards:
        assert by_shard[shard]["checkpointed"], o.committed
        assert (int(by_shard[shard]["sequence_number"]), by_shard[shard]["sub_sequence_number"]) == o.last_w0[shard]
    for shard in o.java_shards:
        assert shard in by_shard and not by_shard[shard]["checkpointed"], o.committed
    # The W0 run's asset checks (chain, counts, checkpoints within materialised) all passed.
    assert all(o.checks.values()) and all(passed for runs in o.checks.values() for passed, _ in runs), o.checks
    for shard in o.our_shards:  # seen in the table before our shutdown
        assert any(s.position == o.last_w0[shard] and _ours(s.owner) for s in o.history[shard]), o.history[shard]


def test_no_ownerless_write_lands_under_the_java_holder(scenario):
    """On every lease sample whose owner is the Java worker, the checkpoint is the one its tenure inherited or the
    one Java wrote (it checkpoints only when it shuts down here: at the last record it delivered), and it never
    moves back. So the W0 commit, which the plan proposed for the two leases Java held, never landed there."""
    o = scenario
    java_positions: dict[str, set[Position]] = {}
    for shard, position in _java_keys(o):
        java_positions.setdefault(shard, set()).add(position)
    java_final = {shard: max(positions) for shard, positions in java_positions.items()}
    violations, samples = [], 0
    for key, hist in o.history.items():
        inherited = previous = None
        for i, s in enumerate(hist):
            if s.owner != JAVA:
                inherited = previous = None
                continue
            samples += 1
            if inherited is None:
                inherited = previous = hist[i - 1].position if i else (-1, 0)
            if s.position not in (inherited, java_final.get(key)):
                violations.append((key, "a checkpoint Java never wrote", s, inherited))
            if s.position < previous:
                violations.append((key, "moved back", s, previous))
            previous = max(previous, s.position)
    assert samples and not violations, violations


def test_no_lease_left_ownerless_by_us(scenario):
    """While ours runs, a lease it held always has an owner (no ownerless write un-owns a live lease); the leases
    it releases when it shuts down are taken (by Java) within a Java taker interval."""
    o = scenario
    problems = []
    for key, hist in o.history.items():
        for i in range(1, len(hist)):
            before, s = hist[i - 1], hist[i]
            if not (_ours(before.owner) and not s.owner and s.checkpoint != "SHARD_END"):
                continue
            stop = max((t for t in o.our_stops if t <= s.at), default=None)
            if stop is None:
                problems.append((key, "un-owned while ours ran", before, s))
            elif stop == o.our_stops[0]:
                taken = next((n for n in hist[i + 1:] if n.owner), None)
                if taken is None or taken.at - s.at > TAKER_INTERVAL + 5:
                    problems.append((key, "released at our shutdown and left ownerless", s, taken))
    assert not problems, problems


def test_the_java_worker_ran_clean(scenario):
    assert scenario.java_exit == 0
    assert scenario.java_exceptions == [], "\n".join(scenario.java_exceptions[:20])


def test_chains_after_the_pipeline_takes_shards_back_from_java(scenario):
    """After Java left, the pipeline landed on from Java's checkpoints: what the chain check of each window says."""
    o = scenario
    for w, (passed, summary, details) in sorted(o.chains_after_return.items()):
        print(partition_key(w), passed, summary, *details, sep="\n  ")
    assert all(passed for passed, _, _ in o.chains_after_return.values())
    # The landed chain's only gaps: the records of a shard Java held, which Java delivered (not landed), once per
    # Java tenure that ended with the pipeline taking the shard back.
    print("whole-history gaps:", o.gaps)
    java_ids = {r["sha256"] for r in o.java_rows}
    for shard, gaps in o.gaps.items():
        assert shard in o.java_shards or not gaps, (shard, gaps)
        for after, resumed_after in gaps:
            between = [r for r in o.java_rows if r["shard_id"] == shard
                       and _position(after.sequence_number, after.sub_sequence_number)
                       < (int(r["sequence_number"]), r["sub_sequence_number"])
                       <= _position(resumed_after.sequence_number, resumed_after.sub_sequence_number)]
            assert between and {r["sha256"] for r in between} <= java_ids
