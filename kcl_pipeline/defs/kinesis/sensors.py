"""The `kinesis_consumer` sensor: this Dagster deployment's member of the consumer fleet.

One tick = one lease-manager cycle (scan, list shards, delete/create leases, acquire, spawn one worker
process per lease), then: read the fleet's landing progress from the lease table, report every window that
became complete since the cursor as a `landed_records` materialisation, and request `transformed_records` +
`kinesis_checkpoints` for it.

State. The manager lives in a module-level registry (keyed by stream and application) so its workers
survive from tick to tick inside the code server; everything that must outlive the process is elsewhere:
leases and progress in the lease table, data in the landing zone, and this host's consumer id and the next
window to report in the sensor cursor (JSON). When ticks stop (sensor off, code reloaded, server killed),
the workers stop by themselves after `keepalive` without a cycle (3 sensor intervals), or at once when the
code server exits, and release their leases; a new code server takes them over only once they are free or
expired, so a reload never has two workers on one lease.
"""

import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    TableColumn,
    TableRecord,
    TableSchema,
    TimeWindowPartitionsDefinition,
    sensor,
)
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES, DagsterRunStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG, WILL_RETRY_TAG
from dagster_aws.s3 import S3Resource

from ...kcl.core.lease_codec import LeaseTableMissing
from ...kcl.core.streams import StreamScope
from ...kcl.shells.aws import client
from ...kcl.shells.lease_table import LeaseTable
from ...kcl.shells.manager import CycleReport, LeaseManager
from ...kcl.shells.shards import StreamNotFound, list_application_shards
from ...landing.completeness import window_complete
from ...landing.layout import landing_directory
from ...landing.progress import progress_from_leases
from ...landing.stream_slice import StreamSlice, current_scope, earlier_incarnations, slice_of
from ...landing.window_followup import (
    RunState,
    WindowObservation,
    follow_up,
    reopen_run_key,
    rerun_key,
    stall_description,
)
from ...landing.window_report import earliest_landed_minute, iso, list_window
from ...landing.window_scan import ending_shards, first_window, resume_window, scan_windows, skip_materialised
from .assets import CHECKPOINTS, KINESIS_STREAM, LANDED, REOPENED, SINGLE, TRANSFORMED, landing_store, output_store
from .partitions import partition_key
from .resources import SPARK_RUN_TAG, AwsResource, KinesisConsumerResource
from .streams import PipelineStream

log = logging.getLogger(__name__)

CURSOR_VERSION = 1
WINDOW_JOB = "kinesis_window_job"
CHECKPOINTS_JOB = "kinesis_checkpoints_job"
SHARD_END_TAG = "kcl_pipeline/shard_end"
HOST_WORKERS_SETTING = "KCL_PIPELINE_HOST_WORKERS"
STALL_CHECK = "windows_not_stalled"
CONSUMER_SENSOR = "kinesis_consumer"  # the pipeline location's sensor: hosts (or observes) and reports windows
MEMBER_SENSOR = "kinesis_fleet_member"  # a fleet-member location's sensor: hosts workers, reports nothing
MEMBER_SUFFIX = "member"  # a member location's consumer name: `<KCL_PIPELINE_WORKER_ID>-member`
OBSERVE_EVERY_MS = 60_000  # fleet observations (lag, leases per consumer): at most once a minute


class CursorError(ValueError):
    """The sensor cursor is not one this sensor wrote."""


