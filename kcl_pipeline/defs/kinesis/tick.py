"""One tick of the `kinesis_consumer` sensor, and of a fleet member's `kinesis_fleet_member` sensor.

A consumer tick looks at the fleet once (the hosted member's lease-manager cycle, or an observer's scan of the
lease table), then, for each stream, takes the decision steps of windows/tick/decisions.py (the next window to report,
the follow-up of the windows asked for, the windows the newest checkpoint report is stopped on, the windows
complete now, the shards to end, the fleet observation and the stall metric). This module is their Dagster
I/O: it gathers what the Dagster instance, the landing zone and the output's window commits say, and turns the
decisions into run requests, asset events and the tick's status line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
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

from ...deployment.consumer import ConsumerSettings
from ...deployment.fleet_hosting import (
    CONSUMER_SENSOR,
    HOST_WORKERS_SETTING,
    MEMBER_SENSOR,
    FleetCycle,
    hosted_cycle,
    observe_fleet,
)
from ...deployment.streams import PipelineStream
from ...kcl.aws_settings import AwsSettings
from ...kcl.core.fleet.cycle import CycleReport
from ...kcl.core.model import Lease
from ...kcl.core.streams import StreamScope
from ...kcl.shells.shards import StreamNotFound
from ...kcl.shells.workers.memory import host_metadata
from ...windows.checkpoints.record import CheckpointRecord, CheckpointRecordError, read_checkpoint_record
from ...windows.commit import window_done
from ...windows.fleet_view import lease_counts, lease_lags
from ...windows.followup import Outstanding, RunState, WindowObservation
from ...windows.keys import partition_key, window_start_ms
from ...windows.manifest import CommitFormatError, read_commit
from ...windows.report import list_window
from ...windows.tick.cursor import Cursor
from ...windows.tick.decisions import (
    ReportDue,
    SensorRules,
    ShardEndRun,
    StallMetric,
    WindowRun,
    abandoned_line,
    finish_tick,
    follow_windows,
    start_tick,
)
from ...windows.tick.report_start import ReportStart, start_reports
from ...zone.layout import iso, landing_directory
from ...zone.progress import progress_from_leases
from ...zone.store import ZoneStore
from ...zone.stream_slice import StreamSlice, current_scope, earlier_incarnations, slice_of
from .assets import (
    KINESIS_STREAM,
    LANDED,
    SINGLE,
    TRANSFORMED,
    landing_store,
    output_store,
)
from .checks import STALL_CHECK
from .jobs import CHECKPOINTS_JOB, SHARD_END_TAG, WINDOW_JOB
from .resources import SPARK_RUN_TAG, AwsResource, KinesisConsumerResource

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
    settings, aws_settings = consumer.settings(), aws.settings()
    _check_window(partitions_def, settings.window_ms)
    status = _StatusLine(context)
    fleet = _look_at_fleet(settings, aws_settings, cursor, interval_seconds, status.say)
    if fleet is None:
        return SensorResult(cursor=cursor.to_json(), skip_reason=(
            f"observer: lease table {settings.lease_table} does not exist yet (no fleet member has started)"))
    if fleet.failure is not None:  # the fleet's view is not this tick's: nothing is reported from it
        context.log.warning(fleet.failure)
        return SensorResult(cursor=cursor.to_json(), skip_reason=f"consumer {fleet.worker_id}: {fleet.failure}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tick = _Tick(context, settings, aws, s3, partitions_def, started, now_ms, status.say)
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
    fleet = hosted_cycle(consumer.settings(), aws.settings(), cursor.worker_id, interval_seconds, MEMBER_SENSOR)
    if fleet.failure is not None:
        context.log.warning(fleet.failure)
        return SensorResult(cursor=cursor.to_json(), skip_reason=f"fleet member {fleet.worker_id}: {fleet.failure}")
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
    consumer: ConsumerSettings
    aws: AwsResource
    s3: S3Resource | None
    partitions_def: TimeWindowPartitionsDefinition
    started: float
    now_ms: int
    say: Callable[[str], None]

    @property
    def rules(self) -> SensorRules:
        consumer = self.consumer
        return SensorRules(window_ms=consumer.window_ms, grace_ms=consumer.grace_ms, overdue_ms=consumer.overdue_ms,
                           max_window_requests=consumer.max_window_requests,
                           max_windows_per_tick=consumer.max_windows_per_tick,
                           partitions_start_ms=int(self.partitions_def.start.timestamp() * 1000))


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


def _look_at_fleet(consumer: ConsumerSettings, aws: AwsSettings, cursor: Cursor, interval_seconds: float,
                   say: Callable[[str], None]) -> FleetCycle | None:
    """The hosted member's lease-manager cycle, or an observer's scan (None: no lease table yet)."""
    if consumer.host_workers:
        fleet = hosted_cycle(consumer, aws, cursor.worker_id, interval_seconds, CONSUMER_SENSOR)
        if fleet.failure is None:
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


# -- one stream's windows: observations gathered, decisions (windows/tick/decisions.py) turned into Dagster's ---------

@dataclass
class _StreamTick:
    """One stream's part of a tick: what its steps read, and what they add (`reported`)."""

    tick: _Tick
    target: PipelineStream
    view: StreamSlice
    store: ZoneStore
    output: ZoneStore  # the stream's transform output: its window commits say which windows are done
    reported: _Reported = field(default_factory=_Reported)

    def say(self, message: str) -> None:
        self.tick.say(self.target.about(message))  # named when there are several streams

    def request(self, run: WindowRun) -> None:
        self.reported.run_requests.append(RunRequest(
            run_key=self.target.run_key(run.run_key), job_name=self.target.job(WINDOW_JOB),
            partition_key=run.partition, tags={SPARK_RUN_TAG: "true"}))


