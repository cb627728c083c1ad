"""The landing sink: flush rules, progress, standalone mode, and bad zones (local directory and S3 on moto)."""
from __future__ import annotations

import os
import shutil

import pytest

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.errors import LandingConfigError, ZoneAccessError, ZoneNotFoundError
from kcl_pipeline.zone.layout import MINUTE_MS, minute_of, parse_batch_key
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor, landing_spec
from kcl_pipeline.zone.store import open_store

from .helpers import (
    SHARD,
    STREAM,
    T0,
    Clock,
    RecordingCheckpointer,
    deliver,
    init,
    make_records,
    run_unprivileged,
    shared_tmpdir,
)

TH = Checkpoint("TRIM_HORIZON")


def sink(zone, clock: Clock, **kwargs) -> LandingProcessor:
    """A sink on `zone` (a test zone, or a URI), built from plain arguments as a worker process would."""
    uri, aws = (zone, None) if isinstance(zone, str) else (zone.uri, zone.aws)
    return LandingProcessor(uri, STREAM, clock=clock.time, monotonic=clock.monotonic, aws=aws, **kwargs)


def landed_rows(store) -> list[tuple]:
    t = read_batches(store, STREAM)
    return list(zip(t.column("sequence_number").to_pylist(), t.column("sub_sequence_number").to_pylist(),
                    t.column("data").to_pylist(), strict=True))


def expected_rows(records) -> list[tuple]:
    return [(r.sequence_number, r.sub_sequence_number, r.data) for r in records]


def assert_exactly_once(uri, store, records):
    assert landed_rows(store) == expected_rows(records)
    report = verify_zone(uri, stream=STREAM, store=store, deep=True)
    assert report.ok, "\n".join(report.lines())
    (chain,) = report.streams[STREAM].values()
    assert chain.rows == len(records) and chain.duplicate_rows == 0
    assert chain.starts_after == TH


# -- landing and flushing ------------------------------------------------------------------------------------

def test_lands_every_record_once_under_deterministic_keys(any_zone):
    uri, store = any_zone
    records = make_records(600, per_minute=170)  # four arrival minutes
    clock = Clock(T0 + 10 * MINUTE_MS)
    p = sink(any_zone, clock, max_batch_records=64)
    init(p)
    assert p.resume_position() is None  # nothing landed, lease at TRIM_HORIZON
    cp = deliver(p, records, 97)
    p.shutdown_requested(cp)
    assert cp.checkpoints == [] and not cp.ended  # the pipeline commits checkpoints, not the sink
    assert_exactly_once(uri, store, records)
    keys = list_batches(store, STREAM)
    assert {k.minute_ms for k in keys} == {T0 + i * MINUTE_MS for i in range(4)}
    for k in keys:  # a batch never spans minutes, and its key is its range
        rows = [r for r in records if k.first.key() <= r.position() <= k.last.key()]
        assert {minute_of(r.approximate_arrival_timestamp_ms) for r in rows} == {k.minute_ms}
        assert len(rows) <= 64
    assert p.stats.rows_written == 600
    assert p.stats.flushes["minute"] == 3


def test_flushes_on_bytes_and_a_big_response_is_landed_in_pieces(local_zone):
    uri, store = local_zone
    records = make_records(400, data_size=10_000)  # ~4 MB in one GetRecords response
    p = sink(uri, Clock(T0), max_batch_bytes=1024 * 1024)
    init(p)
    deliver(p, records, 400)
    assert p.stats.flushes.get("bytes", 0) >= 3  # flushed early, inside one process_records call
    p.flush()
    sizes = [sum(len(r.data) + 200 for r in records if k.first.key() <= r.position() <= k.last.key())
             for k in list_batches(store, STREAM)]
    assert len(sizes) >= 4 and max(sizes) <= 1024 * 1024 + 200 * 100
    assert landed_rows(store) == expected_rows(records)


