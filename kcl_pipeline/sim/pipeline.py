"""The pipeline process of a simulated world: windows closed on virtual time, each transformed, reconciled and
committed, and the stream's checkpoints committed for what materialised — the shipped code at every step but
one.

Per tick (every `period` virtual seconds, the Dagster sensor's and runs' stand-in for scheduling only):

* the sensor: every window that ended more than `grace` ago is requested once (its cursor moves past it) and
  followed (`landing.window_followup`: `follow_up` decides wait / ask again / stalled / given up from the
  window's commit and its newest run's state, `track_reports` takes the late and uncommitted windows of the
  last checkpoint run's report);
* each requested window runs: the transform's row writing is the one stand-in (`write_window`: it reads the
  window's landed batches through the shipped listing and decoder — `checkpoint_commit.list_landed`,
  `batch.decode_batch` — counts copies, quarantines what its decoder refuses, and writes both datasets, their
  `_manifest.json` and the pending commit exactly as transform/job.py and transform/manifest.py lay them out:
  the run deletes the window's commits first, and writes the pending commit last); then the shipped
  `reconcile_window` (the rows_reconcile check) publishes the commit, or leaves it pending;
* the checkpoint run: the shipped `commit_checkpoints` over the real `LeaseTable` on the simulated DynamoDB
  (what the workers use), the stream's shards listed through the shipped `list_shards` over the simulated
  Kinesis; its report's late and uncommitted windows go to the sensor's follow-up.

Faults the world draws for the pipeline (scenario.py): a window run that fails once or for good, a crash of a
run after its datasets and before its pending commit, or after the pending commit and before the publish
(`PIPELINE_CRASHES`), a deleted commit (`delete_commit`), and a run that drops a row it read (once: a Spark bug,
a partial read — the rows_reconcile check must keep its commit unpublished). A run that meets a batch its decoder
cannot read fails (as Spark does on a corrupt file), for as long as the batch stays corrupted.

The ground truth of what each run transformed (`runs_read`: the batches it read, the rows it dropped) is what the
checker counts records by: a record is in a committed window when the run that window's commit names read it.
"""
from __future__ import annotations

import json
import random
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from ..kcl.core.model import TRIM_HORIZON, Checkpoint
from ..kcl.core.streams import StreamScope
from ..kcl.shells.shards import list_shards
from ..landing import window_commit, window_followup
from ..landing.audit import MANIFEST, QUARANTINE, TRANSFORMED, audit_window, output_partition
from ..landing.batch import decode_batch
from ..landing.checkpoint_commit import CheckpointReport, commit_checkpoints, list_landed
from ..landing.errors import CorruptBatchError
from ..landing.store import MemoryZoneStore, ZoneStore
from ..landing.stream_slice import slice_of
from ..landing.verify import list_batches
from ..landing.window_followup import Outstanding, RunState, WindowObservation, track_reports
from ..transform.manifest import WindowCommit, commit_key, commit_windows, pending_commit_key, read_commit

