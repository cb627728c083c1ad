"""The lineage audit: from a Kinesis sequence range, through the landed batches, to the transform's output.

Three checks per window [t0, t1), the same for the Dagster asset checks and `kcl-pipeline audit`:

* chain     every shard's batches form an unbroken chain (no gap, no overlap, no unreadable object), and
            the first one follows on from the shard's last batch of the previous window when it has one;
* counts    landed rows = transformed rows + duplicates dropped + quarantined rows, from the landing zone
            and the output's manifests (and, when given, the transform's own report agrees); a window with
            landed rows and no output is fine while its transform may still be on its way, and a failure
            once the window ended more than the transform grace ago (a stalled pipeline is never green);
* checkpoints  no committed checkpoint reaches into a window that has not materialised, and SHARD_END only
            where the shard's last record is landed and every earlier window materialised (except the one
            holding its last record: see checkpoint_plan.py); no checkpoint is past the last landed record.

A window has materialised when its output partition has a committed manifest (the transform's output is the
source of truth; the Dagster asset checks see the same). The output layout is the transform's contract:
`<output>/transformed/window=<YYYYMMDDTHHMMSSZ>/_manifest.json` and the same under `quarantine/`.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from ..kcl.core.model import Checkpoint, Lease
from ..kcl.shells.aws import AwsSettings
from .errors import ZoneNotFoundError
from .layout import BatchKey
from .progress import ShardProgress, progress_from_leases
from .store import ZoneStore, open_store
from .verify import ChainReport, list_batches, verify_batches

TRANSFORMED = "transformed"
QUARANTINE = "quarantine"
MANIFEST = "_manifest.json"
CHECKS = ("chain", "counts", "checkpoints")


def output_partition(window_start_ms: int) -> str:
    """The transform's partition directory of a window (transform/job.py window_partition)."""
    start = datetime.fromtimestamp(window_start_ms / 1000, tz=timezone.utc)
    return f"window={start:%Y%m%dT%H%M%SZ}"


@dataclass(frozen=True)
class OutputCounts:
    transformed_rows: int
    quarantined_rows: int


@dataclass(frozen=True)
class CheckOutcome:
    check: str  # chain | counts | checkpoints
    window_start_ms: int
    window_end_ms: int
    ok: bool
    summary: str
    details: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)  # JSON-ready numbers and strings
    stream: str | None = None  # named when one audit covers several streams