@dataclass(frozen=True)
class Cursor:
    worker_id: str | None = None
    next_window_ms: int | None = None  # the first window not reported yet (None: not decided yet)
    observed_at_ms: int | None = None
    # reported windows not materialised yet -> how many times the sensor requested them (window_followup.py)
    outstanding: dict[int, int] = field(default_factory=dict)
    # A multi-stream deployment: each stream's own windows, by its Dagster prefix (the fields above unused)
    streams: dict[str, "Cursor"] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self._data(), sort_keys=True)

    def _data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"v": CURSOR_VERSION, "worker_id": self.worker_id,
                                "next_window_ms": self.next_window_ms, "observed_at_ms": self.observed_at_ms,
                                "outstanding": {str(k): v for k, v in sorted(self.outstanding.items())}}
        if self.streams:
            data["streams"] = {name: c._data() for name, c in sorted(self.streams.items())}
        return data

    @classmethod
    def parse(cls, text: str | None) -> "Cursor":
        if not text:
            return cls()
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
                raise ValueError(f"version {data.get('v') if isinstance(data, dict) else None!r}")
            return cls._from_data(data)
        except (ValueError, TypeError) as exc:
            raise CursorError(
                f"kinesis_consumer cursor {text[:200]!r} is not a v{CURSOR_VERSION} cursor ({exc}); clear the "
                f"cursor in the UI to start afresh (windows already reported are not reported twice: runs are "
                f"keyed by partition)") from None

    @classmethod
    def _from_data(cls, data: Any) -> "Cursor":
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {data!r}")
        streams = data.get("streams") or {}
        if not isinstance(streams, dict):
            raise TypeError(f"streams must be an object, got {streams!r}")
        return cls(worker_id=_opt(data.get("worker_id"), str), next_window_ms=_opt(data.get("next_window_ms"), int),
                   observed_at_ms=_opt(data.get("observed_at_ms"), int),
                   outstanding=_outstanding(data.get("outstanding")),
                   streams={str(name): cls._from_data(sub) for name, sub in streams.items()})


def _opt(value: Any, kind: type) -> Any:
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"expected an integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _outstanding(value: Any) -> dict[int, int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"outstanding must be an object, got {value!r}")
    return {int(k): _opt(v, int) for k, v in value.items()}


def new_worker_id(role: str | None = None) -> str:
    return f"dagster-{socket.gethostname()}{'-' + role if role else ''}-{uuid.uuid4().hex[:8]}"


def consumer_name(worker_id: str) -> str:
    """The stable name of a consumer; its worker ids are `<name>#<incarnation>`, one per code-server process."""
    return worker_id.split("#", 1)[0]


def incarnation_id(name: str) -> str:
    return f"{name}#{uuid.uuid4().hex[:8]}"


# -- the hosted lease managers ------------------------------------------------------------------------------

@dataclass
class HostedConsumer:
    manager: LeaseManager
    worker_id: str


# Keyed by stream, application and the hosting sensor: one process may load both sensors (tests, or one
# code server serving both locations), and each is its own fleet member.
_REGISTRY: dict[tuple[str, str, str], HostedConsumer] = {}
_REGISTRY_LOCK = threading.Lock()


def registry_key(consumer: KinesisConsumerResource, sensor_name: str = CONSUMER_SENSOR) -> tuple[str, str, str]:
    return consumer.stream, consumer.application, sensor_name


def hosted_consumer(consumer: KinesisConsumerResource, aws: AwsResource, worker_id: str,
                    interval_seconds: float, sensor_name: str = CONSUMER_SENSOR) -> HostedConsumer:
    """This process's lease manager for the consumer, created (and started) on first use."""
    key = registry_key(consumer, sensor_name)
    with _REGISTRY_LOCK:
        hosted = _REGISTRY.get(key)
        if hosted is not None and hosted.worker_id == worker_id:
            return hosted
        if hosted is not None:  # the identity changed (cursor cleared and a new id set): hand over gracefully
            log.info("consumer id changed from %s to %s: stopping the old workers", hosted.worker_id, worker_id)
            hosted.manager.shutdown(timeout=min(20.0, interval_seconds))
            del _REGISTRY[key]
        settings = aws.settings()
        name = consumer_name(worker_id)
        manager = LeaseManager(consumer.consumer_config(settings, worker_id, float(interval_seconds)),
                               consumer.processor_spec(settings), keepalive_timeout=3.0 * interval_seconds,
                               predecessor=lambda owner: owner != worker_id and consumer_name(owner) == name)
        manager.start()  # a missing stream fails the tick here, with a message naming it
        hosted = _REGISTRY[key] = HostedConsumer(manager, worker_id)
        return hosted


def shutdown_hosted(timeout: float = 30.0) -> None:
    """Stop every hosted manager's workers (graceful: they release their leases). For tests and embedding."""
    with _REGISTRY_LOCK:
        for hosted in _REGISTRY.values():
            hosted.manager.shutdown(timeout=timeout)
        _REGISTRY.clear()


# -- one tick ---------------------------------------------------------------------------------------------