def test_a_record_bigger_than_a_batch_lands_alone(local_zone):
    uri, store = local_zone
    records = make_records(3, data_size=100)
    big = make_records(4, data_size=3000, seed=9)[3]  # sequence after records[2]
    p = sink(uri, Clock(T0), max_batch_bytes=2048, memory_limit_bytes=8192)
    init(p)
    deliver(p, records + [big], 10)
    p.flush()
    ranges = [(k.first, k.last) for k in list_batches(store, STREAM)]
    assert (big.checkpoint, big.checkpoint) in ranges
    assert landed_rows(store) == expected_rows(records + [big])


def test_flush_on_age_and_when_caught_up_past_the_minute(local_zone):
    uri, store = local_zone
    records = make_records(10, start_ms=T0 + 1000)
    clock = Clock(T0 + 2000)
    p = sink(uri, clock, max_batch_age_seconds=30)
    init(p)
    cp = RecordingCheckpointer()
    p.process_records(ProcessRecordsInput(records[:5], 0, cp))
    assert list_batches(store, STREAM) == []  # young, and the minute is not over
    clock.mono += 29
    p.process_records(ProcessRecordsInput([], 500, cp))
    assert list_batches(store, STREAM) == []
    clock.mono += 1
    p.process_records(ProcessRecordsInput([], 500, cp))  # an empty poll is enough to flush on age
    assert len(list_batches(store, STREAM)) == 1 and p.stats.flushes == {"age": 1}
    p.process_records(ProcessRecordsInput(records[5:], 0, cp))
    clock.ms = T0 + MINUTE_MS - 1
    p.process_records(ProcessRecordsInput([], 0, cp))
    assert len(list_batches(store, STREAM)) == 1  # caught up, but the minute is not over yet
    clock.ms = T0 + MINUTE_MS
    p.process_records(ProcessRecordsInput([], 200, cp))
    assert len(list_batches(store, STREAM)) == 1  # minute over, but behind: more of it may come
    p.process_records(ProcessRecordsInput([], 0, cp))
    assert len(list_batches(store, STREAM)) == 2 and p.stats.flushes["minute_over"] == 1
    clock.mono += 100
    p.tick()  # nothing buffered: nothing to do
    assert len(list_batches(store, STREAM)) == 2


def test_progress_is_published_only_for_landed_polls(local_zone):
    uri, store = local_zone
    records = make_records(6, start_ms=T0)
    clock = Clock(T0 + 5000)
    p = sink(uri, clock)
    assert p.heartbeat_attributes() == {}
    init(p)
    assert ShardProgress.from_attributes(SHARD, p.heartbeat_attributes()) is None
    cp = RecordingCheckpointer()
    p.process_records(ProcessRecordsInput([], 0, cp))  # idle poll, caught up, nothing buffered
    assert p.progress == ShardProgress(SHARD, polled_at_ms=T0 + 5000, millis_behind_latest=0)
    clock.ms += 1000
    p.process_records(ProcessRecordsInput(records, 0, cp))  # buffered, not landed: the poll is not settled
    assert p.progress.polled_at_ms == T0 + 5000 and p.progress.landed is None
    clock.ms = T0 + MINUTE_MS + 10
    p.process_records(ProcessRecordsInput([], 0, cp))  # the minute is over: flush, then settle
    progress = ShardProgress.from_attributes(SHARD, p.heartbeat_attributes())
    (key,) = list_batches(store, STREAM)
    assert progress == ShardProgress(SHARD, records[-1].checkpoint, records[-1].approximate_arrival_timestamp_ms,
                                     T0 + MINUTE_MS + 10, 0, False, key.key())


def test_a_fast_host_clock_does_not_complete_windows_early(local_zone):
    """The caught-up time is the service's (the GetRecords Date header), not the host's: a worker whose clock
    runs a minute fast must not report "caught up at window end + grace" a minute before it is."""
    uri, store = local_zone
    clock = Clock(T0 + 5000 + MINUTE_MS)  # the host: a minute fast
    p = sink(uri, clock)
    init(p)
    p.process_records(ProcessRecordsInput([], 0, RecordingCheckpointer(), service_time_ms=T0 + 5000))
    assert p.progress.polled_at_ms == T0 + 5000
    p.process_records(ProcessRecordsInput([], 0, RecordingCheckpointer()))  # no Date: the host clock stands in
    assert p.progress.polled_at_ms == T0 + 5000 + MINUTE_MS


