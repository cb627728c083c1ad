"""What a landed window holds (rows, bytes, per-shard ranges and keys), and where the zone's data begins.

Read from the batch keys and footers only (one ranged GET per batch, fetched in parallel: a sensor tick
must stay short), never from the rows.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .batch import BatchInfo, read_batch_info
from .errors import CorruptBatchError, ZoneNotFoundError
from .layout import parse_batch_key
from .store import ZoneStore
from .verify import ChainReport, list_batches, verify_chain

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
        def pos(cp):
            return None if cp is None else [cp.sequence_number, cp.sub_sequence_number]

        return {shard: {"first": pos(r.first), "last": pos(r.last), "rows": r.rows, "batches": r.batches,
                        "starts_after": pos(r.starts_after), "chain_ok": r.ok}
                for shard, r in sorted(self.shards.items())}


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


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
