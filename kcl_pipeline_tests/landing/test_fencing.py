"""Landing writes are fenced by construction: two holders of one lease never land overlapping batches.

The old holder (still running for up to a heartbeat after a steal) and the new holder land the same
records with different batch boundaries, interleaved so that each lists the zone before the other
writes: the race the range-named keys alone could not settle.
"""
from __future__ import annotations

from itertools import pairwise

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import ZoneStore

from .helpers import STREAM, T0, Clock, ForwardingStore, deliver, init, make_records


class RaceBeforeFirstWrite(ForwardingStore):
    """The real store, with a hook run once just before the first batch write (after the writer listed)."""

    def __init__(self, inner: ZoneStore, before_first_write):
        self.inner, self.zone, self._hook = inner, inner.zone, before_first_write

    def put_if_absent(self, key, body):
        if self._hook is not None and (key.endswith(".parquet") or "/after=" in key):
            hook, self._hook = self._hook, None
            hook()
        return self.inner.put_if_absent(key, body)


def _rows(store):
    t = read_batches(store, STREAM)
    return list(zip(t.column("sequence_number").to_pylist(), t.column("sub_sequence_number").to_pylist(), strict=True))


def test_old_and_new_holder_landing_overlapping_ranges_never_overlap(s3_zone):
    uri, store = s3_zone.uri, s3_zone.store
    records = make_records(40, per_minute=40)
    clock = Clock(T0 + 5 * 60_000)
    new = LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=5)

    def new_holder_lands_first():
        init(new)
        new.shutdown_requested(deliver(new, records[:23], 23))

    old = LandingProcessor(RaceBeforeFirstWrite(store, new_holder_lands_first), STREAM, clock=clock.time,
                           monotonic=clock.monotonic, max_batch_records=8)
    init(old)
    old.shutdown_requested(deliver(old, records, 40))

    assert _rows(store) == [(r.sequence_number, r.sub_sequence_number) for r in records]
    report = verify_zone(uri, stream=STREAM, store=store, deep=True)
    assert report.ok, "\n".join(report.lines())
    (chain,) = report.streams[STREAM].values()
    assert chain.rows == 40 and chain.duplicate_rows == 0 and not chain.overlaps and not chain.gaps
    keys = list_batches(store, STREAM)
    assert all(a.last.key() < b.first.key() for a, b in pairwise(keys))
    assert old.stats.records_already_landed >= 20  # the loser dropped what the winner had landed


def test_a_winner_that_died_between_link_and_batch_is_completed_by_the_loser(local_zone):
    """The link names a batch that was never written: the next writer lands exactly that range, then continues."""
    uri, store = local_zone
    records = make_records(12, per_minute=12)
    clock = Clock(T0 + 5 * 60_000)
    from kcl_pipeline.kcl.core.model import Checkpoint
    from kcl_pipeline.zone.batch import encode_batch
    from kcl_pipeline.zone.layout import link_key
    dead = encode_batch(STREAM, records[0].shard_id, records[:7], Checkpoint("TRIM_HORIZON"))
    assert store.put_if_absent(link_key(STREAM, dead.key.minute_ms, records[0].shard_id, Checkpoint("TRIM_HORIZON")),
                               dead.key.key().encode())
    p = LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=4)
    init(p)
    p.shutdown_requested(deliver(p, records, 12))
    assert _rows(store) == [(r.sequence_number, r.sub_sequence_number) for r in records]
    assert dead.key in list_batches(store, STREAM)
    report = verify_zone(uri, stream=STREAM, store=store, deep=True)
    assert report.ok, "\n".join(report.lines())


def test_a_backfill_before_the_first_live_run_does_not_make_the_consumer_skip_older_data(local_zone):
    """Lease at TRIM_HORIZON, no landing hint, and a backfill's batches in the last minutes: start from the
    beginning, not after the backfill."""
    from kcl_pipeline.kcl.core.model import Checkpoint

    uri, store = local_zone
    records = make_records(40, per_minute=10)
    clock = Clock(T0 + 5 * 60_000)
    backfill = LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic)
    init(backfill, Checkpoint("AT_TIMESTAMP", T0 + 2 * 60_000))
    backfill.shutdown_requested(deliver(backfill, records[20:], 20))
    live = LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=7)
    init(live)
    assert live.resume_position() is None  # read from TRIM_HORIZON
    live.shutdown_requested(deliver(live, records, 40))
    assert _rows(store) == [(r.sequence_number, r.sub_sequence_number) for r in records]
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


def test_without_a_hint_a_lease_at_trim_horizon_resumes_after_its_chains_last_batch(local_zone):
    """The chain ended long before the lookback window: resume exactly after its last batch all the same."""
    uri, store = local_zone
    records = make_records(60, per_minute=10)  # six minutes
    first = LandingProcessor(store, STREAM, clock=Clock(T0 + 7 * 60_000).time, max_batch_records=8)
    init(first)
    first.shutdown_requested(deliver(first, records[:45], 15))
    later = Clock(T0 + 180 * 60_000)  # three hours later, no landing progress in the lease
    second = LandingProcessor(store, STREAM, clock=later.time, monotonic=later.monotonic, max_batch_records=8)
    init(second)
    assert second.resume_position() == records[44].checkpoint