def report_windows(tick: _Tick, target: PipelineStream, cursor: Cursor, cycle: CycleReport,
                   view: StreamSlice) -> _Reported:
    """Report every window of the stream that became complete since its cursor and request its transform
    (host or observer). Returns the run requests, the asset events and the stream's new cursor."""
    stream = _StreamTick(tick, target, view, landing_store(tick.consumer, tick.aws, tick.s3),
                         output_store(tick.consumer, tick.aws, tick.s3, target))
    rules, instance = tick.rules, tick.context.instance
    start = start_tick(cursor, rules, _report_start(stream, rules) if cursor.next_window_ms is None else None)
    for warning in start.warnings:
        tick.context.log.warning(warning)
    for note in start.notes:
        stream.say(note)
    _say_abandoned(stream, [(w, "followed by the sensor's cursor") for w in start.abandoned])
    _cancel_queued_runs_outside(stream)
    followed = follow_windows(
        cursor, start, rules, now_ms=tick.now_ms, leases=view.leases, shards=view.shards,
        observed=observe_windows(instance, stream.output, {w: cursor.outstanding[w] for w in start.observe}, target),
        checkpoint_report=_checkpoint_record(stream))
    _say_abandoned(stream, followed.abandoned)
    for run in followed.runs:
        stream.request(run)
    for note in followed.notes:
        stream.say(note)
    end = finish_tick(cursor, start, followed, _report_complete_windows(stream, followed.to_report), rules,
                      now_ms=tick.now_ms, leases=view.leases)
    for note in end.notes:
        stream.say(note)
    _request_shard_end(stream, end.shard_end)
    if end.observe_fleet:
        stream.reported.events.append(AssetObservation(
            asset_key=target.key(KINESIS_STREAM), metadata=_fleet_metadata(cycle, view.leases)))
    if end.stall is not None:
        _report_the_stall_metric(stream, end.stall)
    stream.reported.cursor = end.cursor
    return stream.reported


def _say_abandoned(stream: _StreamTick, windows: Sequence[tuple[int, str]]) -> None:
    """One warning per window the partitions definition does not have, naming what the zone holds of it (one
    listing each; the decisions drop them, so this is said once)."""
    rules = stream.tick.rules
    for window, why in windows:
        listing = list_window(stream.store, stream.view.directory, window, window + rules.window_ms)
        holds = f"{len(listing.batches)} batches from {len(listing.per_shard())} shards"
        line = stream.target.about(abandoned_line(window, rules, why, holds))
        stream.tick.context.log.warning(line)
        stream.tick.say(line)


def _cancel_queued_runs_outside(stream: _StreamTick) -> None:
    """Queued window runs of partitions the definition does not have (queued before a restart with a later first
    partition, or a run retry of one that failed so) would fail at launch, and be retried: canceled, once each."""
    instance, rules = stream.tick.context.instance, stream.tick.rules
    queued = instance.get_runs(RunsFilter(job_name=stream.target.job(WINDOW_JOB), statuses=[DagsterRunStatus.QUEUED]))
    for run in queued:
        key = run.tags.get(PARTITION_NAME_TAG)
        try:
            if key is None or rules.has_partition(window_start_ms(key)):
                continue
        except ValueError:
            continue  # not a window's key: not the sensor's to judge
        instance.report_run_canceled(run, message=(
            f"partition {key} is outside the partitions definition (its first partition is "
            f"{partition_key(rules.partitions_start_ms)}): a run of it cannot start; canceled by the sensor"))
        stream.say(f"queued run {run.run_id} of window {key} canceled: the partitions definition does not have it "
                   f"(its first partition is {partition_key(rules.partitions_start_ms)})")


