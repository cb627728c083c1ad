"""Issue 20 §3: a holder that claimed a shard's start link and died before writing its batch blocks nobody.

Before: the next holder read from its own start — LATEST now, or a trim horizon that had moved — got other
first records, met the dead claim on the start link and stopped with CorruptBatchError; so did every holder
after it, until a person moved the link away. Now a holder that finds the start link naming a batch never
written reads from that batch's minute and lands exactly that batch (same records, same key: a claimer that
was only slow writes the same object), and a holder that meets a start claimed meanwhile gives its lease back
to start again on that chain.
"""
from __future__ import annotations

import pytest

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.windows.checkpoints.run import list_landed, read_chain_evidence
from kcl_pipeline.zone.batch import encode_batch
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.errors import ChainStartTaken, CorruptBatchError
from kcl_pipeline.zone.layout import link_key, link_target
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import SHARD, STREAM, T0, Clock, RecordingCheckpointer, make_records

RECORDS = make_records(40, per_minute=10, aggregate_every=1)  # four minutes
NOW = T0 + 30 * 60_000
LATEST_FROM = 30  # the first record a LATEST iterator taken now delivers


def read_from(position: Checkpoint) -> list:
    """What a reader started at `position` delivers (a position is read after)."""
    if position.sequence_number == TRIM_HORIZON:
        return list(RECORDS)
    if position.sequence_number == LATEST:
        return RECORDS[LATEST_FROM:]
    if position.sequence_number == AT_TIMESTAMP:
        return [r for r in RECORDS if r.approximate_arrival_timestamp_ms >= position.sub_sequence_number]
    return [r for r in RECORDS if r.position() > position.key()]


def holder(store, worker: str = "worker-2") -> LandingProcessor:
    clock = Clock(NOW)
    return LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=4)


def start(p: LandingProcessor, position: Checkpoint, worker: str = "worker-2") -> list:
    from kcl_pipeline.kcl.processor import InitializationInput

    p.initialize(InitializationInput(SHARD, worker, position))
    return read_from(p.resume_position() or position)


def deliver_all(p: LandingProcessor, records: list, chunk: int = 7) -> None:
    cp = RecordingCheckpointer()
    for i in range(0, len(records), chunk):
        p.process_records(ProcessRecordsInput(records[i:i + chunk], 0, cp))
    p.shutdown_requested(cp)


def claim_start(store, position: Checkpoint, first: int, n: int = 5):
    """A holder claimed the start link for records[first:first+n] and died before writing the batch."""
    claimed = encode_batch(STREAM, SHARD, RECORDS[first:first + n], position).key
    assert store.put_if_absent(link_key(STREAM, 0, SHARD, position), claimed.key().encode())
    return claimed


def landed_positions(store) -> list:
    t = read_batches(store, STREAM)
    return list(zip(t.column("sequence_number").to_pylist(), t.column("sub_sequence_number").to_pylist(), strict=True))


# (start position, index of the dead claim's first record): LATEST was taken when record 10 was next
STARTS = [(Checkpoint(LATEST), 10), (Checkpoint(TRIM_HORIZON), 0),
          (Checkpoint(AT_TIMESTAMP, RECORDS[13].approximate_arrival_timestamp_ms), 13)]


@pytest.mark.parametrize("position,first", STARTS, ids=["LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"])
def test_a_dead_holders_start_claim_is_landed_by_the_next_holder(local_zone, position, first):
    uri, store = local_zone
    claimed = claim_start(store, position, first)
    p = holder(store)
    deliver_all(p, start(p, position))
    assert landed_positions(store) == [(r.sequence_number, r.sub_sequence_number) for r in RECORDS[first:]]
    assert list_batches(store, STREAM)[0] == claimed  # exactly the claimed batch, under its key
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok
    # the checkpoint plan proves the chain from the start link the dead holder claimed
    view = StreamSlice(StreamScope(STREAM), [Lease(SHARD, position)], [Shard(SHARD)])
    evidence = read_chain_evidence(store, view, list_landed(store, STREAM, T0, T0 + 5 * 60_000),
                                   {SHARD: list_batches(store, STREAM)})
    assert evidence.starts == {SHARD: claimed.key()}


def test_a_holder_that_meets_a_start_claimed_meanwhile_starts_again_on_that_chain(local_zone):
    """The race: this holder began at LATEST before any start link existed; another holder claimed the
    start meanwhile, from earlier records. This holder gives the lease back; the next start lands that chain."""
    uri, store = local_zone
    p = holder(store)
    records = start(p, Checkpoint(LATEST))
    assert records[0] == RECORDS[LATEST_FROM] and p.resume_position() is None
    claim_start(store, Checkpoint(LATEST), 10)  # a zombie's claim, made while this holder read
    with pytest.raises(ChainStartTaken, match="start link"):
        deliver_all(p, records)
    again = holder(store)
    deliver_all(again, start(again, Checkpoint(LATEST)))
    assert landed_positions(store) == [(r.sequence_number, r.sub_sequence_number) for r in RECORDS[10:]]
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


