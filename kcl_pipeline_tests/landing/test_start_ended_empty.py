"""Sim seeds 6056 and 3451: a shard's start link claimed after its end was reported landed with nothing landed.

An application started at LATEST. The shard's first holder read from LATEST and froze inside its first flush,
before its put-if-absent of the start link `_start/<shard>/after=LATEST_0`. Its lease moved; the next holder
found no start link, read LATEST on the shard (closed meanwhile: nothing) and ended it; a look at the start link
there (seed 3670's fix) came before the frozen holder's claim. The frozen holder thawed, won the start link and
landed a batch from the middle of the shard: the chain began there, and nobody ever landed the records after it.

Now the holder ending a shard with nothing landed after its start claims the start link itself, with a body
saying so (`layout.ENDED_EMPTY`); the frozen holder's claim then fails on it and lands nothing. Every reader of
start links takes the marker for a complete, empty chain: a later holder, the checkpoint plan, the backfill,
verify and the audit.
"""
from __future__ import annotations

import random

import pytest

from kcl_pipeline.audit.history import audit_history
from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import LATEST, SHARD_END, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.kcl.processor import InitializationInput, ProcessRecordsInput
from kcl_pipeline.windows.backfill import BackfillPace, backfill_range, live_start
from kcl_pipeline.windows.checkpoints.plan import ChainEvidence, plan_checkpoints
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.errors import ChainStartTaken
from kcl_pipeline.zone.layout import MINUTE_MS, ended_empty_body, ends_empty, link_key, link_target
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.stream_slice import StreamSlice

from .fake_kinesis import FakeKinesis, Ticking
from .helpers import SHARD, STREAM, T0, Clock, RecordingCheckpointer, RecordingLeaseTable, make_records

RECORDS = make_records(40, per_minute=10, aggregate_every=1)  # four minutes
NOW = T0 + 30 * 60_000
ZOMBIE_READ = RECORDS[30:37]  # what the first holder read from LATEST before it froze inside its first flush
LATEST_START = Checkpoint(LATEST)
START_LINK = link_key(STREAM, 0, SHARD, LATEST_START)


def holder(store, worker: str) -> LandingProcessor:
    clock = Clock(NOW)
    p = LandingProcessor(store, STREAM, clock=clock.time, monotonic=clock.monotonic, max_batch_records=100)
    p.initialize(InitializationInput(SHARD, worker, LATEST_START))
    return p


def ended_lease() -> Lease:
    """The shard's lease at LATEST, its holder reporting the end landed with nothing landed."""
    ended = ShardProgress(SHARD, None, shard_end_landed=True).to_attributes()
    return Lease(SHARD, LATEST_START, extra={k: v for k, v in ended.items() if v is not None})


def zombie_after_the_end(store) -> tuple[LandingProcessor, LandingProcessor]:
    """The race of seeds 6056 and 3451: the first holder read and froze before its first flush reached the start
    link; the next holder read LATEST after the shard closed (nothing) and ended it; then the first thawed."""
    zombie = holder(store, "worker-5")
    cp = RecordingCheckpointer()
    zombie.process_records(ProcessRecordsInput(ZOMBIE_READ, 1000, cp))  # buffered: its flush is frozen
    ender = holder(store, "worker-13")
    assert ender.resume_position() is None  # no start link yet: it reads LATEST, on a closed shard
    ender.shard_ended(RecordingCheckpointer())
    with pytest.raises(ChainStartTaken, match="ended with nothing landed"):
        zombie.shutdown_requested(cp)  # thawed: its flush claims the start link
    return zombie, ender


def test_a_zombies_start_claim_after_the_shard_ended_empty_lands_nothing(memory_zone):
    store = memory_zone.store
    zombie, ender = zombie_after_the_end(store)
    assert ender.progress is not None and ender.progress.shard_end_landed and ender.progress.landed is None
    body = store.get(START_LINK)
    assert ends_empty(link_target(body)) and body.decode().splitlines()[1] == "holder=worker-13"
    assert list_batches(store, STREAM) == [], "the zombie began the chain in the middle of an ended shard"
    assert zombie.stats.batches_written == 0 and zombie.progress is not None and zombie.progress.landed is None
    # it dropped its buffer and stopped: nothing more is taken, nothing flushed
    zombie.process_records(ProcessRecordsInput(RECORDS[37:], 1000, RecordingCheckpointer()))
    zombie.flush()
    assert list_batches(store, STREAM) == []


def test_a_later_holder_of_a_shard_that_ended_empty_has_nothing_to_land_and_ends_it(memory_zone):
    """Before, the marker was no batch key: a later holder following its chain from the start link stopped
    with CorruptBatchError."""
    store = memory_zone.store
    assert store.put_if_absent(START_LINK, ended_empty_body("worker-13"))
    later = holder(store, "worker-20")
    assert later.resume_position() is None and later.progress is not None and later.progress.landed is None
    later.shard_ended(RecordingCheckpointer())  # its own claim of the end meets the marker: the same end
    assert later.progress.shard_end_landed and list_batches(store, STREAM) == []


