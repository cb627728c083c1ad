"""Bounded re-reads: where a read starts, where it stops, what it leaves to the live consumer; on kinesis-local."""
from __future__ import annotations

import threading
import time

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard, UserRecord
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.backfill import BackfillPace, backfill_range, cut_batch, live_shards, start_position
from kcl_pipeline.zone.batch import read_batch_info
from kcl_pipeline.zone.chain import list_batches, read_batches, verify_batches
from kcl_pipeline.zone.layout import MINUTE_MS, minute_of
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.store import open_store

from .helpers import T0, seq

H = 3_600_000
A, B = "shardId-000000000000", "shardId-000000000001"


@pytest.mark.parametrize("start,now,retention,kind", [
    (T0, T0 + 1 * H, 24, "AT_TIMESTAMP"),
    (T0, T0 + 24 * H - 1, 24, "AT_TIMESTAMP"),
    (T0, T0 + 24 * H, 24, "TRIM_HORIZON"),  # the start is the trim horizon: nothing older exists
    (T0, T0 + 30 * H, 168, "AT_TIMESTAMP"),
    (T0, T0 + 200 * H, 168, "TRIM_HORIZON"),
])
def test_start_position(start, now, retention, kind):
    cp = start_position(start, now, retention)
    assert cp.sequence_number == kind
    assert cp.sub_sequence_number == (start if kind == "AT_TIMESTAMP" else 0)


def rec(i: int, arrival: int) -> UserRecord:
    return UserRecord(A, seq(i), 0, "pk", None, arrival, b"{}")


@pytest.mark.parametrize("arrivals,delivered,skipped,done", [
    ([T0, T0 + 1, T0 + MINUTE_MS - 1], [0, 1, 2], 0, False),
    ([T0 - 5, T0 - 1, T0, T0 + 3], [2, 3], 2, False),  # a TRIM_HORIZON read skips what precedes the range
    ([T0, T0 + MINUTE_MS, T0 + MINUTE_MS + 1], [0], 0, True),  # the first record at the end stops the read
    ([T0 - 1, T0 + MINUTE_MS], [], 1, True),
    ([], [], 0, False),
])
def test_cut_batch(arrivals, delivered, skipped, done):
    records = [rec(i, a) for i, a in enumerate(arrivals)]
    cut = cut_batch(records, T0, T0 + MINUTE_MS)
    assert [records.index(r) for r in cut.deliver] == delivered
    assert (cut.skipped_before, cut.done) == (skipped, done)
    assert cut.last_before == (records[skipped - 1].checkpoint if skipped else None)


def lease(key: str, cp: str = "TRIM_HORIZON", progress: ShardProgress | None = None) -> Lease:
    return Lease(key, Checkpoint(cp), lease_owner="live", extra=progress.to_attributes() if progress else {})


SHARDS = [Shard(A), Shard(B)]


@pytest.mark.parametrize("leases,live", [
    ([], set()),  # no live consumer at all
    ([lease(A, progress=ShardProgress(A, Checkpoint(seq(9)), T0 + MINUTE_MS)),
      lease(B, progress=ShardProgress(B, Checkpoint(seq(9)), T0 + 2 * MINUTE_MS))], set()),  # both past the end
    ([lease(A, progress=ShardProgress(A, Checkpoint(seq(9)), T0 + 10)),
      lease(B, "SHARD_END")], {A}),  # A is still inside the range: left to the live consumer
    ([lease(A), lease(B, progress=ShardProgress(B, None, None, T0 + MINUTE_MS + 5_000, 0))], {A}),  # B caught up
])
def test_live_shards(leases, live):
    got = live_shards(T0, T0 + MINUTE_MS, SHARDS, leases, grace_ms=1_000)
    assert set(got) == live
    assert all(got.values())  # every one says why


def test_backfill_rejects_a_bad_range(tmp_path):
    with pytest.raises(ValueError, match="whole minutes"):
        backfill_range("s", T0, T0 + 1, str(tmp_path))
    with pytest.raises(ValueError, match="non-empty"):
        backfill_range("s", T0, T0, str(tmp_path))


@pytest.mark.parametrize("kwargs,error", [
    (dict(reads_per_second=5), "below the shard's 5 GetRecords/s"),
    (dict(reads_per_second=0), "reads_per_second must be > 0"),
    (dict(bytes_per_second=2 * 1024 * 1024), "below the shard's 2097152 B/s"),
    (dict(parallelism=0), "parallelism must be >= 1"),
])
def test_a_backfill_pace_that_would_starve_the_live_consumer_is_refused(kwargs, error):
    with pytest.raises(ValueError, match=error):
        BackfillPace(**kwargs)


def test_the_default_backfill_pace_leaves_the_live_consumer_most_of_each_shard():
    pace = BackfillPace()
    assert pace.reads_per_second <= 1 and pace.polling_interval >= 1.0
    assert pace.bytes_per_second <= 1024 * 1024 and pace.parallelism > 1


FAST = BackfillPace(reads_per_second=4)


@pytest.fixture
def stream_with_records(emulators, aws_settings, unique_name):
    """A 2-shard stream holding 160 user records (KPL aggregates of 4 and plain ones), and the range around them."""
    kinesis = client("kinesis", aws_settings)
    stream = unique_name("backfill")
    before = int(time.time() * 1000)
    report = produce(kinesis, stream, 80, aggregate=4, create_shards=2, seed=1)
    report2 = produce(kinesis, stream, 80, aggregate=1, first_id=80, seed=2)
    after = int(time.time() * 1000)
    start, end = minute_of(before) - MINUTE_MS, minute_of(after) + 2 * MINUTE_MS
    return kinesis, stream, start, end, report.user_records + report2.user_records


