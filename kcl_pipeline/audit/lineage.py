"""The lineage audit: from a Kinesis sequence range, through the landed batches, to the transform's output.

Three checks per window [t0, t1), the same for the Dagster asset checks and `kcl-pipeline audit`:

* chain     every shard's batches form an unbroken chain (no gap, no overlap, no unreadable object), and
            the first one follows on from the shard's last batch of the previous window when it has one;
* counts    landed rows = transformed rows + duplicates dropped + quarantined rows, over the batches the
            window's commit names, from the landing zone and the commit (and, when given, the transform's own
            report agrees); a batch the commit names that the zone no longer holds is a loss; a window (or a
            batch landed after its run) not transformed is fine while its transform may still be on its way,
            and a failure once the window ended more than the transform grace ago (a stalled pipeline is
            never green);
* checkpoints  no committed checkpoint reaches into a batch its window's commit does not name, and SHARD_END
            only where the shard's last record is landed and every earlier window materialised (except the one
            holding its last record: see windows/checkpoints/plan.py); no checkpoint is past the last landed record; and
            the zone holds the last landed record the lease's landing progress names, in the window of the batch
            the progress names (`lost_last_batch`: a shard's lost last batch, which no footer names).

A window has materialised when its commit (`<output>/_commits/window=<YYYYMMDDTHHMMSSZ>.json`, written last
by the transform: docs/transform-commits.md) exists, and then only for the batches it names — what the
checkpoint plan trusts, so the audit judges by the same object. The per-dataset `_manifest.json` files prove
nothing on their own: a run that deleted the commit and failed leaves them in place.

`audit_window` audits chosen windows (the asset checks, `kcl-pipeline audit --window`); the whole history
is audited incrementally by `audit/history.py` (`kcl-pipeline audit`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Collection, Iterable, Mapping, Sequence

from ..kcl.core.model import Checkpoint, Lease
from ..kcl.core.table.lease_rules import held_by_another_protocol
from ..windows.manifest import COMMITS, CommitFormatError, WindowCommit, commit_key, is_commit_key
from ..zone.batch import BatchInfo, read_batch_info
from ..zone.chain import ChainReport, list_batches, mixed_streams, verify_batches, verify_chain
from ..zone.errors import CorruptBatchError, ZoneNotFoundError
from ..zone.layout import BatchKey, iso, landing_directory, overlapping_batches, parse_batch_key
from ..zone.progress import ShardProgress, progress_from_leases
from ..zone.store import ZoneStore

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
    """A window's committed output: its rows, and the landed batch keys its run read (None: the caller asserts
    the whole window, as pure tests do)."""

    transformed_rows: int
    quarantined_rows: int
    batches: frozenset[str] | None = None
    files: frozenset[str] = frozenset()  # the datasets' files the commit names, keys relative to the output root

    @classmethod
    def from_commit(cls, commit: WindowCommit, where: str) -> "OutputCounts":
        """The rows and files the commit records for both datasets; a commit without them is a
        CommitFormatError."""
        try:
            rows = [int(commit.datasets[name]["rows"]) for name in (TRANSFORMED, QUARANTINE)]
            files = frozenset(f"{name}/{output_partition(commit.window_start_ms)}/{str(file)}"
                              for name in (TRANSFORMED, QUARANTINE) for file in commit.datasets[name]["files"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitFormatError(f"{where}: no row count or files for the {TRANSFORMED} and {QUARANTINE} "
                                    f"datasets ({type(exc).__name__}: {exc})") from exc
        return cls(rows[0], rows[1], commit.batches, files)


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
    whole_history: bool = False  # a summary of the check over [window_start_ms, window_end_ms), many windows


@dataclass
class AuditReport:
    """Outcomes per window and check. A whole-history audit (audit/history.py) lists only the failed windows'
    outcomes, then one summary per check over the history, and says what it covered (`scopes`)."""

    outcomes: list[CheckOutcome] = field(default_factory=list)
    scopes: list[Any] = field(default_factory=list)  # audit_history.HistoryScope, one per stream audited

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def lines(self) -> list[str]:
        out: list[str] = []
        for o in self.outcomes:
            where = f"{o.stream} " if o.stream else ""
            when = (f"{iso(o.window_start_ms)}..{iso(o.window_end_ms)}" if o.whole_history
                    else iso(o.window_start_ms))
            out.append(f"{where}{when} {o.check:<11} {'OK' if o.ok else 'FAILED'}: {o.summary}")
            out += [f"    {line}" for line in o.details]
        out += [scope.line() for scope in self.scopes]
        failed = sum(1 for o in self.outcomes if not o.ok)
        if self.scopes:
            windows = sum(scope.windows for scope in self.scopes)
            out.append(f"{'OK' if self.ok else 'FAILED'}: the whole history, {windows} windows"
                       + (f", {failed} failed checks" if failed else ""))
            return out
        windows = len({o.window_start_ms for o in self.outcomes})
        out.append(f"{'OK' if self.ok else 'FAILED'}: {len(self.outcomes)} checks over {windows} windows"
                   + (f", {failed} failed" if failed else ""))
        return out


# -- the checks (pure) -------------------------------------------------------------------------------------

def check_chain(t0: int, t1: int, reports: Mapping[str, ChainReport],
                previous_last: Mapping[str, Checkpoint],
                missing_predecessors: Mapping[str, str] | None = None, directory: str | None = None) -> CheckOutcome:
    """`previous_last`: per shard, the last position of its batches in the previous window (when it has any);
    `missing_predecessors`: per shard, the predecessor key its first batch names but the zone does not hold.

    A first batch that names its predecessor (footer `prev_key`) is linked to it directly, across any number
    of empty windows; one that follows a starting position AT_TIMESTAMP (a backfill) starts a chain of its
    own. Only batches landed before predecessor keys existed fall back to the previous window's last batch.
    Stream identity as `landing verify` judges it: a batch of another stream (`ChainReport.foreign`) breaks its
    shard's chain; batches of `directory` naming two streams (chain.mixed_streams) fail the check."""
    details: list[str] = []
    broken: list[str] = []
    missing = missing_predecessors or {}
    for shard_id, r in sorted(reports.items()):
        problems = [f"gap after {g.after}: {g.next_key} follows {g.next_prev}" for g in r.gaps]
        problems += [f"overlap: {o.first_key} and {o.second_key}" for o in r.overlaps]
        problems += [f"unreadable: {k}: {why}" for k, why in sorted(r.corrupt.items())]
        problems += [f"foreign: {line}" for line in r.foreign]
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
    mixed = mixed_streams(directory, reports.values()) if directory is not None else None
    summary = (f"{len(reports)} shards, chains unbroken" if not broken
               else f"chain broken in {', '.join(broken)}")
    if mixed is not None:
        details.append(f"mixed streams: {mixed}")
        summary = f"mixed streams: {mixed}" if not broken else f"{summary}; mixed streams: {mixed}"
    return CheckOutcome("chain", t0, t1, not broken and mixed is None, summary, tuple(details),
                        {"shards": len(reports), "broken_shards": len(broken),
                         "batches": sum(r.batches for r in reports.values()),
                         "rows": sum(r.rows for r in reports.values())})


