"""One tick of the `kinesis_consumer` sensor, and of a fleet member's `kinesis_fleet_member` sensor.

A consumer tick looks at the fleet once (the hosted member's lease-manager cycle, or an observer's scan of the
lease table), then, for each stream, in named steps: decide the next window to report, follow up the windows
asked for and not done yet (request one whose run ended without its commit again, name the stalled ones), ask
for — and follow from then on — the windows the newest checkpoint report is stopped on (late batches, no
commit), report every window complete since the cursor as a `landed_records` materialisation and request its
run, request the checkpoint plan when shards must be ended, and observe the fleet. The decisions are
landing/'s (window_scan, window_followup, report_start, fleet_view); the steps gather what the Dagster instance
and the output's window commits say and turn the decisions into run requests, asset events and the tick's
status line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    AssetRecordsFilter,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    TableColumn,
    TableRecord,
    TableSchema,
    TimeWindowPartitionsDefinition,
)
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES, DagsterRunStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG, WILL_RETRY_TAG
from dagster_aws.s3 import S3Resource

from ...kcl.core.streams import StreamScope
from ...kcl.shells.manager import CycleReport
from ...kcl.shells.memory import host_metadata
from ...kcl.shells.shards import StreamNotFound
from ...landing.completeness import WindowStatus
from ...landing.fleet_view import lease_counts, lease_lags, observation_due
from ...landing.layout import landing_directory
from ...landing.progress import ShardProgress, progress_from_leases
from ...landing.report_start import start_reports
from ...landing.store import ZoneStore
from ...landing.stream_slice import StreamSlice, current_scope, earlier_incarnations, slice_of
from ...landing.window_followup import (
    GIVEN_UP_PER_TICK,
    FollowUp,
    Outstanding,
    RunState,
    WindowObservation,
    follow_up,
    observation_slice,
    rerun_key,
    shard_end_run_key,
    stall_description,
    stall_metric_due,
    track_reports,
)
from ...landing.window_report import iso, list_window
from ...landing.window_scan import complete_windows, resume_window, shard_ends_to_plan
from ...transform.manifest import CommitFormatError, read_commit
from .assets import (
    CHECKPOINTS,
    KINESIS_STREAM,
    LANDED,
    REOPENED,
    SINGLE,
    TRANSFORMED,
    UNCOMMITTED,
    landing_store,
    output_store,
)
from .checks import STALL_CHECK
from .cursor import Cursor
from .fleet_hosting import (
    CONSUMER_SENSOR,
    HOST_WORKERS_SETTING,
    MEMBER_SENSOR,
    FleetCycle,
    hosted_cycle,
    observe_fleet,
)
from .jobs import CHECKPOINTS_JOB, SHARD_END_TAG, WINDOW_JOB
from .partitions import partition_key, window_of
from .resources import SPARK_RUN_TAG, AwsResource, KinesisConsumerResource
from .streams import PipelineStream

LEASE_TABLE_SCHEMA = TableSchema(columns=[
    TableColumn("lease", "string"), TableColumn("owner", "string"), TableColumn("counter", "int"),
    TableColumn("checkpoint", "string"), TableColumn("lag_ms", "int"),
])


# -- the ticks ----------------------------------------------------------------------------------------------

def consumer_tick(context: SensorEvaluationContext, consumer: KinesisConsumerResource, aws: AwsResource,
                  s3: S3Resource | None, partitions_def: TimeWindowPartitionsDefinition, interval_seconds: float,
                  *, now_ms: int | None = None, targets: Sequence[PipelineStream] = (SINGLE,)) -> SensorResult:
    started = time.monotonic()
    cursor = Cursor.parse(context.cursor)
    _check_window(partitions_def, consumer.window_ms)
    status = _StatusLine(context)
    fleet = _look_at_fleet(consumer, aws, cursor, interval_seconds, status.say)
    if fleet is None:
        return SensorResult(cursor=cursor.to_json(), skip_reason=(
            f"observer: lease table {consumer.lease_table} does not exist yet (no fleet member has started)"))
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tick = _Tick(context, consumer, aws, s3, partitions_def, started, now_ms, status.say)
    if any(target.multi for target in targets):
        reported = _report_each_stream(tick, targets, cursor, fleet)
    else:
        reported = _report_the_stream(tick, cursor, fleet)
    return SensorResult(run_requests=reported.run_requests, asset_events=reported.events,
                        cursor=reported.cursor.to_json(), skip_reason=status.skip_reason(reported.run_requests))


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
    fleet = hosted_cycle(consumer, aws, cursor.worker_id, interval_seconds, MEMBER_SENSOR)
    message = (f"fleet member {fleet.worker_id} cycle: {fleet.cycle.summary()} (windows are reported by "
               f"{CONSUMER_SENSOR})")
    context.log.info(message)
    return SensorResult(cursor=Cursor(worker_id=fleet.worker_id).to_json(), skip_reason=message)


class _StatusLine:
    """The tick's log, and its status line when it requests nothing (Dagster shows it instead of "empty")."""

    def __init__(self, context: SensorEvaluationContext) -> None:
        self._context = context
        self._said: list[str] = []

    def say(self, message: str) -> None:
        self._context.log.info(message)
        self._said.append(message)

    def skip_reason(self, run_requests: Sequence[RunRequest]) -> str | None:
        return None if run_requests else " | ".join(self._said)[:4000]


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

    @property
    def partitions_start_ms(self) -> int:
        return int(self.partitions_def.start.timestamp() * 1000)