def test_a_holder_ending_a_shard_after_a_batch_claim_still_gives_the_lease_back(memory_zone):
    """The other order (seed 3670): the frozen holder claimed the start link first; the ender's claim fails on
    a batch, so it does not report the end landed."""
    store = memory_zone.store
    zombie = holder(store, "worker-5")
    ender = holder(store, "worker-13")
    zombie.process_records(ProcessRecordsInput(ZOMBIE_READ, 0, RecordingCheckpointer()))
    zombie.flush()
    with pytest.raises(ChainStartTaken, match="names"):
        ender.shard_ended(RecordingCheckpointer())
    assert ender.progress is not None and not ender.progress.shard_end_landed
    assert not ends_empty(link_target(store.get(START_LINK)))


def test_the_checkpoint_plan_ends_a_shard_whose_start_link_says_it_ended_empty():
    """Pure: a holder reporting the end landed with nothing landed, and the start link the ended-empty marker."""
    lease = ended_lease()
    plan = plan_checkpoints([], 60_000, {}, {SHARD: ShardProgress(SHARD, None, shard_end_landed=True)}, [lease],
                            chain=ChainEvidence(starts={SHARD: link_target(ended_empty_body("worker-13"))}))
    assert plan.shards[SHARD].end and plan.ends == [SHARD], plan.shards[SHARD].reason


def test_the_pipeline_ends_a_shard_after_the_zombies_claim_failed_on_the_marker(memory_zone, unique_name):
    """Through the zone: before, the zombie's batch sat on the start link with nothing landed after it as far as
    the ender's progress told, and the plan never ended the shard (the records after that batch never landed)."""
    from kcl_pipeline.zone.store import open_store

    store = memory_zone.store
    zombie_after_the_end(store)
    output = open_store(f"memory://{unique_name('out')}")
    output.ensure_zone(create=True)
    lease = ended_lease()
    table = RecordingLeaseTable()
    table.scan = lambda: [lease]  # type: ignore[attr-defined]  # the children's creation reads the leases
    report = commit_checkpoints(table, StreamSlice(StreamScope(STREAM), [lease], [Shard(SHARD)]), store, output,
                                window_ms=60_000, first_window_ms=T0, initial=LATEST_START, grace_ms=0)
    assert report.plan.shards[SHARD].end and table.ended == [SHARD], report.plan.shards[SHARD].reason
    output.drop()  # type: ignore[attr-defined]


def test_verify_and_the_audit_take_a_shard_ended_empty_for_a_complete_empty_chain(memory_zone, unique_name):
    """A shard whose only object is its start link's marker: no corrupt link, no missing batch, no chain."""
    from kcl_pipeline.zone.store import open_store

    store = memory_zone.store
    zombie_after_the_end(store)
    assert list_batches(store, STREAM) == [] and ends_empty(link_target(store.get(START_LINK)))
    ended = Lease(SHARD, Checkpoint(SHARD_END), extra=ended_lease().extra)
    verified = verify_zone(store.uri, stream=STREAM, store=store, leases=[ended], deep=True)
    assert verified.ok and verified.leases_checked == 1, verified.lines()
    output = open_store(f"memory://{unique_name('out')}")
    output.ensure_zone(create=True)
    audited = audit_history(store, output, STREAM, 60_000, leases=[ended], now_ms=NOW, transform_grace_ms=0)
    assert audited.ok, audited.lines()
    output.drop()  # type: ignore[attr-defined]


def test_a_refill_lands_nothing_of_a_latest_shard_that_ended_empty(memory_zone):
    """The shard's LATEST chain began and ended empty: every record of it arrived before the application's start
    on it. Its lease since cleaned up (no live lease), a refill of a minute once landed the whole minute under an
    AT_TIMESTAMP chain of its own — records the application never owed, before its start."""
    store = memory_zone.store
    assert store.put_if_absent(START_LINK, ended_empty_body("worker-13"))
    minute = T0 + 3 * MINUTE_MS
    report = backfill_range(STREAM, minute, minute + MINUTE_MS, store,
                            kinesis=FakeKinesis(STREAM, {SHARD: RECORDS}, random.Random(6056)),
                            leases=None,
                            application_start=LATEST_START, now_ms=T0 + 10 * MINUTE_MS,
                            pace=BackfillPace(reads_per_second=4), monotonic=Ticking())
    assert list_batches(store, STREAM) == [], "records before the shard's LATEST start were landed"
    assert report.shards[SHARD].skipped_before_start == 10 and report.shards[SHARD].records_landed == 0
    assert live_start(store, STREAM, SHARD) == Checkpoint(SHARD_END)  # the chain begins at the shard's end
