"""Issue 20 §7: a window that does not reconcile is never checkpointed, by its own run or by any later one.

Before: the transform wrote the window's commit, then the blocking rows_reconcile check failed — which stopped
only that run. The commit stayed, and the next window's checkpoint run advanced through the failed window.
Now the run leaves its commit pending and the check publishes it only when the window reconciles.
"""
from __future__ import annotations

import json

import pytest

from kcl_pipeline.audit.reconcile import reconcile_window
from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.windows.manifest import WindowCommit, commit_key, pending_commit_key, read_materialised
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import SHARD, STREAM, T0, Clock, RecordingLeaseTable, deliver, init, make_records

W = 60_000
TH = Checkpoint("TRIM_HORIZON")


@pytest.fixture
def zone(tmp_path):
    """Two one-minute windows of one shard, 20 records each, landed by the live writer."""
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    records = make_records(40, per_minute=20)
    clock = Clock(T0 + 10 * W)
    sink = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=8)
    init(sink)
    sink.shutdown_requested(deliver(sink, records, 20))
    return zone, output, records


def run_leaves_pending(zone, output, w: int, transformed_rows: int | None = None) -> None:
    """What a window run leaves (transform_window(publish=False)): its commit, pending. `transformed_rows`: what
    its output says it holds (a writer that lost rows says fewer than landed)."""
    batches = list_batches(zone, STREAM, w, w + W)
    rows = 20 if transformed_rows is None else transformed_rows
    commit = WindowCommit(w, w + W, f"run-{w}", frozenset(b.key() for b in batches),
                          {"transformed": {"rows": rows, "files": []}, "quarantine": {"rows": 0, "files": []}})
    output.put(pending_commit_key(w), commit.to_json())


def checkpoints(zone, output) -> dict[str, Checkpoint]:
    table = RecordingLeaseTable()
    commit_checkpoints(table, StreamSlice(StreamScope(STREAM), [Lease(SHARD, TH)], [Shard(SHARD)]), zone, output,
                       window_ms=W, first_window_ms=T0, initial=TH, grace_ms=0)
    return table.checkpoints


def test_a_window_that_does_not_reconcile_is_never_checkpointed_by_a_later_run(zone):
    zone, output, records = zone
    run_leaves_pending(zone, output, T0, transformed_rows=19)  # the first window's output lost a row
    (failed,) = reconcile_window(zone, output, STREAM, T0, T0 + W)
    assert not failed.ok and "landed 20 != transformed 19" in failed.summary
    assert output.get_optional(commit_key(T0)) is None  # not materialised: nothing can pass it
    run_leaves_pending(zone, output, T0 + W)  # the next window's run reconciles
    (passed,) = reconcile_window(zone, output, STREAM, T0 + W, T0 + 2 * W)
    assert passed.ok and read_materialised(output).windows == [T0 + W]
    assert checkpoints(zone, output) == {}  # its checkpoint run stops before the failed window

    run_leaves_pending(zone, output, T0)  # the failed window runs again and reconciles
    assert reconcile_window(zone, output, STREAM, T0, T0 + W)[0].ok
    assert checkpoints(zone, output) == {SHARD: records[-1].checkpoint}


def test_a_reconciled_window_is_published_once_and_a_later_check_changes_nothing(zone):
    zone, output, records = zone
    run_leaves_pending(zone, output, T0)
    assert reconcile_window(zone, output, STREAM, T0, T0 + W)[0].ok
    published = output.get(commit_key(T0))
    assert output.get_optional(pending_commit_key(T0)) is None
    assert WindowCommit.from_json(published).run_id == f"run-{T0}"
    # a check run again, by hand: no pending commit, the published one is judged and left alone
    assert reconcile_window(zone, output, STREAM, T0, T0 + W)[0].ok
    assert output.get(commit_key(T0)) == published
    assert checkpoints(zone, output) == {SHARD: records[19].checkpoint}


def test_a_run_cut_off_before_its_check_leaves_the_window_unmaterialised(zone):
    """The transform finished, the run died before rows_reconcile: the pending commit counts for nothing."""
    zone, output, _ = zone
    run_leaves_pending(zone, output, T0)
    run_leaves_pending(zone, output, T0 + W)
    assert read_materialised(output).windows == []
    assert checkpoints(zone, output) == {}


def test_a_published_commit_is_the_pending_one_byte_for_byte(zone):
    zone, output, _ = zone
    run_leaves_pending(zone, output, T0)
    pending = output.get(pending_commit_key(T0))
    reconcile_window(zone, output, STREAM, T0, T0 + W)
    assert json.loads(output.get(commit_key(T0))) == json.loads(pending)


def test_the_checkpoint_report_names_the_window_without_a_commit_it_waits_on(zone):
    """What the sensor asks for again (docs/windows.md): the window the shard is stopped on has no commit."""
    zone, output, _ = zone
    run_leaves_pending(zone, output, T0, transformed_rows=19)
    reconcile_window(zone, output, STREAM, T0, T0 + W)
    run_leaves_pending(zone, output, T0 + W)
    reconcile_window(zone, output, STREAM, T0 + W, T0 + 2 * W)
    report = commit_checkpoints(RecordingLeaseTable(),
                                StreamSlice(StreamScope(STREAM), [Lease(SHARD, TH)], [Shard(SHARD)]),
                                zone, output, window_ms=W, first_window_ms=T0, initial=TH, grace_ms=0)
    assert report.uncommitted == [T0] and report.late == {} and report.broken == {}
