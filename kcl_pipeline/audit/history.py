"""The lineage audit over a stream's whole history, incrementally: `kcl-pipeline audit` without `--window`.

The audit once looked at the newest 24 windows only, so a window that stalled (or lost a batch) earlier
passed for ever. Now every run covers every window the zone or the output holds, and its cost follows what
changed, not how long the history is:

1. **List** the stream's landing directory, the output's commits (with their version tags) and the output's
   dataset partitions (one LIST per 1,000 objects; the only requests whose number grows with the history). The
   listing is what makes the audit whole: a batch deleted from an old window, a commit removed or rewritten,
   an output partition gone, is seen here. A thorough audit (`full`, or the first) lists every output file
   instead; an incremental one lists the files of the commits it reads.
2. **Read** only the objects the index (audit/index.py, in the output zone) has no facts for under the same
   tag: after the first audit, the new batches' footers and the new or rewritten commits (reads run in
   parallel, `workers` at a time). The listing is the evidence that an object is unchanged: its tag (S3's
   ETag, the digest of the object's bytes; a file's inode, mtime and size) is the one the facts were filed
   under, and the facts are a function of those bytes. Each read's facts are filed under the tag of the
   bytes it read (an object replaced after it was listed is judged, and indexed, as read). A read that
   fails stops the audit naming the object (AuditIncompleteError): no verdict, never a skipped object.
   A thorough audit reads every footer and every commit: two reads a window, neither of which the listing
   can stand in for (a batch's rows and predecessor are in its footer only; a window's named batches and
   counts in its commit only — the datasets' manifests are not trusted, issue 20 item 4).
3. **Judge** every window from the facts (pure, in memory): the same three checks as audit/lineage.py's — the chain
   of every shard over the whole history (each batch against the one before it; a first batch that names a
   predecessor the zone does not hold), the counts of every window against its commit, every checkpoint
   against the batches the commits name.
4. **Save** the index when its facts changed.

The report names each failed window and check, and sums up each check over the history.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, TypeVar

from ..kcl.core.model import Lease
from ..kcl.core.table.lease_rules import held_by_another_protocol
from ..windows.manifest import COMMITS, CommitFormatError, WindowCommit, is_commit_key
from ..windows.scan import window_floor
from ..zone.batch import BatchInfo, format_position, parse_position, read_batch_info
from ..zone.chain import ChainReport, foreign_batch, mixed_streams, verify_batches, verify_chain
from ..zone.errors import CorruptBatchError, LandingError, ZoneNotFoundError
from ..zone.layout import BatchKey, iso, overlapping_batches, split_batch_keys
from ..zone.progress import ShardProgress, progress_from_leases
from ..zone.store import ObjectVersion, ZoneStore
from .index import AuditIndex, BatchFacts, CommitFacts, IndexFormatError, index_key
from .lineage import (
    CHECKS,
    QUARANTINE,
    TRANSFORMED,
    AuditReport,
    CheckOutcome,
    OutputCounts,
    check_counts,
    commit_window,
    lost_last_batch,
)

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 16  # concurrent reads: S3 answers each in milliseconds; the audit waits on the network
F = TypeVar("F", BatchFacts, CommitFacts)


@dataclass(frozen=True)
class HistoryScope:
    """What a history audit covered and what it had to read."""

    directory: str
    windows: int
    first_window_ms: int | None
    end_ms: int | None
    batches: int
    commits: int
    read_batches: int
    read_commits: int
    index: str  # where the index is kept
    note: str = ""  # how the index was used when not simply (ignored on request, unreadable, …)
    stream: str | None = None  # named when one audit covers several streams

    def line(self) -> str:
        where = f"{self.stream} " if self.stream else ""
        span = "" if self.first_window_ms is None or self.end_ms is None else \
            f" [{iso(self.first_window_ms)}, {iso(self.end_ms)})"
        return (f"{where}history of {self.directory}: {self.windows} windows{span}, {self.batches} batches, "
                f"{self.commits} commits; read {self.read_batches} footers and {self.read_commits} commits, the "
                f"rest from the index {self.index}" + (f" ({self.note})" if self.note else ""))


def audit_history(store: ZoneStore, output: ZoneStore, directory: str, window_ms: int, *,
                  leases: Sequence[Lease] | None = None, now_ms: int | None = None, transform_grace_ms: int = 300_000,
                  full: bool = False, first_window_ms: int | None = None, workers: int = DEFAULT_WORKERS,
                  save: bool = True, stream_arn: str | None = None) -> AuditReport:
    """Audit every window of `directory` (a stream's landing directory) against `output` (its transform output,
    where the index is kept). `leases`: the stream's leases by shard id (the checkpoints check; None skips it).
    `full`: ignore the index and read every object again. `first_window_ms`: the first partition's start (a
    batch before it belongs to no window run: never transformed by design, not counted, stepped over by the
    checkpoint plan). `stream_arn`: the stream every batch must be of (besides an identity directory's own)."""
    if window_ms <= 0 or window_ms % 60_000:
        raise ValueError(f"window_ms must be a positive whole number of minutes, got {window_ms}")
    if transform_grace_ms < 0:
        raise ValueError(f"transform_grace_ms must be >= 0, got {transform_grace_ms}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    store.ensure_zone(create=False)
    key = index_key(directory)
    old, note = _load_index(output, key, store.uri, directory, full)
    facts = AuditIndex(store.uri, directory, audited_at_ms=now_ms)
    # The four listings (landing, commits, both datasets) run at once, and each object to read is read as soon
    # as its page is listed: the reads overlap the listings (four workers list; `workers` more read).
    # Output files: a thorough audit (--full, or no index) lists every file of both datasets; an incremental
    # one lists their partitions (one entry a window, not one per file) and the files of the commits it reads.
    thorough = full or not old.commits
    with ThreadPoolExecutor(max_workers=max(1, workers) + 4, thread_name_prefix="audit") as pool:
        try:
            landing = pool.submit(_gather_batches, store, directory, old.batches, pool)
            outputs = pool.submit(_gather_commits, output, old.commits, pool)
            listed = [pool.submit(_output_files if thorough else _output_partitions, output, dataset)
                      for dataset in (TRANSFORMED, QUARANTINE)]
            batch_versions, malformed, reused_batches, batch_reads = landing.result()
            commit_versions, reused_commits, commit_reads = outputs.result()
            facts.batches.update(reused_batches)
            facts.batches.update(_results(batch_reads, directory))
            facts.commits.update(reused_commits)
            facts.commits.update(_results(commit_reads, directory))
            output_listing = set().union(*(f.result() for f in listed))
            if thorough:
                lost = {k: sorted(c.files - output_listing) for k, c in facts.commits.items()}
            else:
                read = {k: pool.submit(_files_of, output, facts.commits[k].files) for k in commit_reads}
                lost = {k: sorted(c.files - read[k].result()) if k in read else
                        sorted(f for f in c.files if _partition(f) not in output_listing)
                        for k, c in facts.commits.items()}
        except BaseException:
            # A listing or a read failed: the reads still queued are dropped, so the error surfaces once the
            # reads in flight end (at most `workers`), not after the rest of the history was read for nothing.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    unread_batches, unread_commits = list(batch_reads), list(commit_reads)
    if save and (full or old.batches != facts.batches or old.commits != facts.commits or old.zone != facts.zone):
        try:
            output.put(key, facts.to_bytes())
        except ZoneNotFoundError as exc:
            # Nothing was ever transformed (the output's directory or bucket is not there yet): the audit
            # stands, and the next one reads what it read again.
            note = "; ".join(filter(None, [note, f"index not saved: {exc}"]))
    batches = {k: (batch_versions[k][0], f) for k, f in facts.batches.items()}
    commits = {commit_window(k): f for k, f in facts.commits.items()}
    duplicates = _duplicates(store, batches, commits, window_ms)
    outcomes, windows = judge_history(batches, commits, window_ms, leases=leases, now_ms=now_ms,
                                      transform_grace_ms=transform_grace_ms, first_window_ms=first_window_ms,
                                      duplicates=duplicates, malformed=malformed, stream_arn=stream_arn,
                                      missing_files={commit_window(k): v for k, v in lost.items() if v})
    scope = HistoryScope(directory, len(windows), windows[0] if windows else None,
                         windows[-1] + window_ms if windows else None, len(batches), len(commits),
                         len(unread_batches), len(unread_commits), f"{output.uri}/{key}", note)
    log.info("%s", scope.line())
    return AuditReport(outcomes, [scope])


# -- I/O --------------------------------------------------------------------------------------------------------

def _gather_batches(store: ZoneStore, directory: str, known: Mapping[str, BatchFacts], pool: Executor):
    """List the stream's landed batches; each one the index has no facts for under its listed tag is read at
    once (in `pool`). Returns (key -> (batch, version), malformed .parquet keys, facts reused, key -> read)."""
    versions: dict[str, tuple[BatchKey, ObjectVersion]] = {}
    malformed: list[str] = []
    reused: dict[str, BatchFacts] = {}
    reads: dict[str, Future[BatchFacts]] = {}
    for version in store.list_versions(f"{directory}/"):
        if not version.key.endswith(".parquet"):
            continue  # fencing links, start links
        listing = split_batch_keys([version.key])
        if not listing.batches or listing.batches[0].stream != directory:
            malformed.append(version.key)
            continue
        batch = listing.batches[0]
        versions[version.key] = (batch, version)
        fact = known.get(version.key)
        if fact is not None and version.tag and fact.tag == version.tag:
            reused[version.key] = fact
        else:
            reads[version.key] = pool.submit(_batch_facts, store, batch, version.tag)
    return versions, malformed, reused, reads


def _gather_commits(output: ZoneStore, known: Mapping[str, CommitFacts], pool: Executor):
    """The same for the output's window commits: (key -> version, facts reused, key -> read)."""
    versions: dict[str, ObjectVersion] = {}
    reused: dict[str, CommitFacts] = {}
    reads: dict[str, Future[CommitFacts]] = {}
    try:
        listed = [v for v in output.list_versions(f"{COMMITS}/") if is_commit_key(v.key)]
    except ZoneNotFoundError:
        listed = []  # nothing was ever transformed
    for version in listed:
        versions[version.key] = version
        fact = known.get(version.key)
        if fact is not None and version.tag and fact.tag == version.tag:
            reused[version.key] = fact
        else:
            reads[version.key] = pool.submit(_commit_facts, output, version.key, version.tag)
    return versions, reused, reads


class AuditIncompleteError(LandingError):
    """An object the audit had to read could not be read (the store failed, or the object went away after it was
    listed): the audit has no verdict, and says which object stopped it."""


def _results(reads: Mapping[str, Future[F]], directory: str) -> dict[str, F]:
    """The facts of concurrent reads, in key order. The first that failed stops the audit, with the store's own
    error (which names the object, what failed and why): a failed read is never taken for a fact, nor skipped."""
    out: dict[str, F] = {}
    for key, future in reads.items():
        try:
            out[key] = future.result()
        except LandingError as exc:
            raise AuditIncompleteError(f"the audit of {directory} stopped without a verdict, an object it listed "
                                       f"could not be read: {exc}") from exc
    return out


def _load_index(output: ZoneStore, key: str, zone: str, directory: str, full: bool) -> tuple[AuditIndex, str]:
    empty = AuditIndex(zone, directory)
    if full:
        return empty, "full audit: the index was not used"
    try:
        raw = output.get_optional(key)
    except ZoneNotFoundError:
        return empty, ""
    if raw is None:
        return empty, "no index yet: every object read"
    try:
        index = AuditIndex.from_bytes(raw, f"{output.uri}/{key}")
    except IndexFormatError as exc:
        log.warning("audit index not used, every object is read again: %s", exc)
        return empty, f"index unreadable, every object read: {exc}"
    if (index.zone, index.directory) != (zone, directory):
        return empty, f"the index was of {index.zone} {index.directory}: every object read"
    return index, ""


class _TaggedReads:
    """`store` as read_batch_info reads it, keeping the tag of the bytes it read: the facts go into the index
    under that tag, not the listed one. An object replaced between its listing and its read is judged as read,
    and its facts are never filed under the tag it had when listed (it could come back to those very bytes, an
    S3 ETag being their digest, and be judged by another content's facts)."""

    def __init__(self, store: ZoneStore, listed: str):
        self.store, self.uri, self.listed = store, store.uri, listed
        self.tags: set[str] = set()

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        body, size, tag = self.store.get_tail_version(key, nbytes)
        self.tags.add(tag)
        return body, size

    def get(self, key: str) -> bytes:
        body, tag = self.store.get_version(key)
        self.tags.add(tag)
        return body

    def tag(self) -> str:
        """The tag of what was read: the listed one when the store cannot tell (as before it could), none ("":
        never reused) when two reads of the object saw different bytes."""
        if len(self.tags) > 1:
            return ""
        read = next(iter(self.tags), "")
        return read or self.listed


def _batch_facts(store: ZoneStore, key: BatchKey, tag: str) -> BatchFacts:
    reads = _TaggedReads(store, tag)
    try:
        info = read_batch_info(reads, key)
    except CorruptBatchError as exc:
        return BatchFacts(reads.tag(), error=str(exc))  # it keeps its place in the chain, which it breaks
    return BatchFacts(reads.tag(), format_position(info.prev), info.prev_key or "", info.rows,
                      stream_arn=info.stream_arn or "")


def _commit_facts(output: ZoneStore, key: str, tag: str) -> CommitFacts:
    where = f"{output.uri}/{key}"
    reads = _TaggedReads(output, tag)
    try:
        commit = WindowCommit.from_json(reads.get(key), where)
        if commit.window_start_ms != commit_window(key):
            raise CommitFormatError(f"{where}: the commit of window {commit.window_start_ms}, not "
                                    f"{commit_window(key)}")
        counts = OutputCounts.from_commit(commit, where)
    except CommitFormatError as exc:
        return CommitFacts(reads.tag(), error=str(exc))  # the window's counts check fails naming it
    return CommitFacts(reads.tag(), commit.batches, counts.transformed_rows, counts.quarantined_rows,
                       files=counts.files)


def _output_files(output: ZoneStore, dataset: str) -> set[str]:
    """Every file of a dataset (the listing proves the files the commits name are still there)."""
    try:
        return set(output.list_keys(f"{dataset}/"))
    except ZoneNotFoundError:
        return set()


def _output_partitions(output: ZoneStore, dataset: str) -> set[str]:
    """Every window partition of a dataset, `<dataset>/window=…` (one listing entry a window)."""
    try:
        return {f"{dataset}/{name}" for name in output.list_dirs(f"{dataset}/")}
    except ZoneNotFoundError:
        return set()


def _partition(file_key: str) -> str:
    """`transformed/window=…/run=…/part-0.parquet` -> `transformed/window=…`."""
    return "/".join(file_key.split("/", 2)[:2])


def _files_of(output: ZoneStore, files: Iterable[str]) -> set[str]:
    """The files the partitions of `files` hold (one LIST each)."""
    found: set[str] = set()
    for partition in sorted({_partition(f) for f in files}):
        try:
            found.update(output.list_keys(f"{partition}/"))
        except ZoneNotFoundError:
            pass
    return found


def _duplicates(store: ZoneStore, batches: Mapping[str, tuple[BatchKey, BatchFacts]],
                commits: Mapping[int, CommitFacts], window_ms: int) -> dict[int, int]:
    """Rows landed twice among the batches each window's commit names: read (deep) only for windows where two
    of a shard's batch ranges overlap — never, for fenced landing."""
    by_window: dict[int, dict[str, list[BatchKey]]] = {}
    for key, _facts in batches.values():
        by_window.setdefault(window_floor(key.minute_ms, window_ms), {}).setdefault(key.shard_id, []).append(key)
    out: dict[int, int] = {}
    for w, shards in by_window.items():
        named = commits[w].batches if w in commits else None
        overlapping = overlapping_batches([b for mine in shards.values() for b in mine
                                           if named is None or b.key() in named])
        if overlapping:
            out[w] = sum(r.duplicate_rows or 0 for r in verify_batches(store, overlapping, deep=True).values())
    return out


# -- judging (pure) ---------------------------------------------------------------------------------------------

def judge_history(batches: Mapping[str, tuple[BatchKey, BatchFacts]], commits: Mapping[int, CommitFacts],
                  window_ms: int, *, leases: Sequence[Lease] | None, now_ms: int, transform_grace_ms: int,
                  first_window_ms: int | None = None, duplicates: Mapping[int, int] | None = None,
                  malformed: Sequence[str] = (), missing_files: Mapping[int, Sequence[str]] | None = None,
                  stream_arn: str | None = None) -> tuple[list[CheckOutcome], list[int]]:
    """Every window's three checks from the facts: the outcomes of the failed ones, then one summary per check
    over the history; and the windows judged (every window with a landed batch or a commit), in order.
    `missing_files`: per window, the output files its commit names that the output does not hold. Stream
    identity, as `landing verify` judges it (zone/chain.py): a batch of another stream than its directory's (or
    `stream_arn`) fails its window's chain check; a directory whose batches name two streams fails the history."""
    windows = sorted({window_floor(k.minute_ms, window_ms) for k, _ in batches.values()} | set(commits))
    failed: dict[str, dict[int, list[str]]] = {check: {} for check in CHECKS}
    mixed = _judge_chains(batches, window_ms, failed["chain"], stream_arn)
    counts = _judge_counts(batches, commits, windows, window_ms, now_ms, transform_grace_ms, first_window_ms,
                           duplicates or {}, missing_files or {})
    if leases is not None:
        _judge_checkpoints(batches, commits, leases, window_ms, first_window_ms, failed["checkpoints"])
    outcomes = [o for o in counts if not o.ok]
    for check in ("chain", "checkpoints"):
        for w, problems in sorted(failed[check].items()):
            outcomes.append(CheckOutcome(check, w, w + window_ms, False, problems[0] if len(problems) == 1 else
                                         f"{len(problems)} problems: {problems[0]} …", tuple(problems),
                                         {"problems": len(problems)}))
    outcomes.sort(key=lambda o: (o.window_start_ms, CHECKS.index(o.check)))
    if malformed:
        outcomes.append(_summary("chain", windows, window_ms, False,
                                 f"{len(malformed)} .parquet objects are not batch keys: {malformed[0]} …",
                                 tuple(f"not a batch key: {k}" for k in malformed), {"bad_keys": len(malformed)}))
    if mixed is not None:
        outcomes.append(_summary("chain", windows, window_ms, False, f"mixed streams: {mixed}",
                                 (f"mixed streams: {mixed}",), {"mixed_streams": 1}))
    shards = {k.shard_id for k, _ in batches.values()}
    rows = sum(f.rows for _, f in batches.values())
    outcomes.append(_summary("chain", windows, window_ms, not failed["chain"],
                             _tally(windows, failed["chain"], f"{len(shards)} shards, {len(batches)} batches, "
                                                              f"{rows} rows: every chain unbroken"),
                             (), {"shards": len(shards), "batches": len(batches), "rows": rows,
                                  "failed_windows": len(failed["chain"])}))
    bad_counts = [o for o in counts if not o.ok]
    transformed = sum(f.transformed for f in commits.values())
    outcomes.append(_summary("counts", windows, window_ms, not bad_counts,
                             _tally(windows, {o.window_start_ms: [] for o in bad_counts},
                                    f"{len(commits)} windows committed, {transformed} rows transformed: every "
                                    f"window reconciles"),
                             (), {"committed_windows": len(commits), "failed_windows": len(bad_counts)}))
    if leases is None:
        outcomes.append(_summary("checkpoints", windows, window_ms, True, "no lease table given: not checked", (),
                                 {}))
    else:
        outcomes.append(_summary("checkpoints", windows, window_ms, not failed["checkpoints"],
                                 _tally(windows, failed["checkpoints"], f"{len(list(leases))} leases: no checkpoint "
                                                                         f"beyond materialised records"),
                                 (), {"leases": len(list(leases)), "failed_windows": len(failed["checkpoints"])}))
    return outcomes, windows


def _tally(windows: Sequence[int], failed: Mapping[int, object], ok_text: str) -> str:
    if not failed:
        return f"{len(windows)} windows: {ok_text}"
    return f"{len(failed)} of {len(windows)} windows failed (each named above)"


def _summary(check: str, windows: Sequence[int], window_ms: int, ok: bool, summary: str, details: tuple[str, ...],
             metadata: dict) -> CheckOutcome:
    start = windows[0] if windows else 0
    end = windows[-1] + window_ms if windows else 0
    return CheckOutcome(check, start, end, ok, f"whole history: {summary}", details,
                        {"windows": len(windows), **metadata}, whole_history=True)


def _judge_chains(batches: Mapping[str, tuple[BatchKey, BatchFacts]], window_ms: int,
                  failed: dict[int, list[str]], stream_arn: str | None = None) -> str | None:
    """Each shard's chain over the whole history (chain.verify_chain on the footers' facts): every problem
    is charged to the window of the batch that shows it. Returns the directory's mixed streams (chain.mixed_streams)
    when its batches name more than one."""
    by_shard: dict[str, list[tuple[BatchKey, BatchFacts]]] = {}
    for key, f in batches.values():
        by_shard.setdefault(key.shard_id, []).append((key, f))

    def charge(key: str, problem: str) -> None:
        minute = batches[key][0].minute_ms if key in batches else 0
        failed.setdefault(window_floor(minute, window_ms), []).append(problem)

    reports: dict[str, ChainReport] = {}
    for shard_id, items in sorted(by_shard.items()):
        infos = [BatchInfo(k, parse_position(f.prev), f.rows, 0, 0, 0, f.prev_key or None, f.stream_arn or None)
                 for k, f in items if not f.error]
        report = reports[shard_id] = verify_chain(infos, {k.key(): f.error for k, f in items if f.error},
                                                  stream_arn)[shard_id]
        for gap in report.gaps:
            named = batches[gap.next_key][1].prev_key
            why = (f"it follows {named}, which the zone does not hold (deleted?)" if named and named not in batches
                   else f"it follows {gap.next_prev}")
            charge(gap.next_key, f"{shard_id}: gap after {gap.after}: {gap.next_key}: {why}")
        for line in report.foreign:
            charge(foreign_batch(line), f"{shard_id}: foreign: {line}")
        for overlap in report.overlaps:
            charge(overlap.second_key, f"{shard_id}: overlap: {overlap.first_key} and {overlap.second_key}")
        for bad, why in sorted(report.corrupt.items()):
            charge(bad, f"{shard_id}: unreadable: {bad}: {why}")
        first = min(items, key=lambda kf: (kf[0].first.key(), kf[0].last.key()))
        if report.starts_after_key is not None and report.starts_after_key not in batches:
            charge(first[0].key(), f"{shard_id}: the first batch {first[0].key()} follows "
                                   f"{report.starts_after_key}, which the zone does not hold (deleted?)")
    directories = sorted({k.stream for k, _ in batches.values()})
    return mixed_streams(directories[0], reports.values()) if len(directories) == 1 else None


def _judge_counts(batches: Mapping[str, tuple[BatchKey, BatchFacts]], commits: Mapping[int, CommitFacts],
                  windows: Sequence[int], window_ms: int, now_ms: int, grace_ms: int, first_window_ms: int | None,
                  duplicates: Mapping[int, int], missing_files: Mapping[int, Sequence[str]]) -> list[CheckOutcome]:
    held: dict[int, list[str]] = {}
    for key, _f in batches.values():
        held.setdefault(window_floor(key.minute_ms, window_ms), []).append(key.key())
    out: list[CheckOutcome] = []
    for w in windows:
        if first_window_ms is not None and w < first_window_ms:
            continue  # in no partition: never transformed by a window run (windows/checkpoints/plan.py)
        mine = held.get(w, [])
        deadline = w + window_ms + grace_ms
        overdue = now_ms - deadline if now_ms >= deadline else None
        commit = commits.get(w)
        if commit is None:
            landed = sum(batches[k][1].rows for k in mine)
            out.append(check_counts(w, w + window_ms, landed, 0, None, None, overdue))
            continue
        if commit.error:
            out.append(check_counts(w, w + window_ms, 0, 0, None, None, overdue, output_error=commit.error))
            continue
        named = [k for k in mine if k in commit.batches]
        out.append(check_counts(
            w, w + window_ms, sum(batches[k][1].rows for k in named if not batches[k][1].error),
            duplicates.get(w, 0), OutputCounts(commit.transformed, commit.quarantined, commit.batches), None, overdue,
            late=sorted(set(mine) - commit.batches), missing=sorted(commit.batches - set(mine)),
            unreadable=sorted(k for k in named if batches[k][1].error),
            missing_files=missing_files.get(w, ())))
    return out


def _judge_checkpoints(batches: Mapping[str, tuple[BatchKey, BatchFacts]], commits: Mapping[int, CommitFacts],
                       leases: Iterable[Lease], window_ms: int, first_window_ms: int | None,
                       failed: dict[int, list[str]]) -> None:
    """Every checkpoint against the whole history: within the landed records (the zone's, and its lease's own
    landing progress), and not into a batch its window's commit does not name (SHARD_END: not while a window
    other than the one holding the shard's last record has such a batch). And the zone holds the last landed
    record the landing progress names, failing the window of the batch it names (`lost_last_batch`)."""
    leases = list(leases)
    progress = progress_from_leases(leases)
    by_shard: dict[str, list[BatchKey]] = {}
    for key, _f in batches.values():
        by_shard.setdefault(key.shard_id, []).append(key)

    def window(key: BatchKey) -> int:
        return window_floor(key.minute_ms, window_ms)

    def covered(key: BatchKey) -> bool:
        w = window(key)
        if first_window_ms is not None and w < first_window_ms:
            return True  # stepped over by the checkpoint plan: in no partition
        commit = commits.get(w)
        return commit is not None and not commit.error and key.key() in commit.batches

    streams = {key.stream for key, _f in batches.values()}  # the directory audited (none: nothing landed)
    for lease in sorted(leases, key=lambda x: x.lease_key):
        shard_id, cp = lease.lease_key, lease.checkpoint
        mine = sorted(by_shard.get(shard_id, ()), key=lambda b: (b.first.key(), b.last.key()))
        p: ShardProgress | None = progress.get(shard_id)
        lost = lost_last_batch(shard_id, p, None, mine) if streams else None
        if lost is not None and lost[0].stream in streams:
            failed.setdefault(window(lost[0]), []).append(lost[1])
        if not mine:
            continue  # nothing of the shard landed in this directory (the lease may be another incarnation's)
        last = max(mine, key=lambda b: b.last.key())
        if held_by_another_protocol(lease):
            continue  # a Java KCL holder's checkpoint is its own processor's, not the zone's (audit.check_checkpoints)
        if not cp.is_sentinel and p is not None and p.landed is not None and cp.key() > p.landed.key():
            failed.setdefault(window(last), []).append(
                f"{shard_id}: checkpoint {cp} is past the last landed record {p.landed}")
        if not cp.is_sentinel and cp.key() > last.last.key():
            failed.setdefault(window(last), []).append(
                f"{shard_id}: checkpoint {cp} is past the zone's last landed record {last.last} ({last.key()})")
        uncovered = [b for b in mine if not covered(b)]
        if not uncovered or cp.is_starting_sentinel:
            continue
        if cp.is_shard_end:
            final = window(last)
            for b in uncovered:
                if window(b) != final:
                    failed.setdefault(window(b), []).append(
                        f"{shard_id}: SHARD_END, but batch {b.key()} of this window is not materialised and the "
                        f"window does not hold the shard's last record")
                    break
        elif cp.key() >= uncovered[0].first.key():
            b = uncovered[0]
            failed.setdefault(window(b), []).append(
                f"{shard_id}: checkpoint {cp} reaches into batch {b.key()}, which its window's commit does not name "
                f"(not materialised)")
