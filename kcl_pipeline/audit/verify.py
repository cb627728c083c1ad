"""Verifying a landing zone: every shard's chain (zone/chain.py), cross-checked with the lease table.

`verify_zone(uri, window)` is what `kcl-pipeline landing verify` prints (`ZoneReport.lines()`; exit 1
when `not report.ok`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Mapping, Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.model import Lease
from ..kcl.core.streams import STREAM_ARN_RE, identifier_parts, parse_multi_stream_key, pinned_scope
from ..zone.chain import ChainReport, check_window, iso, mixed_streams, scan_batches, verify_batches
from ..zone.layout import (
    HOUR_MS,
    MINUTE_MS,
    landing_directory,
    stream_directory,
)
from ..zone.progress import progress_from_leases
from ..zone.store import ZoneStore, open_store
from ..zone.stream_slice import slice_of


@dataclass
class ZoneReport:
    uri: str
    window: tuple[int, int] | None
    streams: dict[str, dict[str, ChainReport]]
    bad_keys: list[str] = field(default_factory=list)
    lease_problems: list[str] = field(default_factory=list)  # disagreements with the lease table
    leases_checked: int | None = None  # None: no lease table was given
    # A shard's first batch (of the history, or of the window) names a predecessor the zone does not hold: lost.
    missing_predecessors: list[str] = field(default_factory=list)
    # A directory whose batches' footers name more than one stream (two streams of one name landed in it).
    mixed_streams: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad_keys and not self.lease_problems and not self.missing_predecessors \
            and not self.mixed_streams and all(r.ok for shards in self.streams.values() for r in shards.values())

    @property
    def rows(self) -> int:
        return sum(r.rows for shards in self.streams.values() for r in shards.values())

    def lines(self) -> list[str]:
        where = "all time" if self.window is None else f"[{iso(self.window[0])}, {iso(self.window[1])})"
        out = [f"landing zone {self.uri}, window {where}"]
        if not self.streams:
            out.append("  no batches")
        for stream, shards in sorted(self.streams.items()):
            out.append(f"stream {stream}")
            for shard_id, r in sorted(shards.items()):
                status = "OK" if r.ok else "BROKEN"
                out.append(f"  {shard_id}: {status} batches={r.batches} rows={r.rows} first={r.first} "
                           f"last={r.last} starts_after={r.starts_after} gaps={len(r.gaps)} "
                           f"overlaps={len(r.overlaps)}" + (f" duplicate_rows={r.duplicate_rows}"
                                                            if r.duplicate_rows is not None else ""))
                out += [f"    gap after {g.after}: next batch {g.next_key} says it follows {g.next_prev}"
                        for g in r.gaps]
                out += [f"    overlap: {o.first_key} and {o.second_key}" for o in r.overlaps]
                out += [f"    corrupt: {k}: {why}" for k, why in sorted(r.corrupt.items())]
                out += [f"    rows: {e}" for e in r.row_errors]
                out += [f"    foreign: {e}" for e in r.foreign]
        out += [f"  not a batch key: {k}" for k in self.bad_keys]
        out += [f"  mixed streams: {m}" for m in self.mixed_streams]
        out += [f"  missing: {m}" for m in self.missing_predecessors]
        if self.leases_checked is not None:
            out.append(f"lease table: {self.leases_checked} leases cross-checked"
                       + ("" if not self.lease_problems else f", {len(self.lease_problems)} problems"))
            out += [f"  {p}" for p in self.lease_problems]
        out.append(f"{'OK' if self.ok else 'BROKEN'}: {self.rows} rows")
        return out


def check_leases(chains: Mapping[str, ChainReport], leases: Iterable[Lease], *, whole_history: bool,
                 missing_predecessors: Mapping[str, str] | None = None,
                 window: tuple[int, int] | None = None) -> list[str]:
    """Pure: the zone's chains against the lease table (starting positions, landing progress, checkpoints).

    Over the whole history a shard's chain must start at a starting position (TRIM_HORIZON, LATEST,
    AT_TIMESTAMP): a first batch that follows a sequence number means the batches before it are gone. Its
    end must reach what the lease's landing progress says was landed and what the checkpoint committed:
    a shorter chain means its last batches are gone. Progress is a hint for resuming, but a hint the zone
    once confirmed, so the zone falling short of it is a loss.

    Over a `window` (not the whole history) a shard's landing progress and checkpoint are usually in a later
    window: the window's chain must reach them only when the last landed record arrived inside the window
    (its arrival time rides with the progress); a checkpoint is always checked against the progress itself."""
    leases = list(leases)
    progress = progress_from_leases(leases)
    missing = missing_predecessors or {}
    problems: list[str] = []
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shard_id, cp = lease.lease_key, lease.checkpoint
        chain = chains.get(shard_id)
        p = progress.get(shard_id)
        landed = p.landed if p is not None else None
        # Where the zone's end of the shard must be: anywhere (whole history), or in this window only when
        # the last landed record arrived in it.
        ends_here = whole_history or (window is not None and landed is not None and p is not None
                                      and p.landed_arrival_ms is not None
                                      and window[0] <= p.landed_arrival_ms < window[1])
        if landed is not None and not cp.is_sentinel and cp.key() > landed.key():
            problems.append(f"{shard_id}: checkpoint {cp} is past the lease's landing progress {landed}")
        if chain is None or chain.last is None:
            if ends_here and landed is not None:
                where = "" if whole_history else " in this window, where it arrived"
                problems.append(f"{shard_id}: the lease says {landed} was landed, the zone holds no batch of the "
                                f"shard{where}")
            elif whole_history and not cp.is_sentinel:
                problems.append(f"{shard_id}: checkpoint {cp}, but the zone holds no batch of the shard")
            continue
        if shard_id in missing:
            what = "the shard's first batch is missing" if whole_history else "the batch before the window is missing"
            problems.append(f"{shard_id}: the first batch follows {missing[shard_id]}, which the zone does not "
                            f"hold: {what}")
        elif whole_history and chain.starts_after is not None and not chain.starts_after.is_starting_sentinel:
            problems.append(f"{shard_id}: the chain starts after {chain.starts_after}, not at a starting position "
                            f"(TRIM_HORIZON, LATEST or AT_TIMESTAMP): the shard's first batch is missing")
        if not ends_here:
            continue
        last_batch = "the shard's last batch" if whole_history else "the window's last batch"
        if landed is not None and landed.key() > chain.last.key():
            problems.append(f"{shard_id}: the lease's landing progress says {landed} was landed, the zone ends at "
                            f"{chain.last}: {last_batch} is missing")
        if not cp.is_sentinel and cp.key() > chain.last.key():
            problems.append(f"{shard_id}: checkpoint {cp} is past the zone's last landed record {chain.last}")
    return problems


def leases_of_directory(directory: str, leases: Sequence[Lease]) -> list[Lease]:
    """The leases of the stream landing in `directory`, named by shard id as the zone names them.

    A single-stream application's lease keys are shard ids already. A multi-stream application's are
    `<account>:<name>:<creationEpoch>:<shardId>` and its streams land in `<name>@<creationEpoch>`
    (layout.stream_directory): the directory picks its incarnation's leases, renamed to shard ids (the lease
    keys never match a shard directory). Pure: the directory says which incarnation, no Kinesis call."""
    parsed = {lease.lease_key: parse_multi_stream_key(lease.lease_key) for lease in leases}
    if not any(parsed.values()):
        return list(leases)
    name, at, epoch = directory.rpartition("@")
    if not at or not epoch.isdigit():
        incarnations = sorted({stream_directory(p[0]) for p in parsed.values() if p is not None
                               and identifier_parts(p[0])[1] == directory})
        raise ValueError(f"the lease table is a multi-stream application's: its streams land in one directory per "
                         f"incarnation, <name>@<creationEpoch>; give --stream one of "
                         f"{', '.join(incarnations) or '(none of ' + repr(directory) + ' in the lease table)'}")
    identifiers = sorted({p[0] for p in parsed.values() if p is not None and stream_directory(p[0]) == directory})
    if len(identifiers) > 1:
        raise ValueError(f"directory {directory} is the incarnation of {', '.join(identifiers)} in the lease table "
                         f"(one name, several accounts): cannot tell whose leases to cross-check")
    if not identifiers:
        return []
    return slice_of(pinned_scope(identifiers[0]), leases, []).leases_by_shard_id()


def verify_zone(uri: str, window: tuple[int, int] | str | None = None, *, stream: str | None = None,
                shard: str | None = None, aws: AwsSettings | None = None, deep: bool = False,
                store: ZoneStore | None = None, leases: Sequence[Lease] | None = None,
                on_progress: Callable[[int, int], None] | None = None,
                stream_arn: str | None = None) -> ZoneReport:
    """Verify every shard's chain in the window (every stream of the zone unless `stream` is given: a directory,
    a name or an ARN, layout.landing_directory).

    Every batch must be of its directory's stream: an identity directory's (`<name>@<region>@<account>`), the
    `stream_arn` expected (a stream given by its ARN is expected), and one stream per directory (footers naming
    two are `mixed_streams`). With `leases` (the consumer application's lease table) the chains of `stream` (or
    the zone's only stream) are cross-checked against it too (`check_leases`). on_progress(done, total): after
    each batch read (total: the batches listed)."""
    if stream is not None and STREAM_ARN_RE.fullmatch(stream):
        stream_arn = stream_arn or stream
    if stream_arn is not None and not STREAM_ARN_RE.fullmatch(stream_arn):
        raise ValueError(f"stream ARN {stream_arn!r} is not one (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
    stream = landing_directory(stream) if stream else stream
    store = store or open_store(uri, aws)
    store.ensure_zone(create=False)
    span = parse_window(window) if isinstance(window, str) else window
    streams = [stream] if stream else store.list_dirs("")
    report = ZoneReport(store.uri, span, {})
    t0, t1 = span or (None, None)
    listings = {name: scan_batches(store, name, t0, t1, shard=shard) for name in streams}
    total = sum(len(listing.batches) for listing in listings.values())
    done = 0

    def one_batch() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    for name, listing in listings.items():
        report.bad_keys += listing.bad_keys
        if listing.batches:
            report.streams[name] = verify_batches(store, listing.batches, deep=deep, on_batch=one_batch,
                                                  stream_arn=stream_arn)
            mixed = mixed_streams(name, report.streams[name].values())
            if mixed is not None:
                report.mixed_streams.append(mixed)
            # With or without a lease table (one HEAD a shard): a first batch whose footer names a predecessor the
            # zone does not hold follows a lost batch — the audit's chain check fails it too. Before, only the
            # lease cross-check looked, so a lost first batch of a chain passed `landing verify` alone.
            for shard_id, r in sorted(report.streams[name].items()):
                if r.starts_after_key is not None and not store.exists(r.starts_after_key):
                    first = min((k for k in listing.batches if k.shard_id == shard_id), key=lambda k: k.first.key())
                    report.missing_predecessors.append(
                        f"{name}/{shard_id}: the first batch {first.key()} follows {r.starts_after_key}, which the "
                        f"zone does not hold (deleted?)")
    if leases is not None:
        multi_stream = any(parse_multi_stream_key(x.lease_key) for x in leases)
        if stream is None and len(streams) > 1 and not multi_stream:
            raise ValueError(f"landing zone {store.uri} holds streams {', '.join(streams)}: give --stream to "
                             f"cross-check the lease table")
        # A multi-stream application's leases cross-check each incarnation directory verified; a single
        # stream's, the stream.
        names = streams if multi_stream and stream is None else [stream or (streams[0] if streams else "")]
        report.leases_checked = 0
        for name in names:
            chains = report.streams.get(name, {})
            mine = leases_of_directory(name, leases)
            if shard is not None:
                mine = [x for x in mine if x.lease_key == shard]
            missing = {s: r.starts_after_key for s, r in chains.items()
                       if r.starts_after_key is not None and not store.exists(r.starts_after_key)}
            found = check_leases(chains, mine, whole_history=span is None, missing_predecessors=missing, window=span)
            report.lease_problems += [f"{name}/{p}" if multi_stream else p for p in found]
            report.leases_checked += len(mine)
    return report


# -- windows ----------------------------------------------------------------------------------------------

def parse_window(text: str) -> tuple[int, int]:
    """`START` (one hour), `START/END` or `START/PT<n>H|M` (ISO 8601 interval); UTC unless an offset is given.

    e.g. 2026-11-22T03:00, 2026-11-22T03:00/2026-11-22T04:00, 2026-11-22T03:00/PT15M.
    """
    start_text, _, end_text = text.partition("/")
    t0 = _parse_instant(start_text, text)
    if not end_text:
        t1 = t0 + HOUR_MS
    elif end_text.upper().startswith("PT"):
        t1 = t0 + _parse_duration(end_text, text)
    else:
        t1 = _parse_instant(end_text, text)
    check_window(t0, t1)
    return t0, t1


def _parse_instant(value: str, whole: str) -> int:
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"window {whole!r}: {value!r} is not an ISO 8601 time (e.g. 2026-11-22T03:00)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _parse_duration(value: str, whole: str) -> int:
    body = value.upper()[2:]
    total, number = 0, ""
    for ch in body:
        if ch.isdigit():
            number += ch
        elif ch in "HM" and number:
            total += int(number) * (HOUR_MS if ch == "H" else MINUTE_MS)
            number = ""
        else:
            break
    else:
        if not number and total:
            return total
    raise ValueError(f"window {whole!r}: duration {value!r} must look like PT1H, PT15M or PT1H30M")
