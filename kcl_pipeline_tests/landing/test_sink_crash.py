"""Crashes in the middle (unit level): drop a sink mid-stream or mid-flush, start another on the same lease
checkpoint, re-deliver — with other batch boundaries — and every record is landed exactly once, chain intact.

The process-level version (SIGKILL of a real consumer) lives with the consumer tests; these drive the
sink the way the lease worker does: initialize, read after `resume_position()`, process_records.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.errors import CorruptBatchError
from kcl_pipeline.zone.layout import MINUTE_MS, BatchKey, link_key, minute_prefix
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import ZoneStore, open_store

from .helpers import SHARD, STREAM, T0, Clock, ForwardingStore, after, deliver, init, make_records

TH = Checkpoint("TRIM_HORIZON")


class Crash(BaseException):
    """The process died (BaseException: nothing in the sink may catch it)."""


class CrashingStore(ForwardingStore):
    """A store whose process dies at the n-th batch put: before writing it, or after writing it but before the
    sink hears back (so the object is there but the sink's progress never says so)."""

    def __init__(self, inner: ZoneStore, crash_at_put: int, after_write: bool):
        self.inner = inner
        self.zone = inner.zone
        self.crash_at_put = crash_at_put
        self.after_write = after_write
        self.puts = 0

    def put_if_absent(self, key, body):
        if not key.endswith(".parquet"):
            return self.inner.put_if_absent(key, body)  # links (fences) are counted apart: test_fencing.py
        self.puts += 1
        if self.puts == self.crash_at_put:
            if self.after_write:
                self.inner.put_if_absent(key, body)
            raise Crash(key)
        return self.inner.put_if_absent(key, body)


def make_sink(zone, clock, hint=None, **kwargs) -> LandingProcessor:
    target = zone if isinstance(zone, ZoneStore) else zone.uri
    aws = None if isinstance(zone, ZoneStore) else zone.aws
    return LandingProcessor(target, STREAM, clock=clock.time, monotonic=clock.monotonic, aws=aws,
                            progress_hint=hint, **kwargs)


def run_until_crash(sink, records, start: Checkpoint, chunk: int, crash_after: int | None) -> ShardProgress:
    """Deliver after `start`; die after `crash_after` records (or at a crashing put). The progress the
    lease table last saw (a heartbeat just before the crash) is returned."""
    init(sink, start)
    todo = after(records, sink.resume_position() or start)
    if crash_after is not None:
        todo = todo[:crash_after]
    try:
        deliver(sink, todo, chunk)
    except Crash:
        pass
    return ShardProgress.from_attributes(SHARD, sink.heartbeat_attributes())


def finish(sink, records, start: Checkpoint, chunk: int, honour_resume: bool = True) -> None:
    init(sink, start)
    begin = sink.resume_position() if honour_resume else start
    cp = deliver(sink, after(records, begin or start), chunk)
    sink.shutdown_requested(cp)


def assert_exactly_once(zone, records) -> None:
    store = zone if isinstance(zone, ZoneStore) else zone.reopen()
    t = read_batches(store, STREAM)
    got = list(zip(t.column("sequence_number").to_pylist(), t.column("sub_sequence_number").to_pylist(),
                   t.column("data").to_pylist(), strict=True))
    assert got == [(r.sequence_number, r.sub_sequence_number, r.data) for r in records]
    report = verify_zone(store.uri, stream=STREAM, store=store, deep=True)
    assert report.ok, "\n".join(report.lines())
    assert report.streams[STREAM][SHARD].starts_after == TH


RECORDS = make_records(240, per_minute=60)  # four minutes, KPL aggregates of 4
NOW = T0 + 6 * MINUTE_MS


@pytest.mark.parametrize("with_hint", [True, False], ids=["lease-progress", "lookback"])
@pytest.mark.parametrize("honour_resume", [True, False], ids=["resume", "reread-from-checkpoint"])
def test_crash_then_another_owner_with_other_boundaries(any_zone, with_hint, honour_resume):
    clock = Clock(NOW)
    a = make_sink(any_zone, clock, max_batch_records=16)
    seen = run_until_crash(a, RECORDS, TH, chunk=13, crash_after=150)  # the buffered tail is lost
    landed = [r.checkpoint for r in RECORDS].index(seen.landed) + 1
    assert seen.landed == max(list_batches(any_zone.reopen(), STREAM), key=lambda k: k.last.key()).last
    assert 100 < landed < 150
    b = make_sink(any_zone, clock, hint=seen if with_hint else None, max_batch_records=23)
    finish(b, RECORDS, TH, chunk=29, honour_resume=honour_resume)
    if honour_resume:
        # Resumed exactly after the last landed record: from the lease's progress, or without it by following
        # the chain that starts at the lease's starting position (never "any batch of the last minutes").
        assert b.stats.records_already_landed == 0
    else:
        assert b.stats.records_already_landed == landed  # re-read, then dropped by the exclusion
    assert_exactly_once(any_zone, RECORDS)


@pytest.mark.parametrize("after_write", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize("crash_at_put", [1, 3, 7])
def test_crash_in_the_middle_of_a_flush(local_zone, crash_at_put, after_write):
    clock = Clock(NOW)
    store = CrashingStore(open_store(local_zone.uri), crash_at_put, after_write)
    seen = run_until_crash(make_sink(store, clock, max_batch_records=20), RECORDS, TH, chunk=50, crash_after=None)
    landed = len(read_batches(local_zone.reopen(), STREAM))
    assert landed == 20 * (crash_at_put - (0 if after_write else 1))
    # The lease saw at most what the sink knew; with after_write the zone holds one batch more.
    b = make_sink(local_zone, clock, hint=seen, max_batch_records=7)
    finish(b, RECORDS, TH, chunk=31)
    assert_exactly_once(local_zone, RECORDS)


def test_three_owners_and_a_committed_checkpoint(local_zone):
    """A checkpoint committed by the pipeline (the plan) in between: resume after the later of the two."""
    clock = Clock(NOW)
    run_until_crash(make_sink(local_zone, clock, max_batch_records=10), RECORDS, TH, 7, crash_after=95)
    committed = RECORDS[39].checkpoint  # the transform has materialised up to here
    b = make_sink(local_zone, clock, max_batch_records=33)
    seen = run_until_crash(b, RECORDS, committed, 11, crash_after=80)
    assert b.resume_position() == RECORDS[89].checkpoint  # the last landed, not the lease checkpoint
    c = make_sink(local_zone, clock, hint=seen, max_batch_records=64)
    finish(c, RECORDS, committed, 17)
    assert_exactly_once(local_zone, RECORDS)


def test_a_corrupt_last_batch_stops_the_next_owner(any_zone):
    clock = Clock(NOW)
    seen = run_until_crash(make_sink(any_zone, clock, max_batch_records=16), RECORDS, TH, 16, crash_after=64)
    store = any_zone.reopen()
    last = max(list_batches(store, STREAM), key=lambda k: k.last.key())
    _replace(any_zone, last, b"PAR1 not really")
    b = make_sink(any_zone, clock, hint=seen)
    with pytest.raises(CorruptBatchError, match=f"landing zone {any_zone.uri}: object {last.key()}"):
        init(b)
    assert len([k for k in store.list_keys("") if k.endswith(".parquet")]) == 4  # nothing written next to it
    # The operator moves it away: the next owner lands the missing records once.
    _delete(any_zone, last)
    finish(make_sink(any_zone, clock, hint=seen, max_batch_records=9), RECORDS, TH, 9)
    assert_exactly_once(any_zone, RECORDS)


def test_a_corrupt_covering_batch_is_never_trusted(local_zone):
    """Re-delivered records covered by an unreadable object: refuse to drop them (nothing lost)."""
    clock = Clock(NOW)
    run_until_crash(make_sink(local_zone, clock, max_batch_records=16), RECORDS, TH, 16, crash_after=32)
    first = min(list_batches(local_zone.store, STREAM), key=lambda k: k.first.key())
    _replace(local_zone, first, b"garbage")
    # Without its start link the chain cannot be followed: the next owner re-reads from TRIM_HORIZON.
    os.unlink(os.path.join(local_zone.uri, link_key(STREAM, 0, SHARD, TH)))
    b = make_sink(local_zone, clock, max_batch_records=16, resume_lookback_minutes=0)
    init(b)
    assert b.resume_position() is None
    with pytest.raises(CorruptBatchError, match=first.key()):
        b.shutdown_requested(deliver(b, RECORDS[:40], 40))
    assert len([k for k in local_zone.store.list_keys("") if k.endswith(".parquet")]) == 2


def test_a_foreign_object_under_the_shard_prefix_is_an_error(local_zone):
    clock = Clock(NOW)
    local_zone.store.put_if_absent(f"{minute_prefix(STREAM, T0)}{SHARD}/part-0001.parquet", b"x")
    b = make_sink(local_zone, clock)
    init(b)  # a lease at TRIM_HORIZON without a chain reads from the start; its first flush lists the minute
    with pytest.raises(CorruptBatchError, match="part-0001.parquet under the shard's prefix is not a batch key"):
        b.shutdown_requested(deliver(b, RECORDS[:10], 10))
    # Objects that are not Parquet are ignored (e.g. a README someone left).
    local_zone.store.put_if_absent(f"{minute_prefix(STREAM, T0)}{SHARD}/README", b"x")


def test_an_existing_object_under_the_same_key_is_checked(local_zone):
    """The conditional put found the key taken (a racing owner with the same boundaries): accepted only if
    the object really holds that range."""
    clock = Clock(NOW)
    a = make_sink(local_zone, clock, max_batch_records=16)
    b = make_sink(local_zone, clock, max_batch_records=16, resume_lookback_minutes=0)
    c = make_sink(local_zone, clock, max_batch_records=16, resume_lookback_minutes=0)
    for sink in (a, b, c):
        init(sink)  # all start before anything landed (a race)
    deliver(a, RECORDS[:16], 16)
    (key,) = list_batches(local_zone.store, STREAM)
    # b does not see a's batch at its first listing (a race): simulate with an exclusion that lists nothing.
    b._list_minute = lambda minute: ([], set())
    deliver(b, RECORDS[:16], 16)
    assert b.stats.batches_already_landed == 1 and b.stats.batches_written == 0
    _replace(local_zone, key, b"not that range")
    c._list_minute = lambda minute: ([], set())
    with pytest.raises(CorruptBatchError, match=key.key()):
        deliver(c, RECORDS[:16], 16)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    owners=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 50), st.integers(0, 120), st.booleans(),
                              st.booleans()), min_size=1, max_size=4),
    final=st.tuples(st.integers(1, 40), st.integers(1, 50)),
)
def test_any_sequence_of_crashes_lands_everything_once(owners, final):
    """Owners with random batch sizes and delivery chunks crash after random numbers of records, with or
    without the previous owner's progress, honouring the resume point or re-reading from the checkpoint."""
    root = tempfile.mkdtemp(prefix="landing-prop-")
    try:
        store = open_store(root)
        clock = Clock(NOW)
        seen = None
        for batch, chunk, crash_after, use_hint, honour in owners:
            sink = make_sink(store, clock, hint=seen if use_hint else None, max_batch_records=batch)
            init(sink, TH)
            begin = sink.resume_position() if honour else None
            deliver(sink, after(RECORDS, begin or TH)[:crash_after], chunk)
            seen = ShardProgress.from_attributes(SHARD, sink.heartbeat_attributes()) or seen
        batch, chunk = final
        finish(make_sink(store, clock, hint=seen, max_batch_records=batch), RECORDS, TH, chunk)
        assert_exactly_once(store, RECORDS)
    finally:
        shutil.rmtree(root)


def _replace(zone, key: BatchKey, body: bytes) -> None:
    _delete(zone, key)
    assert zone.store.put_if_absent(key.key(), body)


def _delete(zone, key: BatchKey) -> None:
    if zone.aws is None:
        import os

        os.unlink(f"{zone.uri}/{key.key()}")
    else:
        from kcl_pipeline.kcl.shells.aws import client

        z = zone.store.zone
        client("s3", zone.aws).delete_object(Bucket=z.bucket, Key=z.full_key(key.key()))
