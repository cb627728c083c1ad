"""The chain of a shard's landed batches, read back from the zone: list and read a window's batches, and verify
each shard's chain.

The chain: every batch records the position delivered just before its first record (`prev`), so in
shard order each batch's prev must equal the previous batch's last. A mismatch is a gap (records
missing between them); ranges that intersect are an overlap (records landed twice). The first batch of
a window chains to something outside it: its prev is reported (`starts_after`) so a caller can stitch
windows together, or compare it with a lease checkpoint. This is the basis of the lineage audit and of the
window reports.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..kcl.core.model import Checkpoint
from .batch import SCHEMA, BatchInfo, decode_batch, info_from_metadata, read_batch_info
from .errors import CorruptBatchError
from .layout import (
    MINUTE_MS,
    BatchKey,
    foreign_stream,
    iso,
    landing_directory,
    minute_prefix,
    parse_batch_key,
    split_batch_keys,
    window_prefixes,
)
from .store import ZoneStore


@dataclass(frozen=True)
class Listing:
    batches: list[BatchKey]  # sorted by (shard, first position)
    bad_keys: list[str]  # .parquet objects whose names are not batch keys


@dataclass(frozen=True)
class Gap:
    after: Checkpoint  # the last record of the earlier batch
    next_prev: Checkpoint | None  # what the next batch says preceded it
    next_key: str


@dataclass(frozen=True)
class Overlap:
    first_key: str
    second_key: str


@dataclass
class ChainReport:
    shard_id: str
    batches: int = 0
    rows: int = 0
    first: Checkpoint | None = None
    last: Checkpoint | None = None
    starts_after: Checkpoint | None = None  # the prev of the first batch (outside the window)
    starts_after_key: str | None = None  # the key of the batch the first one says it follows (its footer)
    gaps: list[Gap] = field(default_factory=list)
    overlaps: list[Overlap] = field(default_factory=list)
    corrupt: dict[str, str] = field(default_factory=dict)  # key -> why it could not be read
    duplicate_rows: int | None = None  # only when rows were read (deep)
    row_errors: list[str] = field(default_factory=list)  # deep: rows that disagree with their batch
    stream_arns: list[str] = field(default_factory=list)  # the streams the batches' footers name (each once)
    foreign: list[str] = field(default_factory=list)  # batches of another stream than the directory's: key: why

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.overlaps or self.corrupt or self.duplicate_rows or self.row_errors
                    or self.foreign)



# -- listing and reading --------------------------------------------------------------------------------

def scan_batches(store: ZoneStore, stream: str, t0: int | None = None, t1: int | None = None,
                 shard: str | None = None) -> Listing:
    """The batches of `stream` whose arrival minute is in [t0, t1) (everything when no window)."""
    if (t0 is None) != (t1 is None):
        raise ValueError("give both ends of the window, or neither")
    stream = landing_directory(stream)
    if t0 is None or t1 is None:  # neither (checked above)
        prefixes = [f"{stream}/"]
    else:
        check_window(t0, t1)
        if shard is not None:  # the shard sits below the minute: one small listing per minute
            prefixes = [f"{minute_prefix(stream, m)}{shard}/" for m in range(t0, t1, MINUTE_MS)]
        else:
            prefixes = window_prefixes(stream, t0, t1)
    batches, bad = [], []
    for prefix in prefixes:
        listing = split_batch_keys(store.list_keys(prefix))
        bad += listing.malformed
        batches += [k for k in listing.batches if k.stream == stream and (shard is None or k.shard_id == shard)]
    batches.sort(key=lambda b: (b.shard_id, b.first.key(), b.last.key()))
    return Listing(batches, bad)


def list_batches(store: ZoneStore, stream: str, t0: int | None = None, t1: int | None = None,
                 shard: str | None = None) -> list[BatchKey]:
    return scan_batches(store, stream, t0, t1, shard).batches


def read_batches(store: ZoneStore, stream: str, t0: int | None = None, t1: int | None = None,
                 shard: str | None = None) -> pa.Table:
    """Every row landed for the window (and shard), in (shard, position) order of the batches."""
    tables = [decode_batch(store.get(b.key()), b.key()) for b in list_batches(store, stream, t0, t1, shard)]
    if not tables:
        return SCHEMA.empty_table()
    return pa.concat_tables(t.replace_schema_metadata(None) for t in tables)


# -- the chain --------------------------------------------------------------------------------------------

def verify_chain(infos: Sequence[BatchInfo], corrupt: Mapping[str, str] | None = None,
                 stream_arn: str | None = None) -> dict[str, ChainReport]:
    """Pure: per-shard chain status from batch footers (and keys that could not be read, key -> reason). A batch
    whose footer names a stream other than its directory's (or `stream_arn`, the stream expected) is foreign."""
    reports: dict[str, ChainReport] = {}
    unreadable: dict[str, list[tuple[BatchKey, str]]] = {}
    for rel, why in (corrupt or {}).items():
        key = parse_batch_key(rel)
        if key is not None:
            unreadable.setdefault(key.shard_id, []).append((key, str(why)))
    by_shard: dict[str, list[BatchInfo]] = {}
    for read in infos:
        by_shard.setdefault(read.key.shard_id, []).append(read)
    for shard_id in sorted(set(by_shard) | set(unreadable)):
        report = reports[shard_id] = ChainReport(shard_id)
        # Unreadable batches keep their place in the chain (their key gives the range) but vouch for nothing.
        items: list[tuple[BatchKey, BatchInfo | None]] = [(i.key, i) for i in by_shard.get(shard_id, ())]
        for key, why in unreadable.get(shard_id, ()):
            items.append((key, None))
            report.corrupt[key.key()] = why
        items.sort(key=lambda kv: (kv[0].first.key(), kv[0].last.key()))
        previous: BatchKey | None = None
        for key, info in items:
            report.batches += 1
            report.rows += info.rows if info else 0
            if info is not None and info.stream_arn:
                if info.stream_arn not in report.stream_arns:
                    report.stream_arns.append(info.stream_arn)
                other = foreign_stream(key.stream, info.stream_arn, stream_arn)
                if other is not None:
                    report.foreign.append(f"{key.key()}: {other}")
            if previous is None:
                report.first = key.first
                report.starts_after = info.prev if info else None
                report.starts_after_key = info.prev_key if info else None
            elif key.first.key() <= previous.last.key():
                report.overlaps.append(Overlap(previous.key(), key.key()))
            elif info is not None and info.prev != previous.last and not _joins_by_backfill(info):
                report.gaps.append(Gap(previous.last, info.prev, key.key()))
            elif info is not None and info.prev_key is not None and info.prev_key != previous.key():
                # The positions meet, but the batch names another predecessor: a batch was replaced or reordered.
                report.gaps.append(Gap(previous.last, info.prev, key.key()))
            if previous is None or key.last.key() > previous.last.key():
                report.last = key.last
                previous = key
    return reports


