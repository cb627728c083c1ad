"""Issue 20 §1: the checkpoint never passes a batch missing from the zone.

Before: the plan walked the landed batch keys in order and never asked whether one batch follows the other.
With a batch lost before its window ran (the run's commit names what was there), every window was
"materialised", the plan said "every landed batch is in a materialised window" and checkpointed past the
lost records, which no window ever transformed. Now each batch must be proven to follow the one before it
(its link in the listing), or the checkpoint / start link for the first one.
"""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.windows.checkpoints.plan import chain_evidence, plan_checkpoints
from kcl_pipeline.windows.checkpoints.record import RECORD_KEY
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import BatchKey, link_key, parse_link_key
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import SHARD, STREAM, T0, Clock, RecordingLeaseTable, deliver, init, make_records, seq

W = 60_000  # one-minute windows: 4 batches each below
TH = Checkpoint("TRIM_HORIZON")


@pytest.fixture
def landed(tmp_path):
    """Three minutes of one shard landed by the live writer, 4 batches a minute (12 in all), and an output."""
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    records = make_records(60, per_minute=20)
    clock = Clock(T0 + 10 * W)
    sink = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=5)
    init(sink)
    sink.shutdown_requested(deliver(sink, records, 20))
    batches = list_batches(zone, STREAM)
    assert len(batches) == 12
    return zone, output, records, batches


def lose(zone, batch: BatchKey, prev: Checkpoint | None = None) -> None:
    """The batch is gone (and its link, when `prev` is given)."""
    zone.delete([batch.key()] + ([link_key(STREAM, batch.minute_ms, batch.shard_id, prev)] if prev else []))


def run_windows(zone, output) -> None:
    """Each window's run commits the batches it listed (the state after runs that read a zone with a loss)."""
    for w in range(T0, T0 + 3 * W, W):
        output.put(commit_key(w), WindowCommit(w, w + W, f"run-{w}",
                                               frozenset(b.key() for b in list_batches(zone, STREAM, w, w + W))
                                               ).to_json())


def checkpoint(zone, output, lease: Lease,
               progress: ShardProgress | None = None) -> tuple[Checkpoint | None, RecordingLeaseTable]:
    """A checkpoint run for a lease in the state given: each call stands alone (no frontier of an earlier
    call, which would assume the lease checkpoint it committed)."""
    output.delete([RECORD_KEY])
    table = RecordingLeaseTable()
    view = StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)])
    if progress is not None:
        lease = Lease(lease.lease_key, lease.checkpoint, extra={k: v for k, v in progress.to_attributes().items()
                                                                  if v is not None})
        view = StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)])
    report = commit_checkpoints(table, view, zone, output, window_ms=W, first_window_ms=T0, initial=TH,
                                grace_ms=0)
    return report.plan.shards[SHARD].commit, table


# (id, batches lost (with their links when True), lease checkpoint (a batch index: its last), last committed batch)
LOSSES = [
    ("a middle batch", [(5, False)], None, 4),
    ("a middle batch and its link", [(5, True)], None, 4),
    ("the first batch of a minute and its link", [(4, True)], None, 3),
    ("two batches in a row", [(5, False), (6, True)], None, 4),
    ("the chain's first batch", [(0, False)], None, None),
    ("the batch right after the checkpoint", [(3, False)], 2, None),
    ("a batch after the checkpoint, with its link", [(8, True)], 2, 7),
]


@pytest.mark.parametrize("lost,at,expected", [c[1:] for c in LOSSES], ids=[c[0] for c in LOSSES])
def test_a_checkpoint_never_passes_a_batch_lost_before_its_window_ran(landed, lost, at, expected):
    zone, output, _, batches = landed
    for i, with_link in lost:
        lose(zone, batches[i], (batches[i - 1].last if i else TH) if with_link else None)
    run_windows(zone, output)
    current = batches[at].last if at is not None else TH
    committed, table = checkpoint(zone, output, Lease(SHARD, current))
    assert committed == (batches[expected].last if expected is not None else None)
    assert table.checkpoints == ({SHARD: committed} if committed else {})


def test_the_plan_names_the_gap(landed):
    zone, output, _, batches = landed
    lose(zone, batches[5])
    run_windows(zone, output)
    table = RecordingLeaseTable()
    report = commit_checkpoints(table, StreamSlice(StreamScope(STREAM), [Lease(SHARD, TH)], [Shard(SHARD)]), zone,
                                output, window_ms=W, first_window_ms=T0, initial=TH, grace_ms=0)
    reason = report.plan.shards[SHARD].reason
    assert f"gap before {batches[6].key()}" in reason and str(batches[4].last) in reason


def test_an_unbroken_chain_is_checkpointed_to_its_end(landed):
    zone, output, _, batches = landed
    run_windows(zone, output)
    assert checkpoint(zone, output, Lease(SHARD, TH))[0] == batches[-1].last
    assert checkpoint(zone, output, Lease(SHARD, batches[3].last))[0] == batches[-1].last
    # a checkpoint inside a batch (a peer committed mid-batch): that batch needs no predecessor
    assert checkpoint(zone, output, Lease(SHARD, make_records(60, per_minute=20)[12].checkpoint))[0] \
        == batches[-1].last


def test_a_shard_is_never_ended_across_a_gap(landed):
    zone, output, records, batches = landed
    lose(zone, batches[5])
    run_windows(zone, output)
    end = ShardProgress(SHARD, records[-1].checkpoint, records[-1].approximate_arrival_timestamp_ms,
                        shard_end_landed=True)
    committed, table = checkpoint(zone, output, Lease(SHARD, TH), end)
    assert committed == batches[4].last and table.ended == []