@dataclass
class _Reported:
    """What a tick adds for its streams: run requests, asset events, and the new cursor."""

    run_requests: list[RunRequest] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    cursor: Cursor = field(default_factory=Cursor)


def _check_window(partitions_def: TimeWindowPartitionsDefinition, window_ms: int) -> None:
    keys = partitions_def.get_first_partition_window()
    if keys is not None:
        length = round((keys.end - keys.start).total_seconds() * 1000)
        if length != window_ms:
            raise ValueError(f"the consumer resource's window ({window_ms // 60_000} min) differs from the "
                             f"partitions' ({length // 60_000} min): build both from the same settings")


def _look_at_fleet(consumer: KinesisConsumerResource, aws: AwsResource, cursor: Cursor, interval_seconds: float,
                   say: Callable[[str], None]) -> FleetCycle | None:
    """The hosted member's lease-manager cycle, or an observer's scan (None: no lease table yet)."""
    if consumer.host_workers:
        fleet = hosted_cycle(consumer, aws, cursor.worker_id, interval_seconds, CONSUMER_SENSOR)
        say(f"consumer {fleet.worker_id} cycle: {fleet.cycle.summary()}")
        return fleet
    observed = observe_fleet(consumer, aws)
    if observed is None:
        return None
    say(f"observer (hosts no workers; {HOST_WORKERS_SETTING}=true to join the fleet): {observed.cycle.summary()}")
    return replace(observed, worker_id=cursor.worker_id)  # an observer keeps the id a host once wrote


def _report_the_stream(tick: _Tick, cursor: Cursor, fleet: FleetCycle) -> _Reported:
    """A single-stream deployment: the fleet is the stream's, and the cursor its own."""
    view = StreamSlice(StreamScope(tick.consumer.stream), list(fleet.leases), list(fleet.shards))
    reported = report_windows(tick, SINGLE, cursor, fleet.cycle, view)
    reported.cursor = replace(reported.cursor, worker_id=fleet.worker_id)
    return reported


def _report_each_stream(tick: _Tick, targets: Sequence[PipelineStream], cursor: Cursor,
                        fleet: FleetCycle) -> _Reported:
    """A multi-stream deployment: each stream's slice of the fleet reports its own windows, under its own part
    of the cursor; a stream that does not exist (yet) waits while the others report."""
    streams = dict(cursor.streams)
    out = _Reported()
    for target in targets:
        try:
            scope = current_scope(target.configured(tick.consumer), True, tick.aws.settings())
        except StreamNotFound as exc:
            tick.say(f"{target.stream}: {exc}; its windows wait")
            continue
        view = slice_of(scope, fleet.leases, fleet.shards)
        _name_earlier_incarnations(tick, target, scope, fleet)
        reported = report_windows(tick, target, streams.get(target.prefix) or Cursor(),
                                  lease_counts(view.leases, view.shards), view)
        streams[target.prefix] = reported.cursor
        out.run_requests += reported.run_requests
        out.events += reported.events
    out.cursor = Cursor(worker_id=fleet.worker_id, streams=streams)
    return out


