"""The reader's prefetch: each GetRecords asks for as many records as fit `max_bytes_per_call`, so a worker holds
about that much of a backlog whatever GetRecords could return (10 MiB)."""
from __future__ import annotations

import botocore.session
import pytest
from botocore.stub import Stubber

from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint
from kcl_pipeline.kcl.shells.read.reader import MAX_RECORD_BYTES, ReaderError, ShardReader

from .test_reader import SHARD, STREAM, A, B, C, D, FakeClock, expect_iterator, rec

KiB, MiB = 1024, 1024 * 1024


@pytest.fixture
def kinesis():
    kin = botocore.session.get_session().create_client(
        "kinesis", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(kin) as stub:
        kin.stub = stub
        yield kin
        stub.assert_no_pending_responses()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def expect(kinesis, iterator: str, records: list[dict], limit: int, next_iterator: str = "next") -> None:
    kinesis.stub.add_response("get_records", {"Records": records, "MillisBehindLatest": 1000,
                                              "NextShardIterator": next_iterator},
                              {"ShardIterator": iterator, "Limit": limit})


def reader(kinesis, clock, **kw) -> ShardReader:
    return ShardReader(kinesis, STREAM, SHARD, Checkpoint(TRIM_HORIZON), sleep=clock.sleep,
                       monotonic=clock.monotonic, **kw)


def test_the_limit_follows_the_mean_record_size_of_the_last_response(kinesis, clock):
    r = reader(kinesis, clock, max_bytes_per_call=2 * MiB)
    # Nothing seen yet: as many records as fit at the largest record a shard may hold (1 MiB each).
    assert r.limit() == 2 * MiB // MAX_RECORD_BYTES == 2
    expect_iterator(kinesis, "it-1", ShardIteratorType=TRIM_HORIZON)
    expect(kinesis, "it-1", [rec(A, b"x" * 50 * KiB), rec(B, b"x" * 30 * KiB)], limit=2, next_iterator="it-2")
    r.poll()
    assert r.limit() == int(2 * MiB // (40 * KiB)) == 51
    expect(kinesis, "it-2", [], limit=51, next_iterator="it-3")  # an empty response keeps the estimate
    r.poll()
    assert r.limit() == 51
    expect(kinesis, "it-3", [rec(C, b"x" * 100), rec(D, b"x" * 100)], limit=51, next_iterator="it-4")
    r.poll()
    assert r.limit() == 10000  # small records: GetRecords' own limit (max_records) applies


def test_a_record_larger_than_the_prefetch_is_still_read_one_at_a_time(kinesis, clock):
    r = reader(kinesis, clock, max_bytes_per_call=64 * KiB, max_records=500)
    assert r.limit() == 1
    expect_iterator(kinesis, "it-1", ShardIteratorType=TRIM_HORIZON)
    expect(kinesis, "it-1", [rec(A, b"x" * 900 * KiB)], limit=1, next_iterator="it-2")
    assert len(r.poll().records) == 1
    assert r.limit() == 1


def test_without_a_prefetch_every_call_asks_for_max_records(kinesis, clock):
    r = reader(kinesis, clock, max_records=700)
    expect_iterator(kinesis, "it-1", ShardIteratorType=TRIM_HORIZON)
    expect(kinesis, "it-1", [rec(A, b"x" * 900 * KiB)], limit=700)
    r.poll()
    assert r.limit() == 700


def test_a_prefetch_must_be_positive(kinesis, clock):
    with pytest.raises(ReaderError, match="max_bytes_per_call must be >= 1, got 0"):
        reader(kinesis, clock, max_bytes_per_call=0)


def test_the_worker_reads_with_its_configured_prefetch(kinesis, clock):
    """The worker's reader (retrieval.open_reader, what the worker opens) is bounded by
    ConsumerConfig.prefetch_bytes, not by what a GetRecords response may carry."""
    from kcl_pipeline.kcl.config import ConsumerConfig
    from kcl_pipeline.kcl.shells.read.retrieval import open_reader

    config = ConsumerConfig(stream=STREAM, application="app").with_(prefetch_bytes=3 * MiB)
    opened = open_reader(config, kinesis, STREAM, SHARD, Checkpoint(TRIM_HORIZON), kpl_stats=None,
                         sleep=clock.sleep)
    assert isinstance(opened, ShardReader) and opened.max_bytes_per_call == 3 * MiB