def test_the_claimer_that_was_only_slow_writes_the_same_batch(local_zone):
    """The adopting holder and the slow claimer write the same object: whoever comes second finds it there."""
    uri, store = local_zone
    position = Checkpoint(LATEST)
    claimed = claim_start(store, position, 10)
    p = holder(store)
    deliver_all(p, start(p, position))
    slow = encode_batch(STREAM, SHARD, RECORDS[10:15], position)
    assert slow.key == claimed and not store.put_if_absent(slow.key.key(), slow.body)
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


def test_a_start_claim_the_stream_no_longer_serves_stops_landing_naming_the_link(local_zone):
    """The documented limit: the claimed batch's first record was trimmed since (retention), so no holder can
    land that batch; landing stops with a message naming the link, never landing around it."""
    _, store = local_zone
    position = Checkpoint(TRIM_HORIZON)
    claim_start(store, position, 0)
    p = holder(store)
    served = start(p, position)[3:]  # the stream trimmed the first three records
    with pytest.raises(CorruptBatchError, match="no longer serves its first record"):
        deliver_all(p, served)
    assert list_batches(store, STREAM) == []


def test_a_start_link_names_its_claimer(local_zone):
    _, store = local_zone
    p = holder(store)
    deliver_all(p, start(p, Checkpoint(TRIM_HORIZON), worker="worker-7"))
    body = store.get(link_key(STREAM, 0, SHARD, Checkpoint(TRIM_HORIZON)))
    assert body.decode().splitlines()[1] == "holder=worker-7"
    assert link_target(body) == list_batches(store, STREAM)[0].key()


def test_a_holder_that_read_nothing_never_reports_the_shard_end_landed_past_a_start_claimed_meanwhile(local_zone):
    """Simulation seed 3670: the holder began at LATEST before any start link existed and read nothing (the shard
    had closed); meanwhile a paused flush of the previous holder claimed the start link and died. Before, the
    holder reported the shard's end landed with nothing landed, and the pipeline ended the shard with the claimed
    batch and every record after it unlanded. Now it gives the lease back; the next start lands that chain."""
    uri, store = local_zone
    p = holder(store)
    start(p, Checkpoint(LATEST))
    claimed = claim_start(store, Checkpoint(LATEST), 10)  # the zombie's claim, made while this holder read
    with pytest.raises(ChainStartTaken, match="start link"):
        p.shard_ended(RecordingCheckpointer())
    assert p.progress is not None and not p.progress.shard_end_landed
    again = holder(store)
    cp = RecordingCheckpointer()
    records = start(again, Checkpoint(LATEST))
    for i in range(0, len(records), 7):
        again.process_records(ProcessRecordsInput(records[i:i + 7], 0, cp))
    again.shard_ended(cp)
    assert again.progress is not None and again.progress.shard_end_landed
    assert landed_positions(store) == [(r.sequence_number, r.sub_sequence_number) for r in RECORDS[10:]]
    assert list_batches(store, STREAM)[0] == claimed
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


def test_a_lost_start_batch_the_leases_progress_names_never_makes_every_holder_give_the_lease_back(local_zone):
    """Simulation seed 3593: a LATEST shard's first holder landed one batch, the chain's first (its start link's),
    and lost its lease; the batch was lost (deleted) and the shard closed. Every later holder found the lease's
    progress naming the lost batch, looked back for other batches (none), read LATEST on the closed shard
    (nothing), met the start link naming the lost batch at the shard's end and gave the lease back
    (ChainStartTaken): for ever, and the batch's records and those after it were never landed. A hint whose batch
    the zone no longer holds is now no hint: the holder follows the chain from its start link and lands the lost
    batch again, under its own key."""
    uri, store = local_zone
    shard = RECORDS[:14]  # the shard closed after its 14th record; LATEST was taken when record 10 was next

    def served(position: Checkpoint) -> list:
        return [] if position.sequence_number == LATEST else [r for r in read_from(position) if r in shard]

    first = holder(store)
    start(first, Checkpoint(LATEST), worker="worker-2")
    deliver_all(first, RECORDS[10:14])  # one batch, the start link's
    lost = list_batches(store, STREAM)
    assert len(lost) == 1 and link_target(store.get(link_key(STREAM, 0, SHARD, Checkpoint(LATEST)))) == lost[0].key()
    assert first.progress is not None
    hint = {k: v for k, v in first.progress.to_attributes().items() if v is not None}
    store.delete([lost[0].key()])  # the batch is lost; the lease still says it was landed

    from kcl_pipeline.kcl.processor import InitializationInput

    later = holder(store)
    later.initialize(InitializationInput(SHARD, "worker-11", Checkpoint(LATEST), lease_attributes=hint))
    cp = RecordingCheckpointer()
    later.process_records(ProcessRecordsInput(served(later.resume_position() or Checkpoint(LATEST)), 0, cp))
    later.shard_ended(cp)  # before: ChainStartTaken, the start link naming the lost batch
    assert later.progress is not None and later.progress.shard_end_landed
    assert list_batches(store, STREAM) == lost  # landed again, under its own key
    assert landed_positions(store) == [(r.sequence_number, r.sub_sequence_number) for r in RECORDS[10:14]]
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok
