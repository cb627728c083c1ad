"""The world's `short-reads` (Kinesis answering GetRecords with fewer records than it holds, even none; aimed at
a lease's new holder whose start thawed a zombie) and `mixed-batch-sizes` (each worker process cutting batches
at the old or the new size of a rolling change): what they do, that a world without them draws exactly what it
drew before, and that the shipped code keeps every invariant beside them. And the default mix's `rolling-change`
(the workers started beside a paused zombie cutting smaller batches, the zombie's new holder reading short at first),
which changes only the worlds it strikes."""
from __future__ import annotations

import dataclasses
import random

import pytest

from kcl_pipeline.sim.actors.consumer import ROLLING_BATCH_SIZES, SHORT_READS_AFTER_A_ZOMBIE
from kcl_pipeline.sim.aws.kinesis import SimKinesisClient, SimStream
from kcl_pipeline.sim.runtime.scenario import FAULTS, OPT_IN_FAULTS, Scenario
from kcl_pipeline.sim.world import World

# The opt-in kinds of uneven reads (OPT_IN_FAULTS has others: test_zone_refuses.py).
NEW = tuple(kind for kind in OPT_IN_FAULTS if kind in ("short-reads", "mixed-batch-sizes"))


def _stream(records: int) -> SimStream:
    stream = SimStream("s", random.Random(1), 1, lambda: 1000.0)
    shard = stream.open_shards()[0]
    for _ in range(records):
        stream.put(shard, 1)
    return stream