def zone_rows(store, stream, start, end):
    table = read_batches(store, stream, start, end)
    return sorted(zip(table.column("sequence_number").to_pylist(), table.column("sub_sequence_number").to_pylist(),
                      strict=True))


@pytest.mark.slow
def test_backfill_lands_a_range_once_and_fills_holes(stream_with_records, aws_settings, tmp_path):
    kinesis, stream, start, end, produced = stream_with_records
    zone = str(tmp_path / "zone")
    store = open_store(zone)
    first = backfill_range(stream, start, end, zone, aws=aws_settings, kinesis=kinesis, create_zone=True,
                           pace=FAST)
    assert first.complete and first.records_in_range == produced == first.records_landed
    assert {s.stopped_by for s in first.shards.values()} == {"caught_up"}  # the range ends in the future
    rows = zone_rows(store, stream, start, end)
    assert len(rows) == produced == len(set(rows))
    batches = list_batches(store, stream, start, end)
    assert all(r.ok for r in verify_batches(store, batches).values())
    # Each batch records the stream it is of, as the live writer's do (docs/landing.md, "Stream identity").
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    assert {read_batch_info(store, b).stream_arn for b in batches} == {arn}

    again = backfill_range(stream, start, end, zone, aws=aws_settings, kinesis=kinesis)
    assert (again.records_landed, again.records_already_landed) == (0, produced)
    assert list_batches(store, stream, start, end) == batches  # same keys, nothing added

    # A lost batch is landed again, under its own key, and only it.
    lost = batches[len(batches) // 2]
    (tmp_path / "zone" / lost.key()).unlink()
    refill = backfill_range(stream, start, end, zone, aws=aws_settings, kinesis=kinesis)
    assert refill.records_landed > 0 and refill.records_landed + refill.records_already_landed == produced
    assert list_batches(store, stream, start, end) == batches
    assert zone_rows(store, stream, start, end) == rows


@pytest.mark.slow
def test_backfill_past_retention_reads_from_trim_horizon(stream_with_records, aws_settings, tmp_path):
    kinesis, stream, start, end, produced = stream_with_records
    report = backfill_range(stream, start, end, str(tmp_path), aws=aws_settings, kinesis=kinesis,
                            now_ms=start + 48 * H)  # the range is beyond the stream's 24 h retention
    assert {s.start for s in report.shards.values()} == {"TRIM_HORIZON"}
    assert report.records_landed == produced


@pytest.mark.slow
def test_backfill_leaves_shards_the_live_consumer_is_still_landing(stream_with_records, aws_settings, tmp_path):
    kinesis, stream, start, end, produced = stream_with_records
    busy = Lease(A, Checkpoint("TRIM_HORIZON"), lease_owner="live-worker")  # no progress past the range yet
    done = Lease(B, Checkpoint("SHARD_END"))
    report = backfill_range(stream, start, end, str(tmp_path), aws=aws_settings, kinesis=kinesis,
                            leases=[busy, done])
    assert report.left_to_live.keys() == {A} and not report.complete
    assert report.shards[A].records_read == 0  # not even read
    assert report.shards[B].records_landed == report.records_landed > 0
    assert {b.shard_id for b in list_batches(open_store(str(tmp_path)), stream, start, end)} == {B}


class CallLog:
    """The emulator's client, recording which thread made each GetRecords call."""

    def __init__(self, kinesis):
        self._kinesis = kinesis
        self.threads: list[int] = []

    def __getattr__(self, name):
        return getattr(self._kinesis, name)

    def get_records(self, **kw):
        self.threads.append(threading.get_ident())
        return self._kinesis.get_records(**kw)


@pytest.mark.slow
def test_a_backfill_reads_its_shards_in_parallel_and_reports_each_one_done(stream_with_records, aws_settings,
                                                                           tmp_path):
    """Shard after shard, a day's backfill of a wide stream takes hours: the shards are read at once, and the
    run hears of each one finished."""
    kinesis, stream, start, end, produced = stream_with_records
    calls = CallLog(kinesis)
    progress = []
    report = backfill_range(stream, start, end, str(tmp_path), aws=aws_settings, kinesis=calls, pace=FAST,
                            on_progress=progress.append)
    assert report.complete and report.records_landed == produced
    assert len(set(calls.threads)) == 2 and threading.get_ident() not in calls.threads
    assert [p.shards_done for p in progress] == [1, 2] and {p.shards_to_read for p in progress} == {2}
    assert {p.last_shard for p in progress} == {A, B}
    assert (progress[-1].records_in_range, progress[-1].records_landed) == (produced, produced)


@pytest.mark.slow
def test_a_backfill_past_its_deadline_says_which_shards_it_cut(stream_with_records, aws_settings, tmp_path):
    kinesis, stream, start, end, produced = stream_with_records
    report = backfill_range(stream, start, end, str(tmp_path), aws=aws_settings, kinesis=kinesis,
                            deadline_seconds=0, pace=FAST)
    assert not report.complete and report.cut_by_deadline == [A, B] and report.records_landed == 0