def _name_earlier_incarnations(tick: _Tick, target: PipelineStream, scope: StreamScope, fleet: FleetCycle) -> None:
    for earlier in earlier_incarnations(scope, fleet.leases):
        tick.say(target.about(
            f"the stream was re-created: unfinished leases of its earlier incarnation {earlier} remain. Its "
            f"windows follow the new incarnation; what the earlier one landed after its last complete "
            f"window stays untransformed in {landing_directory(scope.stream, earlier)} (check it with "
            f"`kcl-pipeline landing verify`, then `kcl-pipeline forget-incarnation {earlier}`)"))


# -- one stream's windows, step by step ---------------------------------------------------------------------

@dataclass
class _StreamTick:
    """One stream's part of a tick: what its steps read, and what they add (`reported`)."""

    tick: _Tick
    target: PipelineStream
    view: StreamSlice
    progress: dict[str, ShardProgress]
    store: ZoneStore
    output: ZoneStore  # the stream's transform output: its window commits say which windows are done
    reported: _Reported = field(default_factory=_Reported)

    @property
    def consumer(self) -> KinesisConsumerResource:
        return self.tick.consumer

    def say(self, message: str) -> None:
        self.tick.say(self.target.about(message))  # named when there are several streams

    def partition_start(self, key: str) -> int:
        return window_of(self.tick.partitions_def, key)[0]

    def request_window(self, key: str, run_key: str) -> None:
        self.reported.run_requests.append(RunRequest(
            run_key=self.target.run_key(run_key), job_name=self.target.job(WINDOW_JOB), partition_key=key,
            tags={SPARK_RUN_TAG: "true"}))


def report_windows(tick: _Tick, target: PipelineStream, cursor: Cursor, cycle: CycleReport,
                   view: StreamSlice) -> _Reported:
    """Report every window of the stream that became complete since its cursor and request its transform
    (host or observer). Returns the run requests, the asset events and the stream's new cursor."""
    stream = _StreamTick(tick, target, view, progress_from_leases(view.leases),
                         landing_store(tick.consumer, tick.aws, tick.s3),
                         output_store(tick.consumer, tick.aws, tick.s3, target))
    next_window = _next_window_to_report(stream, cursor.next_window_ms)
    followed, rotation = _follow_up_requested_windows(stream, cursor)
    outstanding = dict(followed.outstanding)
    _request_failed_windows_again(stream, followed)
    report = _ask_for_windows_checkpoints_wait_on(stream, outstanding, cursor.checkpoint_report, next_window)
    _name_stalled_windows(stream, followed)
    if next_window is not None:
        next_window = _report_complete_windows(stream, next_window, outstanding)
    _request_shard_ends(stream, next_window)
    observed_at = _observe_the_fleet(stream, cursor.observed_at_ms, cycle)
    _report_the_stall_metric(stream, followed, cursor.outstanding, outstanding)
    stream.reported.cursor = Cursor(None, next_window, observed_at, outstanding, checkpoint_report=report,
                                    rotation=rotation)
    return stream.reported


def _next_window_to_report(stream: _StreamTick, cursor_next_ms: int | None) -> int | None:
    """The cursor's next window, never before the first partition; with none yet, where reports start
    (landing/report_start.py). None: not decided yet."""
    tick, consumer = stream.tick, stream.consumer
    if cursor_next_ms is None:
        start = start_reports(stream.store, stream.view.directory, stream.output, stream.view.leases,
                              stream.progress, window_ms=consumer.window_ms, grace_ms=consumer.grace_ms,
                              not_before_ms=tick.partitions_start_ms, now_ms=tick.now_ms)
        stream.say(start.note)
        return start.start_ms
    resumed, moved = resume_window(cursor_next_ms, tick.partitions_start_ms)
    if moved:
        tick.context.log.warning(f"the cursor's next window {iso(cursor_next_ms)} precedes the first partition; "
                                 f"skipping to {iso(tick.partitions_start_ms)}")
    return resumed