def test_pipeline_mode_never_checkpoints_and_marks_shard_end(local_zone):
    uri, store = local_zone
    records = make_records(20)
    p = sink(uri, Clock(T0), max_batch_records=8)
    init(p)
    cp = deliver(p, records, 5)
    p.shard_ended(cp)
    assert cp.checkpoints == [] and not cp.ended  # the checkpoint plan ends the shard after the transform
    attrs = p.heartbeat_attributes()
    assert attrs["landingShardEnd"] is True and attrs["landingSequenceNumber"] == records[-1].sequence_number
    assert landed_rows(store) == expected_rows(records)


class HeartbeatCheckpointer(RecordingCheckpointer):
    """A worker checkpointer that can defer a checkpoint to its next heartbeat write."""

    def checkpoint(self, sequence_number=None, sub_sequence_number=0):
        raise AssertionError("the deferred form should be used when offered")

    def checkpoint_at_next_heartbeat(self, sequence_number=None, sub_sequence_number=0):
        self.checkpoints.append(Checkpoint(sequence_number, sub_sequence_number))


@pytest.mark.parametrize("checkpointer", [RecordingCheckpointer, HeartbeatCheckpointer])
def test_standalone_mode_checkpoints_after_each_flush_and_ends_the_shard(local_zone, checkpointer):
    uri, store = local_zone
    records = make_records(20)
    p = sink(uri, Clock(T0), max_batch_records=8, checkpoint_after_flush=True)
    init(p)
    cp = deliver(p, records, 5, checkpointer())
    p.shard_ended(cp)
    lasts = [k.last for k in sorted(list_batches(store, STREAM), key=lambda k: k.first.key())]
    assert cp.checkpoints == lasts and lasts[-1] == records[-1].checkpoint
    assert cp.ended


def test_lease_lost_drops_the_buffer_and_the_next_owner_lands_it(local_zone):
    uri, store = local_zone
    records = make_records(30)
    clock = Clock(T0 + MINUTE_MS)
    a = sink(uri, clock, max_batch_records=8)
    init(a)
    deliver(a, records[:20], 20)  # 16 landed, 4 buffered
    a.lease_lost()
    a.process_records(ProcessRecordsInput(records[20:], 0, RecordingCheckpointer()))  # ignored after loss
    assert len(landed_rows(store)) == 16
    b = sink(uri, clock, max_batch_records=8, progress_hint=a.progress)  # a's progress, from its heartbeats
    init(b)
    assert b.resume_position() == records[15].checkpoint
    b.shutdown_requested(deliver(b, [r for r in records if r.position() > records[15].position()], 7))
    assert_exactly_once(uri, store, records)


def test_arrival_minute_going_back_still_chains(local_zone):
    """ApproximateArrivalTimestamp is not guaranteed monotonic: a minute change either way flushes."""
    uri, store = local_zone
    records = make_records(9, per_minute=3)
    r = records[6]
    records[6] = type(r)(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key,
                         r.explicit_hash_key, T0 + MINUTE_MS + 59_000, r.data, r.aggregated)  # back to minute 1
    p = sink(uri, Clock(T0 + 5 * MINUTE_MS))
    init(p)
    p.shutdown_requested(deliver(p, records, 9))
    assert_exactly_once(uri, store, records)


def test_a_backfill_landed_before_the_first_live_run_does_not_make_the_consumer_skip_older_data(local_zone):
    """A lease at TRIM_HORIZON with no landing progress must read from the start, not resume after whatever
    landed in the last minutes (here a backfill's batch of later records): that skipped every older record."""
    uri, store = local_zone
    records = make_records(60, start_ms=T0)
    clock = Clock(T0 + 5 * MINUTE_MS)
    backfill = sink(uri, clock)
    init(backfill, records[39].checkpoint)  # a bounded re-read from a timestamp, landed first
    backfill.shutdown_requested(deliver(backfill, records[40:], 20))
    live = sink(uri, clock)
    init(live, TH)  # the first live run: lease at TRIM_HORIZON, no progress attributes yet
    assert live.resume_position() is None, "the consumer would skip records 0..39"
    live.shutdown_requested(deliver(live, records, 25))
    assert_exactly_once(uri, store, records)


