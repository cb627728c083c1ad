"""Issue 20 §2: a batch names its true predecessor however polls, flushes and other writers fall.

Before: a flush part-way through a poll that found its records landed already (another writer got further)
left the rest of the poll buffered; the next poll dropped the records up to the other writer's end while that
stale buffer stayed, so the buffer was no longer consecutive and the exclusion took the new batch's
predecessor from the stale records. The batch then claimed the link after the wrong position: a writer with
the right predecessor landed the same records again (a record in two batches, the shard's checkpoint plan
stopped for good on "overlapping batches"), and footers named predecessors that verify and the audit
reported as chain gaps.
"""
from __future__ import annotations

import random
from itertools import pairwise

import pytest

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.zone.batch import read_batch_info
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import ZoneStore

from .helpers import STREAM, T0, Clock, ForwardingStore, RecordingCheckpointer, init, make_records

LATER = T0 + 600 * 60_000  # hours after the records: a resume walk of the last minutes finds none of them


def sink(store, clock: Clock, **settings) -> LandingProcessor:
    return LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, **settings)


def poll(p: LandingProcessor, records, checkpointer=None) -> None:
    p.process_records(ProcessRecordsInput(list(records), 1000, checkpointer or RecordingCheckpointer()))


def assert_chain_true(store, records) -> None:
    """Every record landed once, and each batch's footer names the record delivered just before its first."""
    batches = list_batches(store, STREAM)
    assert all(a.last.key() < b.first.key() for a, b in pairwise(batches)), [b.key() for b in batches]
    index = {r.position(): i for i, r in enumerate(records)}
    landed = []
    for b in batches:
        first = index[b.first.key()]
        info = read_batch_info(store, b)
        truth = records[first - 1].checkpoint if first else Checkpoint("TRIM_HORIZON")
        assert info.prev == truth, f"{b.key()} says it follows {info.prev}, but {truth} precedes it"
        landed += range(first, index[b.last.key()] + 1)
    assert landed == list(range(len(records)))


class RaceBeforeNextClaim(ForwardingStore):
    """The real store; once armed, a hook runs just before the next link claim (after the writer listed)."""

    def __init__(self, inner: ZoneStore):
        self.inner, self.zone, self.hook = inner, inner.zone, None

    def put_if_absent(self, key, body):
        if self.hook is not None and "/after=" in key:
            hook, self.hook = self.hook, None
            hook()
        return self.inner.put_if_absent(key, body)


def test_a_writer_resuming_behind_another_never_lands_a_record_twice(local_zone):
    """The race of the issue: B resumes behind the batches A landed (an under-estimated resume point), its
    flushes part-way through a poll find A's batches; then B and A's successor C both land the records after
    A's last batch, each listing the zone before the other writes. They must meet on one link."""
    uri, store = local_zone
    records = make_records(40, per_minute=40, aggregate_every=1)
    clock = Clock(LATER)
    a = sink(store, clock, max_batch_records=10)
    init(a)
    poll(a, records[:20])
    a.flush()  # A landed 0..9 and 10..19
    racing = RaceBeforeNextClaim(store)
    b = sink(racing, clock, max_batch_records=3, resume_lookback_minutes=0)
    init(b, records[4].checkpoint)  # B resumes at its lease checkpoint, behind A's batches
    assert b.resume_position() == records[4].checkpoint
    poll(b, records[5:13])  # its flushes find A's batches part-way through the poll
    c = sink(store, clock, max_batch_records=30)  # A's successor, resuming after A's last batch

    def c_lands_first():
        init(c, records[19].checkpoint)
        poll(c, records[20:40])
        c.flush()

    racing.hook = c_lands_first
    poll(b, records[13:40])
    b.flush()
    assert_chain_true(store, records)
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


def test_a_poll_cut_by_a_flush_that_found_its_records_landed_keeps_the_chain(local_zone):
    """No race: the stale buffer alone wrote a wrong predecessor in the footer (a chain gap for verify)."""
    uri, store = local_zone
    records = make_records(40, per_minute=40, aggregate_every=1)
    clock = Clock(LATER)
    a = sink(store, clock, max_batch_records=10)
    init(a)
    poll(a, records[:20])
    a.flush()
    b = sink(store, clock, max_batch_records=3, resume_lookback_minutes=0)
    init(b, records[4].checkpoint)
    poll(b, records[5:13])
    poll(b, records[13:40])
    b.flush()
    assert_chain_true(store, records)
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok


@pytest.mark.parametrize("seed", range(24))
def test_every_batch_names_its_true_predecessor_however_polls_and_flushes_fall(local_zone, seed):
    """Writers one after another, each resuming at a random point at or behind what is landed (a lease
    checkpoint behind the landing progress), with random batch limits, polls and minute lengths: the zone
    holds one chain, each footer true. (Seeds 5 and 13 wrote a wrong predecessor before the fix.)"""
    uri, store = local_zone
    rng = random.Random(seed)
    records = make_records(80, per_minute=rng.choice([20, 80]), aggregate_every=rng.choice([1, 3]), data_size=8,
                           seed=seed)
    clock = Clock(LATER)
    landed_to = -1  # the last record index the writers so far have landed through
    while landed_to < len(records) - 1:
        resume = rng.randint(max(-1, landed_to - 25), landed_to)
        w = sink(store, clock, max_batch_records=rng.choice([1, 2, 3, 5, 8, 13]), resume_lookback_minutes=0)
        init(w, records[resume].checkpoint if resume >= 0 else Checkpoint("TRIM_HORIZON"))
        i = resume + 1
        stop = min(len(records), i + rng.randint(10, 40))
        while i < stop:
            n = rng.randint(1, 12)
            poll(w, records[i:min(stop, i + n)])
            i = min(stop, i + n)
        w.shutdown_requested(RecordingCheckpointer())
        landed_to = max(landed_to, stop - 1)
    assert_chain_true(store, records)
    assert verify_zone(uri, stream=STREAM, store=store, deep=True).ok