PIPELINE_CRASHES = ("after-dataset", "before-publish")


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
    """The stand-in for Spark's row writing (transform/job.py `transform_window` with publish=False): the window's
    batches as the shipped listing finds them, their rows through the shipped decoder, distinct by position,
    both datasets and their manifests, and the pending commit last. Returns the transform's own counts."""
    output.delete([commit_key(t0), pending_commit_key(t0)])
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
    partition = output_partition(t0)
    datasets: dict[str, dict[str, Any]] = {}
    for name, rows in ((TRANSFORMED, good), (QUARANTINE, bad)):
        part = f"{name}/{partition}/"
        file = f"{run_id}/part-00000.parquet"
        output.put(part + file, b"rows %d" % rows)
        manifest = {"job_id": run_id, "partition": partition, "run": run_id, "files": [file], "rows": rows}
        output.put(part + MANIFEST, json.dumps(manifest).encode())
        output.delete([k for k in output.list_keys(part) if k not in (part + file, part + MANIFEST)])
        datasets[name] = {"job_id": run_id, "run": run_id, "files": [file], "rows": rows}
    crash("after-dataset")
    commit = WindowCommit(t0, t1, run_id, frozenset(b.key() for b in listing.batches), datasets)
    output.put(pending_commit_key(t0), commit.to_json())
    crash("before-publish")
    return {"rows_in": rows_in, "rows_out": good, "duplicates_dropped": rows_in - len(seen), "quarantined": bad}


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
                 rng: random.Random | None = None, note: Callable[[str], None] = lambda text: None) -> None:
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
        self.cursor = first_window_ms  # the next window the sensor reports
        self.outstanding: dict[int, Outstanding] = {}
        self.runs: dict[int, RunState] = {}  # each window's newest run
        self.queue: list[int] = []  # windows requested, not run yet
        self.frontier: dict[str, int] = {}
        self.report: CheckpointReport | None = None
        self.reports = 0
        self.stalled: tuple[int, ...] = ()
        self.gave_up: tuple[int, ...] = ()
        self.runs_started = 0
        self.healed = False  # the faults stopped (heal): a person re-runs what the sensor gives up on
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
        w = self.window_ms
        while self.cursor + w + self.grace_ms <= now_ms:
            self.outstanding[self.cursor] = Outstanding(1)
            self.queue.append(self.cursor)
            self.cursor += w
        observed = {}
        for start, entry in self.outstanding.items():
            commit = read_commit(self.output, start)
            done = commit is not None and set(entry.need) <= commit.batches
            observed[start] = WindowObservation(done, self.runs.get(start, RunState.NONE))
        # Through the module: a mutation plants its edit there (sim/mutations.py).
        decision = window_followup.follow_up(self.outstanding, observed, now_ms=now_ms, window_ms=w,
                                             overdue_ms=self.overdue_ms, max_requests=self.max_requests)
        self.outstanding = decision.outstanding
        self.stalled, self.gave_up = decision.stalled, decision.gave_up
        if self.healed:
            self._rerun_given_up()
        for start in decision.rerequest:
            if start not in self.queue:
                self.queue.append(start)
        report = self.report
        if report is not None:
            tracked = track_reports(self.outstanding, report.late, report.uncommitted, report=str(self.reports),
                                    reported_before_ms=self.cursor, now_ms=now_ms, partition=output_partition)
            self.outstanding = tracked.outstanding
            self.late_requests += sum(1 for s in tracked.request if s in report.late)
            self.queue += [s for s in tracked.request if s not in self.queue]
            self.report = None

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
                raise RunFailed("fails for good")
            if t0 in faults.fail_once:
                faults.fail_once.discard(t0)
                raise RunFailed("fails once")
            report = write_window(self.store, self.output, self.scope.stream, t0, t1, run_id, crash)
            self._record_run(t0, run_id, report)
            # Through the module: a mutation plants its edit there (sim/mutations.py).
            outcomes = window_commit.reconcile_window(self.store, self.output, self.scope.stream, t0, t1,
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
                datasets = {k: dict(v) for k, v in commit.datasets.items()}
                datasets[TRANSFORMED]["rows"] = int(datasets[TRANSFORMED]["rows"]) - 1
                report["rows_out"] -= 1
                self.output.put(pending_commit_key(t0), WindowCommit(
                    commit.window_start_ms, commit.window_end_ms, commit.run_id, commit.batches, datasets).to_json())
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
        report = commit_checkpoints(self.table, view, self.store, self.output, self.frontier,
                                    window_ms=self.window_ms, first_window_ms=self.first_window_ms,
                                    initial=Checkpoint(TRIM_HORIZON), grace_ms=self.grace_ms, now_ms=now_ms)
        self.frontier = report.frontier
        self.reports += 1
        self.report = report

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
        backfill` does after a landing backfill: whatever the sensor made of it (given up, about to, or done
        before the refill landed), its follow-up starts again from this run."""
        entry = self.outstanding.get(start)
        if entry is not None:
            self.outstanding[start] = Outstanding(1, f"{entry.run_key(output_partition(start))}-by-hand", entry.need)
        if start not in self.queue:
            self.queue.append(start)

    def heal(self) -> None:
        """The faults stop: runs succeed from now on, the windows given up on are asked for again (a person
        re-running what the stall check named), and so is every window whose deleted commit the shipped audit
        failed and that has none still: a person re-running what the audit named (seeds 819, 1229: the commit
        was deleted after the checkpoints had passed the window, so no checkpoint run waits on it and the sensor,
        which follows a window until its commit is there, follows it no more — only the audit can tell)."""
        self.faults = PipelineFaults()
        self.healed = True
        self._rerun_given_up()
        for start in sorted({w for w, ok in self.deleted_audits if not ok}):
            if read_commit(self.output, start) is None:
                self.rerun_by_hand(start)

    def _rerun_given_up(self) -> None:
        """A person re-runs each window the sensor gave up on — at the heal, and later ones as the sensor gives up
        on them (seed 3125: a window failing for good was still being asked again when the faults stopped and
        was given up on after)."""
        for start, entry in list(self.outstanding.items()):
            if entry.gave_up:
                self.outstanding[start] = Outstanding(1, f"{entry.run_key(output_partition(start))}-by-hand",
                                                      entry.need)
                if start not in self.queue:
                    self.queue.append(start)

    def committed(self) -> dict[int, WindowCommit]:
        """Every published commit (the checker's view)."""
        return {w: c for w in commit_windows(self.output, self.first_window_ms, self.cursor + self.window_ms)
                if (c := read_commit(self.output, w)) is not None}

    def drop(self) -> None:
        self.output.drop()


__all__ = ["PIPELINE_CRASHES", "PipelineFaults", "RunFailed", "SimPipeline", "quarantined", "write_window"]
