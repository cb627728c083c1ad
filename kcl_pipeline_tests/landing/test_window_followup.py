"""The sensor's follow-up of reported windows: pure decisions, table-driven."""
from __future__ import annotations

import pytest

from kcl_pipeline.windows.followup import (
    FollowUp,
    Outstanding,
    RunState,
    WindowObservation,
    follow_up,
    reopen_run_key,
    rerun_key,
    shard_end_run_key,
    stall_metric_due,
)

W = 60_000
OVERDUE = 2 * W


def decide(outstanding, observed, now_ms=10 * W, max_requests=3) -> FollowUp:
    return follow_up(outstanding, observed, now_ms=now_ms, window_ms=W, overdue_ms=OVERDUE,
                     max_requests=max_requests)


def test_a_window_whose_run_failed_for_good_is_requested_again_not_forgotten():
    out = decide({5 * W: 1}, {5 * W: WindowObservation(False, RunState.FAILED)})
    assert out.rerequest == (5 * W,) and out.outstanding == {5 * W: Outstanding(2)}


def test_a_materialised_window_is_forgotten():
    out = decide({5 * W: 1, 6 * W: 1}, {5 * W: WindowObservation(True, RunState.SUCCEEDED),
                                         6 * W: WindowObservation(True, RunState.FAILED)})
    assert out == FollowUp({}, (), (), ())


@pytest.mark.parametrize("run", [RunState.ACTIVE, RunState.NONE])
def test_a_window_whose_run_is_active_or_not_created_yet_waits(run):
    out = decide({8 * W: 1}, {8 * W: WindowObservation(False, run)})
    assert out == FollowUp({8 * W: Outstanding(1)}, (), (), ())


def test_a_window_whose_run_succeeded_without_its_commit_is_requested_again():
    """The run ended and the window has no commit (its rows_reconcile check did not pass it, or it ran without
    the check): waiting would wait for ever."""
    out = decide({8 * W: 1}, {8 * W: WindowObservation(False, RunState.SUCCEEDED)})
    assert out.rerequest == (8 * W,) and out.outstanding == {8 * W: Outstanding(2)}


def test_a_window_with_no_run_at_all_is_stalled_once_overdue():
    out = decide({5 * W: 1}, {5 * W: WindowObservation(False, RunState.NONE)}, now_ms=8 * W)
    assert (out.rerequest, out.stalled) == ((), (5 * W,))


def test_an_unobserved_window_is_kept_unchanged():
    assert decide({8 * W: 2}, {}) == FollowUp({8 * W: Outstanding(2)}, (), (), ())


def test_a_window_past_its_end_plus_overdue_is_stalled_by_name_and_given_up_after_max_requests():
    # window [5, 6) W, overdue at 8 W
    assert decide({5 * W: 1}, {5 * W: WindowObservation(False, RunState.ACTIVE)}, now_ms=8 * W - 1).stalled == ()
    out = decide({5 * W: 3}, {5 * W: WindowObservation(False, RunState.FAILED)}, now_ms=8 * W)
    assert (out.stalled, out.gave_up, out.rerequest, out.outstanding) == \
        ((5 * W,), (5 * W,), (), {5 * W: Outstanding(3, gave_up=True)})


def test_max_requests_must_be_positive():
    with pytest.raises(ValueError, match="max_requests must be >= 1"):
        decide({}, {}, max_requests=0)


def test_rerun_keys_are_distinct_per_request_and_the_first_is_the_window_key():
    assert rerun_key("2026-11-22-03:00", 1) == "window-2026-11-22-03:00"
    assert len({rerun_key("k", n) for n in (1, 2, 3)}) == 3


def test_a_reopened_window_is_requested_once_per_set_of_late_batches():
    key = "2026-11-22-03:00"
    assert reopen_run_key(key, ["b", "a"]) == reopen_run_key(key, ["a", "b"])  # the same late batches, any order
    assert reopen_run_key(key, ["a"]) != reopen_run_key(key, ["a", "b"])  # another batch came late: ask again
    assert reopen_run_key(key, ["a"]).startswith(f"window-{key}-reopened-")
    assert reopen_run_key(key, ["a"]) not in {rerun_key(key, n) for n in (1, 2, 3)}


def test_the_stall_metric_is_reported_while_windows_stall_and_once_when_they_recover():
    def due(stalled, previous) -> bool:
        return stall_metric_due(stalled, previous, now_ms=10 * W, window_ms=W, overdue_ms=OVERDUE)

    assert due((5 * W,), {5 * W: 1})
    assert due((), {5 * W: 1})  # recovered: once more, to say so
    assert not due((), {})
    assert not due((), {9 * W: 1})  # outstanding, not overdue: nothing to report


def test_a_shard_end_run_is_asked_for_once_per_window_period():
    assert shard_end_run_key(["a", "b"], 5 * W, W) == shard_end_run_key(["a", "b"], 6 * W - 1, W) \
        == "shard-end-a+b-5"
