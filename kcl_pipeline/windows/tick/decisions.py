"""The `kinesis_consumer` sensor's decisions for one stream and one tick, as pure functions.

Observations in (what the Dagster instance, the output's window commits and the lease table said), decisions
out (runs to request, windows to report, notes for the tick's status line, the stream's next cursor). No
Dagster, no clock, no I/O: the sensor (defs/kinesis/tick.py) gathers the observations and turns the decisions
into run requests and asset events; the simulation can drive the same steps.

A tick takes three steps, with the sensor's reads between them:

  1. `start_tick`: the next window to report (the cursor's, or where reports start: tick/report_start.py), and the
     windows asked for whose state the tick must observe (the given-up ones a few per tick, in turn); windows
     the cursor follows that the partitions definition does not have (before its first partition: a cursor
     or a home kept from a deployment that started later) are abandoned, once, and never requested;
  2. `follow_windows`, with each observed window's state and the newest checkpoint report: the follow-up
     (request a window whose run ended without its commit again, name the stalled ones), the windows the
     report is stopped on (asked for once per report, followed from then on; those outside the partitions
     abandoned), and the windows complete now;
  3. `finish_tick`, once the sensor has reported as many of those as its time budget allowed: the next
     cursor, the checkpoint plan's run when shards must be ended, whether the fleet observation and the stall
     metric are due.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ...kcl.core import coverage
from ...kcl.core.model import Lease, Shard
from ...zone.layout import iso
from ...zone.progress import progress_from_leases
from ..checkpoints.record import CheckpointRecord
from ..completeness import WindowStatus
from ..fleet_view import observation_due
from ..followup import (
    GIVEN_UP_PER_TICK,
    FollowUp,
    Outstanding,
    WindowObservation,
    follow_up,
    observation_slice,
    rerun_key,
    shard_end_run_key,
    stall_description,
    stall_metric_due,
    track_reports,
)
from ..keys import partition_key
from ..scan import WindowScan, complete_windows, resume_window, shard_ends_to_plan
from .cursor import Cursor
from .report_start import ReportStart


@dataclass(frozen=True)
class SensorRules:
    """The bounds the decisions keep to (the deployment's consumer settings and first partition)."""

    window_ms: int
    grace_ms: int
    overdue_ms: int
    max_window_requests: int
    max_windows_per_tick: int
    partitions_start_ms: int

    def has_partition(self, window_ms: int) -> bool:
        """Whether the partitions definition has the window starting at `window_ms`: a run of any other window
        fails at launch (Dagster refuses a partition key before the first partition), so it is never requested."""
        return window_ms >= self.partitions_start_ms and window_ms % self.window_ms == 0


@dataclass(frozen=True)
class WindowRun:
    """A transform run of a window to request (its run key is the stream's own: the sensor prefixes it)."""

    partition: str
    run_key: str


@dataclass(frozen=True)
class TickStart:
    next_window_ms: int | None  # the first window not reported yet (None: not decided yet)
    observe: tuple[int, ...]  # windows asked for whose state the tick observes now
    rotation: int  # which given-up windows the next tick observes
    notes: tuple[str, ...]
    warnings: tuple[str, ...]
    outstanding: dict[int, Outstanding]  # the cursor's windows asked for that the partitions definition has
    abandoned: tuple[int, ...] = ()  # the cursor's windows asked for that it does not have: dropped, once


def start_tick(cursor: Cursor, rules: SensorRules, report_start: ReportStart | None) -> TickStart:
    """The next window to report, never before the first partition: the cursor's, or with none yet
    `report_start` (the sensor reads it when `cursor.next_window_ms` is None)."""
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    if cursor.next_window_ms is None:
        if report_start is None:
            raise ValueError("a cursor without a next window needs where reports start")
        next_window, notes = report_start.start_ms, (report_start.note,)
    else:
        next_window, moved = resume_window(cursor.next_window_ms, rules.partitions_start_ms)
        if moved:
            warnings = (f"the cursor's next window {iso(cursor.next_window_ms)} precedes the first partition; "
                        f"skipping to {iso(rules.partitions_start_ms)}",)
    outstanding = {w: e for w, e in cursor.outstanding.items() if rules.has_partition(w)}
    abandoned = tuple(sorted(set(cursor.outstanding) - set(outstanding)))
    observe, rotation = observation_slice(outstanding, cursor.rotation, GIVEN_UP_PER_TICK)
    return TickStart(next_window, tuple(observe), rotation, notes, warnings, outstanding, abandoned)


def abandoned_line(window_ms: int, rules: SensorRules, why: str, holds: str) -> str:
    """What the tick says, once, of a window it drops because the partitions definition does not have it (`why`:
    what asked for it; `holds`: what the landing zone has of it)."""
    return (f"window {partition_key(window_ms)} ({why}) is outside the partitions definition (its first partition "
            f"is {partition_key(rules.partitions_start_ms)}): abandoned, never requested again; it holds {holds}, "
            f"left untransformed in the landing zone")


@dataclass(frozen=True)
class ReportDue:
    """A window complete now: its `landed_records` report and its run."""

    status: WindowStatus
    run: WindowRun


@dataclass(frozen=True)
class Followed:
    follow_up: FollowUp
    outstanding: dict[int, Outstanding]  # after the checkpoint report's windows were added
    runs: tuple[WindowRun, ...]  # windows requested again, and those the checkpoint report is stopped on
    notes: tuple[str, ...]
    checkpoint_report: int | None  # the newest report acted on
    scan: WindowScan | None  # None: no next window decided yet
    to_report: tuple[ReportDue, ...]  # the windows complete now, in order
    # the checkpoint report's windows the partitions definition does not have (window, what asked for it)
    abandoned: tuple[tuple[int, str], ...] = ()


def follow_windows(cursor: Cursor, start: TickStart, rules: SensorRules, *, now_ms: int,
                   observed: Mapping[int, WindowObservation], checkpoint_report: CheckpointRecord | None,
                   leases: Sequence[Lease], shards: Sequence[Shard]) -> Followed:
    """The follow-up of the windows asked for (`observed`: the states of `start.observe`), the windows the
    newest checkpoint report is stopped on, and the windows complete from the next one on."""
    followed = follow_up(start.outstanding, observed, now_ms=now_ms, window_ms=rules.window_ms,
                         overdue_ms=rules.overdue_ms, max_requests=rules.max_window_requests)
    runs: list[WindowRun] = []
    notes: list[str] = []
    for window in followed.rerequest:
        coverage.hit("sensor.failed-run-requested-again")
        key, entry = partition_key(window), followed.outstanding[window]
        runs.append(WindowRun(key, entry.run_key(key)))
        # A window asked again for late batches may still have its earlier commit: what it lacks is their naming.
        missing = (f"no commit naming the {len(entry.need)} batch(es) landed after its run," if entry.need
                   else "no commit")
        notes.append(f"window {key} has {missing} and its last run ended: transform requested again "
                     f"(request {entry.requests} of {rules.max_window_requests})")
    outstanding = dict(followed.outstanding)
    acted_on = cursor.checkpoint_report
    abandoned: list[tuple[int, str]] = []
    if checkpoint_report is not None and checkpoint_report.report is not None \
            and checkpoint_report.new_since(acted_on):
        report = checkpoint_report.report
        late = {w: keys for w, keys in checkpoint_report.late.items() if rules.has_partition(w)}
        uncommitted = [w for w in checkpoint_report.uncommitted if rules.has_partition(w)]
        abandoned += [(w, f"checkpoint report {report}: batches landed after its run")
                      for w in sorted(set(checkpoint_report.late) - set(late))]
        abandoned += [(w, f"checkpoint report {report}: shards stopped on it uncommitted")
                      for w in sorted(set(checkpoint_report.uncommitted) - set(uncommitted))]
        tracked = track_reports(outstanding, late, uncommitted,
                                report=str(report), reported_before_ms=start.next_window_ms,
                                now_ms=now_ms, partition=partition_key)
        outstanding = dict(tracked.outstanding)
        for window in tracked.request:
            key, entry = partition_key(window), tracked.outstanding[window]
            runs.append(WindowRun(key, entry.run_key(key)))
            why = ("batches landed in it after its run" if entry.need
                   else "checkpoints wait on it and it has no commit")
            coverage.hit("sensor.reran-late-batches" if entry.need else "sensor.reran-uncommitted")
            notes.append(f"window {key}: {why}; transform requested again and followed ({entry.run_key(key)})")
        acted_on = checkpoint_report.report
    if followed.stalled:
        coverage.hit("sensor.named-stalled")
        names = ", ".join(partition_key(w) for w in followed.stalled)
        gave_up = ", ".join(partition_key(w) for w in followed.gave_up)
        notes.append(f"STALLED windows (not materialised {rules.overdue_ms / 1000:.0f}s past their end): {names}"
                     + (f"; no more requests for {gave_up}" if gave_up else ""))
    scan = None
    if start.next_window_ms is not None:
        scan = complete_windows(start.next_window_ms, rules.window_ms, now_ms, shards, progress_from_leases(leases),
                                leases, rules.grace_ms, rules.max_windows_per_tick)
    due = tuple(ReportDue(status, WindowRun(key, rerun_key(key, 1)))
                for status in (scan.complete if scan else []) for key in [partition_key(status.window_start_ms)])
    return Followed(followed, outstanding, tuple(runs), tuple(notes), acted_on, scan, due, tuple(abandoned))


@dataclass(frozen=True)
class ShardEndRun:
    """A checkpoint plan's run that ends shards whose last record has landed (requested unless one is in
    flight)."""

    partition: str
    run_key: str
    shards: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class StallMetric:
    """The stall metric and the windows_not_stalled check's evaluation."""

    stalled: tuple[str, ...]  # partition keys
    outstanding_windows: int
    description: str


@dataclass(frozen=True)
class TickEnd:
    cursor: Cursor  # the stream's next cursor (its worker id is the sensor's to set)
    notes: tuple[str, ...]
    shard_end: ShardEndRun | None
    observe_fleet: bool  # the fleet observation (lag, leases per consumer) is due
    stall: StallMetric | None


def finish_tick(cursor: Cursor, start: TickStart, followed: Followed, reported: int, rules: SensorRules, *,
                now_ms: int, leases: Sequence[Lease]) -> TickEnd:
    """The tick's end once the sensor reported the first `reported` windows of `followed.to_report` (its time
    budget may stop it early): each reported window is outstanding until it materialises."""
    outstanding = dict(followed.outstanding)
    next_window = start.next_window_ms
    for due in followed.to_report[:reported]:
        outstanding[due.status.window_start_ms] = Outstanding(1)
        next_window = due.status.window_end_ms
    if reported:
        coverage.hit("sensor.cursor-past-complete-windows")
    notes: list[str] = []
    scan = followed.scan
    if scan is not None and scan.stopped_by == "incomplete" and next_window == scan.next_start_ms \
            and scan.blocking is not None:
        coverage.hit("sensor.waits-on-an-incomplete-window")
        waiting = "; ".join(f"{s}: {scan.blocking.reasons.get(s, '')}" for s in scan.blocking.waiting_on)
        notes.append(f"window {partition_key(scan.blocking.window_start_ms)} not complete yet, waiting on {waiting}")
    observe = observation_due(cursor.observed_at_ms, now_ms)
    stalled = followed.follow_up.stalled
    stall = None
    if stall_metric_due(stalled, start.outstanding, now_ms=now_ms, window_ms=rules.window_ms,
                        overdue_ms=rules.overdue_ms):
        names = tuple(partition_key(w) for w in stalled)
        stall = StallMetric(names, len(outstanding), stall_description(list(names), rules.overdue_ms / 1000))
    return TickEnd(Cursor(None, next_window, now_ms if observe else cursor.observed_at_ms, outstanding,
                          checkpoint_report=followed.checkpoint_report, rotation=start.rotation),
                   tuple(notes), _shard_end(leases, next_window, rules, now_ms), observe, stall)


def _shard_end(leases: Sequence[Lease], next_window: int | None, rules: SensorRules, now_ms: int
               ) -> ShardEndRun | None:
    """A kinesis_checkpoints run when shards have landed their last record but are not SHARD_END yet (the plan
    ends them and creates their children's leases), under the window before the next one to report."""
    ends = shard_ends_to_plan(leases, progress_from_leases(leases), next_window, rules.window_ms,
                              rules.partitions_start_ms)
    if ends is None:
        return None
    coverage.hit("sensor.shard-end-run")
    shards = ",".join(ends.shards)
    return ShardEndRun(partition_key(ends.anchor_ms), shard_end_run_key(ends.shards, now_ms, rules.window_ms),
                       tuple(ends.shards), f"shards {shards} landed their last record: checkpoint plan requested "
                                           f"(it ends them and creates their children's leases)")