def test_records_of_another_shard_are_refused(local_zone):
    uri, _ = local_zone
    p = sink(uri, Clock(T0))
    init(p)
    with pytest.raises(ValueError, match="got a record of shardId-000000000009"):
        deliver(p, make_records(2, shard="shardId-000000000009"), 2)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_batch_bytes": 100}, "max_batch_bytes"),
    ({"max_batch_bytes": 64 * 1024 * 1024}, "memory_limit_bytes"),
    ({"max_batch_age_seconds": 0}, "max_batch_age_seconds"),
    ({"max_batch_records": 0}, "max_batch_records"),
    ({"compression": "brotli2"}, "compression"),
    ({"resume_lookback_minutes": -1}, "resume_lookback_minutes"),
])
def test_bad_settings(local_zone, kwargs, match):
    with pytest.raises(LandingConfigError, match=match):
        LandingProcessor(local_zone.uri, STREAM, **kwargs)
    with pytest.raises(LandingConfigError, match=match):
        landing_spec(local_zone.uri, STREAM, **kwargs)
    with pytest.raises(LandingConfigError, match="stream"):
        LandingProcessor(local_zone.uri, "a/b")


# -- bad zones ------------------------------------------------------------------------------------------------

def test_missing_directory_is_created_only_when_asked(tmp_path):
    zone = str(tmp_path / "nope")
    p = sink(zone, Clock(T0))
    with pytest.raises(ZoneNotFoundError, match=zone):
        init(p)
    assert not os.path.exists(zone)
    p = sink(zone, Clock(T0), create_zone=True)
    init(p)
    p.shutdown_requested(deliver(p, make_records(3), 3))
    assert len(landed_rows(open_store(zone))) == 3


def test_missing_bucket_is_a_clear_error(aws_settings, unique_name):
    bucket = unique_name("nobucket")
    p = LandingProcessor(f"s3://{bucket}/z", STREAM, aws=aws_settings)
    with pytest.raises(ZoneNotFoundError, match=f"s3://{bucket}/z: bucket '{bucket}' does not exist"):
        init(p)
    p = LandingProcessor(f"s3://{bucket}/z", STREAM, aws=aws_settings, create_zone=True)
    init(p)
    p.shutdown_requested(deliver(p, make_records(3), 3))
    assert len(landed_rows(open_store(f"s3://{bucket}/z", aws_settings))) == 3


def test_unwritable_directory_loses_nothing():
    base = shared_tmpdir()
    zone = os.path.join(base, "zone")
    os.mkdir(zone)
    records = make_records(40, per_minute=10)
    try:
        os.chown(zone, 65534, 65534) if os.geteuid() == 0 else None

        def read_only_from_the_start():
            os.chmod(zone, 0o555)
            try:
                init(sink(zone, Clock(T0)))
            finally:
                os.chmod(zone, 0o755)

        def read_only_while_landing():
            p = sink(zone, Clock(T0 + 10 * MINUTE_MS), max_batch_records=8)
            init(p)
            deliver(p, records[:12], 12)  # the first minute lands
            _chmod_dirs(zone, 0o555)
            try:
                deliver(p, records[12:], 5)
            finally:
                _chmod_dirs(zone, 0o755)

        with pytest.raises(ZoneAccessError, match=f"landing zone {zone}.*not writable"):
            run_unprivileged(read_only_from_the_start)
        with pytest.raises(ZoneAccessError, match=f"landing zone {zone}: cannot write {STREAM}/"):
            run_unprivileged(read_only_while_landing)
        store = open_store(zone)
        landed = landed_rows(store)
        assert landed == expected_rows(records[:len(landed)]) and 0 < len(landed) < 40
        # Nothing was checkpointed: the next owner re-reads from the lease checkpoint and lands the rest once.
        p = sink(zone, Clock(T0 + 10 * MINUTE_MS), max_batch_records=5)
        init(p)
        p.shutdown_requested(deliver(p, records, 9))  # re-delivered from TRIM_HORIZON
        assert_exactly_once(zone, store, records)
    finally:
        shutil.rmtree(base)


def _chmod_dirs(root: str, mode: int) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, mode)