def test_a_refilled_batch_lets_the_checkpoint_through_once_its_window_ran_again(landed):
    """The remedy: a backfill re-lands the lost range (it meets the lost batch's link and writes exactly that
    batch), the window runs again, and the plan goes on to the end."""
    zone, output, records, batches = landed
    lose(zone, batches[5])
    run_windows(zone, output)
    assert checkpoint(zone, output, Lease(SHARD, TH))[0] == batches[4].last
    clock = Clock(T0 + 10 * W)
    refill = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=20)
    init(refill, Checkpoint("AT_TIMESTAMP", T0 + W))
    refill.shutdown_requested(deliver(refill, records[20:40], 20))
    assert batches[5] in list_batches(zone, STREAM)
    assert checkpoint(zone, output, Lease(SHARD, TH))[0] == batches[4].last  # not before its window ran again
    run_windows(zone, output)
    assert checkpoint(zone, output, Lease(SHARD, TH))[0] == batches[-1].last


def test_link_keys_name_the_position_each_batch_follows():
    b = BatchKey(STREAM, SHARD, T0 + W, Checkpoint(seq(5), 1), Checkpoint(seq(9)))
    link = parse_link_key(link_key(STREAM, b.minute_ms, SHARD, Checkpoint(seq(5))))
    assert link is not None and (link.minute_ms, link.prev) == (T0 + W, Checkpoint(seq(5)))
    start = parse_link_key(link_key(STREAM, 0, SHARD, Checkpoint("AT_TIMESTAMP", T0)))
    assert start is not None and (start.minute_ms, start.prev) == (None, Checkpoint("AT_TIMESTAMP", T0))
    assert parse_link_key(link_key(STREAM, T0, SHARD, None)) is None  # `after=none` names no position
    assert parse_link_key(b.key()) is None
    evidence = chain_evidence([(SHARD, link)], {})
    assert evidence.follows(SHARD, b) == Checkpoint(seq(5)).key()


def test_without_evidence_a_batch_stops_the_walk():
    """A batch whose minute holds no link (written by hand, or before fencing) proves nothing."""
    a = BatchKey(STREAM, SHARD, T0, Checkpoint(seq(1)), Checkpoint(seq(2)))
    b = BatchKey(STREAM, SHARD, T0, Checkpoint(seq(3)), Checkpoint(seq(4)))
    evidence = chain_evidence([], {SHARD: a.key()})
    plan = plan_checkpoints([T0], W, {SHARD: [a, b]}, {}, [Lease(SHARD, TH)], chain=evidence)
    assert plan.shards[SHARD].commit == a.last and "no link" in plan.shards[SHARD].reason


@pytest.mark.parametrize("backfilled_from", [0, 20], ids=["the shard's first records", "later records"])
def test_a_backfills_chain_is_passed_once_the_live_writer_saw_where_it_joins(tmp_path, backfilled_from):
    """A backfill landed before the live consumer: its first batch follows AT_TIMESTAMP, so its minute holds no
    link naming the record before it. The live writer, delivering that record and then the backfill's batch,
    claims the missing link (the start link, for the shard's first record): the plan then passes the batch."""
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    records = make_records(60, per_minute=20)
    clock = Clock(T0 + 10 * W)
    backfill = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=7)
    init(backfill, Checkpoint("AT_TIMESTAMP", T0 + backfilled_from // 20 * W))
    backfill.shutdown_requested(deliver(backfill, records[backfilled_from:], 40))
    run_windows(zone, output)
    unproven = checkpoint(zone, output, Lease(SHARD, TH))[0]
    assert unproven is None or unproven.key() < records[backfilled_from].position()
    live = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=5)
    init(live)
    live.shutdown_requested(deliver(live, records, 20))
    assert live.stats.links_joined == 1
    run_windows(zone, output)
    assert checkpoint(zone, output, Lease(SHARD, TH))[0] == records[-1].checkpoint


@pytest.mark.parametrize("claimed", [True, False], ids=["a start link claimed", "no start link"])
def test_a_shard_is_never_ended_while_its_start_link_names_a_batch_nothing_landed(tmp_path, claimed):
    """Simulation seed 3670: the holder (at LATEST) read nothing before its shard closed and reported the end
    landed with nothing landed, while a holder it never saw had claimed the start link (and died before its
    batch). Before, the plan ended the shard past every record of that chain; now it waits for the chain."""
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    latest = Checkpoint("LATEST")
    if claimed:
        batch = BatchKey(STREAM, SHARD, T0, Checkpoint(seq(3)), Checkpoint(seq(7)))
        assert zone.put_if_absent(link_key(STREAM, 0, SHARD, latest), batch.key().encode())
    ended = ShardProgress(SHARD, None, shard_end_landed=True).to_attributes()
    lease = Lease(SHARD, latest, extra={k: v for k, v in ended.items() if v is not None})
    table = RecordingLeaseTable()
    table.scan = lambda: [lease]  # type: ignore[attr-defined]  # the children's creation reads the leases
    report = commit_checkpoints(table, StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)]),
                                zone, output, window_ms=W, first_window_ms=T0, initial=TH, grace_ms=0)
    assert report.plan.shards[SHARD].end is not claimed and table.ended == ([] if claimed else [SHARD])