def _follow_up_requested_windows(stream: _StreamTick, cursor: Cursor) -> tuple[FollowUp, int]:
    """The follow-up of the windows asked for (the given-up ones a few per tick, in turn), and the rotation."""
    consumer = stream.consumer
    windows, rotation = observation_slice(cursor.outstanding, cursor.rotation, GIVEN_UP_PER_TICK)
    observed = observe_windows(stream.tick.context.instance, stream.output,
                               {w: cursor.outstanding[w] for w in windows}, stream.target)
    return follow_up(cursor.outstanding, observed, now_ms=stream.tick.now_ms, window_ms=consumer.window_ms,
                     overdue_ms=consumer.overdue_ms, max_requests=consumer.max_window_requests), rotation


def _request_failed_windows_again(stream: _StreamTick, followed: FollowUp) -> None:
    for start in followed.rerequest:
        key, entry = partition_key(start), followed.outstanding[start]
        stream.request_window(key, entry.run_key(key))
        stream.say(f"window {key} has no commit and its last run ended: transform requested again "
                   f"(request {entry.requests} of {stream.consumer.max_window_requests})")


def _ask_for_windows_checkpoints_wait_on(stream: _StreamTick, outstanding: dict[int, Outstanding],
                                         seen: int | None, reported_before_ms: int | None) -> int | None:
    """The windows the newest checkpoint report is stopped on (late batches in a committed window, or no
    commit), asked for once per report and followed from then on. Returns the report acted on."""
    report = read_checkpoint_report(stream.tick.context.instance, stream.target, stream.partition_start)
    if report is None or (seen is not None and report.storage_id <= seen):
        return seen
    tracked = track_reports(outstanding, report.late, report.uncommitted, report=str(report.storage_id),
                            reported_before_ms=reported_before_ms, now_ms=stream.tick.now_ms,
                            partition=partition_key)
    outstanding.clear()
    outstanding.update(tracked.outstanding)
    for start in tracked.request:
        key, entry = partition_key(start), tracked.outstanding[start]
        stream.request_window(key, entry.run_key(key))
        why = "batches landed in it after its run" if entry.need else "checkpoints wait on it and it has no commit"
        stream.say(f"window {key}: {why}; transform requested again and followed ({entry.run_key(key)})")
    return report.storage_id


def _name_stalled_windows(stream: _StreamTick, followed: FollowUp) -> None:
    if followed.stalled:
        names = ", ".join(partition_key(w) for w in followed.stalled)
        stream.say(f"STALLED windows (not materialised {stream.consumer.overdue_seconds:.0f}s past their end): "
                   f"{names}" + (f"; no more requests for {', '.join(partition_key(w) for w in followed.gave_up)}"
                                 if followed.gave_up else ""))


def _report_complete_windows(stream: _StreamTick, next_window: int, outstanding: dict[int, int]) -> int:
    """Report the windows complete from `next_window` on, within the tick's bounds, and request their runs
    (each is outstanding until it materialises). Returns the first window not reported."""
    tick, consumer = stream.tick, stream.consumer
    scan = complete_windows(next_window, consumer.window_ms, tick.now_ms, stream.view.shards, stream.progress,
                            stream.view.leases, consumer.grace_ms, consumer.max_windows_per_tick)
    for status in scan.complete:
        if time.monotonic() - tick.started > consumer.tick_budget_seconds:
            stream.say(f"tick budget spent; window {iso(status.window_start_ms)} waits for the next tick")
            break
        _report_complete_window(stream, status)
        outstanding[status.window_start_ms] = 1
        next_window = status.window_end_ms
    if scan.stopped_by == "incomplete" and next_window == scan.next_start_ms and scan.blocking is not None:
        waiting = "; ".join(f"{s}: {scan.blocking.reasons.get(s, '')}" for s in scan.blocking.waiting_on)
        stream.say(f"window {partition_key(scan.blocking.window_start_ms)} not complete yet, waiting on {waiting}")
    return next_window


