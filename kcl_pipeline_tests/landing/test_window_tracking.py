"""Issue 20 §9: a window asked for again because of the checkpoint run's report is followed until it is done.

Before: a window re-run because batches landed in it late was requested once (one run key per set of late
batches) and never tracked. If that run failed for good, the window still showed materialised in Dagster,
nothing flagged it, and the shard's checkpoints stopped silently before the late batches. Now the report's
windows join the sensor's follow-up: done only when the commit names the late batches, requested again
(under new run keys) when a run ends without that, named stalled, given up after `max_requests`. Windows a
shard is stopped on that have no commit at all (a run that failed for good before the cursor knew it, a
transform without its check) are asked for the same way, once per report.
"""
from __future__ import annotations

from kcl_pipeline.windows.followup import (
    Outstanding,
    RunState,
    WindowObservation,
    follow_up,
    observation_slice,
    reopen_run_key,
    stall_metric_due,
    track_reports,
)

W = 60_000
OVERDUE = 5 * W
NOW = 1000 * W


def partition(start: int) -> str:
    return f"p{start // W}"


def track(outstanding, late=None, uncommitted=(), report="r1", before=NOW):
    return track_reports(outstanding, late or {}, uncommitted, report=report, reported_before_ms=before, now_ms=NOW,
                         partition=partition)


def decide(outstanding, observed, now_ms=NOW, max_requests=3):
    return follow_up(outstanding, observed, now_ms=now_ms, window_ms=W, overdue_ms=OVERDUE, max_requests=max_requests)


def test_a_window_rerun_for_late_batches_is_followed_until_it_is_done_or_named_stalled():
    old = 10 * W
    tracked = track({}, late={old: ["b2", "b1"]})
    entry = tracked.outstanding[old]
    assert tracked.request == (old,) and entry.need == ("b1", "b2") and entry.since_ms == NOW
    assert entry.run_key(partition(old)) == reopen_run_key(partition(old), ["b1", "b2"])
    # its run failed for good: asked again under a new run key, until max_requests; stalled once overdue
    failed = WindowObservation(False, RunState.FAILED)
    keys = [entry.run_key(partition(old))]
    out = decide(tracked.outstanding, {old: failed})
    for _ in range(2):
        assert out.rerequest == (old,)
        keys.append(out.outstanding[old].run_key(partition(old)))
        out = decide(out.outstanding, {old: failed}, now_ms=NOW + OVERDUE)
    assert len(set(keys)) == 3
    assert out.rerequest == () and out.gave_up == (old,) and out.stalled == (old,)
    assert out.outstanding[old].gave_up
    assert stall_metric_due(out.stalled, out.outstanding, now_ms=NOW + OVERDUE, window_ms=W, overdue_ms=OVERDUE)
    # the stall clock of a window asked for again starts at the request, not at its (long past) end
    assert decide(tracked.outstanding, {old: WindowObservation(False, RunState.ACTIVE)}).stalled == ()
    # done once its commit names the late batches (what the sensor observes), given up or not
    assert decide(out.outstanding, {old: WindowObservation(True, RunState.NONE)}).outstanding == {}


def test_a_window_followed_already_takes_the_late_batches_in_without_a_second_request():
    tracked = track({7 * W: Outstanding(1)}, late={7 * W: ["x"]})
    assert tracked.request == () and tracked.outstanding[7 * W] == Outstanding(1, need=("x",))
    again = track(tracked.outstanding, late={7 * W: ["y"]}, report="r2")
    assert again.outstanding[7 * W].need == ("x", "y")


def test_a_window_checkpoints_wait_on_without_a_commit_is_asked_for_once_per_report():
    tracked = track({}, uncommitted=[3 * W, 4 * W, NOW + W])
    # reported windows only (before the cursor's next window): the newest is on its first way
    assert tracked.request == (3 * W, 4 * W) and NOW + W not in tracked.outstanding
    key = tracked.outstanding[3 * W].run_key(partition(3 * W))
    assert key == "window-p3-uncommitted-r1"
    # a later report naming it again while it is followed asks nothing more
    assert track(tracked.outstanding, uncommitted=[3 * W], report="r2").request == ()
    # a new report after it was done asks again, under that report's own run key
    done = {k: v for k, v in tracked.outstanding.items() if k != 3 * W}
    assert track(done, uncommitted=[3 * W], report="r2").outstanding[3 * W].run_key("p3") == \
        "window-p3-uncommitted-r2"
    assert track({}, uncommitted=[3 * W], before=None).request == ()  # no window reported yet


def test_given_up_windows_cost_a_few_commit_reads_per_tick_in_turn_never_a_run_query_each():
    outstanding = {w * W: Outstanding(3, gave_up=True) for w in range(10)}
    outstanding[50 * W] = Outstanding(1)
    seen: list[int] = []
    rotation = 0
    for _ in range(3):
        windows, rotation = observation_slice(outstanding, rotation, 4)
        assert 50 * W in windows and len(windows) == 5
        seen += [w for w in windows if w != 50 * W]
    assert set(seen) == {w * W for w in range(10)}  # every given-up window in turn
    assert observation_slice({1: Outstanding(1)}, 7, 4) == ([1], 0)


def test_outstanding_entries_keep_their_cursor_form():
    plain = Outstanding(2)
    assert plain.to_json() == 2 and Outstanding.from_json(2) == plain  # the cursor's first format
    full = Outstanding(2, "window-p-reopened-abc", ("a", "b"), 5, True)
    assert Outstanding.from_json(full.to_json()) == full
