"""A backfill refills a lost batch exactly, under the live chain's link (issue 20, item 8).

A backfill reads from AT_TIMESTAMP and so does not know the record before its first one: when the lost batch
started its minute (the range's first), the refill landed under a start chain of its own, fenced by no live
link, cut where its own buffer happened to flush; the live successor still named the lost key, and the
chain was reported broken for ever with no record missing. The fuzz below lands a live chain, deletes a
batch, refills it, and asks the whole-history chain (and the rows) to come out whole, and the refilled batch's
footer to make the claims the lost one made (its predecessor's position and key)."""
from __future__ import annotations

import random

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import LATEST, SHARD_END, Checkpoint, Lease, UserRecord
from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.windows.backfill import BackfillPace, backfill_range, live_predecessor
from kcl_pipeline.zone.batch import read_batch_info
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.layout import MINUTE_MS, minute_of
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import MemoryZoneStore

from .fake_kinesis import FakeKinesis, Ticking
from .helpers import SHARD, STREAM, T0, Clock, RecordingCheckpointer, init, make_records

PACE = BackfillPace(reads_per_second=4)


def land_live(store, records: list[UserRecord], rng: random.Random) -> None:
    """The live worker: random polls, random batch sizes, and flushes at random points (its age limit)."""
    p = LandingProcessor(store, STREAM, max_batch_records=rng.randint(2, 9), clock=Clock(T0).time)
    init(p)
    checkpointer = RecordingCheckpointer()
    i = 0
    while i < len(records):
        n = rng.randint(1, 10)
        p.process_records(ProcessRecordsInput(records[i:i + n], 1000, checkpointer))
        i += n
        if rng.random() < 0.3:
            p.flush()
    p.shutdown_requested(checkpointer)


def rows(store) -> list[tuple[str, int]]:
    table = read_batches(store, STREAM)
    return sorted(zip(table.column("sequence_number").to_pylist(), table.column("sub_sequence_number").to_pylist(),
                      strict=True))


def refill_case(seed: int, zone) -> str | None:
    """One fuzzed refill; None when the zone comes out whole, else what went wrong."""
    rng = random.Random(seed)
    store = zone
    records = make_records(rng.randint(30, 90), per_minute=rng.choice([5, 8, 12, 20]), aggregate_every=1, seed=seed)
    land_live(store, records, rng)
    assert verify_zone(store.uri, store=store).ok
    before = rows(store)
    batches = list_batches(store, STREAM)
    lost = rng.choice(batches)
    claims = read_batch_info(store, lost)
    store.delete([lost.key()])
    # The range starts at the lost batch's minute (the case that broke), or a few minutes earlier.
    start = lost.minute_ms - rng.choice([0, 0, 1, 2]) * MINUTE_MS
    end = minute_of(records[-1].approximate_arrival_timestamp_ms) + MINUTE_MS
    report = backfill_range(STREAM, max(start, T0), end, store, kinesis=FakeKinesis(STREAM, {SHARD: records}, rng),
                            now_ms=end + MINUTE_MS, pace=PACE, monotonic=Ticking())
    if rows(store) != before:
        return f"seed {seed}: rows differ after the refill of {lost.key()}"
    verified = verify_zone(store.uri, store=store)
    if not verified.ok:
        return f"seed {seed}: chain broken after the refill of {lost.key()}: {verified.lines()[1:4]}"
    if lost.key() not in {b.key() for b in list_batches(store, STREAM)}:
        return f"seed {seed}: {lost.key()} was refilled under other keys ({report.records_landed} records landed)"
    refilled = read_batch_info(store, lost)
    if (refilled.prev, refilled.prev_key) != (claims.prev, claims.prev_key):
        return (f"seed {seed}: {lost.key()} was refilled naming predecessor {refilled.prev} {refilled.prev_key}, "
                f"the live writer's named {claims.prev} {claims.prev_key}")
    return None


def test_fuzzed_refills_of_a_lost_batch_leave_the_chain_whole(memory_zone, tmp_path):
    from kcl_pipeline.zone.store import open_store

    broken = []
    for seed in range(40):
        zone = open_store(f"memory://refill-{seed}-{tmp_path.name}")
        zone.ensure_zone(create=True)
        try:
            found = refill_case(seed, zone)
        finally:
            zone.drop()  # type: ignore[attr-defined]
        if found:
            broken.append(found)
    assert not broken, f"{len(broken)} of 40 refills broke the chain:\n" + "\n".join(broken)


def test_the_live_predecessor_of_a_ranges_first_record_is_read_from_the_links(memory_zone):
    store = memory_zone.store
    records = make_records(40, per_minute=10, aggregate_every=1)
    p = LandingProcessor(store, STREAM, max_batch_records=4, clock=Clock(T0).time)
    init(p)
    for i in range(0, 40, 5):
        p.process_records(ProcessRecordsInput(records[i:i + 5], 1000, RecordingCheckpointer()))
    p.shutdown_requested(RecordingCheckpointer())
    ending_19 = next(b.key() for b in list_batches(store, STREAM) if b.last == records[19].checkpoint)
    assert live_predecessor(store, STREAM, SHARD, records[20]) == (records[19].checkpoint, ending_19)
    store.delete([b.key() for b in list_batches(store, STREAM, T0 + 2 * MINUTE_MS, T0 + 3 * MINUTE_MS)])
    assert live_predecessor(store, STREAM, SHARD, records[20]) == (records[19].checkpoint, ending_19)  # links stay
    store.delete([ending_19])
    assert live_predecessor(store, STREAM, SHARD, records[20]) == (records[19].checkpoint, None)  # its batch is gone
    # The shard's first record follows its start link's position.
    assert live_predecessor(store, STREAM, SHARD, records[0]) == (Checkpoint("TRIM_HORIZON"), None)