@dataclass
class AuditReport:
    outcomes: list[CheckOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def lines(self) -> list[str]:
        out: list[str] = []
        for o in self.outcomes:
            where = f"{o.stream} " if o.stream else ""
            out.append(f"{where}{_iso(o.window_start_ms)} {o.check:<11} {'OK' if o.ok else 'FAILED'}: {o.summary}")
            out += [f"    {line}" for line in o.details]
        failed = sum(1 for o in self.outcomes if not o.ok)
        windows = len({o.window_start_ms for o in self.outcomes})
        out.append(f"{'OK' if self.ok else 'FAILED'}: {len(self.outcomes)} checks over {windows} windows"
                   + (f", {failed} failed" if failed else ""))
        return out


# -- the checks (pure) -------------------------------------------------------------------------------------

def check_chain(t0: int, t1: int, reports: Mapping[str, ChainReport],
                previous_last: Mapping[str, Checkpoint],
                missing_predecessors: Mapping[str, str] | None = None) -> CheckOutcome:
    """`previous_last`: per shard, the last position of its batches in the previous window (when it has any);
    `missing_predecessors`: per shard, the predecessor key its first batch names but the zone does not hold.

    A first batch that names its predecessor (footer `prev_key`) is linked to it directly, across any number
    of empty windows; one that follows a starting position AT_TIMESTAMP (a backfill) starts a chain of its
    own. Only batches landed before predecessor keys existed fall back to the previous window's last batch."""
    details: list[str] = []
    broken: list[str] = []
    missing = missing_predecessors or {}
    for shard_id, r in sorted(reports.items()):
        problems = [f"gap after {g.after}: {g.next_key} follows {g.next_prev}" for g in r.gaps]
        problems += [f"overlap: {o.first_key} and {o.second_key}" for o in r.overlaps]
        problems += [f"unreadable: {k}: {why}" for k, why in sorted(r.corrupt.items())]
        before = previous_last.get(shard_id)
        link = "no batch in the previous window"
        if shard_id in missing:
            problems.append(f"first batch follows {missing[shard_id]}, which the zone does not hold (deleted?)")
            link = "predecessor missing"
        elif r.starts_after_key is not None:
            link = f"follows {r.starts_after_key}"
        elif r.starts_after is not None and r.starts_after.sequence_number == "AT_TIMESTAMP":
            link = "starts a backfill (AT_TIMESTAMP)"
        elif before is not None:
            if r.starts_after == before:
                link = f"follows {before} (previous window)"
            else:
                problems.append(f"first batch follows {r.starts_after}, but the previous window ends at {before}")
                link = "does not follow the previous window"
        if problems:
            broken.append(shard_id)
        details.append(f"{shard_id}: {r.batches} batches, {r.rows} rows, {r.first}..{r.last}; {link}")
        details += [f"  {p}" for p in problems]
    summary = (f"{len(reports)} shards, chains unbroken" if not broken
               else f"chain broken in {', '.join(broken)}")
    return CheckOutcome("chain", t0, t1, not broken, summary, tuple(details),
                        {"shards": len(reports), "broken_shards": len(broken),
                         "batches": sum(r.batches for r in reports.values()),
                         "rows": sum(r.rows for r in reports.values())})


def check_counts(t0: int, t1: int, landed_rows: int, duplicate_rows: int, output: OutputCounts | None,
                 transform: Mapping[str, int] | None = None, overdue_ms: int | None = None) -> CheckOutcome:
    """landed = transformed + duplicates + quarantined. `transform`: the transform's own report (rows_in,
    rows_out, duplicates_dropped, quarantined), checked against the zone and the manifests when given.
    `overdue_ms`: how long past its deadline (window end + transform grace) the window is, when it is."""
    meta: dict[str, Any] = {"landed_rows": landed_rows, "duplicate_rows": duplicate_rows}
    if output is None:
        if overdue_ms is not None and landed_rows:
            summary = (f"{landed_rows} rows landed and never transformed: the window's transform is "
                       f"{overdue_ms / 1000:.0f}s past its deadline (window end + transform grace)")
            return CheckOutcome("counts", t0, t1, False, summary, (summary,), {**meta, "overdue_seconds":
                                                                             overdue_ms // 1000})
        return CheckOutcome("counts", t0, t1, True, f"{landed_rows} rows landed; window not transformed yet",
                            (), meta)
    meta.update(transformed_rows=output.transformed_rows, quarantined_rows=output.quarantined_rows)
    accounted = output.transformed_rows + duplicate_rows + output.quarantined_rows
    problems = []
    if accounted != landed_rows:
        problems.append(f"landed {landed_rows} != transformed {output.transformed_rows} + duplicates "
                        f"{duplicate_rows} + quarantined {output.quarantined_rows} (= {accounted})")
    if transform is not None:
        expected = {"rows_in": landed_rows, "duplicates_dropped": duplicate_rows,
                    "rows_out": output.transformed_rows, "quarantined": output.quarantined_rows}
        for name, value in expected.items():
            if name in transform and int(transform[name]) != value:
                problems.append(f"the transform reported {name}={transform[name]}, the zone and output say {value}")
    summary = (f"landed {landed_rows} = transformed {output.transformed_rows} + duplicates {duplicate_rows} "
               f"+ quarantined {output.quarantined_rows}") if not problems else "; ".join(problems)
    return CheckOutcome("counts", t0, t1, not problems, summary, tuple(problems), meta)


def check_checkpoints(t0: int, t1: int, batches: Sequence[BatchKey], leases: Iterable[Lease],
                      progress: Mapping[str, ShardProgress], materialised: bool) -> CheckOutcome:
    """`batches`: the window's landed batches (every shard); `materialised`: the window's output exists."""
    by_shard: dict[str, list[BatchKey]] = {}
    for b in batches:
        by_shard.setdefault(b.shard_id, []).append(b)
    details: list[str] = []
    problems: list[str] = []
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shard_id, cp = lease.lease_key, lease.checkpoint
        p = progress.get(shard_id)
        if not cp.is_sentinel and p is not None and p.landed is not None and cp.key() > p.landed.key():
            problems.append(f"{shard_id}: checkpoint {cp} is past the last landed record {p.landed}")
        mine = by_shard.get(shard_id)
        if not mine:
            continue
        first = min(mine, key=lambda b: b.first.key()).first
        last = max(mine, key=lambda b: b.last.key()).last
        details.append(f"{shard_id}: checkpoint {cp}; window holds {first}..{last}")
        if materialised or cp.is_starting_sentinel:
            continue
        if cp.is_shard_end:
            holds_last = p is not None and p.landed is not None and first.key() <= p.landed.key() <= last.key()
            if not holds_last:
                problems.append(f"{shard_id}: SHARD_END, but this window ({first}..{last}) has not materialised "
                                f"and does not hold the shard's last record")
        elif cp.key() >= first.key():
            problems.append(f"{shard_id}: checkpoint {cp} reaches into this window ({first}..{last}), "
                            f"which has not materialised")
    state = "materialised" if materialised else "not materialised"
    summary = (f"window {state}; {len(by_shard)} shards, no checkpoint beyond materialised records"
               if not problems else "; ".join(problems))
    return CheckOutcome("checkpoints", t0, t1, not problems, summary, tuple(details + problems),
                        {"materialised": materialised, "shards": len(by_shard), "violations": len(problems)})


# -- I/O -----------------------------------------------------------------------------------------------------

def read_output_counts(output: ZoneStore, window_start_ms: int) -> OutputCounts | None:
    """Rows of the window's committed output (None when the window has no committed output)."""
    counts = []
    for dataset in (TRANSFORMED, QUARANTINE):
        key = f"{dataset}/{output_partition(window_start_ms)}/{MANIFEST}"
        try:
            present = key in set(output.list_keys(key))
        except ZoneNotFoundError:
            return None
        if not present:
            return None
        counts.append(int(json.loads(output.get(key))["rows"]))
    return OutputCounts(*counts)


def missing_predecessors(store: ZoneStore, reports: Mapping[str, ChainReport]) -> dict[str, str]:
    """Per shard, the predecessor its window's first batch names when the zone does not hold it (one HEAD each)."""
    return {shard_id: r.starts_after_key for shard_id, r in reports.items()
            if r.starts_after_key is not None and not store.exists(r.starts_after_key)}


def _last_positions(batches: Iterable[BatchKey]) -> dict[str, Checkpoint]:
    out: dict[str, Checkpoint] = {}
    for b in batches:
        if b.shard_id not in out or b.last.key() > out[b.shard_id].key():
            out[b.shard_id] = b.last
    return out


def audit_window(store: ZoneStore, output: ZoneStore, stream: str, t0: int, t1: int, *,
                 leases: Sequence[Lease] | None = None, transform: Mapping[str, int] | None = None,
                 checks: Sequence[str] = CHECKS, now_ms: int | None = None,
                 transform_grace_ms: int = 0) -> list[CheckOutcome]:
    """Run `checks` for one window. `leases`: a lease-table snapshot (the checkpoints check needs it).
    `now_ms`: the time of the audit; a window still untransformed `transform_grace_ms` after its end fails
    the counts check (without `now_ms`, untransformed windows are never overdue)."""
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown audit checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    batches = list_batches(store, stream, t0, t1)
    outcomes: list[CheckOutcome] = []
    reports: dict[str, ChainReport] = {}  # read only when a check needs them
    if "chain" in checks or "counts" in checks:
        reports = verify_batches(store, batches)
        if any(r.overlaps for r in reports.values()):
            reports = verify_batches(store, batches, deep=True)  # count the rows landed twice
    if "chain" in checks:
        previous = _last_positions(list_batches(store, stream, t0 - (t1 - t0), t0))
        outcomes.append(check_chain(t0, t1, reports, previous, missing_predecessors(store, reports)))
    output_counts = read_output_counts(output, t0) if ("counts" in checks or "checkpoints" in checks) else None
    if "counts" in checks:
        landed = sum(r.rows for r in reports.values())
        duplicates = sum(r.duplicate_rows or 0 for r in reports.values())
        deadline = t1 + transform_grace_ms
        overdue = now_ms - deadline if now_ms is not None and now_ms >= deadline else None
        outcomes.append(check_counts(t0, t1, landed, duplicates, output_counts, transform, overdue))
    if "checkpoints" in checks:
        if leases is None:
            outcomes.append(CheckOutcome("checkpoints", t0, t1, True, "no lease table given: not checked"))
        else:
            outcomes.append(check_checkpoints(t0, t1, batches, leases, progress_from_leases(leases),
                                              output_counts is not None))
    return outcomes


def materialised_windows(output: ZoneStore) -> list[int]:
    """Window starts (epoch millis) with a committed transformed partition, in order."""
    try:
        names = output.list_dirs(f"{TRANSFORMED}/")
    except ZoneNotFoundError:
        return []
    out = []
    for name in names:
        try:
            start = datetime.strptime(name, "window=%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        out.append(int(start.timestamp() * 1000))
    return sorted(out)


def landed_windows(store: ZoneStore, stream: str, window_ms: int, last: int) -> list[int]:
    """The starts of the newest `last` windows with landed batches (from the zone's minute prefixes,
    newest first: a few LIST calls, never one per batch)."""
    found: set[int] = set()
    for day in sorted(store.list_dirs(f"{stream}/"), reverse=True):
        for hour in sorted(store.list_dirs(f"{stream}/{day}/"), reverse=True):
            for minute in sorted(store.list_dirs(f"{stream}/{day}/{hour}/"), reverse=True):
                try:
                    at = datetime.strptime(f"{day} {hour} {minute}", "dt=%Y-%m-%d hh=%H mm=%M")
                except ValueError:
                    continue  # not a minute of the layout (a stray folder): not a window
                ms = int(at.replace(tzinfo=timezone.utc).timestamp() * 1000)
                found.add(ms - ms % window_ms)
                if len(found) > last:
                    return sorted(found)[-last:]
    return sorted(found)[-last:] if last > 0 else []


def audit(zone_uri: str, output_uri: str, stream: str, window_ms: int, *,
          window: tuple[int, int] | None = None, application: str | None = None, aws: AwsSettings | None = None,
          last: int = 24, store: ZoneStore | None = None, output: ZoneStore | None = None,
          leases: Sequence[Lease] | None = None, now_ms: int | None = None,
          transform_grace_ms: int = 300_000) -> AuditReport:
    """Audit the windows of `window` (split into `window_ms` windows), or else the newest `last` windows that
    landed or materialised (a window that landed and never materialised is audited too: it is how a stalled
    pipeline shows). Untransformed windows older than their end + `transform_grace_ms` at `now_ms` (default:
    now) fail.

    The lease table of `application` is scanned for the checkpoints check (read only); without an
    application (and no `leases`) that check is skipped.
    """
    if transform_grace_ms < 0:
        raise ValueError(f"transform_grace_ms must be >= 0, got {transform_grace_ms}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if window_ms <= 0 or window_ms % 60_000:
        raise ValueError(f"window_ms must be a positive whole number of minutes, got {window_ms}")
    store = store or open_store(zone_uri, aws)
    output = output or open_store(output_uri, aws)
    store.ensure_zone(create=False)
    if window is not None:
        t0, t1 = window
        if t0 % window_ms or t1 % window_ms or t1 <= t0:
            raise ValueError(f"window [{t0}, {t1}) must be whole {window_ms // 60_000}-minute windows of the pipeline")
        starts = list(range(t0, t1, window_ms))
    else:
        starts = sorted(set(materialised_windows(output)[-last:]) | set(landed_windows(store, stream, window_ms, last))
                        )[-last:] if last > 0 else []
    if leases is None and application:
        from ..kcl.shells.aws import client
        from ..kcl.shells.lease_table import LeaseTable

        leases = LeaseTable(application, client("dynamodb", aws)).scan()
    report = AuditReport()
    for start in starts:
        report.outcomes += audit_window(store, output, stream, start, start + window_ms, leases=leases,
                                        now_ms=now_ms, transform_grace_ms=transform_grace_ms)
    return report


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