def mixed_streams(directory: str, chains: Iterable[ChainReport]) -> str | None:
    """Pure: the streams a directory's batches name (its shards' chain reports, `verify_chain`), when they are
    more than one — two streams of one name landed in it (`landing verify`, the audit); batches that name none,
    landed before stream identity, are of no stream in particular."""
    shards_of: dict[str, list[str]] = {}
    for chain in chains:
        for arn in chain.stream_arns:
            shards_of.setdefault(arn, []).append(chain.shard_id)
    if len(shards_of) < 2:
        return None
    return f"{directory} holds batches of {len(shards_of)} streams: " + "; ".join(
        f"{arn} (shards {', '.join(sorted(shards))})" for arn, shards in sorted(shards_of.items()))


def foreign_batch(line: str) -> str:
    """The key a `ChainReport.foreign` line names (`<key>: <why>`; keys hold no ': ')."""
    return line.partition(": ")[0]


def _joins_by_backfill(info: BatchInfo) -> bool:
    """A backfill's first batch (it follows AT_TIMESTAMP) after batches of the live chain: the backfill read
    from a time, not from a batch, so it cannot name one; the fencing link and the exclusion kept it from
    overlapping, and no overlap is what the chain can still check."""
    return info.prev is not None and info.prev.sequence_number == "AT_TIMESTAMP"