def _report_complete_window(stream: _StreamTick, status: WindowStatus) -> None:
    """The window's `landed_records` materialisation and its run. The listing only (a few LIST pages, whatever
    the window holds): the window run counts the rows (transformed_records' rows_in) and checks the chain
    (chain_unbroken), once."""
    key = partition_key(status.window_start_ms)
    listing = list_window(stream.store, stream.view.directory, status.window_start_ms, status.window_end_ms)
    per_shard = listing.per_shard()
    stream.reported.events.append(AssetMaterialization(asset_key=stream.target.key(LANDED), partition=key, metadata={
        "batches": len(listing.batches),
        "shards": len(per_shard),
        "per_shard": MetadataValue.json(per_shard),
        "keys": MetadataValue.json(listing.keys[:200]),
        "malformed_keys": MetadataValue.json(listing.malformed[:200]),
        "completeness": MetadataValue.json(status.reasons),
        "source": "kinesis_consumer sensor",
    }))
    stream.request_window(key, rerun_key(key, 1))
    stream.say(f"window {key} complete: {len(listing.batches)} batches from {len(per_shard)} shards"
               + (f" ({len(listing.malformed)} malformed keys)" if listing.malformed else "")
               + "; transform requested")


def _request_shard_ends(stream: _StreamTick, next_window: int | None) -> None:
    """A kinesis_checkpoints run when shards have landed their last record but are not SHARD_END yet (the
    plan ends them and creates their children's leases): at most one such run in flight, one per window."""
    tick, target, window_ms = stream.tick, stream.target, stream.consumer.window_ms
    ends = shard_ends_to_plan(stream.view.leases, stream.progress, next_window, window_ms, tick.partitions_start_ms)
    if ends is None:
        return
    job = target.job(CHECKPOINTS_JOB)
    if tick.context.instance.get_runs_count(RunsFilter(job_name=job, statuses=IN_PROGRESS_RUN_STATUSES)):
        return
    shards = ",".join(ends.shards)
    stream.reported.run_requests.append(RunRequest(
        run_key=target.run_key(shard_end_run_key(ends.shards, tick.now_ms, window_ms)), job_name=job,
        partition_key=partition_key(ends.anchor_ms), tags={SHARD_END_TAG: shards}))
    stream.say(f"shards {shards} landed their last record: checkpoint plan requested (it ends them and creates "
               f"their children's leases)")


def _observe_the_fleet(stream: _StreamTick, observed_at_ms: int | None, cycle: CycleReport) -> int | None:
    """An observation of `kinesis_stream` (lag, leases per consumer), at most once a minute; returns when the
    fleet was last observed."""
    now_ms = stream.tick.now_ms
    if not observation_due(observed_at_ms, now_ms):
        return observed_at_ms
    stream.reported.events.append(AssetObservation(
        asset_key=stream.target.key(KINESIS_STREAM), metadata=_fleet_metadata(cycle, stream.progress,
                                                                               stream.view.leases)))
    return now_ms


def _report_the_stall_metric(stream: _StreamTick, followed: FollowUp, previous: Mapping[int, int],
                             outstanding: Mapping[int, int]) -> None:
    """The stall metric and the windows_not_stalled check: on every tick while windows are stalled, and once
    when they no longer are."""
    consumer = stream.consumer
    if not stall_metric_due(followed.stalled, previous, now_ms=stream.tick.now_ms, window_ms=consumer.window_ms,
                            overdue_ms=consumer.overdue_ms):
        return
    names = [partition_key(w) for w in followed.stalled]
    transformed = stream.target.key(TRANSFORMED)
    stream.reported.events.append(AssetObservation(asset_key=transformed, metadata={
        "stalled_windows": len(followed.stalled),
        "stalled": MetadataValue.json(names),
        "outstanding_windows": len(outstanding)}))
    stream.reported.events.append(AssetCheckEvaluation(
        asset_key=transformed, check_name=STALL_CHECK, passed=not names,
        metadata={"stalled": MetadataValue.json(names),
                  "description": stall_description(names, consumer.overdue_seconds)}))


