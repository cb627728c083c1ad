"""The pipeline process of a simulated world: windows closed when the shipped completeness rule says so, on the
world's evidence, each transformed, reconciled and committed, and the stream's checkpoints committed for what
materialised — the shipped code at every step but one.

Per tick (every `period` virtual seconds, the Dagster sensor's and runs' stand-in for scheduling only):

* the sensor: the shipped tick (windows/tick/decisions.py: `start_tick`, `follow_windows`, `finish_tick`, as
  defs/kinesis/tick.py drives them) on what the world holds — the leases of the listed shards and their landing
  progress from the lease table, the shards from Kinesis, the zone (where reports start), the window commits and
  the checkpoint record in the output, the world's state of each run; its cursor kept between ticks as Dagster
  keeps a sensor's, serialised. Its decisions are carried out: every run it requests is launched once per run
  key (as Dagster launches them), windows complete by the completeness rule (windows/completeness.py) are
  reported and run, windows whose run ended without a commit are asked for again, stalled ones named, and the
  checkpoint record's late and uncommitted windows followed;
* each requested window runs: the transform's row writing is the one stand-in (`write_window`: inside the
  shipped window-commit protocol — windows/commit.py, the transform's own: the window's commits deleted
  first, the pending commit written last from the datasets' manifests — it reads the window's landed batches
  through the shipped listing and decoder — `checkpoint_commit.list_landed`, `batch.decode_batch` — counts
  copies, quarantines what its decoder refuses, and writes both datasets with their `DatasetManifest`); then
  the shipped `reconcile_window` (the rows_reconcile check) publishes the commit, or leaves it pending;
* the checkpoint run, every tick (so the shard ends the tick asks for too): the shipped `commit_checkpoints`
  over the real `LeaseTable` on the simulated DynamoDB
  (what the workers use), the stream's shards listed through the shipped `list_shards` over the simulated
  Kinesis; it stores the stream's checkpoint record, whose late and uncommitted windows the sensor reads.

Faults the world draws for the pipeline (runtime/scenario.py): a window run that fails once or for good, a crash of a
run after its datasets and before its pending commit, or after the pending commit and before the publish
(`PIPELINE_CRASHES`), a deleted commit (`delete_commit`), and a run that drops a row it read (once: a Spark bug,
a partial read — the rows_reconcile check must keep its commit unpublished). A run that meets a batch its decoder
cannot read fails (as Spark does on a corrupt file), for as long as the batch stays corrupted.

The ground truth of what each run transformed (`runs_read`: the batches it read, the rows it dropped) is what the
checker counts records by: a record is in a committed window when the run that window's commit names read it.
"""
from __future__ import annotations

import random
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ...audit import reconcile
from ...audit.lineage import audit_window, output_partition
from ...kcl.core.lineage import scoped_leases
from ...kcl.core.model import TRIM_HORIZON, Checkpoint
from ...kcl.core.streams import StreamScope
from ...kcl.shells.shards import list_shards
from ...windows.checkpoints.record import CheckpointRecord, CheckpointRecordError, read_checkpoint_record
from ...windows.checkpoints.run import commit_checkpoints, list_landed
from ...windows.commit import begin_window, window_done
from ...windows.followup import Outstanding, RunState, WindowObservation
from ...windows.keys import window_start_ms
from ...windows.manifest import (
    QUARANTINE,
    TRANSFORMED,
    CommitFormatError,
    DatasetManifest,
    WindowCommit,
    commit_key,
    commit_windows,
    pending_commit_key,
    read_commit,
    window_partition,
)
from ...windows.tick.cursor import Cursor
from ...windows.tick.decisions import SensorRules, WindowRun, finish_tick, follow_windows, start_tick
from ...windows.tick.report_start import start_reports
from ...zone.batch import decode_batch
from ...zone.chain import list_batches
from ...zone.errors import CorruptBatchError
from ...zone.progress import progress_from_leases
from ...zone.store import MemoryZoneStore, ZoneStore
from ...zone.stream_slice import slice_of

