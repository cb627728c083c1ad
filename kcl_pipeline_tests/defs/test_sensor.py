"""The kinesis_consumer sensor over successive ticks (build_sensor_context), against the emulators over HTTP:
lease-manager cycles, cursor, window reports and run requests; workers that stop by themselves when ticks stop;
a "reload" (a fresh registry) that never puts two workers on one lease."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    SensorResult,
    TimeWindowPartitionsDefinition,
    build_sensor_context,
)

from kcl_pipeline.defs.kinesis.assets import build_assets
from kcl_pipeline.defs.kinesis.jobs import CHECKPOINTS_JOB, SHARD_END_TAG, WINDOW_JOB
from kcl_pipeline.defs.kinesis.resources import SPARK_RUN_TAG, KinesisConsumerResource
from kcl_pipeline.defs.kinesis.sensors import build_consumer_sensor, build_member_sensor
from kcl_pipeline.deployment import fleet_hosting as hosting
from kcl_pipeline.deployment.fleet_hosting import consumer_name, shutdown_hosted
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import PARTITION_FMT, partition_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.zone.chain import read_batches
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.defs.support import pipeline_jobs, sensor_resources

pytestmark = pytest.mark.slow
W = 60_000
INTERVAL = 2  # seconds; workers stop by themselves after 3 intervals without a tick


@pytest.fixture
def setup(emulators, aws_settings, unique_name, tmp_path):
    kinesis = client("kinesis", aws_settings)
    stream = unique_name("sensor")
    before = int(time.time() * 1000)
    produced = produce(kinesis, stream, 60, aggregate=3, create_shards=2, seed=1).user_records
    produced += produce(kinesis, stream, 40, aggregate=1, first_id=60, seed=2).user_records
    after = int(time.time() * 1000)
    partitions = TimeWindowPartitionsDefinition(
        start=datetime.fromtimestamp((before - before % W) / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC")
    _, transformed, checkpoints = build_assets(partitions, W)
    jobs = pipeline_jobs(transformed, checkpoints)
    consumer = KinesisConsumerResource(
        stream=stream, application=unique_name("app"), window_minutes=1, landing_uri=str(tmp_path / "zone"),
        output_uri=str(tmp_path / "out"), create_zones=True, heartbeat_seconds=1.0, lease_expiry_seconds=3.0,
        leases_to_acquire=2, grace_seconds=1.0)
    resources = sensor_resources(emulators, consumer)
    sensor = build_consumer_sensor(partitions, jobs, INTERVAL)
    table = LeaseTable(consumer.application, client("dynamodb", aws_settings))
    yield dict(sensor=sensor, resources=resources, consumer=consumer, table=table, produced=produced,
               windows=list(range(before - before % W, after - after % W + W, W)), aws=aws_settings,
               instance=DagsterInstance.ephemeral(), checkpoints=checkpoints, kinesis=kinesis, stream=stream)
    shutdown_hosted(timeout=15)


def tick(s, cursor: str | None) -> SensorResult:
    with build_sensor_context(cursor=cursor, resources=s["resources"], instance=s["instance"]) as context:
        result = s["sensor"](context)
    assert isinstance(result, SensorResult)
    return result


def hosted(s):
    return hosting._REGISTRY[hosting.registry_key(s["consumer"].settings())]


def owners(table) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in table.scan()}


def wait_until(predicate, timeout: float, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def test_successive_ticks_report_each_complete_window_once(setup, monkeypatch):
    s = setup

    def no_batch_reads(*args, **kwargs):  # a tick reading every batch's footer grows with the window
        raise AssertionError("a sensor tick read a landed batch")

    from kcl_pipeline.windows import report
    monkeypatch.setattr(report, "read_batch_info", no_batch_reads)
    first = tick(s, None)
    cursor = Cursor.parse(first.cursor)
    assert cursor.worker_id and cursor.worker_id.startswith("dagster-")
    assert cursor.next_window_ms is None and not first.run_requests  # nothing landed yet
    # The tick's status line says what it did (Dagster shows it instead of "empty result").
    status = first.skip_reason.skip_message
    assert "cycle: leases=2 shards=2" in status and "created=" in status and "first window not decided yet" in status
    observation = [e for e in first.asset_events if isinstance(e, AssetObservation)]
    assert observation and observation[0].asset_key == AssetKey("kinesis_stream")
    assert observation[0].metadata["total_leases"].value == 2
    manager = hosted(s).manager
    workers = {key: proc.pid for key, proc in manager.workers.items()}
    assert set(workers) == {"shardId-000000000000", "shardId-000000000001"}

    reported: dict[str, AssetMaterialization] = {}
    requests = []
    text = first.cursor
    deadline = time.monotonic() + 150
    expected = {partition_key(w) for w in s["windows"]}
    patient = s["consumer"]
    hurried = KinesisConsumerResource(**{**patient.model_dump(), "tick_budget_seconds": 0.0})
    while not expected <= set(reported) and time.monotonic() < deadline:
        time.sleep(INTERVAL)
        # A tick whose budget is spent reports nothing and leaves the cursor's next window where it was.
        s["resources"]["consumer"] = hurried
        rushed = tick(s, text)
        before = Cursor.parse(text).next_window_ms
        assert not rushed.run_requests
        if before is not None:
            assert Cursor.parse(rushed.cursor).next_window_ms == before
        s["resources"]["consumer"] = patient
        result = tick(s, text)
        text = result.cursor
        for event in result.asset_events:
            if isinstance(event, AssetMaterialization):
                assert event.partition not in reported, "a window is reported once"
                reported[event.partition] = event
        requests += result.run_requests
        assert (result.skip_reason is None) == bool(result.run_requests)
        assert hosted(s).manager is manager  # the same manager, the same worker processes, tick after tick
        assert {k: p.pid for k, p in manager.workers.items()} == workers
        assert Cursor.parse(text).worker_id == cursor.worker_id
    assert expected <= set(reported), f"windows reported: {sorted(reported)}"

    zone = open_store(s["consumer"].landing_uri)
    rows = 0
    for key in expected:
        meta = reported[key].metadata
        t0 = int(datetime.strptime(key, PARTITION_FMT).replace(tzinfo=timezone.utc).timestamp() * 1000)
        landed = read_batches(zone, s["consumer"].stream, t0, t0 + W)
        rows += landed.num_rows
        assert meta["batches"].value == len(meta["keys"].value) > 0 and not meta["malformed_keys"].value
        for shard_id, shard in meta["per_shard"].value.items():
            positions = [[r["sequence_number"], r["sub_sequence_number"]] for r in landed.to_pylist()
                         if r["shard_id"] == shard_id]
            assert (shard["first"], shard["last"]) == (positions[0], positions[-1]) and shard["batches"] > 0
    assert rows == s["produced"]  # every record in exactly the windows reported
    assert [r.partition_key for r in requests] == sorted(reported)  # one transform per window, in order
    assert all(r.run_key == f"window-{r.partition_key}" and r.tags[SPARK_RUN_TAG] == "true"
               and r.job_name == WINDOW_JOB for r in requests)
    next_window = Cursor.parse(text).next_window_ms
    assert next_window == max(s["windows"]) + W or next_window > max(s["windows"])

    again = tick(s, text)  # nothing new: nothing reported twice
    assert not [e for e in again.asset_events if isinstance(e, AssetMaterialization)] and not again.run_requests

    shutdown_hosted(timeout=15)  # graceful: every worker releases its lease
    assert set(owners(s["table"]).values()) == {None}


def test_workers_stop_by_themselves_when_ticks_stop_and_a_reload_never_doubles_a_lease(setup):
    s = setup
    cursor = tick(s, None).cursor
    old = hosted(s).manager
    assert wait_until(lambda: len(old.workers) == 2 and set(owners(s["table"]).values()) == {Cursor.parse(
        cursor).worker_id}, 20)

    # A reload: the new code server has an empty registry, the same cursor (same consumer id), and the old
    # workers are still running. The new manager must not take leases the old workers hold.
    hosting._REGISTRY.clear()
    seen_overlap = []
    trace = []  # (old workers alive, new workers) after each tick
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cursor = tick(s, cursor).cursor
        new = hosted(s).manager
        assert new is not old
        alive_old = {k for k, p in old.workers.items() if p.is_alive()}
        overlap = alive_old & {k for k, p in new.workers.items() if p.is_alive()}
        seen_overlap.append(overlap)
        trace.append((len(alive_old), len(new.workers)))
        if not alive_old and len(new.workers) == 2:
            break
        time.sleep(INTERVAL)
    assert not any(seen_overlap), f"two workers on one lease: {seen_overlap}"
    # The new process is a new incarnation: same consumer name, never the old process's worker id (a zombie of
    # the old process must not share its fencing identity).
    assert new.config.worker_id != old.config.worker_id
    assert consumer_name(new.config.worker_id) == consumer_name(old.config.worker_id)
    assert trace[0] == (2, 0), trace  # the new manager waited while the old workers held the leases
    # The old workers stopped by themselves (no cycle for 3 intervals) and the new manager took over.
    assert all(not p.is_alive() for p in old.workers.values())
    assert set(hosted(s).manager.workers) == {"shardId-000000000000", "shardId-000000000001"}

    # Ticks stop altogether: the workers stop within a few heartbeats and release their leases.
    procs = list(hosted(s).manager.workers.values())
    assert wait_until(lambda: all(not p.is_alive() for p in procs), 30)
    assert set(owners(s["table"]).values()) == {None}
    assert json.loads(cursor)["v"] == 1


def test_a_missing_stream_fails_the_tick_with_its_name(setup, unique_name):
    s = setup
    missing = unique_name("nostream")
    s["resources"]["consumer"] = KinesisConsumerResource(
        stream=missing, application=unique_name("app"), window_minutes=1, landing_uri=s["consumer"].landing_uri,
        output_uri=s["consumer"].output_uri, create_zones=True)
    with pytest.raises(Exception, match=f"Kinesis stream {missing} does not exist"):
        tick(s, None)
    assert hosting.registry_key(s["resources"]["consumer"].settings()) not in hosting._REGISTRY  # not kept half-started


def test_a_new_consumer_id_hands_the_leases_over_and_an_old_cursor_skips_to_the_partitions(setup):
    s = setup
    tick(s, Cursor("dagster-a").to_json())
    first = hosted(s).manager
    assert wait_until(lambda: {o and consumer_name(o) for o in owners(s["table"]).values()} == {"dagster-a"}, 20)
    # The cursor now names another consumer (say, it was edited): the old workers stop and release first.
    result = tick(s, Cursor("dagster-b", next_window_ms=0).to_json())
    assert consumer_name(hosted(s).worker_id) == "dagster-b" and not any(p.is_alive() for p in first.workers.values())
    assert Cursor.parse(result.cursor).next_window_ms >= int(s["windows"][0]) - 3600_000  # not before partitions
    cursor = result.cursor
    for _ in range(10):
        cursor = tick(s, cursor).cursor
        if {o and consumer_name(o) for o in owners(s["table"]).values()} == {"dagster-b"}:
            break
        time.sleep(INTERVAL)
    assert {o and consumer_name(o) for o in owners(s["table"]).values()} == {"dagster-b"}


def test_a_split_parent_is_ended_by_the_checkpoint_plan_and_its_children_are_consumed(setup, tmp_path):
    import os

    from dagster import materialize

    from kcl_pipeline.audit.lineage import output_partition
    from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
    from kcl_pipeline.zone.progress import progress_from_leases

    s = setup
    parent = "shardId-000000000000"
    cursor = tick(s, None).cursor

    def landed_everywhere() -> bool:
        nonlocal cursor
        cursor = tick(s, cursor).cursor  # keep ticking: workers stop by themselves without ticks
        progress = progress_from_leases(s["table"].scan())
        return len(progress) == 2 and all(p.landed is not None for p in progress.values())

    # Let the workers land what was produced, then split the parent and produce into its children.
    assert wait_until(landed_everywhere, 90, step=INTERVAL)  # batches flush after 30 s or at the minute's end
    shard = next(x for x in list_shards(s["kinesis"], s["stream"]) if x.shard_id == parent)
    lo, hi = int(shard.hash_key_range.starting_hash_key), int(shard.hash_key_range.ending_hash_key)
    s["kinesis"].split_shard(StreamName=s["stream"], ShardToSplit=parent, NewStartingHashKey=str((lo + hi) // 2))
    wait_stream_active(s["kinesis"], s["stream"])
    produce(s["kinesis"], s["stream"], 40, aggregate=1, first_id=1000, seed=3)

    request = None
    for _ in range(40):
        result = tick(s, cursor)
        cursor = result.cursor
        request = next((r for r in result.run_requests if r.job_name == CHECKPOINTS_JOB), None)
        if request is not None:
            break
        time.sleep(INTERVAL)
    assert request is not None and request.tags[SHARD_END_TAG] == parent
    assert s["table"].get(parent).checkpoint.sequence_number != "SHARD_END"  # the sensor itself never ends it

    # The windows before the parent's last one have materialised (their outputs exist): run what was requested.
    last_arrival = progress_from_leases([s["table"].get(parent)])[parent].landed_arrival_ms
    for window in range(s["windows"][0], last_arrival - last_arrival % W, W):
        os.makedirs(f"{s['consumer'].output_uri}/transformed/{output_partition(window)}", exist_ok=True)
        open(f"{s['consumer'].output_uri}/transformed/{output_partition(window)}/_manifest.json", "w").write("{}")
    result = materialize([s["checkpoints"]], partition_key=request.partition_key, resources=s["resources"],
                         instance=s["instance"], tags=request.tags)
    assert result.success
    leases = {lease.lease_key: lease for lease in s["table"].scan()}
    assert leases[parent].checkpoint.sequence_number == "SHARD_END"
    children = {k for k, lease in leases.items() if parent in lease.parent_shard_ids}
    assert len(children) == 2

    # The next cycles hand the children to workers.
    me = Cursor.parse(cursor).worker_id
    for _ in range(20):
        cursor = tick(s, cursor).cursor
        if all(s["table"].get(c).lease_owner == me for c in children):
            break
        time.sleep(INTERVAL)
    assert all(s["table"].get(c).lease_owner == me for c in children)
    assert children <= set(hosted(s).manager.workers)


def test_children_are_read_once_their_parent_landed_its_last_record_before_its_end_is_committed(setup):
    """A window run that fails or waits (the code server killed while it is queued) must not stop a resharded
    stream: the parent's SHARD_END is committed only after materialisation, but its children are read as soon as
    the parent's last record has landed."""
    from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
    from kcl_pipeline.zone.progress import progress_from_leases

    s = setup
    parent = "shardId-000000000000"
    cursor = tick(s, None).cursor

    def landed_everywhere() -> bool:
        nonlocal cursor
        cursor = tick(s, cursor).cursor
        progress = progress_from_leases(s["table"].scan())
        return len(progress) == 2 and all(p.landed is not None for p in progress.values())

    assert wait_until(landed_everywhere, 90, step=INTERVAL)
    shard = next(x for x in list_shards(s["kinesis"], s["stream"]) if x.shard_id == parent)
    lo, hi = int(shard.hash_key_range.starting_hash_key), int(shard.hash_key_range.ending_hash_key)
    s["kinesis"].split_shard(StreamName=s["stream"], ShardToSplit=parent, NewStartingHashKey=str((lo + hi) // 2))
    wait_stream_active(s["kinesis"], s["stream"])
    produce(s["kinesis"], s["stream"], 40, aggregate=1, first_id=1000, seed=3)

    def children_read() -> bool:
        nonlocal cursor
        cursor = tick(s, cursor).cursor  # no window run and no checkpoint run is ever executed here
        leases = {lease.lease_key: lease for lease in s["table"].scan()}
        children = [lease for lease in leases.values() if parent in lease.parent_shard_ids]
        progress = progress_from_leases(children)
        return len(children) == 2 and any(p.landed is not None for p in progress.values())

    assert wait_until(children_read, 150, step=INTERVAL), "the children waited for the parent's SHARD_END"
    assert s["table"].get(parent).checkpoint.sequence_number != "SHARD_END"  # still only the pipeline ends it


def test_a_fleet_member_location_shares_the_leases_and_never_reports_a_window(setup):
    """Two code servers in one deployment: the pipeline location's sensor and a fleet-member location's sensor
    each host workers; the leases split between them, every record lands once, and only the pipeline's sensor
    reports windows or requests runs."""
    from kcl_pipeline.audit.verify import verify_zone

    s = setup
    member = build_member_sensor(INTERVAL)
    member_resources = {k: s["resources"][k] for k in ("consumer", "aws")}

    def member_tick(cursor):
        with build_sensor_context(cursor=cursor, resources=member_resources, instance=s["instance"]) as context:
            result = member(context)
        assert not result.run_requests and not result.asset_events  # a member reports nothing
        return result

    pipeline_cursor = tick(s, None).cursor
    member_cursor = member_tick(None).cursor
    pipeline_id, member_id = Cursor.parse(pipeline_cursor).worker_id, Cursor.parse(member_cursor).worker_id
    assert consumer_name(pipeline_id) != consumer_name(member_id) and "-member-" in member_id
    reported: list[str] = []
    held: dict[str, str | None] = {}

    def both_hold_and_everything_landed() -> bool:
        nonlocal pipeline_cursor, member_cursor
        result = tick(s, pipeline_cursor)
        pipeline_cursor = result.cursor
        reported.extend(e.partition for e in result.asset_events if isinstance(e, AssetMaterialization))
        member_cursor = member_tick(member_cursor).cursor
        held.clear()
        held.update(owners(s["table"]))
        names = {consumer_name(o) for o in held.values() if o}
        expected = {partition_key(w) for w in s["windows"]}
        return names == {consumer_name(pipeline_id), consumer_name(member_id)} and expected <= set(reported)

    assert wait_until(both_hold_and_everything_landed, 150, step=INTERVAL), (held, reported)
    assert len(reported) == len(set(reported)), "a window was reported twice"
    member_key = hosting.registry_key(s["consumer"].settings(), hosting.MEMBER_SENSOR)
    member_workers = set(hosting._REGISTRY[member_key].manager.workers)
    assert member_workers and member_workers.isdisjoint(hosted(s).manager.workers)
    shutdown_hosted(timeout=15)
    assert set(owners(s["table"]).values()) == {None}
    report = verify_zone(s["consumer"].landing_uri, stream=s["stream"])
    assert report.ok, report
    assert read_batches(open_store(s["consumer"].landing_uri), s["stream"]).num_rows == s["produced"]


def test_a_fleet_member_location_without_hosting_enabled_takes_no_lease(setup):
    s = setup
    member = build_member_sensor(INTERVAL)
    idle = KinesisConsumerResource(**{**s["consumer"].model_dump(), "host_workers": False})
    with build_sensor_context(resources={"consumer": idle, "aws": s["resources"]["aws"]},
                              instance=s["instance"]) as context:
        result = member(context)
    assert "KCL_PIPELINE_HOST_WORKERS" in result.skip_reason.skip_message
    assert not hosting._REGISTRY


def test_windows_outside_the_partitions_are_reported_once_and_never_run(setup):
    """A home kept from a deployment whose partitions started earlier: the cursor still follows a window before
    the first partition, and a run of it waits in the queue (queued before the restart, or a run retry). Such a
    run fails at launch and is retried, and the sensor re-requested the window after each failure. The tick
    names the window once, with what the zone holds of it, never requests it, and cancels the queued run."""
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
    from dagster._core.storage.tags import PARTITION_NAME_TAG
    from dagster._core.utils import make_new_run_id

    from kcl_pipeline.windows.followup import Outstanding

    s = setup
    first = s["windows"][0] - 3600_000  # the setup's first partition
    outside = first - 2 * W
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("kcl_pipeline"), "__repository__"),
                             WINDOW_JOB)
    queued = DagsterRun(job_name=WINDOW_JOB, run_id=make_new_run_id(), status=DagsterRunStatus.QUEUED,
                        tags={PARTITION_NAME_TAG: partition_key(outside)}, remote_job_origin=origin)
    s["instance"].add_run(queued)
    now = int(time.time() * 1000)
    # the next window is the current one: nothing is complete, so the tick's lines are its status line
    cursor = Cursor("dagster-outside", next_window_ms=now - now % W, outstanding={outside: Outstanding(2)})
    result = tick(s, cursor.to_json())
    assert result.run_requests == [], result.run_requests
    assert f"window {partition_key(outside)} (followed by the sensor's cursor) is outside the partitions definition " \
           f"(its first partition is {partition_key(first)}): abandoned, never requested again; it holds 0 batches " \
           f"from 0 shards" in result.skip_reason.skip_message
    assert f"queued run {queued.run_id} of window {partition_key(outside)} canceled" in \
        result.skip_reason.skip_message
    assert s["instance"].get_run_by_id(queued.run_id).status == DagsterRunStatus.CANCELED
    assert Cursor.parse(result.cursor).outstanding == {}
    again = tick(s, result.cursor)
    said = again.skip_reason.skip_message if again.skip_reason else ""
    assert "outside the partitions" not in said and "canceled" not in said
