"""The kinesis_consumer sensor's decisions (windows/tick/decisions.py), driven without Dagster: observations in, run
requests, notes, shard ends, the stall metric and the next cursor out."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.windows.checkpoints.record import CheckpointRecord
from kcl_pipeline.windows.followup import Outstanding, RunState, WindowObservation, rerun_key
from kcl_pipeline.windows.keys import partition_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.windows.tick.decisions import (
    SensorRules,
    WindowRun,
    abandoned_line,
    finish_tick,
    follow_windows,
    start_tick,
)
from kcl_pipeline.windows.tick.report_start import ReportStart
from kcl_pipeline.zone.progress import ShardProgress

from .helpers import T0, seq

pytestmark = pytest.mark.core

W = 120_000  # 2-minute windows
A = "shardId-000000000000"
RULES = SensorRules(window_ms=W, grace_ms=1_000, overdue_ms=300_000, max_window_requests=3, max_windows_per_tick=12,
                    partitions_start_ms=T0)


def lease(key: str = A, *, landed_at: int | None = None, shard_end_landed: bool = False) -> Lease:
    """A live lease whose heartbeat says its shard landed a record arriving at `landed_at`."""
    progress = ShardProgress(key, Checkpoint(seq(1)) if landed_at is not None else None, landed_at,
                             shard_end_landed=shard_end_landed)
    extra = {k: v for k, v in progress.to_attributes().items() if v is not None}
    return Lease(key, Checkpoint("TRIM_HORIZON"), lease_owner="w", extra=extra)


def tick(cursor: Cursor, *, now_ms: int, leases: list[Lease], observed=None, report=None, start=None,
         reported: int | None = None):
    """One stream's tick through the three steps; `reported`: how many due windows the sensor reported (all)."""
    begun = start_tick(cursor, RULES, start)
    shards = [Shard(lease.lease_key) for lease in leases]
    followed = follow_windows(cursor, begun, RULES, now_ms=now_ms, observed=observed or {},
                              checkpoint_report=report, leases=leases, shards=shards)
    due = len(followed.to_report) if reported is None else reported
    return begun, followed, finish_tick(cursor, begun, followed, due, RULES, now_ms=now_ms, leases=leases)


def test_a_first_tick_starts_where_reports_start_and_reports_every_complete_window():
    start = ReportStart(T0, "first window 2026-11-22T03:00:00Z")
    begun, followed, end = tick(Cursor(), now_ms=T0 + 3 * W + 5_000, leases=[lease(landed_at=T0 + 3 * W + 2_000)],
                                start=start)
    assert begun.next_window_ms == T0 and begun.notes == (start.note,)
    keys = [partition_key(T0 + i * W) for i in range(3)]
    assert [due.run for due in followed.to_report] == [WindowRun(key, rerun_key(key, 1)) for key in keys]
    assert end.cursor.next_window_ms == T0 + 3 * W
    assert set(end.cursor.outstanding) == {T0, T0 + W, T0 + 2 * W}
    assert end.observe_fleet and end.cursor.observed_at_ms == T0 + 3 * W + 5_000


def test_a_cursor_without_a_next_window_needs_where_reports_start():
    with pytest.raises(ValueError, match="where reports start"):
        start_tick(Cursor(), RULES, None)


def test_a_cursor_before_the_first_partition_moves_up_with_a_warning():
    begun = start_tick(Cursor(next_window_ms=T0 - 10 * W), RULES, None)
    assert begun.next_window_ms == T0 and len(begun.warnings) == 1 and "precedes the first partition" in \
        begun.warnings[0]


def test_windows_the_time_budget_left_unreported_stay_for_the_next_tick():
    cursor = Cursor(next_window_ms=T0, observed_at_ms=T0 + 3 * W)
    _, followed, end = tick(cursor, now_ms=T0 + 3 * W + 5_000, leases=[lease(landed_at=T0 + 3 * W + 2_000)],
                            reported=1)
    assert len(followed.to_report) == 3
    assert end.cursor.next_window_ms == T0 + W and set(end.cursor.outstanding) == {T0}
    assert not end.observe_fleet and end.cursor.observed_at_ms == T0 + 3 * W  # observed under a minute ago
    assert end.notes == ()  # the windows are complete: nothing named as waiting


def test_an_incomplete_window_is_named_with_what_it_waits_on():
    _, followed, end = tick(Cursor(next_window_ms=T0), now_ms=T0 + 3 * W, leases=[lease(landed_at=T0 + W + 10)])
    assert [due.status.window_start_ms for due in followed.to_report] == [T0]
    assert end.cursor.next_window_ms == T0 + W
    assert len(end.notes) == 1 and end.notes[0].startswith(f"window {partition_key(T0 + W)} not complete yet")


def test_a_window_whose_run_failed_for_good_is_requested_again_and_one_done_is_forgotten():
    cursor = Cursor(next_window_ms=T0 + 2 * W, outstanding={T0: Outstanding(1), T0 + W: Outstanding(1)})
    observed = {T0: WindowObservation(False, RunState.FAILED), T0 + W: WindowObservation(True, RunState.SUCCEEDED)}
    begun, followed, end = tick(cursor, now_ms=T0 + 2 * W + 1, leases=[lease(landed_at=T0 + W)], observed=observed)
    assert set(begun.observe) == {T0, T0 + W}
    key = partition_key(T0)
    assert followed.runs == (WindowRun(key, followed.outstanding[T0].run_key(key)),)
    assert followed.outstanding[T0].requests == 2
    assert "request 2 of 3" in followed.notes[0]
    assert set(end.cursor.outstanding) == {T0}