def _fleet_metadata(cycle: CycleReport, progress: Mapping[str, ShardProgress], leases) -> dict[str, Any]:
    """Fixed keys (they plot over time whatever the shards and owners) and the lease table as a table."""
    lags = lease_lags(leases, progress)
    known = [row.lag_ms for row in lags if row.lag_ms is not None]
    rows = [TableRecord({"lease": row.lease, "owner": row.owner, "counter": row.counter,
                         "checkpoint": row.checkpoint, "lag_ms": row.lag_ms if row.lag_ms is not None else -1})
            for row in lags]
    return {
        "total_leases": cycle.total_leases,
        "total_shards": cycle.total_shards if cycle.total_shards is not None else -1,
        "unclaimed_leases": cycle.unclaimed_leases,
        "worker_leases": cycle.worker_leases,
        "leases_held": sum(cycle.owners.values()),
        "consumers": len(cycle.owners),
        "max_lag_ms": max(known) if known else 0,
        "leases": MetadataValue.table(rows, schema=LEASE_TABLE_SCHEMA),
        **host_metadata(),  # this host's lease workers' memory (PSS in all, the largest), how they start
    }


# -- what the Dagster instance says -------------------------------------------------------------------------

def observe_windows(instance, output: ZoneStore, outstanding: Mapping[int, Outstanding],
                    target: PipelineStream = SINGLE) -> dict[int, WindowObservation]:
    """Each window's state: done when its commit is in the output and names every batch its entry needs (one
    GET; Dagster's materialisation says nothing of a failed check or a late batch), else its newest run's
    state (one run query; none for a given-up window)."""
    observed: dict[int, WindowObservation] = {}
    for start, entry in outstanding.items():
        if _committed(output, start, entry):
            observed[start] = WindowObservation(True, RunState.SUCCEEDED)
            continue
        if entry.gave_up:
            observed[start] = WindowObservation(False, RunState.NONE)
            continue
        runs = instance.get_runs(RunsFilter(job_name=target.job(WINDOW_JOB),
                                            tags={PARTITION_NAME_TAG: partition_key(start)}), limit=1)
        observed[start] = WindowObservation(False, _run_state(runs[0] if runs else None))
    return observed


def _committed(output: ZoneStore, start: int, entry: Outstanding) -> bool:
    try:
        commit = read_commit(output, start)
    except CommitFormatError:
        return False  # the checkpoint run fails naming it; for the follow-up the window is not done
    return commit is not None and set(entry.need) <= commit.batches


def _run_state(run) -> RunState:
    if run is None:
        return RunState.NONE
    if run.status == DagsterRunStatus.SUCCESS:
        return RunState.SUCCEEDED
    if run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return RunState.ACTIVE if run.tags.get(WILL_RETRY_TAG) == "true" else RunState.FAILED
    return RunState.ACTIVE


@dataclass(frozen=True)
class CheckpointReportSeen:
    """What the newest kinesis_checkpoints materialisation says the checkpoints wait on."""

    storage_id: int
    late: dict[int, list[str]]  # committed window -> batches its commit does not name
    uncommitted: list[int]  # windows a shard is stopped on that have no commit


def read_checkpoint_report(instance, target: PipelineStream, start_of: Callable[[str], int]
                           ) -> CheckpointReportSeen | None:
    """The newest checkpoint report (one event query), its partition keys as window starts (`start_of`)."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=target.key(CHECKPOINTS)), limit=1).records
    materialization = records[0].asset_materialization if records else None
    if materialization is None:
        return None
    late = getattr(materialization.metadata.get(REOPENED), "data", None)
    uncommitted = getattr(materialization.metadata.get(UNCOMMITTED), "data", None)
    return CheckpointReportSeen(
        records[0].storage_id,
        {start_of(k): [str(b) for b in v] for k, v in late.items()} if isinstance(late, dict) else {},
        [start_of(k) for k in uncommitted] if isinstance(uncommitted, list) else [])
