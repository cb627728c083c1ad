"""The checkpoint record (windows/checkpoints/record.py): the one stored report the checkpoint run writes and the
next run, a fresh sensor cursor and the sensor read — one frontier, typed, versioned.

Before: the frontier was stored twice (the asset's materialisation metadata, read back with a json.loads
fallback, and `_checkpoints/frontier.json`) and merged, and the sensor parsed the late and uncommitted windows
out of the string-keyed metadata of the newest materialisation."""
from __future__ import annotations

import json

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.windows.checkpoints.record import (
    LEGACY_FRONTIER_KEY,
    MAX_LATE_KEYS,
    RECORD_KEY,
    CheckpointRecord,
    CheckpointRecordError,
    next_report_id,
    read_checkpoint_record,
    write_checkpoint_record,
)
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.windows.tick.report_start import start_reports
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import SHARD, STREAM, T0, Clock, RecordingLeaseTable, deliver, init, make_records

W = 60_000
NOW = T0 + 10 * W
TH = Checkpoint("TRIM_HORIZON")


@pytest.fixture
def output(tmp_path):
    store = open_store(str(tmp_path / "out"))
    store.ensure_zone(create=True)
    return store


@pytest.fixture
def zone(tmp_path, output):
    """Three one-minute windows of one shard, landed and committed."""
    zone = open_store(str(tmp_path / "zone"))
    zone.ensure_zone(create=True)
    records = make_records(30, per_minute=10)
    clock = Clock(NOW)
    sink = LandingProcessor(zone, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=5)
    init(sink)
    sink.shutdown_requested(deliver(sink, records, 10))
    for w in range(T0, T0 + 3 * W, W):
        names = frozenset(b.key() for b in list_batches(zone, STREAM, w, w + W))
        output.put(commit_key(w), WindowCommit(w, w + W, "run", names).to_json())
    return zone, records


def checkpoint_run(zone, output, lease: Lease, now_ms: int = NOW):
    return commit_checkpoints(RecordingLeaseTable(), StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)]), zone,
                              output, window_ms=W, first_window_ms=T0 - 100 * W, initial=TH, grace_ms=0,
                              now_ms=now_ms, requested_for=(T0 + 2 * W, T0 + 3 * W))


def test_a_record_reads_back_as_it_was_written(output):
    record = CheckpointRecord({"shardId-1": T0 + W}, {T0: ("b2", "b1")}, (T0 + W,), 7, NOW, (T0, T0 + W))
    write_checkpoint_record(output, record, replaces_legacy=False)
    assert read_checkpoint_record(output) == record


def test_a_frontier_stored_without_a_report_gives_the_sensor_nothing_to_act_on(output):
    write_checkpoint_record(output, CheckpointRecord({"s": T0}), replaces_legacy=False)
    record = read_checkpoint_record(output)
    assert record == CheckpointRecord({"s": T0}) and not record.new_since(None)


def test_no_record_and_no_output_location_read_as_none(tmp_path, output):
    assert read_checkpoint_record(output) is None
    assert read_checkpoint_record(open_store(str(tmp_path / "absent"))) is None


GOOD = json.loads(CheckpointRecord({"s": T0}, {T0: ("b",)}, (T0,), 1, NOW).to_json())


@pytest.mark.parametrize("body,why", [
    (b"not json", "not JSON"),
    (b"[1]", "a JSON list"),
    (json.dumps({**GOOD, "v": 2}).encode(), "version 2, this code reads version 1"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "v"}).encode(), "version None"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "frontier"}).encode(), "KeyError"),
    (json.dumps({**GOOD, "frontier": {"s": "soon"}}).encode(), "expected an integer, got 'soon'"),
    (json.dumps({**GOOD, "frontier": [1]}).encode(), "frontier must be an object"),
    (json.dumps({**GOOD, "late": {"1": ["b"]}}).encode(), "expected a list"),
    (json.dumps({**GOOD, "late": [{"window_start_ms": T0, "batches": [3]}]}).encode(), "expected a string"),
    (json.dumps({**GOOD, "uncommitted": [True]}).encode(), "expected an integer, got True"),
    (json.dumps({**GOOD, "report": "7"}).encode(), "expected an integer, got '7'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "report"}).encode(), "KeyError"),
    (json.dumps({**GOOD, "requested_for": [T0]}).encode(), "IndexError"),
])
def test_a_malformed_record_is_a_clear_error_naming_the_object(output, body, why):
    output.put(RECORD_KEY, body)
    with pytest.raises(CheckpointRecordError, match=RECORD_KEY) as raised:
        read_checkpoint_record(output)
    assert why in str(raised.value)