def _report_start(stream: _StreamTick, rules: SensorRules) -> ReportStart:
    return start_reports(stream.store, stream.view.directory, stream.output, stream.view.leases,
                         progress_from_leases(stream.view.leases), window_ms=rules.window_ms,
                         grace_ms=rules.grace_ms, not_before_ms=rules.partitions_start_ms, now_ms=stream.tick.now_ms)


def _report_complete_windows(stream: _StreamTick, due: Sequence[ReportDue]) -> int:
    """Report the complete windows in order within the tick's time budget, and request their runs. Returns how
    many were reported."""
    tick = stream.tick
    for count, window in enumerate(due):
        if time.monotonic() - tick.started > tick.consumer.tick_budget_seconds:
            stream.say(f"tick budget spent; window {iso(window.status.window_start_ms)} waits for the next tick")
            return count
        _report_complete_window(stream, window)
    return len(due)


def _report_complete_window(stream: _StreamTick, due: ReportDue) -> None:
    """The window's `landed_records` materialisation and its run. The listing only (a few LIST pages, whatever
    the window holds): the window run counts the rows (transformed_records' rows_in) and checks the chain
    (chain_unbroken), once."""
    status, key = due.status, due.run.partition
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
    stream.request(due.run)
    stream.say(f"window {key} complete: {len(listing.batches)} batches from {len(per_shard)} shards"
               + (f" ({len(listing.malformed)} malformed keys)" if listing.malformed else "")
               + "; transform requested")


def _request_shard_end(stream: _StreamTick, shard_end: ShardEndRun | None) -> None:
    """The checkpoint plan's run that ends shards: at most one such run in flight."""
    if shard_end is None:
        return
    job = stream.target.job(CHECKPOINTS_JOB)
    if stream.tick.context.instance.get_runs_count(RunsFilter(job_name=job, statuses=IN_PROGRESS_RUN_STATUSES)):
        return
    stream.reported.run_requests.append(RunRequest(
        run_key=stream.target.run_key(shard_end.run_key), job_name=job, partition_key=shard_end.partition,
        tags={SHARD_END_TAG: ",".join(shard_end.shards)}))
    stream.say(shard_end.note)


def _report_the_stall_metric(stream: _StreamTick, stall: StallMetric) -> None:
    """The stall metric and the windows_not_stalled check: on every tick while windows are stalled, and once
    when they no longer are."""
    transformed = stream.target.key(TRANSFORMED)
    stream.reported.events.append(AssetObservation(asset_key=transformed, metadata={
        "stalled_windows": len(stall.stalled),
        "stalled": MetadataValue.json(list(stall.stalled)),
        "outstanding_windows": stall.outstanding_windows}))
    stream.reported.events.append(AssetCheckEvaluation(
        asset_key=transformed, check_name=STALL_CHECK, passed=not stall.stalled,
        metadata={"stalled": MetadataValue.json(list(stall.stalled)), "description": stall.description}))


def _fleet_metadata(cycle: CycleReport, leases: Sequence[Lease]) -> dict[str, Any]:
    """Fixed keys (they plot over time whatever the shards and owners) and the lease table as a table."""
    lags = lease_lags(leases, progress_from_leases(leases))
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
    return window_done(commit, entry.need)


def _run_state(run) -> RunState:
    if run is None:
        return RunState.NONE
    if run.status == DagsterRunStatus.SUCCESS:
        return RunState.SUCCEEDED
    if run.status in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return RunState.ACTIVE if run.tags.get(WILL_RETRY_TAG) == "true" else RunState.FAILED
    return RunState.ACTIVE


def _checkpoint_record(stream: _StreamTick) -> CheckpointRecord | None:
    """The checkpoint run's stored record (windows/checkpoints/record.py); a malformed one is said on the status line
    and acted on by nobody until the next checkpoint run writes a good one."""
    try:
        return read_checkpoint_record(stream.output)
    except CheckpointRecordError as exc:
        stream.say(f"{exc}: no checkpoint report to act on until the next checkpoint run stores a new record")
        return None