def test_landing_spec_builds_a_processor_in_a_worker_process(local_zone):
    """The spec is picklable and builds the sink in a spawned process (as the lease worker does)."""
    import multiprocessing

    uri, store = local_zone
    spec = landing_spec(uri, STREAM, max_batch_records=4)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_land_in_child, args=(spec, make_records(10)))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert landed_rows(store) == expected_rows(make_records(10))
    assert all(parse_batch_key(k) for k in store.list_keys("") if "/after=" not in k)  # links fence batches


def _land_in_child(spec, records) -> None:
    p = spec.build()
    init(p)
    p.shutdown_requested(deliver(p, records, 3))


# -- the columnar path -----------------------------------------------------------------------------------------

def _kpl_batch(aggregates: int = 30, per: int = 40, minute_every: int = 10):
    """A GetRecords response of KPL aggregates (some user records with explicit hash keys), deaggregated by
    the reader's own code: a columnar UserRecordBatch, arrivals crossing minutes every `minute_every`."""
    from datetime import datetime, timezone

    from kcl_pipeline.kcl.records import kpl

    response = []
    for a in range(aggregates):
        users = [(f"pk-{a}-{u}", str(10 ** 20 + u) if u % 7 == 0 else None, b'{"a":%d,"u":%d}' % (a, u))
                 for u in range(per)]
        arrival = T0 + (a // minute_every) * MINUTE_MS + a
        response.append({"SequenceNumber": str(49_000_000_000_000_000_000 + a * 1000),
                         "ApproximateArrivalTimestamp": datetime.fromtimestamp(arrival / 1000, tz=timezone.utc),
                         "Data": kpl.aggregate(users), "PartitionKey": users[0][0]})
    return kpl.deaggregate_batch(response, SHARD)


def test_landing_a_deaggregated_batch_builds_no_object_per_record(local_zone, monkeypatch):
    """Before: the sink iterated one UserRecord per user record (built on demand from the columnar batch)
    and encoded Parquet from per-record attribute lists, so landing ran at 0.9x aws-kinesis-agg."""
    from kcl_pipeline.kcl.records.record_batch import UserRecordBatch

    uri, store = local_zone
    batch = _kpl_batch()
    built = []
    real = UserRecordBatch._materialise
    monkeypatch.setattr(UserRecordBatch, "_materialise", lambda self: built.append(len(self)) or real(self))
    p = sink(uri, Clock(T0 + 10 * MINUTE_MS), max_batch_records=256)
    init(p)
    p.process_records(ProcessRecordsInput(batch, 0, RecordingCheckpointer()))
    p.flush()
    assert built == []  # no record-by-record materialisation on the way to Parquet
    monkeypatch.undo()
    assert landed_rows(store) == expected_rows(list(batch))
    assert p.stats.flushes.get("minute", 0) == 2 and p.stats.flushes.get("records", 0) >= 3


def test_the_columnar_and_the_object_path_encode_the_same_batch():
    from kcl_pipeline.zone.batch import encode_batch

    batch = _kpl_batch(aggregates=5, minute_every=100)
    objects = list(batch)
    assert objects[0].explicit_hash_key is not None and objects[0].aggregated
    columnar = encode_batch(STREAM, SHARD, batch, TH, prev_key="p")
    plain = encode_batch(STREAM, SHARD, objects, TH, prev_key="p")
    assert columnar == plain  # same key, same bytes (schema, row groups, metadata), same rows


def test_a_delivery_cut_by_bytes_records_and_minutes_lands_each_record_once(local_zone):
    uri, store = local_zone
    batch = _kpl_batch(aggregates=40, per=25, minute_every=7)
    p = sink(uri, Clock(T0 + 10 * MINUTE_MS), max_batch_records=90, max_batch_bytes=4096, memory_limit_bytes=65536)
    init(p)
    for start in range(0, len(batch), 333):  # responses that cut aggregates apart
        p.process_records(ProcessRecordsInput(batch[start:start + 333], 0, RecordingCheckpointer()))
    p.flush()
    assert_exactly_once(uri, store, list(batch))
    assert {"bytes", "minute"} <= set(p.stats.flushes)