def _reading(records: int, short_reads: float):
    """A one-shard stream of `records` records, a client reading it (every read short when `short_reads` is 1)
    and an iterator at its start."""
    stream = _stream(records)
    shard = stream.open_shards()[0]
    kinesis = SimKinesisClient(stream, random.Random(2), short_reads=short_reads, short_rng=random.Random(3))
    iterator = kinesis.get_shard_iterator(StreamName="s", ShardId=shard.shard_id,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    return shard, kinesis, iterator


def test_short_reads_answer_a_prefix_and_reading_on_still_gets_every_record_once_in_order():
    shard, kinesis, iterator = _reading(200, short_reads=1.0)
    read, sizes = [], []
    while len(read) < 200 and len(sizes) < 10_000:
        response = kinesis.get_records(ShardIterator=iterator, Limit=25)
        sizes.append(len(response["Records"]))
        read += [r["SequenceNumber"] for r in response["Records"]]
        iterator = response["NextShardIterator"]
    assert read == [r.sequence for r in shard.records]
    assert 0 in sizes and any(0 < n < 25 for n in sizes), "no response came back short"
    assert max(sizes) <= 25


def test_a_short_read_that_returned_nothing_is_behind_until_nothing_is_left():
    shard, kinesis, iterator = _reading(30, short_reads=1.0)
    behind = []
    while True:
        response = kinesis.get_records(ShardIterator=iterator, Limit=2)
        left = int(response["NextShardIterator"].split("|")[1]) < len(shard.records)
        if not response["Records"] and left:
            behind.append(response["MillisBehindLatest"])  # seed 488: it said 0, and a window closed early
        if not left:
            assert response["MillisBehindLatest"] == 0
            break
        iterator = response["NextShardIterator"]
    assert behind and all(ms > 0 for ms in behind)


def test_full_reads_without_the_fault():
    _, kinesis, iterator = _reading(60, short_reads=0.0)
    assert len(kinesis.get_records(ShardIterator=iterator, Limit=25)["Records"]) == 25


@pytest.mark.parametrize("seed", range(40))
def test_a_world_without_the_new_faults_draws_what_it_drew_before(seed):
    without = Scenario.generate(seed, 1000, FAULTS)
    every = Scenario.generate(seed, 1000, FAULTS + NEW)
    assert without.short_reads == 0.0 and not without.mixed_batch_sizes
    assert dataclasses.replace(every, faults=without.faults, short_reads=0.0, mixed_batch_sizes=False) == without


def test_aimed_short_reads_answer_the_next_reads_short_and_then_in_full():
    _, kinesis, iterator = _reading(500, short_reads=0.0)
    kinesis.short_next = 40
    sizes = []
    for _ in range(50):
        response = kinesis.get_records(ShardIterator=iterator, Limit=10)
        sizes.append(len(response["Records"]))
        iterator = response["NextShardIterator"]
    assert any(n < 10 for n in sizes[:40]), "no aimed read came back short"
    assert sizes[40:] == [10] * 10 and kinesis.short_next == 0


def test_some_worlds_read_short_and_every_world_with_mixed_sizes_cuts_per_worker():
    scenarios = [Scenario.generate(seed, 1000, NEW) for seed in range(40)]
    assert 0 < sum(s.short_reads > 0 for s in scenarios) < 40
    assert all(s.mixed_batch_sizes for s in scenarios)


def test_a_new_holder_that_thaws_a_zombie_reads_short_when_short_reads_are_on():
    """The race issue 20's stale predecessor needs: a zombie lands its batch as the lease's new holder starts, and
    the new holder's polls end inside that batch. Seed 30 of the stale-predecessor mutation's faults thaws one."""
    thawed = {}
    for faults in (("zombie-flush", "mixed-batch-sizes"), ("zombie-flush", "short-reads", "mixed-batch-sizes")):
        result = World(Scenario.generate(30, 1000, faults)).run()
        assert result.ok, result.violations
        thawed[faults] = (result.stats["zombie-flush: thawed as the new holder started"],
                          result.stats["short-reads: aimed at a new holder that thawed a zombie"])
    assert thawed[("zombie-flush", "mixed-batch-sizes")][1] == 0
    assert thawed[("zombie-flush", "short-reads", "mixed-batch-sizes")][0] >= 1
    assert thawed[("zombie-flush", "short-reads", "mixed-batch-sizes")][1] >= 1
    assert SHORT_READS_AFTER_A_ZOMBIE >= 1


@pytest.mark.parametrize("seed", [2, 4, 7, 14])
def test_the_shipped_code_keeps_every_invariant_with_short_reads_and_mixed_batch_sizes(seed):
    scenario = Scenario.generate(seed, 1000, (*NEW, "zombie-flush", "crash", "freeze-worker"))
    scenario = dataclasses.replace(scenario, short_reads=0.3, mixed_batch_sizes=True)
    result = World(scenario).run()
    assert result.ok, result.violations
    sizes = [k for k, n in result.stats.items() if k.startswith("mixed-batch-sizes:") and n]
    assert len(sizes) >= 2, sizes  # its workers cut batches of different sizes
    assert {int(k.rsplit(" ", 1)[1]) for k in sizes} <= set(ROLLING_BATCH_SIZES)


ROLLED = "rolling-change: a worker started beside a paused zombie cuts at the new size"
AIMED = "short-reads: aimed at a new holder that thawed a zombie"


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 26])
def test_a_rolling_change_draws_nothing_and_changes_only_the_worlds_it_strikes(seed):
    """Only a world that cuts the old size and starts a worker beside a paused zombie changes (from then on); any
    other world runs as it would without the kind (the default mix's other catches stay where they were)."""
    without = Scenario.generate(seed, 1000, [k for k in FAULTS if k != "rolling-change"])
    scenario = Scenario.generate(seed, 1000, FAULTS)
    assert dataclasses.replace(scenario, faults=without.faults) == without
    rolled, plain = World(scenario).run(), World(without).run()
    assert rolled.ok, rolled.violations
    if scenario.flush_records != max(ROLLING_BATCH_SIZES):
        assert not rolled.stats[ROLLED]
    if not rolled.stats[ROLLED]:
        assert rolled.trace == plain.trace and not rolled.stats[AIMED]


def test_a_rolling_change_beside_a_paused_zombie_cuts_smaller_and_aims_the_new_holders_reads():
    """Seed 26 of the default mix: a world cutting 8 records pauses a zombie, a worker started meanwhile cuts 3, and
    the new holder that thaws the zombie reads short at first (the stale predecessor's race)."""
    result = World(Scenario.generate(26, 1000, FAULTS)).run()
    assert result.ok, result.violations
    assert result.stats[ROLLED] >= 1 and result.stats[AIMED] >= 1