PIPELINE_CRASHES = ("after-dataset", "before-publish")
MAX_WINDOWS_PER_TICK = 12  # the consumer settings' default (deployment/consumer.py)


class RunFailed(Exception):
    """A window run failed (the world's doing)."""


def quarantined(data: bytes) -> bool:
    """The stand-in decoder's verdict: a record whose sequence number ends in 7 is not decodable (one in ten)."""
    return data.split(b".", 1)[0][-1:] == b"7"


# Per store, per batch key: (the body decoded, its rows as (shard, sequence, sub-sequence) with the stand-in
# decoder's verdict). A window is run again and again (re-requests, reports, the by-hand runs after a heal) over
# the same batches; a batch is written once (put-if-absent), so a body already decoded is not decoded again. The
# memory store hands back the stored bytes object itself, so one whose object is still the one decoded is that
# batch unchanged; a replaced or corrupted object is another object, decoded (and refused) afresh.
_DECODED: "weakref.WeakKeyDictionary[ZoneStore, dict[str, tuple[bytes, list]]]" = weakref.WeakKeyDictionary()


def _decoded_rows(store: ZoneStore, key: str, directory: str) -> list[tuple[tuple[str, str, int], bool]]:
    body = store.get(key)
    memo = _DECODED.setdefault(store, {})
    known = memo.get(key)
    if known is not None and known[0] is body:
        return known[1]
    table = decode_batch(body, key, directory)
    rows = [((shard, seq, sub), quarantined(payload)) for shard, seq, sub, payload in zip(
        table.column("shard_id").to_pylist(), table.column("sequence_number").to_pylist(),
        table.column("sub_sequence_number").to_pylist(), table.column("data").to_pylist(), strict=True)]
    memo[key] = (body, rows)
    return rows


def write_window(store: ZoneStore, output: ZoneStore, directory: str, t0: int, t1: int, run_id: str,
                 crash: Callable[[str], None] = lambda point: None) -> dict[str, int]:
    """The stand-in for Spark's row writing inside the shipped window-commit protocol (windows/commit.py, as
    transform/job.py `transform_window` with publish=False runs it): the window's batches as the shipped
    listing finds them, their rows through the shipped decoder, distinct by position, both datasets with
    their manifests, and the pending commit last. Returns the transform's own counts."""
    write = begin_window(output, t0, t1, publish=False)
    listing = list_landed(store, directory, t0, t1)
    rows_in, seen, good, bad = 0, set(), 0, 0
    for batch in listing.batches:
        for row, refused in _decoded_rows(store, batch.key(), directory):
            rows_in += 1
            if row in seen:
                continue
            seen.add(row)
            if refused:
                bad += 1
            else:
                good += 1
    partition = window_partition(t0)
    for name, rows in ((TRANSFORMED, good), (QUARANTINE, bad)):
        part = f"{name}/{partition}/"
        file = f"{run_id}/part-00000.parquet"
        output.put(part + file, b"rows %d" % rows)
        # the dataset's switch, then the rest of the partition removed (datasource.PartitionWriter.commit)
        output.put(write.manifest_key(name), DatasetManifest(run_id, run_id, (file,), rows).to_json(partition))
        output.delete([k for k in output.list_keys(part) if k not in (part + file, write.manifest_key(name))])
    crash("after-dataset")
    write.finish(b.key() for b in listing.batches)
    crash("before-publish")
    return {"rows_in": rows_in, "rows_out": good, "duplicates_dropped": rows_in - len(seen), "quarantined": bad}


# How long after the faults stop the person fixes what made windows fail for good (and re-runs them).
FIX_SECONDS = 90.0
# What the person fixes at the latest, faults or not: a window failing for good holds back its shards' ends, and so
# their children, whose records leave the stream with its retention; the fix comes within this share of the
# retention after a run first failed for good (never before the window is overdue and the sensor's stall report
# can be judged).
FIX_WITHIN_RETENTION = 0.5


