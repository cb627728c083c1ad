"""The world's `short-reads` (Kinesis answering GetRecords with fewer records than it holds, even none) and
`mixed-batch-sizes` (each worker process cutting batches at a size of its own): what they do, that a world
without them draws exactly what it drew before, and that the shipped code keeps every invariant beside them."""
from __future__ import annotations

import dataclasses
import random

import pytest

from kcl_pipeline.sim.kinesis import SimKinesisClient, SimStream
from kcl_pipeline.sim.scenario import FAULTS, OPT_IN_FAULTS, Scenario
from kcl_pipeline.sim.world import World

NEW = OPT_IN_FAULTS


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


def test_some_worlds_read_short_and_some_cut_batches_per_worker():
    scenarios = [Scenario.generate(seed, 1000, NEW) for seed in range(40)]
    assert 0 < sum(s.short_reads > 0 for s in scenarios) < 40
    assert 0 < sum(s.mixed_batch_sizes for s in scenarios) < 40


@pytest.mark.parametrize("seed", [3, 7, 11, 14])
def test_the_shipped_code_keeps_every_invariant_with_short_reads_and_mixed_batch_sizes(seed):
    scenario = Scenario.generate(seed, 1000, (*NEW, "zombie-flush", "crash", "freeze-worker"))
    scenario = dataclasses.replace(scenario, short_reads=0.3, mixed_batch_sizes=True)
    result = World(scenario).run()
    assert result.ok, result.violations
    sizes = [k for k, n in result.stats.items() if k.startswith("mixed-batch-sizes:") and n]
    assert len(sizes) >= 2, sizes  # its workers cut batches of different sizes
