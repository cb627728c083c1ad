"""The record after the last landed one: the sink publishes its arrival while it holds it, so a window closes
as soon as a record after it has been read, and never on a held record whose predecessor is not landed."""
from __future__ import annotations

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.windows.completeness import window_complete
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.progress import ShardProgress, progress_from_leases
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, RecordingCheckpointer, init, make_records

GRACE = 10_000


def sink(zone, clock: Clock, **kwargs) -> LandingProcessor:
    return LandingProcessor(zone.uri, STREAM, clock=clock.time, monotonic=clock.monotonic, aws=zone.aws, **kwargs)


def poll(processor: LandingProcessor, records, behind: int = 1000) -> None:
    processor.process_records(ProcessRecordsInput(records, behind, RecordingCheckpointer()))


def status(progress: dict[str, ShardProgress], t0: int = T0):
    return window_complete(t0, t0 + MINUTE_MS, [Shard(SHARD)], progress, [Lease(SHARD, Checkpoint("TRIM_HORIZON"))],
                           GRACE)


def test_a_window_completes_when_the_record_after_it_is_read_before_its_batch_lands(s3_zone, dynamodb_client,
                                                                                     unique_name):
    """On the emulators: the sink lands on S3 (moto), its progress rides on a heartbeat of a real lease table
    (dynalite), and the sensor's view is what a scan of that table reads. The window [T0, T0 + 1 min) is
    complete once the first record of the next minute is held, while that record's batch is not landed."""
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    table = LeaseTable(unique_name("leases"), dynamodb_client)
    table.ensure_table()
    assert table.create(Lease(SHARD, Checkpoint("TRIM_HORIZON")))
    assert table.acquire(SHARD, "w1", None, 0) is not None
    counter = 1

    def sensor_view() -> dict[str, ShardProgress]:
        nonlocal counter
        assert table.heartbeat(SHARD, "w1", counter, p.heartbeat_attributes())
        counter += 1
        return progress_from_leases(table.scan())

    records = make_records(16, per_minute=8)  # 8 records in each of two minutes
    clock = Clock(T0 + 2 * MINUTE_MS)
    p = sink(s3_zone, clock)
    init(p)
    poll(p, records[:8])  # the window's records, held: nothing landed
    assert not status(sensor_view()).complete
    poll(p, records[8:9])  # the next minute's first record: the window's batch lands, that record is held
    view = sensor_view()
    (landed,) = list_batches(s3_zone.store, STREAM)
    assert landed.last == records[7].checkpoint  # the post-window record's batch is not landed
    assert view[SHARD].next_arrival_ms == records[8].approximate_arrival_timestamp_ms >= T0 + MINUTE_MS
    window = status(view)
    assert window.complete, window.reasons
    assert window.reasons[SHARD].startswith(f"holds the record after {records[7].checkpoint}")
    assert not status(view, T0 + MINUTE_MS).complete  # the next window waits for its records to land
    poll(p, records[9:])  # more of the next minute: still the first held record's arrival
    assert sensor_view()[SHARD].next_arrival_ms == records[8].approximate_arrival_timestamp_ms
    p.flush()  # its batch lands: nothing is held, and the window stays complete (the landed record proves it)
    view = sensor_view()
    assert view[SHARD].next_arrival_ms is None and view[SHARD].landed == records[-1].checkpoint
    assert status(view).complete


def test_a_holder_that_landed_nothing_publishes_no_held_record(local_zone):
    """Before its first batch claims the chain's start, a holder's first records may not be the chain's: another
    holder that read LATEST earlier may claim the start from records that arrived in the window. Its held records
    prove nothing, so nothing is published."""
    records = make_records(8, start_ms=T0 + MINUTE_MS)
    p = sink(local_zone, Clock(T0 + 3 * MINUTE_MS))
    init(p, Checkpoint("LATEST"))
    poll(p, records)
    assert p.progress is not None and p.progress.next_arrival_ms is None
    assert ShardProgress.from_attributes(SHARD, p.heartbeat_attributes()) is None
    assert not status({}).complete


def test_a_resume_after_a_checkpoint_beyond_the_last_landed_batch_publishes_no_held_record(local_zone):
    """A lease checkpoint beyond the last landed batch found: the held records follow the checkpoint, not the
    landed record the progress names, so their arrival proves nothing about the records between."""
    records = make_records(16, per_minute=8)
    clock = Clock(T0 + 3 * MINUTE_MS)
    first = sink(local_zone, clock)
    init(first)
    poll(first, records[:4])
    first.flush()  # landed up to records[3]
    second = sink(local_zone, clock)
    init(second, records[9].checkpoint)  # a checkpoint in the next minute, beyond the landed batch
    assert second.progress is not None and second.progress.landed == records[3].checkpoint
    poll(second, records[10:])
    assert second.progress.next_arrival_ms is None
    assert not status({SHARD: second.progress}).complete


def test_a_lost_lease_publishes_no_held_record(local_zone):
    records = make_records(16, per_minute=8)
    p = sink(local_zone, Clock(T0 + 3 * MINUTE_MS))
    init(p)
    poll(p, records[:9])
    assert p.progress is not None and p.progress.next_arrival_ms == records[8].approximate_arrival_timestamp_ms
    p.lease_lost()  # the buffer is dropped: the next owner re-reads it
    assert p.progress.next_arrival_ms is None and p.progress.landed == records[7].checkpoint