def check_counts(t0: int, t1: int, landed_rows: int, duplicate_rows: int, output: OutputCounts | None,
                 transform: Mapping[str, int] | None = None, overdue_ms: int | None = None, *,
                 late: Sequence[str] = (), missing: Sequence[str] = (), unreadable: Sequence[str] = (),
                 output_error: str | None = None, missing_files: Sequence[str] = ()) -> CheckOutcome:
    """landed = transformed + duplicates + quarantined. With a commit (`output`), `landed_rows` and
    `duplicate_rows` count the batches it names; `missing`: the ones the zone no longer holds (their records are
    lost); `unreadable`: the ones whose rows cannot be counted; `late`: batches of the window it does not name
    (landed after its run). `output_error`: the window's commit could not be read; `missing_files`: output files
    the commit names that the output no longer holds (their rows are lost). `transform`: the transform's
    own report (rows_in, rows_out, duplicates_dropped, quarantined), checked against the zone and the commit.
    `overdue_ms`: how long past its deadline (window end + transform grace) the window is, when it is."""
    meta: dict[str, Any] = {"landed_rows": landed_rows, "duplicate_rows": duplicate_rows}
    if output_error is not None:
        summary = f"the window's commit cannot be read: {output_error}"
        return CheckOutcome("counts", t0, t1, False, summary, (summary,), meta)
    if output is None:
        if overdue_ms is not None and landed_rows:
            summary = (f"{landed_rows} rows landed and never transformed: the window's transform is "
                       f"{overdue_ms / 1000:.0f}s past its deadline (window end + transform grace)")
            return CheckOutcome("counts", t0, t1, False, summary, (summary,), {**meta, "overdue_seconds":
                                                                             overdue_ms // 1000})
        return CheckOutcome("counts", t0, t1, True, f"{landed_rows} rows landed; window not transformed yet",
                            (), meta)
    meta.update(transformed_rows=output.transformed_rows, quarantined_rows=output.quarantined_rows,
                late_batches=len(late), missing_batches=len(missing), missing_files=len(missing_files))
    problems = []
    if missing:
        problems.append(f"the window's commit names {len(missing)} batches the zone no longer holds (their records "
                        f"are lost): {', '.join(sorted(missing)[:5])}" + (" …" if len(missing) > 5 else ""))
    if missing_files:
        problems.append(f"the window's commit names {len(missing_files)} output files the output no longer holds "
                        f"(their rows are lost): {', '.join(sorted(missing_files)[:5])}"
                        + (" …" if len(missing_files) > 5 else ""))
    if unreadable:
        problems.append(f"{len(unreadable)} batches the commit names cannot be read, their rows not counted: "
                        f"{', '.join(sorted(unreadable)[:5])}" + (" …" if len(unreadable) > 5 else ""))
    accounted = output.transformed_rows + duplicate_rows + output.quarantined_rows
    if accounted != landed_rows and not (missing or unreadable):
        problems.append(f"landed {landed_rows} != transformed {output.transformed_rows} + duplicates "
                        f"{duplicate_rows} + quarantined {output.quarantined_rows} (= {accounted})")
    if transform is not None:
        expected = {"rows_in": landed_rows, "duplicates_dropped": duplicate_rows,
                    "rows_out": output.transformed_rows, "quarantined": output.quarantined_rows}
        for name, value in expected.items():
            if name in transform and int(transform[name]) != value:
                problems.append(f"the transform reported {name}={transform[name]}, the zone and output say {value}")
    pending = ""
    if late:
        names = ", ".join(sorted(late)[:5]) + (" …" if len(late) > 5 else "")
        if overdue_ms is not None:
            problems.append(f"{len(late)} batches landed after the window's run and were never transformed: the "
                            f"window is {overdue_ms / 1000:.0f}s past its deadline (window end + transform "
                            f"grace): {names}")
            meta["overdue_seconds"] = overdue_ms // 1000
        else:
            pending = f"; {len(late)} batches landed after its run, to be transformed by a new run: {names}"
    summary = (f"landed {landed_rows} = transformed {output.transformed_rows} + duplicates {duplicate_rows} "
               f"+ quarantined {output.quarantined_rows}{pending}") if not problems else "; ".join(problems)
    return CheckOutcome("counts", t0, t1, not problems, summary, tuple(problems), meta)


def lost_last_batch(shard_id: str, p: ShardProgress | None, stream: str | None,
                    held: Iterable[BatchKey]) -> tuple[BatchKey, str] | None:
    """The batch the lease's landing progress names (`landingLastBatchKey`, holding the last landed record) and
    the problem, when none of the shard's batches `held` reaches that record: the shard's last batch is lost.

    The chain check sees a lost batch only in the footer of the batch after it, so a shard's last batch lost
    (a closed shard, an idle stream: no batch follows it) is invisible to it; the progress is a
    hint the zone once confirmed (a holder reports a batch after landing it). Progress naming no batch, another
    shard's or another directory's (`stream`: the audited one, None: any) is not judged here."""
    if p is None or p.landed is None or not p.last_batch_key:
        return None
    named = parse_batch_key(p.last_batch_key)
    if named is None or named.shard_id != shard_id or (stream is not None and named.stream != stream):
        return None
    landed = p.landed.key()
    if any(b.shard_id == shard_id and b.last.key() >= landed for b in held):
        return None
    return named, (f"{shard_id}: the lease's landing progress says {p.landed} was landed and names "
                   f"{named.key()}, which the zone does not hold (deleted?): the shard's last batch is missing")


def check_checkpoints(t0: int, t1: int, batches: Sequence[BatchKey], leases: Iterable[Lease],
                      progress: Mapping[str, ShardProgress], materialised: bool | Collection[str],
                      stream: str | None = None) -> CheckOutcome:
    """`batches`: the window's landed batches (every shard); `materialised`: the batch keys its commit names
    (True: the whole window, False: none) — a checkpoint may reach only through batches that are named.
    `stream`: the landing directory audited (a lease's landing progress is judged in the window of the batch
    it names, `lost_last_batch`, when that batch is of this directory)."""
    named = None if isinstance(materialised, bool) else frozenset(materialised)

    def covered(b: BatchKey) -> bool:
        return materialised is True if named is None else b.key() in named

    by_shard: dict[str, list[BatchKey]] = {}
    for b in batches:
        by_shard.setdefault(b.shard_id, []).append(b)
    details: list[str] = []
    problems: list[str] = []
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shard_id, cp = lease.lease_key, lease.checkpoint
        p = progress.get(shard_id)
        if not cp.is_sentinel and p is not None and p.landed is not None and cp.key() > p.landed.key():
            if held_by_another_protocol(lease):
                # A Java KCL holder checkpoints what its own processor did: past the zone, and none of ours.
                details.append(f"{shard_id}: checkpoint {cp} is a Java holder's ({lease.lease_owner}), past the "
                               f"zone's {p.landed}: not judged")
            else:
                problems.append(f"{shard_id}: checkpoint {cp} is past the last landed record {p.landed}")
        lost = lost_last_batch(shard_id, p, stream, by_shard.get(shard_id, ()))
        if lost is not None and t0 <= lost[0].minute_ms < t1:
            problems.append(lost[1])
        mine = by_shard.get(shard_id)
        if not mine:
            continue
        first = min(mine, key=lambda b: b.first.key()).first
        last = max(mine, key=lambda b: b.last.key()).last
        details.append(f"{shard_id}: checkpoint {cp}; window holds {first}..{last}")
        open_batches = sorted((b for b in mine if not covered(b)), key=lambda b: b.first.key())
        if not open_batches or cp.is_starting_sentinel:
            continue
        if cp.is_shard_end:
            holds_last = p is not None and p.landed is not None and first.key() <= p.landed.key() <= last.key()
            if not holds_last:
                problems.append(f"{shard_id}: SHARD_END, but this window ({first}..{last}) has not materialised "
                                f"(batch {open_batches[0].key()}) and does not hold the shard's last record")
        elif cp.key() >= open_batches[0].first.key():
            what = ("which has not materialised" if len(open_batches) == len(mine)
                    else f"whose batch {open_batches[0].key()} its commit does not name")
            problems.append(f"{shard_id}: checkpoint {cp} reaches into this window ({first}..{last}), {what}")
    state = ("materialised" if materialised is True or (materialised is not False and not any(
        not covered(b) for b in batches)) else "not materialised")
    summary = (f"window {state}; {len(by_shard)} shards, no checkpoint beyond materialised records"
               if not problems else "; ".join(problems))
    return CheckOutcome("checkpoints", t0, t1, not problems, summary, tuple(details + problems),
                        {"materialised": materialised is not False, "shards": len(by_shard),
                         "violations": len(problems)})


# -- I/O -----------------------------------------------------------------------------------------------------

def read_output_counts(output: ZoneStore, window_start_ms: int) -> OutputCounts | None:
    """The window's committed output (None when it has no commit, i.e. has not materialised). A commit that
    cannot be read (truncated, not a window commit, no row counts) is a CommitFormatError naming the object."""
    key = commit_key(window_start_ms)
    try:
        raw = output.get_optional(key)
    except ZoneNotFoundError:
        return None
    if raw is None:
        return None
    where = f"{output.uri}/{key}"
    commit = WindowCommit.from_json(raw, where)
    if commit.window_start_ms != window_start_ms:
        raise CommitFormatError(f"{where}: the commit of window {commit.window_start_ms}, not {window_start_ms}")
    return OutputCounts.from_commit(commit, where)


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


def _read_infos(store: ZoneStore, batches: Sequence[BatchKey]) -> tuple[dict[str, BatchInfo], dict[str, str]]:
    """Each batch's footer (key -> info), and the keys that could not be read (key -> why)."""
    infos: dict[str, BatchInfo] = {}
    corrupt: dict[str, str] = {}
    for b in batches:
        try:
            infos[b.key()] = read_batch_info(store, b)
        except CorruptBatchError as exc:
            corrupt[b.key()] = str(exc)
    return infos, corrupt


def audit_window(store: ZoneStore, output: ZoneStore, stream: str, t0: int, t1: int, *,
                 leases: Sequence[Lease] | None = None, transform: Mapping[str, int] | None = None,
                 checks: Sequence[str] = CHECKS, now_ms: int | None = None,
                 transform_grace_ms: int = 0, stream_arn: str | None = None) -> list[CheckOutcome]:
    """Run `checks` for one window. `leases`: a lease-table snapshot (the checkpoints check needs it).
    `now_ms`: the time of the audit; a window (or a batch landed after its run) still untransformed
    `transform_grace_ms` after the window's end fails the counts check (without `now_ms`, never overdue).
    `stream_arn`: the stream every batch must be of (besides an identity directory's own)."""
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown audit checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    batches = list_batches(store, stream, t0, t1)
    outcomes: list[CheckOutcome] = []
    infos: dict[str, BatchInfo] = {}
    corrupt: dict[str, str] = {}
    if "chain" in checks or "counts" in checks:
        infos, corrupt = _read_infos(store, batches)
    if "chain" in checks:
        reports = verify_chain(list(infos.values()), corrupt, stream_arn)
        previous = _last_positions(list_batches(store, stream, t0 - (t1 - t0), t0))
        outcomes.append(check_chain(t0, t1, reports, previous, missing_predecessors(store, reports),
                                    landing_directory(stream)))
    output_counts: OutputCounts | None = None
    output_error: str | None = None
    if "counts" in checks or "checkpoints" in checks:
        try:
            output_counts = read_output_counts(output, t0)
        except CommitFormatError as exc:
            output_error = str(exc)  # the counts check fails naming it; nothing counts as materialised
    if "counts" in checks:
        deadline = t1 + transform_grace_ms
        overdue = now_ms - deadline if now_ms is not None and now_ms >= deadline else None
        outcomes.append(_window_counts(store, output, t0, t1, batches, infos, corrupt, output_counts, output_error,
                                       transform, overdue))
    if "checkpoints" in checks:
        if leases is None:
            outcomes.append(CheckOutcome("checkpoints", t0, t1, True, "no lease table given: not checked"))
        else:
            named: bool | frozenset[str] = (False if output_counts is None else True if output_counts.batches is None
                                            else output_counts.batches)
            outcomes.append(check_checkpoints(t0, t1, batches, leases, progress_from_leases(leases), named, stream))
    return outcomes


def _window_counts(store: ZoneStore, output_store: ZoneStore, t0: int, t1: int, batches: Sequence[BatchKey],
                   infos: Mapping[str, BatchInfo], corrupt: Mapping[str, str], output: OutputCounts | None,
                   output_error: str | None, transform: Mapping[str, int] | None, overdue: int | None) -> CheckOutcome:
    """The counts check of one window from its batches' footers and its commit."""
    held = {b.key(): b for b in batches}
    named = set(held) if output is None or output.batches is None else set(output.batches)
    counted = [held[k] for k in sorted(named & set(held))]
    landed = sum(infos[b.key()].rows for b in counted if b.key() in infos)
    duplicates = _duplicate_rows(store, counted)
    if output is None:
        return check_counts(t0, t1, landed, duplicates, None, transform, overdue, output_error=output_error)
    return check_counts(t0, t1, landed, duplicates, output, transform, overdue,
                        late=sorted(set(held) - named), missing=sorted(named - set(held)),
                        unreadable=sorted(b.key() for b in counted if b.key() in corrupt),
                        missing_files=sorted(output.files - _output_files(output_store, t0)))


def _output_files(output: ZoneStore, window_start_ms: int) -> set[str]:
    """The files both datasets hold for the window (one LIST each)."""
    found: set[str] = set()
    for dataset in (TRANSFORMED, QUARANTINE):
        try:
            found.update(output.list_keys(f"{dataset}/{output_partition(window_start_ms)}/"))
        except ZoneNotFoundError:
            pass
    return found


def _duplicate_rows(store: ZoneStore, batches: Sequence[BatchKey]) -> int:
    """Rows landed twice among `batches`: read only when two of a shard's batch ranges overlap (never, for
    fenced landing)."""
    overlapping = overlapping_batches(batches)
    if not overlapping:
        return 0
    reports = verify_batches(store, overlapping, deep=True)
    return sum(r.duplicate_rows or 0 for r in reports.values())


def materialised_windows(output: ZoneStore) -> list[int]:
    """Window starts (epoch millis) with a commit, in order."""
    try:
        keys = [k for k in output.list_keys(f"{COMMITS}/") if is_commit_key(k)]
    except ZoneNotFoundError:
        return []
    return sorted(commit_window(k) for k in keys)


def commit_window(key: str) -> int:
    """The window start (epoch millis) a commit key names (`is_commit_key` holds)."""
    start = datetime.strptime(key[len(COMMITS) + 1:-len(".json")], "window=%Y%m%dT%H%M%SZ")
    return int(start.replace(tzinfo=timezone.utc).timestamp() * 1000)