def consumer_tick(context: SensorEvaluationContext, consumer: KinesisConsumerResource, aws: AwsResource,
                  s3: S3Resource | None, partitions_def: TimeWindowPartitionsDefinition, interval_seconds: float,
                  *, now_ms: int | None = None, targets: Sequence[PipelineStream] = (SINGLE,)) -> SensorResult:
    started = time.monotonic()
    cursor = Cursor.parse(context.cursor)
    _check_window(partitions_def, consumer.window_ms)
    said: list[str] = []

    def say(message: str) -> None:  # the tick log, and the tick's status line when it requests nothing
        context.log.info(message)
        said.append(message)

    if not consumer.host_workers:
        observed = observe_fleet(consumer, aws)
        if observed is None:
            return SensorResult(cursor=cursor.to_json(), skip_reason=(
                f"observer: lease table {consumer.lease_table} does not exist yet (no fleet member has started)"))
        cycle, leases, shards = observed
        worker_id = cursor.worker_id
        say(f"observer (hosts no workers; {HOST_WORKERS_SETTING}=true to join the fleet): {cycle.summary()}")
    else:
        manager, worker_id, cycle = _hosted_cycle(consumer, aws, cursor, interval_seconds, CONSUMER_SENSOR)
        leases, shards = manager.leases, manager.shards
        say(f"consumer {worker_id} cycle: {cycle.summary()}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tick = _Tick(context, consumer, aws, s3, partitions_def, started, now_ms, say)
    run_requests: list[RunRequest] = []
    events: list[Any] = []
    if not any(target.multi for target in targets):
        run_requests, events, new_cursor = _report_windows(
            tick, SINGLE, cursor, cycle, StreamSlice(StreamScope(consumer.stream), list(leases), list(shards)))
        new_cursor = replace(new_cursor, worker_id=worker_id)
    else:
        streams = dict(cursor.streams)
        for target in targets:
            try:
                scope = current_scope(target.configured(consumer), True, aws.settings())
            except StreamNotFound as exc:
                say(f"{target.stream}: {exc}; its windows wait")
                continue
            view = slice_of(scope, leases, shards)
            for earlier in earlier_incarnations(scope, leases):
                say(target.about(
                    f"the stream was re-created: unfinished leases of its earlier incarnation {earlier} remain. Its "
                    f"windows follow the new incarnation; what the earlier one landed after its last complete "
                    f"window stays untransformed in {landing_directory(scope.stream, earlier)} (check it with "
                    f"`kcl-pipeline landing verify`, then `kcl-pipeline forget-incarnation {earlier}`)"))
            requested, reported, streams[target.prefix] = _report_windows(
                tick, target, streams.get(target.prefix) or Cursor(), _cycle_report(view.leases, view.shards), view)
            run_requests += requested
            events += reported
        new_cursor = Cursor(worker_id=worker_id, streams=streams)
    return SensorResult(run_requests=run_requests, asset_events=events, cursor=new_cursor.to_json(),
                        skip_reason=None if run_requests else " | ".join(said)[:4000])


@dataclass(frozen=True)
class _Tick:
    """What every stream's part of one tick shares."""

    context: SensorEvaluationContext
    consumer: KinesisConsumerResource
    aws: AwsResource
    s3: S3Resource | None
    partitions_def: TimeWindowPartitionsDefinition
    started: float
    now_ms: int
    say: Callable[[str], None]


def _hosted_cycle(consumer: KinesisConsumerResource, aws: AwsResource, cursor: Cursor, interval_seconds: float,
                  sensor_name: str) -> tuple[LeaseManager, str, CycleReport]:
    """One lease-manager cycle of this process's fleet member for the sensor (started on first use)."""
    with _REGISTRY_LOCK:
        hosted = _REGISTRY.get(registry_key(consumer, sensor_name))
    # The consumer's name is stable (setting, cursor); its worker id is one per code-server process
    # incarnation, `<name>#<incarnation>`: a new process never shares its fencing identity with a zombie of the
    # old one, and it leaves an earlier incarnation's leases to expire rather than stealing them.
    configured = consumer.worker_id and (consumer.worker_id if sensor_name == CONSUMER_SENSOR
                                         else f"{consumer.worker_id}-{MEMBER_SUFFIX}")
    name = configured or (consumer_name(cursor.worker_id) if cursor.worker_id else None) \
        or (consumer_name(hosted.worker_id) if hosted else None) \
        or new_worker_id(None if sensor_name == CONSUMER_SENSOR else MEMBER_SUFFIX)
    worker_id = hosted.worker_id if hosted and consumer_name(hosted.worker_id) == name else incarnation_id(name)
    manager = hosted_consumer(consumer, aws, worker_id, interval_seconds, sensor_name).manager
    return manager, worker_id, manager.run_cycle()


def member_tick(context: SensorEvaluationContext, consumer: KinesisConsumerResource, aws: AwsResource,
                interval_seconds: float) -> SensorResult:
    """A fleet member's tick (the `kinesis_fleet_member` location): one lease-manager cycle, nothing reported.

    Windows are reported, and runs requested, only by the pipeline location's `kinesis_consumer` sensor, so a
    second code server adds workers to the fleet without a second report of any window."""
    cursor = Cursor.parse(context.cursor)
    if not consumer.host_workers:
        return SensorResult(cursor=cursor.to_json(), skip_reason=(
            f"fleet member idle: {HOST_WORKERS_SETTING} is not true in this code server's environment, so it "
            f"joins no fleet (set it where this location should take leases)"))
    _, worker_id, cycle = _hosted_cycle(consumer, aws, cursor, interval_seconds, MEMBER_SENSOR)
    message = f"fleet member {worker_id} cycle: {cycle.summary()} (windows are reported by {CONSUMER_SENSOR})"
    context.log.info(message)
    return SensorResult(cursor=Cursor(worker_id=worker_id).to_json(), skip_reason=message)


def reopened_requests(instance, target: PipelineStream = SINGLE) -> list[RunRequest]:
    """A window run for every materialised window the latest checkpoint run found late batches in (its
    `reopened_windows` metadata): until it runs again, the checkpoint plan cannot pass those batches. One
    request per set of late batches (the run key names them), so ticks do not repeat it."""
    event = instance.get_latest_materialization_event(target.key(CHECKPOINTS))
    materialization = event.asset_materialization if event is not None else None
    value = materialization.metadata.get(REOPENED) if materialization is not None else None
    late = getattr(value, "data", None)
    if not isinstance(late, dict):
        return []
    return [RunRequest(run_key=target.run_key(reopen_run_key(key, keys)), job_name=target.job(WINDOW_JOB),
                       partition_key=key, tags={SPARK_RUN_TAG: "true"}) for key, keys in sorted(late.items())]


def observe_fleet(consumer: KinesisConsumerResource, aws: AwsResource):
    """The fleet as an observer sees it: the lease table and the stream's shards, without holding a lease.
    None when the lease table does not exist yet."""
    settings = aws.settings()
    try:
        leases = LeaseTable(consumer.lease_table, client("dynamodb", settings)).scan()
    except LeaseTableMissing:
        return None
    streams = consumer.streams
    shards = list_application_shards(client("kinesis", settings), streams, len(streams) > 1)
    return _cycle_report(leases, shards), leases, shards


def _cycle_report(leases, shards) -> CycleReport:
    """The fleet's lease counts as a scan shows them (an observer, or one stream of several)."""
    report = CycleReport(total_leases=len(leases), total_shards=len(shards))
    for lease in leases:
        if lease.is_ended:
            continue
        if lease.lease_owner:
            report.owners[lease.lease_owner] = report.owners.get(lease.lease_owner, 0) + 1
        else:
            report.unclaimed_leases += 1
    return report


def _report_windows(tick: _Tick, target: PipelineStream, cursor: Cursor, cycle: CycleReport,
                    view: StreamSlice) -> tuple[list[RunRequest], list[Any], Cursor]:
    """Report every window of the stream that became complete since its cursor and request its transform
    (host or observer). Returns the run requests, the asset events and the stream's new cursor."""
    context, consumer, aws, s3, say, now_ms = tick.context, tick.consumer, tick.aws, tick.s3, tick.say, tick.now_ms
    if target.multi:
        say = lambda message, _say=tick.say: _say(target.about(message))  # noqa: E731 - a prefix, not logic
    window_ms = consumer.window_ms
    leases, shards, directory = view.leases, view.shards, view.directory
    progress = progress_from_leases(leases)
    grace_ms = int(consumer.grace_seconds * 1000)
    store = landing_store(consumer, aws, s3)
    partitions_start_ms = int(tick.partitions_def.start.timestamp() * 1000)
    window_job = target.job(WINDOW_JOB)

    events: list[Any] = []
    next_window = cursor.next_window_ms
    if next_window is None:
        first = first_window(window_ms, earliest_landed_minute(store, directory), leases, progress, grace_ms,
                             not_before_ms=partitions_start_ms)
        if first.start_ms is None:
            say(f"first window not decided yet: {first.reason}"
                + (f" ({', '.join(first.waiting_on)})" if first.waiting_on else ""))
        else:
            from ...transform.manifest import read_materialised

            # committed manifests only
            committed = read_materialised(output_store(consumer, aws, s3, target)).windows
            next_window = skip_materialised(first.start_ms, committed, window_ms)
            skipped = (next_window - first.start_ms) // window_ms
            say(f"first window {iso(next_window)}: {first.reason}"
                + (f"; {skipped} window(s) from {iso(first.start_ms)} already transformed (their output is "
                   f"committed): not reported again" if skipped else ""))
    else:
        resumed, moved = resume_window(next_window, partitions_start_ms)
        if moved:
            context.log.warning(f"the cursor's next window {iso(next_window)} precedes the first partition; "
                                f"skipping to {iso(partitions_start_ms)}")
        next_window = resumed

    run_requests: list[RunRequest] = []
    outstanding = dict(cursor.outstanding)
    followed = follow_up(outstanding, _observe_windows(context.instance, outstanding, target), now_ms=now_ms,
                         window_ms=window_ms, overdue_ms=int(consumer.overdue_seconds * 1000),
                         max_requests=consumer.max_window_requests)
    outstanding = dict(followed.outstanding)
    for start in followed.rerequest:
        key = partition_key(start)
        run_requests.append(RunRequest(run_key=target.run_key(rerun_key(key, outstanding[start])),
                                       job_name=window_job, partition_key=key, tags={SPARK_RUN_TAG: "true"}))
        say(f"window {key} has no materialisation and its last run failed: transform requested again "
            f"(request {outstanding[start]} of {consumer.max_window_requests})")
    for request in reopened_requests(context.instance, target):
        run_requests.append(request)
        say(f"window {request.partition_key} materialised before batches landed in it: transform requested "
            f"again ({request.run_key})")
    if followed.stalled:
        names = ", ".join(partition_key(w) for w in followed.stalled)
        say(f"STALLED windows (not materialised {consumer.overdue_seconds:.0f}s past their end): {names}"
            + (f"; no more requests for {', '.join(partition_key(w) for w in followed.gave_up)}"
               if followed.gave_up else ""))
    if next_window is not None:
        scan = scan_windows(next_window, window_ms, now_ms,
                            lambda t0, t1: window_complete(t0, t1, shards, progress, leases, grace_ms),
                            limit=max(1, consumer.max_windows_per_tick))
        for status in scan.complete:
            if time.monotonic() - tick.started > consumer.tick_budget_seconds:
                say(f"tick budget spent; window {iso(status.window_start_ms)} waits for the next tick")
                break
            key = partition_key(status.window_start_ms)
            # The listing only (a few LIST pages, whatever the window holds): the window run counts the rows
            # (transformed_records' rows_in) and checks the chain (chain_unbroken), once.
            listing = list_window(store, directory, status.window_start_ms, status.window_end_ms)
            per_shard = listing.per_shard()
            events.append(AssetMaterialization(asset_key=target.key(LANDED), partition=key, metadata={
                "batches": len(listing.batches),
                "shards": len(per_shard),
                "per_shard": MetadataValue.json(per_shard),
                "keys": MetadataValue.json(listing.keys[:200]),
                "malformed_keys": MetadataValue.json(listing.malformed[:200]),
                "completeness": MetadataValue.json(status.reasons),
                "source": "kinesis_consumer sensor",
            }))
            run_requests.append(RunRequest(run_key=target.run_key(rerun_key(key, 1)), job_name=window_job,
                                           partition_key=key, tags={SPARK_RUN_TAG: "true"}))
            outstanding[status.window_start_ms] = 1
            next_window = status.window_end_ms
            say(f"window {key} complete: {len(listing.batches)} batches from {len(per_shard)} shards"
                + (f" ({len(listing.malformed)} malformed keys)" if listing.malformed else "")
                + "; transform requested")
        if scan.stopped_by == "incomplete" and next_window == scan.next_start_ms and scan.blocking is not None:
            waiting = "; ".join(f"{s}: {scan.blocking.reasons.get(s, '')}" for s in scan.blocking.waiting_on)
            say(f"window {partition_key(scan.blocking.window_start_ms)} not complete yet, waiting on {waiting}")

    end_request = _shard_end_request(context, target, leases, progress, next_window, window_ms, partitions_start_ms,
                                     now_ms)
    if end_request is not None:
        run_requests.append(end_request)
        say(f"shards {end_request.tags[SHARD_END_TAG]} landed their last record: checkpoint plan requested "
            f"(it ends them and creates their children's leases)")

    observed_at = cursor.observed_at_ms
    if observed_at is None or now_ms - observed_at >= OBSERVE_EVERY_MS:
        events.append(AssetObservation(asset_key=target.key(KINESIS_STREAM),
                                       metadata=_fleet_metadata(cycle, progress, leases)))
        observed_at = now_ms
    if followed.stalled or set(followed.stalled) != _stalled_before(cursor, now_ms, window_ms, consumer):
        # The stall metric: on every tick while windows are stalled, and once when they no longer are.
        events.append(AssetObservation(asset_key=target.key(TRANSFORMED), metadata={
            "stalled_windows": len(followed.stalled),
            "stalled": MetadataValue.json([partition_key(w) for w in followed.stalled]),
            "outstanding_windows": len(outstanding)}))
        names = [partition_key(w) for w in followed.stalled]
        events.append(AssetCheckEvaluation(
            asset_key=target.key(TRANSFORMED), check_name=STALL_CHECK, passed=not names,
            metadata={"stalled": MetadataValue.json(names),
                      "description": stall_description(names, consumer.overdue_seconds)}))
    return run_requests, events, Cursor(None, next_window, observed_at, outstanding)


def _stalled_before(cursor: Cursor, now_ms: int, window_ms: int, consumer: KinesisConsumerResource) -> set[int]:
    overdue_ms = int(consumer.overdue_seconds * 1000)
    return {w for w in cursor.outstanding if now_ms >= w + window_ms + overdue_ms}


def _observe_windows(instance, outstanding: dict[int, int],
                     target: PipelineStream = SINGLE) -> dict[int, WindowObservation]:
    """What the Dagster instance says about each outstanding window: materialised, and its newest run's state."""
    if not outstanding:
        return {}
    keys = {start: partition_key(start) for start in outstanding}
    done = instance.get_materialized_partitions(target.key(TRANSFORMED))
    observed: dict[int, WindowObservation] = {}
    for start, key in keys.items():
        runs = instance.get_runs(RunsFilter(job_name=target.job(WINDOW_JOB), tags={PARTITION_NAME_TAG: key}),
                                 limit=1)
        observed[start] = WindowObservation(key in done, _run_state(runs[0] if runs else None))
    return observed


def _run_state(run) -> RunState:
    if run is None:
        return RunState.NONE
    if run.status == DagsterRunStatus.SUCCESS:
        return RunState.SUCCEEDED
    if run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return RunState.ACTIVE if run.tags.get(WILL_RETRY_TAG) == "true" else RunState.FAILED
    return RunState.ACTIVE


def _shard_end_request(context, target: PipelineStream, leases, progress, next_window: int | None, window_ms: int,
                       partitions_start_ms: int, now_ms: int) -> RunRequest | None:
    """A kinesis_checkpoints run when shards have landed their last record but are not SHARD_END yet.

    Only the checkpoint plan ends a shard in the pipeline, and the window holding a parent's last record
    cannot complete until its children land, whose leases exist only once the parent is ended: without
    this run a split would wait forever. At most one such run is in flight, and one per window period."""
    ending = ending_shards(leases, progress)
    if not ending or next_window is None or next_window - window_ms < partitions_start_ms:
        return None
    job = target.job(CHECKPOINTS_JOB)
    in_flight = context.instance.get_runs_count(RunsFilter(job_name=job, statuses=IN_PROGRESS_RUN_STATUSES))
    if in_flight:
        return None
    anchor = partition_key(next_window - window_ms)  # any existing partition: the plan itself is global
    return RunRequest(run_key=target.run_key(f"shard-end-{'+'.join(ending)}-{now_ms // window_ms}"), job_name=job,
                      partition_key=anchor, tags={SHARD_END_TAG: ",".join(ending)})


LEASE_TABLE_SCHEMA = TableSchema(columns=[
    TableColumn("lease", "string"), TableColumn("owner", "string"), TableColumn("counter", "int"),
    TableColumn("checkpoint", "string"), TableColumn("lag_ms", "int"),
])


def _fleet_metadata(cycle, progress, leases) -> dict[str, Any]:
    """Fixed keys (they plot over time whatever the shards and owners) and the lease table as a table."""
    rows = []
    lags = []
    for lease in sorted(leases, key=lambda lease: lease.lease_key):
        p = progress.get(lease.lease_key)
        lag = p.millis_behind_latest if p is not None and not lease.is_ended else None
        if lag is not None:
            lags.append(lag)
        rows.append(TableRecord({"lease": lease.lease_key, "owner": lease.lease_owner or "",
                                 "counter": lease.lease_counter, "checkpoint": str(lease.checkpoint),
                                 "lag_ms": lag if lag is not None else -1}))
    return {
        "total_leases": cycle.total_leases,
        "total_shards": cycle.total_shards if cycle.total_shards is not None else -1,
        "unclaimed_leases": cycle.unclaimed_leases,
        "worker_leases": cycle.worker_leases,
        "leases_held": sum(cycle.owners.values()),
        "consumers": len(cycle.owners),
        "max_lag_ms": max(lags) if lags else 0,
        "leases": MetadataValue.table(rows, schema=LEASE_TABLE_SCHEMA),
    }


def _check_window(partitions_def: TimeWindowPartitionsDefinition, window_ms: int) -> None:
    keys = partitions_def.get_first_partition_window()
    if keys is not None:
        length = round((keys.end - keys.start).total_seconds() * 1000)
        if length != window_ms:
            raise ValueError(f"the consumer resource's window ({window_ms // 60_000} min) differs from the "
                             f"partitions' ({length // 60_000} min): build both from the same settings")


def build_consumer_sensor(partitions_def: TimeWindowPartitionsDefinition, jobs, interval_seconds: int,
                          targets: Sequence[PipelineStream] = (SINGLE,)):
    """`jobs`: each stream's window job (transform + checkpoints) and checkpoints-only job, named as above."""
    names = sorted(job.name for job in jobs)
    expected = sorted(target.job(base) for target in targets for base in (WINDOW_JOB, CHECKPOINTS_JOB))
    if names != expected:
        raise ValueError(f"the kinesis_consumer sensor targets the jobs {', '.join(expected)}, got {names}")

    @sensor(name=CONSUMER_SENSOR, jobs=jobs, minimum_interval_seconds=interval_seconds,
            default_status=DefaultSensorStatus.RUNNING,
            description="This deployment's Kinesis consumer: one lease-manager cycle per tick (one worker process "
                        "per held lease), then reports every window that became complete as landed_records and "
                        "requests its transform and checkpoints.")
    def kinesis_consumer(context: SensorEvaluationContext, consumer: KinesisConsumerResource, aws: AwsResource,
                         s3: S3Resource) -> SensorResult:
        return consumer_tick(context, consumer, aws, s3, partitions_def, interval_seconds, targets=targets)

    return kinesis_consumer


def build_member_sensor(interval_seconds: int):
    """The fleet-member location's one sensor: hosts lease workers, targets no job, reports no window."""

    @sensor(name=MEMBER_SENSOR, minimum_interval_seconds=interval_seconds, default_status=DefaultSensorStatus.RUNNING,
            description=f"A second host's member of the Kinesis consumer fleet: one lease-manager cycle per tick "
                        f"(one worker process per held lease). It reports nothing: the pipeline location's "
                        f"{CONSUMER_SENSOR} sensor reports windows and requests their runs.")
    def kinesis_fleet_member(context: SensorEvaluationContext, consumer: KinesisConsumerResource,
                             aws: AwsResource) -> SensorResult:
        return member_tick(context, consumer, aws, interval_seconds)

    return kinesis_fleet_member