def test_a_record_no_live_link_claims_has_no_live_predecessor(memory_zone):
    store = memory_zone.store
    records = make_records(20, per_minute=10, aggregate_every=1)
    assert live_predecessor(store, STREAM, SHARD, records[10]) is None  # nothing landed at all
    p = LandingProcessor(store, STREAM, clock=Clock(T0).time)
    init(p)
    p.process_records(ProcessRecordsInput(records[:10], 1000, RecordingCheckpointer()))
    p.shutdown_requested(RecordingCheckpointer())
    assert live_predecessor(store, STREAM, SHARD, records[10]) is None  # the live chain has not reached it


def test_a_refill_of_a_latest_chains_first_minute_lands_nothing_before_the_applications_start(memory_zone):
    """Sim seed 35 (`latest-start` with `refill`): the application started at LATEST in the middle of a minute;
    a refill of that minute read AT_TIMESTAMP from its start and landed the records before the application's
    start under a start chain of its own, and the chain was reported broken for ever ("gap after …: … follows
    LATEST/0"). A backfill never lands below a shard's LATEST start: it refills the lost first batch under the
    live start link, exactly, and nothing else."""
    store = memory_zone.store
    records = make_records(40, per_minute=10, aggregate_every=1)
    started = records[7:]  # LATEST: the first holder's first record is the minute's eighth
    p = LandingProcessor(store, STREAM, max_batch_records=4, clock=Clock(T0).time)
    init(p, Checkpoint("LATEST"))
    for i in range(0, len(started), 5):
        p.process_records(ProcessRecordsInput(started[i:i + 5], 1000, RecordingCheckpointer()))
    p.shutdown_requested(RecordingCheckpointer())
    assert verify_zone(store.uri, store=store).ok
    before = rows(store)
    first = list_batches(store, STREAM)[0]
    assert first.first == records[7].checkpoint
    store.delete([first.key()])  # the chain's first batch lost, then refilled with its minute
    lost = len(before) - len(rows(store))

    report = backfill_range(STREAM, T0, T0 + MINUTE_MS, store,
                            kinesis=FakeKinesis(STREAM, {SHARD: records}, random.Random(35)),
                            now_ms=T0 + 10 * MINUTE_MS, pace=PACE, monotonic=Ticking())

    assert rows(store) == before, "records before the application's start were landed"
    assert first.key() in {b.key() for b in list_batches(store, STREAM)}
    verified = verify_zone(store.uri, store=store)
    assert verified.ok, verified.lines()
    assert report.shards[SHARD].records_landed == lost
    assert report.shards[SHARD].skipped_before_start == 7


class _PausedAtTheStartLink(MemoryZoneStore):
    """The holder's store: its first flush listed the zone, then paused right before claiming the start link
    (a host stall inside the put); `meanwhile` runs before that put goes out."""

    def __init__(self, name: str, meanwhile) -> None:
        super().__init__(name)
        self.meanwhile = meanwhile

    def put_if_absent(self, key: str, body: bytes) -> bool:
        if self.meanwhile is not None and "/_start/" in key:
            run, self.meanwhile = self.meanwhile, None
            run()
        return super().put_if_absent(key, body)


def test_a_backfill_beside_a_latest_holders_first_flush_never_lands_its_records_a_second_time(memory_zone):
    """Sim seed 3451 (`zombie-flush`, `refill`, LATEST): a shard's first holder read from LATEST (its first
    record the minute's eighth), listed the zone for its first flush and froze before claiming the start link;
    the next holder ended the shard with nothing read (LATEST after it closed). A refill of the minute then
    found the shard done and no LATEST start link, and landed the whole minute under an AT_TIMESTAMP chain of
    its own; the holder thawed, won the start link (no link is common to both chains) and landed its batch:
    its records were in two batches. A LATEST application's backfill lands nothing of a leased shard whose
    chain has not begun: whatever of the range the application owes is the holder's."""
    store = memory_zone.store
    records = make_records(40, per_minute=10, aggregate_every=1)
    started = records[7:17]  # LATEST: the first holder read from the minute's eighth record

    def refill() -> None:
        report = backfill_range(STREAM, T0, T0 + MINUTE_MS, store,
                                kinesis=FakeKinesis(STREAM, {SHARD: records}, random.Random(3451)),
                                leases=[Lease(SHARD, Checkpoint(SHARD_END))],  # the next holder ended it
                                application_start=Checkpoint(LATEST),
                                now_ms=T0 + 10 * MINUTE_MS, pace=PACE, monotonic=Ticking())
        assert report.complete

    holder = LandingProcessor(_PausedAtTheStartLink(store.name, refill), STREAM, max_batch_records=100,
                              clock=Clock(T0).time)
    init(holder, Checkpoint(LATEST))
    holder.process_records(ProcessRecordsInput(started, 1000, RecordingCheckpointer()))
    holder.shutdown_requested(RecordingCheckpointer())  # the first flush: lists, claims the start link, lands

    landed = rows(store)
    assert len(landed) == len(set(landed)), "a record is in two batches"
    assert landed == sorted((r.sequence_number, r.sub_sequence_number) for r in started)
    verified = verify_zone(store.uri, store=store)
    assert verified.ok, verified.lines()
