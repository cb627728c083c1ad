"""`landing verify --deep` reads every row of a range one batch at a time (issue 20, item 11): it kept every
decoded batch of the range until the end, so memory grew with the range."""
from __future__ import annotations

import pyarrow as pa

from kcl_pipeline.audit import verify
from kcl_pipeline.zone import chain
from kcl_pipeline.zone.batch import encode_batch
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records

SHARD1 = "shardId-000000000001"


def test_a_deep_verify_holds_one_decoded_batch_at_a_time_whatever_the_range(local_zone, monkeypatch):
    uri, store = local_zone
    for shard in (SHARD, SHARD1):
        records = make_records(600, shard=shard, per_minute=200, data_size=2000, seed=3)
        p = LandingProcessor(uri, STREAM, max_batch_records=20, clock=Clock(T0).time)
        init(p, shard=shard)
        p.shutdown_requested(deliver(p, records, 100))
    decoded = chain.decode_batch
    sizes: list[int] = []
    held: list[int] = []
    baseline = pa.total_allocated_bytes()

    def measured(body, key="?", stream=None):
        table = decoded(body, key, stream)
        sizes.append(table.nbytes)
        held.append(pa.total_allocated_bytes() - baseline)  # Arrow memory alive right after this decode
        return table

    monkeypatch.setattr(chain, "decode_batch", measured)
    report = verify.verify_zone(uri, deep=True)
    assert report.ok and report.rows == 1200 and len(sizes) == 60
    assert max(held) < 3 * max(sizes), (max(held), sum(sizes))  # it was the whole range: ~sum(sizes)


def test_a_deep_verify_still_counts_rows_landed_twice_across_batches(local_zone):
    uri, store = local_zone
    records = make_records(90, per_minute=30)
    p = LandingProcessor(uri, STREAM, max_batch_records=12, clock=Clock(T0).time)
    init(p)
    p.shutdown_requested(deliver(p, records, 20))
    for first, last in ((5, 9), (7, 14), (40, 41)):  # overlapping copies, one inside another's range
        copy = encode_batch(STREAM, SHARD, records[first:last], records[first - 1].checkpoint)
        store.put_if_absent(copy.key.key(), copy.body)
    report = verify.verify_zone(uri, deep=True).streams[STREAM][SHARD]
    assert report.duplicate_rows == 4 + 7 + 1 and report.overlaps and not report.row_errors


def test_a_deep_verify_reports_an_unreadable_batch_and_goes_on(local_zone):
    uri, store = local_zone
    records = make_records(30, per_minute=30)
    p = LandingProcessor(uri, STREAM, max_batch_records=10, clock=Clock(T0).time)
    init(p)
    p.shutdown_requested(deliver(p, records, 10))
    middle = sorted(chain.list_batches(store, STREAM), key=lambda b: b.first.key())[1]
    store.delete([middle.key()])
    store.put_if_absent(middle.key(), b"not parquet at all")
    report = verify.verify_zone(uri, deep=True).streams[STREAM][SHARD]
    assert not report.ok and list(report.corrupt) == [middle.key()] and report.duplicate_rows == 0
    assert report.rows == 20 and report.batches == 3