@dataclass
class PipelineFaults:
    """What the world set up to go wrong in window runs (window start -> how)."""

    fail_once: set[int] = field(default_factory=set)
    fail_always: set[int] = field(default_factory=set)
    crash: dict[int, str] = field(default_factory=dict)  # window -> a PIPELINE_CRASHES point (once)
    drop_row: set[int] = field(default_factory=set)  # windows whose next run drops one good row it read (once)


class SimPipeline:
    """The pipeline of one world (see the module docstring)."""

    def __init__(self, *, store: ZoneStore, output_name: str, table: Any, kinesis: Any, stream: str,
                 window_ms: int, first_window_ms: int, grace_ms: int, overdue_ms: int, max_requests: int = 3,
                 retention_ms: int | None = None, rng: random.Random | None = None,
                 note: Callable[[str], None] = lambda text: None) -> None:
        self.store = store
        self.output = MemoryZoneStore(output_name, "output")
        self.output.ensure_zone(create=True)
        self.table = table
        self.kinesis = kinesis
        self.scope = StreamScope(stream)
        self.window_ms = window_ms
        self.first_window_ms = first_window_ms
        self.grace_ms = grace_ms
        self.overdue_ms = overdue_ms
        self.max_requests = max_requests
        self.rng = rng or random.Random(0)
        self.note = note
        self.faults = PipelineFaults()
        self.sensor_cursor: str | None = None  # the sensor's cursor, as Dagster keeps it between ticks
        self.run_keys: set[str] = set()  # the run keys the sensor requested (Dagster launches each once)
        self.reports_from: int | None = None  # the first window the sensor reports (where reports start)
        # (window, when) the sensor reported complete since the checker last looked (Checker.on_pipeline_tick)
        self.reported: list[tuple[int, int]] = []
        self.reported_at: dict[int, int] = {}  # window -> when the sensor first reported it complete
        self.runs: dict[int, RunState] = {}  # each window's newest run
        self.queue: list[int] = []  # windows requested, not run yet
        self.stalled: tuple[int, ...] = ()
        self.gave_up: tuple[int, ...] = ()
        self.runs_started = 0
        self.healed = False  # the faults stopped (heal): a person re-runs what the sensor gives up on
        self.fixed_at_ms: int | None = None  # when the person has fixed what made windows fail for good
        self.retention_ms = retention_ms
        self.first_failed_for_good: tuple[int, int] | None = None  # (window, when its run failed for good)
        # Committed windows whose re-run withdrew the commit (a run deletes it before writing, as the shipped
        # transform does) and has not published a new one: their records wait for the re-run, not lost.
        self.withdrawn: set[int] = set()
        self.withdrawn_named: set[str] = set()  # the batches those withdrawn commits named
        self.enabled = True
        self.now_ms = 0
        self.period_ms = 0  # the tick's period (the world sets it)
        self.deleted: set[int] = set()  # windows whose commit the world deleted
        self.deleted_named: set[str] = set()  # the batches those deleted commits named
        self.deleted_audits: list[tuple[int, bool]] = []  # (window, the shipped audit's verdict right after), if owed
        self.runs_read: dict[str, tuple[frozenset[str], frozenset[tuple[str, tuple[int, str, int]]]]] = {}
        self.late_requests = 0  # windows re-run because batches landed after their run (track_reports)
        self.by_hand: set[int] = set()  # windows a person re-ran after refilling their batches
        self.unreconciled = 0  # runs whose rows_reconcile check kept the commit pending

    # -- a tick ----------------------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        self.now_ms = now_ms
        if not self.enabled:
            return
        self._sense(now_ms)
        while self.queue:
            self._run(self.queue.pop(0))
        self._checkpoint(now_ms)

    def _sense(self, now_ms: int) -> None:
        """One tick of the `kinesis_consumer` sensor for the stream: the shipped decisions
        (windows/tick/decisions.py) on what the world holds, as defs/kinesis/tick.py gathers it — the leases and
        their landing progress from the lease table, the shards from Kinesis, the zone, the window commits and
        the checkpoint record in the output, the world's run states — and its decisions carried out: each run
        requested goes to the world's run launcher (once per run key, as Dagster launches it), and the cursor is
        kept between ticks as Dagster keeps a sensor's, serialised."""
        cursor = Cursor.parse(self.sensor_cursor)
        rules = SensorRules(window_ms=self.window_ms, grace_ms=self.grace_ms, overdue_ms=self.overdue_ms,
                            max_window_requests=self.max_requests, max_windows_per_tick=MAX_WINDOWS_PER_TICK,
                            partitions_start_ms=self.first_window_ms)
        shards = list_shards(self.kinesis, self.scope.stream)
        # The leases of the stream's listed shards, as a hosted fleet member's cycle hands them to the tick
        # (kcl/core/fleet/cycle.py: `scoped_leases`); the table also holds other applications' leases.
        view = slice_of(self.scope, scoped_leases(self.table.scan(), shards), shards)
        leases = view.leases
        start = start_tick(cursor, rules, None if cursor.next_window_ms is not None else start_reports(
            self.store, view.directory, self.output, leases, progress_from_leases(leases),
            window_ms=self.window_ms, grace_ms=self.grace_ms, not_before_ms=self.first_window_ms, now_ms=now_ms))
        if self.reports_from is None and start.next_window_ms is not None:
            self.reports_from = start.next_window_ms
        observed = {w: self._observe(w, cursor.outstanding[w]) for w in start.observe}
        followed = follow_windows(cursor, start, rules, now_ms=now_ms, observed=observed,
                                  checkpoint_report=self._checkpoint_record(), leases=leases, shards=view.shards)
        self.stalled, self.gave_up = followed.follow_up.stalled, followed.follow_up.gave_up
        rerequested = len(followed.follow_up.rerequest)  # the runs after those are the checkpoint report's
        for i, run in enumerate(followed.runs):
            if self._launch(run) and i >= rerequested and followed.outstanding[window_start_ms(run.partition)].need:
                self.late_requests += 1
        for due in followed.to_report:
            self._launch(due.run)
            self.reported.append((due.status.window_start_ms, now_ms))
            self.reported_at.setdefault(due.status.window_start_ms, now_ms)
        end = finish_tick(cursor, start, followed, len(followed.to_report), rules, now_ms=now_ms, leases=leases)
        for line in (*start.warnings, *start.notes, *followed.notes, *end.notes):
            self.note(f"sensor: {line}")  # the tick's status line
        # end.shard_end needs no run of its own here: the world runs the checkpoint plan every tick (_checkpoint),
        # which ends the shards whose last record landed.
        self.sensor_cursor = end.cursor.to_json()
        self._fix_when_due(now_ms)
        if self.healed:
            self._rerun_given_up()

    def fix_due_ms(self) -> int | None:
        """When the person fixes what makes windows fail for good: FIX_SECONDS after the faults stop, and, faults
        or not, within FIX_WITHIN_RETENTION of the retention after a run first failed for good (a fix that waited
        for the faults' end let a split shard's child leave the stream unread while its parent's end waited on the
        failed window), but not before that window is overdue and a tick past the checker's bound for its stall
        report; None: nothing to fix."""
        if not self.faults.fail_always:
            return None
        due = [self.fixed_at_ms] if self.fixed_at_ms is not None else []
        if self.first_failed_for_good is not None and self.retention_ms is not None:
            window, failed_ms = self.first_failed_for_good
            judged = self.stall_report_due_ms(window)
            if judged is None:  # never reported complete: the bound as from its overdue time
                judged = window + self.window_ms + self.overdue_ms + self.period_ms
            due.append(max(failed_ms + int(FIX_WITHIN_RETENTION * self.retention_ms), judged + self.period_ms))
        return min(due, default=None)

    def stall_report_due_ms(self, window: int) -> int | None:
        """By when a window failing for good must have been reported stalled (the checker's bound): a tick past
        its overdue time, or past the tick after its first report when that is later; None: never reported
        complete (the sensor never ran it)."""
        reported_at = self.reported_at.get(window)
        if reported_at is None:
            return None
        return max(window + self.window_ms + self.overdue_ms, reported_at + self.period_ms) + self.period_ms

    def _fix_when_due(self, now_ms: int) -> None:
        due = self.fix_due_ms()
        if due is None or now_ms < due:
            return
        if self.healed:
            self.faults = PipelineFaults()
            self._person_reruns()
            return
        # While the other faults go on: only the cause is fixed, and the windows the sensor gave up on run again.
        self.faults.fail_always.clear()
        self.first_failed_for_good = None
        self.note("pipeline: a person fixed what made windows fail for good (before the faults stopped)")
        self._rerun_given_up()

    def _observe(self, window: int, entry: Outstanding) -> WindowObservation:
        """A followed window's state as the sensor observes it (defs/kinesis/tick.py `observe_windows`): done when
        its commit names every batch its entry needs, else its newest run's state (none for a given-up window)."""
        if self._done(window, entry):
            return WindowObservation(True, RunState.SUCCEEDED)
        return WindowObservation(False, RunState.NONE if entry.gave_up else self.runs.get(window, RunState.NONE))

    def _done(self, window: int, entry: Outstanding) -> bool:
        """Whether a followed window's commit names every batch its entry needs (what the sensor waits for)."""
        try:
            return window_done(read_commit(self.output, window), entry.need)
        except CommitFormatError:
            return False

    def _checkpoint_record(self) -> CheckpointRecord | None:
        try:
            return read_checkpoint_record(self.output)
        except CheckpointRecordError as exc:
            self.note(f"pipeline: {exc}")
            return None

    def _launch(self, run: WindowRun) -> bool:
        """The world's run launcher: a run key the sensor used before launches nothing (as Dagster skips it);
        otherwise the window's run is queued. Returns whether it was."""
        if run.run_key in self.run_keys:
            return False
        self.run_keys.add(run.run_key)
        window = window_start_ms(run.partition)
        if window not in self.queue:
            self.queue.append(window)
        return True

    @property
    def cursor(self) -> int:
        """The next window the sensor reports (its cursor's; the first partition's until it decides)."""
        next_window = Cursor.parse(self.sensor_cursor).next_window_ms
        return self.first_window_ms if next_window is None else next_window

    @cursor.setter
    def cursor(self, window: int) -> None:
        self.sensor_cursor = replace(Cursor.parse(self.sensor_cursor), next_window_ms=window).to_json()

    @property
    def outstanding(self) -> dict[int, Outstanding]:
        """The windows the sensor's cursor follows."""
        return Cursor.parse(self.sensor_cursor).outstanding

    def _run(self, t0: int) -> None:
        t1 = t0 + self.window_ms
        self.runs_started += 1
        run_id = f"run-{self.runs_started}"
        faults = self.faults

        def crash(point: str) -> None:
            if faults.crash.get(t0) == point:
                del faults.crash[t0]
                raise RunFailed(f"crashed {point}")
        previous = read_commit(self.output, t0)
        if previous is not None:
            self.withdrawn.add(t0)
            self.withdrawn_named |= previous.batches
        try:
            if t0 in faults.fail_always:
                if self.first_failed_for_good is None:
                    self.first_failed_for_good = (t0, self.now_ms)
                raise RunFailed("fails for good")
            if t0 in faults.fail_once:
                faults.fail_once.discard(t0)
                raise RunFailed("fails once")
            report = write_window(self.store, self.output, self.scope.stream, t0, t1, run_id, crash)
            self._record_run(t0, run_id, report)
            # Through the module: a mutation plants its edit there (sim/judge/mutations.py).
            outcomes = reconcile.reconcile_window(self.store, self.output, self.scope.stream, t0, t1,
                                                      transform=report)
        except (RunFailed, CorruptBatchError) as exc:
            self.runs[t0] = RunState.FAILED
            self.note(f"pipeline: window {output_partition(t0)} run {run_id} {exc}")
            return
        ok = all(o.ok for o in outcomes)
        self.unreconciled += not ok
        self.runs[t0] = RunState.SUCCEEDED
        self.note(f"pipeline: window {output_partition(t0)} run {run_id} "
                  + ("committed" if ok else "did not reconcile: " + "; ".join(o.summary for o in outcomes)))

    def _record_run(self, t0: int, run_id: str, report: dict[str, int]) -> None:
        """What the run read (its pending commit's batches), and the row it drops when the world makes it: the
        transformed dataset, the pending commit and the transform's report then hold one row fewer."""
        raw = self.output.get_optional(pending_commit_key(t0))
        if raw is None:
            return
        commit = WindowCommit.from_json(raw)
        dropped: frozenset[tuple[str, tuple[int, str, int]]] = frozenset()
        if t0 in self.faults.drop_row and report["rows_out"]:
            victim = self._a_good_row(commit.batches)
            if victim is not None:
                self.faults.drop_row.discard(t0)
                dropped = frozenset([victim])
                transformed = commit.dataset(TRANSFORMED)
                report["rows_out"] -= 1
                self.output.put(pending_commit_key(t0), replace(commit, datasets={
                    **commit.datasets, TRANSFORMED: replace(transformed, rows=transformed.rows - 1).entry()}
                ).to_json())
                self.note(f"pipeline: window {output_partition(t0)} run {run_id} dropped row {victim[0]} "
                          f"{victim[1][1]}/{victim[1][2]}")
        self.runs_read[run_id] = (commit.batches, dropped)

    def _a_good_row(self, batches: frozenset[str]) -> tuple[str, tuple[int, str, int]] | None:
        for name in sorted(batches):
            table = decode_batch(self.store.get(name), name, self.scope.stream)
            for shard, seq, sub, payload in zip(table.column("shard_id").to_pylist(),
                                                table.column("sequence_number").to_pylist(),
                                                table.column("sub_sequence_number").to_pylist(),
                                                table.column("data").to_pylist(), strict=True):
                if not quarantined(payload):
                    return shard, (len(seq), seq, int(sub))
        return None

    def _checkpoint(self, now_ms: int) -> None:
        scan = self.table.scan()
        view = slice_of(self.scope, scan, list_shards(self.kinesis, self.scope.stream))
        commit_checkpoints(self.table, view, self.store, self.output, window_ms=self.window_ms,
                           first_window_ms=self.first_window_ms, initial=Checkpoint(TRIM_HORIZON),
                           grace_ms=self.grace_ms, now_ms=now_ms)

    def delete_newest_commit(self, now_ms: int | None = None) -> int | None:
        """The world deletes the newest published commit (an operator's mistake, a lifecycle rule) at `now_ms` (the
        world's time; the last tick's when not given). The shipped audit (counts, no grace) must then fail the
        window (`deleted_audits`: its verdicts, judged by the checker) where it promises to: a window past its end
        whose zone holds a batch. Not before its end (seeds 18, 58: a by-hand run after a refill committed the
        window early; "not transformed yet" — the sensor reports and runs it after its end, and the checkpoints
        check fails it meanwhile if a checkpoint reached into it), nor an empty window (seeds 33, 99, 225:
        nothing landed, nothing lost)."""
        windows = commit_windows(self.output, self.first_window_ms, self.cursor + self.window_ms)
        if not windows:
            return None
        start = windows[-1]
        gone = read_commit(self.output, start)
        if gone is not None:
            self.deleted_named |= gone.batches
        self.output.delete([commit_key(start)])
        self.deleted.add(start)
        now = self.now_ms if now_ms is None else now_ms
        end = start + self.window_ms
        if now >= end and list_batches(self.store, self.scope.stream, start, end):
            outcomes = audit_window(self.store, self.output, self.scope.stream, start, end, checks=["counts"],
                                    now_ms=now, transform_grace_ms=0)
            self.deleted_audits.append((start, all(o.ok for o in outcomes)))
        return start

    def named(self, name: str) -> bool:
        """Whether a commit named the batch: one published now, one the world deleted, or one a re-run withdrew
        (seed 1724: the checkpoint passed the batch on its window's commit, a re-run withdrew that commit and
        crashed, and the world then lost the batch — the world's loss, as when a commit it deleted named it)."""
        return (name in self.deleted_named or name in self.withdrawn_named
                or any(name in c.batches for c in self.committed().values()))

    def failing_for_good(self) -> set[int]:
        return set(self.faults.fail_always)

    def rerun_by_hand(self, start: int) -> None:
        """A person who repaired a window's batches (refilled them) runs the window again, as `kcl-pipeline
        backfill` does after a landing backfill, whatever the sensor made of it (given up, about to, or done
        before the refill landed): a run of the partition launched by hand, which the sensor's follow-up then
        observes as the window's newest run (its cursor is the sensor's own). The person watches that run: one
        that fails (it withdrew the window's commit first, as every run does) is run again once the faults stop."""
        self.by_hand.add(start)
        if start not in self.queue:
            self.queue.append(start)

    def heal(self) -> None:
        """The faults stop: runs succeed from now on, the windows given up on are asked for again (a person
        re-running what the stall check named), and so is every window whose deleted commit the shipped audit
        failed and that has none still: a person re-running what the audit named (seeds 819, 1229: the commit
        was deleted after the checkpoints had passed the window, so no checkpoint run waits on it and the sensor,
        which follows a window until its commit is there, follows it no more — only the audit can tell), and
        every window a person re-ran by hand whose run failed and left it without a commit (a run the sensor did
        not launch, of a window it follows no more).

        What made windows fail for good (a bad release, a bad row the transform cannot read) is fixed by that
        person FIX_SECONDS after the other faults stopped, or earlier within the retention (`fix_due_ms`), and
        those windows fail until then: meanwhile the pipeline goes on with later windows, and the checkpoints must
        not pass the failed ones."""
        self.faults = PipelineFaults(fail_always=set(self.faults.fail_always))
        self.healed = True
        self.fixed_at_ms = self.now_ms + int(FIX_SECONDS * 1000)
        if not self.faults.fail_always:
            self._person_reruns()

    def _person_reruns(self) -> None:
        self._rerun_given_up()
        for start in sorted({w for w, ok in self.deleted_audits if not ok} | self.by_hand):
            if read_commit(self.output, start) is None:
                self.rerun_by_hand(start)

    def _rerun_given_up(self) -> None:
        """A person re-runs each window the sensor gave up on and that is not done — at the heal, and later ones
        as the sensor gives up on them (seed 3125: a window failing for good was still being asked again when the
        faults stopped and was given up on after), again while its runs fail (a batch the operator has yet to
        repair). Not done is the sensor's own judgement (`_done`): no commit, or one that does not name every batch
        the window needs (seed 8346: a committed window asked again for refilled batches, whose runs failed for good
        before the fix, keeps its old commit, and the checkpoints stay before those batches until a run names them)."""
        if self.faults.fail_always:
            return  # not before the cause is fixed: the runs would fail again
        for start, entry in self.outstanding.items():
            if entry.gave_up and start not in self.queue and not self._done(start, entry):
                self.queue.append(start)

    def committed(self) -> dict[int, WindowCommit]:
        """Every published commit (the checker's view), up to the newest window a run can have committed: the
        sensor's cursor, or the window of now when that is later — a person's run after a refill
        (`rerun_by_hand`) commits a window the sensor has not reported yet (a LATEST shard's first window,
        committed by hand while the sensor still waits on another shard for the window before), and the
        checkpoint plan rightly passes its records."""
        newest = max(self.cursor, self.now_ms - self.now_ms % self.window_ms)
        return {w: c for w in commit_windows(self.output, self.first_window_ms, newest + self.window_ms)
                if (c := read_commit(self.output, w)) is not None}

    def drop(self) -> None:
        self.output.drop()


__all__ = ["PIPELINE_CRASHES", "PipelineFaults", "RunFailed", "SimPipeline", "quarantined", "write_window"]
