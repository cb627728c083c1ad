"""Issue 20 §10: a checkpoint run and a fresh sensor cursor read what changed since the last run, not history.

Before: every kinesis_checkpoints run listed and read every window commit ever written (a commit names every
batch of its window: time and memory grew with the output's age), a fresh sensor cursor (a new Dagster
instance, a cleared cursor) read them all too, and a fresh Dagster instance had no frontier, so its first
checkpoint run listed the landing zone from its first batch. Now the runs read the commits from their listing
start on (one listing per UTC day), the frontier is stored beside the commits (in the checkpoint record), and a
fresh cursor starts from it reading commit keys only. Counted in requests and keys here; timed in
benchmarks/bench_history.py.
"""
from __future__ import annotations

from collections import Counter

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.windows.checkpoints.record import CheckpointRecord, read_checkpoint_record, write_checkpoint_record
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.windows.manifest import COMMITS, WindowCommit, commit_key
from kcl_pipeline.windows.tick.report_start import start_reports
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import SHARD, STREAM, T0, Clock, ForwardingStore, RecordingLeaseTable, deliver, init, make_records

W = 60_000
DAY = 86_400_000
HISTORY = 30  # windows committed on earlier days, long checkpointed


class Counting(ForwardingStore):
    """The real store, counting the commits read and the commit keys listed."""

    def __init__(self, inner):
        self.inner, self.zone = inner, inner.zone
        self.counts: Counter[str] = Counter()

    def get_optional(self, key):
        if key.startswith(f"{COMMITS}/"):
            self.counts["commit GETs"] += 1
        return self.inner.get_optional(key)

    def list_keys(self, prefix):
        for key in self.inner.list_keys(prefix):
            if key.startswith(f"{COMMITS}/"):
                self.counts["commit keys listed"] += 1
            yield key


@pytest.fixture
def zone(tmp_path):
    """Today: three one-minute windows of one shard landed and committed; before: a history of commits, one a
    day (their batches long checkpointed and gone from the zone)."""
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    records = make_records(30, per_minute=10)
    clock = Clock(T0 + 10 * W)
    sink = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=5)
    init(sink)
    sink.shutdown_requested(deliver(sink, records, 10))
    for day in range(1, HISTORY + 1):
        w = T0 - day * DAY
        output.put(commit_key(w), WindowCommit(w, w + W, "old", frozenset({f"old-{day}"})).to_json())
    for w in range(T0, T0 + 3 * W, W):
        names = frozenset(b.key() for b in list_batches(zone, STREAM, w, w + W))
        output.put(commit_key(w), WindowCommit(w, w + W, "run", names).to_json())
    return zone, Counting(output), records


def stored_frontier(output) -> dict[str, int]:
    record = read_checkpoint_record(output)
    return dict(record.frontier) if record is not None else {}


def run(zone, output, lease: Lease, previous: dict[str, int] | None = None):
    """A checkpoint run; `previous`: the frontier an earlier run stored (None: whatever is stored)."""
    if previous is not None:
        write_checkpoint_record(output, CheckpointRecord(previous), replaces_legacy=False)
    view = StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)])
    return commit_checkpoints(RecordingLeaseTable(), view, zone, output, window_ms=W,
                              first_window_ms=T0 - 100 * DAY,
                              initial=Checkpoint("TRIM_HORIZON"), grace_ms=0, now_ms=T0 + 10 * W)


def test_a_checkpoint_run_reads_the_commits_from_its_listing_start_only(zone):
    zone, output, records = zone
    report = run(zone, output, Lease(SHARD, records[9].checkpoint), {SHARD: T0 + W})
    assert report.plan.shards[SHARD].commit == records[-1].checkpoint
    assert report.listed_from_ms == T0 + W
    # the windows from T0 + W on: two commits read, today's keys listed; none of the history
    assert output.counts["commit GETs"] == 2 and output.counts["commit keys listed"] == 3


def test_a_fresh_dagster_instance_starts_from_the_frontier_the_last_run_stored(zone):
    zone, output, records = zone
    first = run(zone, output, Lease(SHARD, records[9].checkpoint), {SHARD: T0 + W})
    assert stored_frontier(output) == first.frontier == {SHARD: T0 + 2 * W}
    output.counts.clear()
    again = run(zone, output, Lease(SHARD, records[-1].checkpoint))  # what the Dagster instance knows: nothing
    assert again.listed_from_ms == T0 + 2 * W and output.counts["commit GETs"] == 1


def test_a_fresh_sensor_cursor_reads_no_commit_and_lists_from_the_frontier(zone):
    zone, output, records = zone
    run(zone, output, Lease(SHARD, records[9].checkpoint), {SHARD: T0 + W})
    output.counts.clear()
    progress = ShardProgress(SHARD, records[-1].checkpoint, records[-1].approximate_arrival_timestamp_ms,
                             T0 + 10 * W, 0)
    lease = Lease(SHARD, records[-1].checkpoint, extra={k: v for k, v in progress.to_attributes().items()
                                                        if v is not None})
    start = start_reports(zone, STREAM, output, [lease], {SHARD: progress}, window_ms=W, grace_ms=0,
                          not_before_ms=T0 - 100 * DAY, now_ms=T0 + 10 * W)
    assert start.start_ms == T0 + 3 * W  # past every committed window
    assert output.counts["commit GETs"] == 0 and output.counts["commit keys listed"] == 3  # today's only


def test_a_checkpoint_the_table_refused_does_not_move_the_frontier(zone):
    """The stored frontier is trusted by every later run: it moves with checkpoints the table took only (one
    refused — a Java holder's lease, say — leaves the lease where it was, to be listed from again)."""
    zone, output, records = zone

    class Refusing(RecordingLeaseTable):
        def checkpoint(self, key: str, checkpoint: Checkpoint) -> bool:
            return False

    view = StreamSlice(StreamScope(STREAM), [Lease(SHARD, records[9].checkpoint)], [Shard(SHARD)])
    write_checkpoint_record(output, CheckpointRecord({SHARD: T0}), replaces_legacy=False)
    report = commit_checkpoints(Refusing(), view, zone, output, window_ms=W,
                                first_window_ms=T0 - 100 * DAY, initial=Checkpoint("TRIM_HORIZON"), grace_ms=0,
                                now_ms=T0 + 10 * W)
    assert report.plan.shards[SHARD].commit == records[-1].checkpoint and report.commits == 0
    assert stored_frontier(output) == {SHARD: T0}  # the window of the batch holding the lease's checkpoint