def test_a_window_asked_again_for_late_batches_is_not_said_to_have_no_commit_when_its_run_fails_again():
    """Seed 8346 of the simulation: a committed window asked again for refilled batches kept its commit while each
    run failed; the status line said it had no commit, sending the operator after the wrong thing. It names what
    the commit lacks."""
    late = ("stream/late-1.parquet", "stream/late-2.parquet")
    cursor = Cursor(next_window_ms=T0 + W, outstanding={T0: Outstanding(1, "window-reopened", late, T0 + W)})
    _, followed, _ = tick(cursor, now_ms=T0 + W + 1, leases=[lease(landed_at=T0 + W)],
                          observed={T0: WindowObservation(False, RunState.FAILED)})
    assert followed.notes[0].startswith(f"window {partition_key(T0)} has no commit naming the 2 batch(es) landed "
                                        "after its run, and its last run ended: transform requested again")


def test_a_checkpoint_report_is_acted_on_once():
    report = CheckpointRecord(frontier={}, uncommitted=(T0,), report=7)
    cursor = Cursor(next_window_ms=T0 + W)
    _, followed, end = tick(cursor, now_ms=T0 + W + 1, leases=[lease(landed_at=T0 + 10)], report=report)
    assert [run.partition for run in followed.runs] == [partition_key(T0)]
    assert "no commit" in followed.notes[0]
    assert end.cursor.checkpoint_report == 7 and T0 in end.cursor.outstanding
    _, again, _ = tick(end.cursor, now_ms=T0 + W + 2, leases=[lease(landed_at=T0 + 10)], report=report,
                       observed={T0: WindowObservation(False, RunState.ACTIVE)})
    assert again.runs == () and again.checkpoint_report == 7


def test_overdue_windows_are_stalled_named_and_measured():
    cursor = Cursor(next_window_ms=T0 + W, outstanding={T0: Outstanding(1)})
    now = T0 + W + RULES.overdue_ms + 1
    _, followed, end = tick(cursor, now_ms=now, leases=[lease(landed_at=T0 + 10)],
                            observed={T0: WindowObservation(False, RunState.ACTIVE)})
    assert any(note.startswith("STALLED windows (not materialised 300s past their end)") for note in followed.notes)
    assert end.stall is not None and end.stall.stalled == (partition_key(T0),)
    assert end.stall.outstanding_windows == len(end.cursor.outstanding)


def test_a_shard_whose_last_record_landed_gets_the_checkpoint_plan_run():
    leases = [lease(landed_at=T0 + 10, shard_end_landed=True)]
    _, _, end = tick(Cursor(next_window_ms=T0 + W), now_ms=T0 + W + 1, leases=leases)
    assert end.shard_end is not None and end.shard_end.shards == (A,)
    assert end.shard_end.partition == partition_key(T0)
    _, _, none_yet = tick(Cursor(next_window_ms=T0), now_ms=T0 + 1, leases=leases)
    assert none_yet.shard_end is None  # no partition exists before the first window to run the plan under


# -- windows the partitions definition does not have ------------------------------------------------------------

def test_a_window_before_the_first_partition_is_never_requested_again_but_abandoned_once():
    """A home kept from a deployment whose partitions started earlier (the demo's windows, then `local up` with
    a later first partition): its runs fail at launch (Dagster refuses the key), so re-requesting them would fail
    for ever. The decision drops them, names them once, and follows the others as before."""
    before = T0 - 2 * W
    cursor = Cursor(next_window_ms=T0, outstanding={before: Outstanding(1), T0 - W: Outstanding(2), T0: Outstanding(1)})
    observed = {w: WindowObservation(False, RunState.FAILED) for w in (before, T0 - W, T0)}
    begun, followed, end = tick(cursor, now_ms=T0 + W + 1, leases=[lease(landed_at=T0 + 10)], observed=observed)
    assert begun.abandoned == (before, T0 - W) and set(begun.observe) == {T0}
    assert [run.partition for run in followed.runs] == [partition_key(T0)]
    assert set(end.cursor.outstanding) == {T0}
    again, followed_again, _ = tick(end.cursor, now_ms=T0 + W + 2, leases=[lease(landed_at=T0 + 10)],
                                    observed={T0: WindowObservation(False, RunState.ACTIVE)})
    assert again.abandoned == () and followed_again.runs == ()


def test_a_checkpoint_reports_windows_before_the_first_partition_are_abandoned_not_requested():
    report = CheckpointRecord(late={T0 - W: ("b1",), T0: ("b2",)}, uncommitted=(T0 - 2 * W,), report=9)
    _, followed, end = tick(Cursor(next_window_ms=T0 + W), now_ms=T0 + W + 1, leases=[lease(landed_at=T0 + 10)],
                            report=report)
    assert [run.partition for run in followed.runs] == [partition_key(T0)]
    assert [w for w, _ in followed.abandoned] == [T0 - W, T0 - 2 * W]
    assert "batches landed after its run" in followed.abandoned[0][1]
    assert set(end.cursor.outstanding) == {T0} and end.cursor.checkpoint_report == 9


def test_a_window_not_on_the_partitions_boundaries_is_not_a_partition():
    assert RULES.has_partition(T0) and RULES.has_partition(T0 + 5 * W)
    assert not RULES.has_partition(T0 - W) and not RULES.has_partition(T0 + W // 2)


def test_the_abandoned_line_names_the_window_the_first_partition_and_what_it_holds():
    line = abandoned_line(T0 - W, RULES, "followed by the sensor's cursor", "3 batches from 2 shards")
    assert line.startswith(f"window {partition_key(T0 - W)} (followed by the sensor's cursor) is outside the "
                           f"partitions definition (its first partition is {partition_key(T0)}): abandoned")
    assert "3 batches from 2 shards" in line
