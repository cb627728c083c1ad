"""What a landed window holds, and where the zone's data begins.

Two depths. `list_window` reads the window's listing only (the batch keys name shard, minute and first/last
positions): its cost is a few LIST pages whatever the window holds, so the sensor tick uses it — one ranged
GET per batch would take an hourly window of 100 busy shards past Dagster's 60 s tick limit. `summarise_window`
adds rows, bytes and the chain from every batch's footer (one ranged GET per batch, in parallel), for runs;
`summarise_range` sums it over a run's windows (a single-run backfill). Neither reads the rows.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..kcl.core.model import Checkpoint
from ..zone.batch import BatchInfo, read_batch_info
from ..zone.chain import ChainReport, list_batches, scan_batches, verify_chain
from ..zone.errors import CorruptBatchError, ZoneNotFoundError
from ..zone.layout import BatchKey, parse_batch_key
from ..zone.store import ZoneStore

FETCH_WORKERS = 8
MAX_KEYS_IN_METADATA = 200


@dataclass(frozen=True)
class WindowSummary:
    stream: str
    window_start_ms: int
    window_end_ms: int
    rows: int
    bytes: int
    shards: dict[str, ChainReport] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)

    @property
    def chain_ok(self) -> bool:
        return all(r.ok for r in self.shards.values())

    def per_shard(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: per shard first/last (sequence, sub-sequence), rows, batches, predecessor."""
        return {shard: {"first": json_position(r.first), "last": json_position(r.last), "rows": r.rows,
                        "batches": r.batches, "starts_after": json_position(r.starts_after), "chain_ok": r.ok}
                for shard, r in sorted(self.shards.items())}


def json_position(cp: Checkpoint | None) -> list[Any] | None:
    """A position as metadata shows it: [sequence, sub-sequence] (None stays None)."""
    return None if cp is None else [cp.sequence_number, cp.sub_sequence_number]


@dataclass(frozen=True)
class WindowListing:
    """A window as its listing shows it: no object is read."""

    stream: str
    window_start_ms: int
    window_end_ms: int
    batches: list[BatchKey]  # in (shard, position) order
    malformed: list[str] = field(default_factory=list)  # `.parquet` objects whose names are not batch keys

    @property
    def keys(self) -> list[str]:
        return [b.key() for b in self.batches]

    def per_shard(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: per shard the first and last (sequence, sub-sequence) its batch keys name, and batches."""
        out: dict[str, dict[str, Any]] = {}
        for b in self.batches:
            shard = out.setdefault(b.shard_id, {"first": json_position(b.first), "batches": 0})
            shard["last"] = json_position(b.last)
            shard["batches"] += 1
        return out


def list_window(store: ZoneStore, stream: str, t0: int, t1: int) -> WindowListing:
    listing = scan_batches(store, stream, t0, t1)
    return WindowListing(stream, t0, t1, listing.batches, listing.bad_keys)


def summarise_window(store: ZoneStore, stream: str, t0: int, t1: int, *, workers: int = FETCH_WORKERS) -> WindowSummary:
    batches = list_batches(store, stream, t0, t1)
    infos: list[BatchInfo] = []
    corrupt: dict[str, str] = {}

    def fetch(b):
        try:
            return b, read_batch_info(store, b), None
        except CorruptBatchError as exc:
            return b, None, str(exc)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(batches) or 1))) as pool:
        for b, info, error in pool.map(fetch, batches):
            if info is not None:
                infos.append(info)
            else:
                corrupt[b.key()] = error
    reports = verify_chain(infos, corrupt)
    return WindowSummary(stream, t0, t1, sum(i.rows for i in infos), sum(i.size for i in infos), reports,
                         [b.key() for b in batches])


@dataclass(frozen=True)
class RangeSummary:
    """A run's windows summed (`summarise_window` each): rows, bytes, batch keys, and per shard the first and
    last position, rows and batches over the range (JSON-ready)."""

    rows: int
    bytes: int
    keys: list[str]
    per_shard: dict[str, dict[str, Any]]


def summarise_range(store: ZoneStore, stream: str, starts: Iterable[int], window_ms: int) -> RangeSummary:
    """Every window starting at `starts` (each `window_ms` long) summarised, and the summaries summed."""
    rows = size = 0
    shards: dict[str, dict[str, Any]] = {}
    keys: list[str] = []
    for start in starts:
        summary = summarise_window(store, stream, start, start + window_ms)
        rows += summary.rows
        size += summary.bytes
        keys += summary.keys
        for shard_id, info in summary.per_shard().items():
            merged = shards.setdefault(shard_id, {"first": info["first"], "rows": 0, "batches": 0})
            merged.update(last=info["last"], rows=merged["rows"] + info["rows"],
                          batches=merged["batches"] + info["batches"])
    return RangeSummary(rows, size, keys, shards)


def earliest_landed_minute(store: ZoneStore, stream: str) -> int | None:
    """The arrival minute (epoch millis) of the zone's earliest batch of `stream`, or None if it has none.

    Walks the date / hour / minute prefixes in order: typically four small LIST calls.
    """
    def dirs(prefix: str) -> list[str]:
        try:
            return store.list_dirs(prefix)
        except ZoneNotFoundError:
            return []

    for day in dirs(f"{stream}/"):
        if not day.startswith("dt="):
            continue
        for hour in dirs(f"{stream}/{day}/"):
            if not hour.startswith("hh="):
                continue
            for minute in dirs(f"{stream}/{day}/{hour}/"):
                for key in store.list_keys(f"{stream}/{day}/{hour}/{minute}/"):
                    batch = parse_batch_key(key)
                    if batch is not None:
                        return batch.minute_ms
    return None
