"""Window summaries from keys and footers, and where the zone's data begins (local directory and S3)."""
from __future__ import annotations

from kcl_pipeline.windows.report import earliest_landed_minute, list_window, summarise_window
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records

SHARD1 = "shardId-000000000001"


def land(zone, shard: str, n: int, start_ms: int) -> list:
    records = make_records(n, shard=shard, per_minute=20, start_ms=start_ms, seed=n)
    p = LandingProcessor(zone.store, STREAM, max_batch_records=8, clock=Clock(start_ms).time)
    init(p, shard=shard)
    p.shutdown_requested(deliver(p, records, 10))
    return records


def test_summary_and_earliest_minute(any_zone):
    assert earliest_landed_minute(any_zone.store, STREAM) is None
    a = land(any_zone, SHARD, 60, T0 + 3 * MINUTE_MS)  # minutes 3, 4, 5
    land(any_zone, SHARD1, 20, T0 + 65 * MINUTE_MS)  # the next hour
    assert earliest_landed_minute(any_zone.store, STREAM) == T0 + 3 * MINUTE_MS
    assert earliest_landed_minute(any_zone.store, "other-stream") is None

    summary = summarise_window(any_zone.store, STREAM, T0, T0 + 5 * MINUTE_MS)
    assert summary.rows == 40 and summary.chain_ok and summary.bytes > 0
    shard = summary.per_shard()[SHARD]
    assert shard["first"] == [a[0].sequence_number, a[0].sub_sequence_number]
    assert shard["last"] == [a[39].sequence_number, a[39].sub_sequence_number]
    assert shard["rows"] == 40 and shard["starts_after"] == ["TRIM_HORIZON", 0] and shard["chain_ok"]
    assert len(summary.keys) == shard["batches"] == 6  # 8-record batches, cut at minute boundaries
    assert set(summarise_window(any_zone.store, STREAM, T0 + 60 * MINUTE_MS, T0 + 70 * MINUTE_MS).per_shard()) \
        == {SHARD1}


def test_summary_reports_an_unreadable_batch(local_zone):
    land(local_zone, SHARD, 20, T0)
    summary = summarise_window(local_zone.store, STREAM, T0, T0 + MINUTE_MS)
    victim = summary.keys[1]
    with open(f"{local_zone.uri}/{victim}", "r+b") as f:
        f.truncate(10)
    broken = summarise_window(local_zone.store, STREAM, T0, T0 + MINUTE_MS)
    assert not broken.chain_ok and list(broken.shards[SHARD].corrupt) == [victim]
    assert broken.rows == summary.rows - 8


class ListOnly:
    """The zone, refusing every object read: what list_window may touch."""

    def __init__(self, store):
        self._store = store

    def list_keys(self, prefix):
        return self._store.list_keys(prefix)

    def __getattr__(self, name):
        raise AssertionError(f"list_window called {name}")


def test_a_window_listing_reads_no_batch(any_zone):
    """The sensor's report of a window costs LIST pages only: one GET per batch would take an hourly window of
    many busy shards past the tick limit."""
    a = land(any_zone, SHARD, 60, T0 + 3 * MINUTE_MS)
    b = land(any_zone, SHARD1, 20, T0 + 4 * MINUTE_MS)
    any_zone.store.put_if_absent(f"{STREAM}/dt=2026-11-22/hh=03/mm=04/{SHARD}/not-a-batch.parquet", b"x")
    listing = list_window(ListOnly(any_zone.store), STREAM, T0, T0 + 5 * MINUTE_MS)
    full = summarise_window(any_zone.store, STREAM, T0, T0 + 5 * MINUTE_MS)
    assert listing.keys == full.keys
    assert {k: (v["first"], v["last"], v["batches"]) for k, v in listing.per_shard().items()} == \
        {k: (v["first"], v["last"], v["batches"]) for k, v in full.per_shard().items()}
    assert listing.per_shard()[SHARD]["first"] == [a[0].sequence_number, a[0].sub_sequence_number]
    assert listing.per_shard()[SHARD1]["last"] == [b[19].sequence_number, b[19].sub_sequence_number]
    assert listing.malformed == [f"{STREAM}/dt=2026-11-22/hh=03/mm=04/{SHARD}/not-a-batch.parquet"]