def test_a_legacy_frontier_is_read_as_a_record_with_no_report(output):
    output.put(LEGACY_FRONTIER_KEY, json.dumps({"frontier": {"s": T0 + W}}).encode())
    record = read_checkpoint_record(output)
    assert record == CheckpointRecord({"s": T0 + W}) and not record.new_since(None)


@pytest.mark.parametrize("body", [b"not json", b'{"frontier": [1]}', b'{"other": {}}', b'{"frontier": {"s": "x"}}'])
def test_a_malformed_legacy_frontier_is_a_clear_error_naming_it(output, body):
    output.put(LEGACY_FRONTIER_KEY, body)
    with pytest.raises(CheckpointRecordError, match=LEGACY_FRONTIER_KEY):
        read_checkpoint_record(output)


def test_the_first_checkpoint_run_migrates_a_legacy_frontier_once(zone, output):
    """An output location written before the record: the run lists from its frontier, stores the record with
    the next frontier and deletes frontier.json (one frontier from then on)."""
    zone, records = zone
    output.put(LEGACY_FRONTIER_KEY, json.dumps({"frontier": {SHARD: T0 + W}}).encode())
    report = checkpoint_run(zone, output, Lease(SHARD, records[9].checkpoint))
    assert report.listed_from_ms == T0 + W  # the legacy frontier was used
    assert output.get_optional(LEGACY_FRONTIER_KEY) is None
    assert read_checkpoint_record(output) == report.record
    assert report.record is not None and report.record.frontier == report.frontier == {SHARD: T0 + 2 * W}
    assert report.record.requested_for == (T0 + 2 * W, T0 + 3 * W) and report.record.report == NOW


def test_a_checkpoint_run_over_a_malformed_record_lists_from_the_zone_start_and_stores_a_good_one(zone, output):
    """The frontier saves listing, it proves nothing: an unreadable record costs one listing from the zone's
    start, and the run's own record replaces it."""
    zone, records = zone
    output.put(RECORD_KEY, b"not json")
    report = checkpoint_run(zone, output, Lease(SHARD, records[9].checkpoint))
    assert report.listed_from_ms == T0 and report.plan.shards[SHARD].commit == records[-1].checkpoint
    assert read_checkpoint_record(output) == report.record


def test_a_fresh_cursor_over_a_malformed_record_starts_past_the_committed_windows_and_says_why(zone, output):
    zone, records = zone
    output.put(RECORD_KEY, b"{}")
    progress = ShardProgress(SHARD, records[-1].checkpoint, records[-1].approximate_arrival_timestamp_ms, NOW, 0)
    lease = Lease(SHARD, records[-1].checkpoint, extra={k: v for k, v in progress.to_attributes().items()
                                                        if v is not None})
    start = start_reports(zone, STREAM, output, [lease], {SHARD: progress}, window_ms=W, grace_ms=0,
                          not_before_ms=T0 - 100 * W, now_ms=NOW)
    assert start.start_ms == T0 + 3 * W
    assert f"{RECORD_KEY}: checkpoint record version None" in start.note


def test_each_run_stores_a_report_the_sensor_has_not_acted_on(zone, output):
    zone, records = zone
    first = checkpoint_run(zone, output, Lease(SHARD, records[9].checkpoint)).record
    # the next run's clock is behind the first's: its report still comes after
    second = checkpoint_run(zone, output, Lease(SHARD, records[-1].checkpoint), now_ms=NOW - W).record
    assert first is not None and second is not None and first.report is not None
    assert second.new_since(first.report) and not first.new_since(first.report)
    assert read_checkpoint_record(output) == second


def test_report_ids_come_after_the_event_storage_ids_a_cursor_acted_on_before():
    """A sensor cursor written before the record holds a kinesis_checkpoints event storage id (a count): the
    first record's report must be new to it, or the windows it names would never be asked for."""
    first = CheckpointRecord(report=next_report_id(None, NOW))
    assert first.new_since(123_456_789)
    assert next_report_id(CheckpointRecord(report=NOW + 5), NOW) == NOW + 6


def test_the_record_keeps_at_most_the_late_keys_the_sensor_follows():
    late = {T0: [f"b{i:03d}" for i in range(MAX_LATE_KEYS + 10)]}
    record = CheckpointRecord.of_run(None, frontier={}, late=late, uncommitted=[T0 + W, T0 + W], now_ms=NOW)
    assert record.late[T0] == tuple(sorted(late[T0]))[:MAX_LATE_KEYS] and record.uncommitted == (T0 + W,)