def _deep_check(table: pa.Table, info: BatchInfo) -> list[str]:
    """Rows against their footer: count, first/last, strictly increasing positions, shard and stream."""
    key = info.key
    problems = []
    if table.num_rows != info.rows:
        problems.append(f"{key.key()}: {table.num_rows} rows, footer says {info.rows}")
    if table.num_rows:
        seqs = table.column("sequence_number").to_pylist()
        subs = table.column("sub_sequence_number").to_pylist()
        positions = [(len(s), s, n) for s, n in zip(seqs, subs, strict=True)]
        if positions[0] != key.first.key() or positions[-1] != key.last.key():
            problems.append(f"{key.key()}: rows run {seqs[0]}/{subs[0]}..{seqs[-1]}/{subs[-1]}")
        if any(a >= b for a, b in pairwise(positions)):
            problems.append(f"{key.key()}: positions are not strictly increasing")
        if set(table.column("shard_id").to_pylist()) != {key.shard_id} or \
                set(table.column("stream").to_pylist()) != {key.stream}:
            problems.append(f"{key.key()}: rows of another shard or stream")
    return problems


@dataclass
class _DeepShard:
    """One shard's rows read so far (deep): only what a later batch could still duplicate is remembered."""

    seen: set[tuple[int, str, int]] = field(default_factory=set)
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, table: pa.Table, info: BatchInfo) -> None:
        """Check a batch's rows and count those an earlier batch of the shard held. Batches come in order of
        their first position, so a position below this batch's first cannot be repeated by it or any later
        one: forgotten, so memory holds one batch's positions (and an overlap's), never the shard's."""
        floor = info.key.first.key()
        if self.seen:
            self.seen = {p for p in self.seen if p >= floor}
        self.errors += _deep_check(table, info)
        seqs = table.column("sequence_number").to_pylist()
        subs = table.column("sub_sequence_number").to_pylist()
        for position in zip(map(len, seqs), seqs, subs, strict=True):
            if position in self.seen:
                self.duplicates += 1
            else:
                self.seen.add(position)


def verify_batches(store: ZoneStore, batches: Iterable[BatchKey], *, deep: bool = False,
                   on_batch: Callable[[], None] | None = None,
                   stream_arn: str | None = None) -> dict[str, ChainReport]:
    """Per-shard chain reports of `batches` from their footers; `deep` also reads every row (one batch at a
    time: a decoded batch is dropped once checked, so memory does not grow with the range)."""
    infos, corrupt = [], {}
    shards: dict[str, _DeepShard] = {}
    for b in sorted(batches, key=lambda k: (k.shard_id, k.first.key(), k.last.key())):
        try:
            if deep:
                body = store.get(b.key())
                info = _info_of_body(store, b, body)
                shards.setdefault(b.shard_id, _DeepShard()).add(decode_batch(body, b.key()), info)
                del body
            else:
                info = read_batch_info(store, b)
            infos.append(info)
        except CorruptBatchError as exc:
            corrupt[b.key()] = str(exc)
        if on_batch is not None:
            on_batch()
    reports = verify_chain(infos, corrupt, stream_arn)
    for shard_id, deep_shard in shards.items():
        reports[shard_id].row_errors += deep_shard.errors
        reports[shard_id].duplicate_rows = deep_shard.duplicates
    for shard_id in reports if deep else ():
        if reports[shard_id].duplicate_rows is None:
            reports[shard_id].duplicate_rows = 0  # every batch of the shard was unreadable: no row counted
    return reports


def _info_of_body(store: ZoneStore, key: BatchKey, body: bytes) -> BatchInfo:
    """The footer of a batch already read whole (deep): no second request."""
    where = f"landing zone {store.uri}: object {key.key()}"
    try:
        metadata = pq.read_metadata(pa.BufferReader(body))
    except Exception as exc:
        raise CorruptBatchError(f"{where}: unreadable Parquet footer ({exc})") from exc
    return info_from_metadata(metadata, key, len(body), where)


def check_window(t0: int, t1: int) -> None:
    if t1 <= t0:
        raise ValueError(f"window [{iso(t0)}, {iso(t1)}) is empty")
    if t0 % MINUTE_MS or t1 % MINUTE_MS:
        raise ValueError(f"window [{t0}, {t1}) must start and end on whole minutes (batches are per minute)")
