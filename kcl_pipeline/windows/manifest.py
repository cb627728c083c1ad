"""A window's commit: the one object that makes a transformed window count as materialised (pure; no Spark).

A window's transform writes two datasets (transformed and quarantine). A folder under `transformed/` proves
nothing: it exists after a run that failed half-way, before the quarantine write, or while the window is
still receiving batches. So each run ends by writing one commit object, LAST, after both datasets are in
place:

    _commits/window=<YYYYMMDDTHHMMSSZ>.json
        {"window_start_ms", "window_end_ms", "run_id", "batches": [landed batch keys the run read],
         "datasets": {"transformed": {...}, "quarantine": {...}}}

A run deletes the window's commit before it writes anything, so a run that fails leaves the window
un-materialised (it was transformed before, but from now on it is being replaced). Both steps are the
window-commit protocol of commit.py, which every writer of a window runs.

In the pipeline a run does not publish its commit itself: it leaves it pending
(`_commits/pending/window=….json`), and the window's rows_reconcile check publishes it once the window
reconciles (audit/reconcile.py). A window whose check fails, or never runs, has no commit, so no
checkpoint run — of this window or of any later one — passes its batches.

"Materialised through" is per batch, not per window: a landed batch counts only when a committed manifest
names it. A batch that lands in a window after its run listed the zone (a late batch: a slow worker, a
backfill) is not in the manifest, so the checkpoint plan stops before it, and `reopened_windows` reports
the window as needing a new run; it is never checkpointed untransformed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping

from ..zone.errors import ZoneNotFoundError

COMMITS = "_commits"
PENDING = f"{COMMITS}/pending"  # commits written by a run, not yet published by its rows_reconcile check
_NAME_FORMAT = "window=%Y%m%dT%H%M%SZ"
TRANSFORMED = "transformed"  # the window's decoded records
QUARANTINE = "quarantine"  # the records its decoder refused, with the reason
DATASETS = (TRANSFORMED, QUARANTINE)
DATASET_MANIFEST = "_manifest.json"  # in each dataset's partition: the run whose files are the partition


class CommitFormatError(ValueError):
    """A commit object that is not a window commit this code wrote."""


def window_partition(window_start_ms: int) -> str:
    """`window=20240501T120000Z`: a window's partition directory in each dataset (ISO 8601 basic format: no
    ':', which Hadoop paths reject)."""
    start = datetime.fromtimestamp(window_start_ms / 1000, tz=timezone.utc)
    return f"{start:{_NAME_FORMAT}}"


def dataset_manifest_key(dataset: str, window_start_ms: int) -> str:
    """`transformed/window=20240501T120000Z/_manifest.json`, relative to the output root."""
    return f"{dataset}/{window_partition(window_start_ms)}/{DATASET_MANIFEST}"


@dataclass(frozen=True)
class DatasetManifest:
    """What one dataset's partition of a window holds: the run that wrote it, its files (relative to the
    partition) and its rows. The dataset's `_manifest.json` says it (its writer may add fields: the Spark
    writer adds the schema), and the window's commit repeats it per dataset."""

    job_id: str
    run: str
    files: tuple[str, ...]
    rows: int

    def entry(self) -> dict[str, object]:
        """The commit's entry for the dataset."""
        return {"job_id": self.job_id, "run": self.run, "files": list(self.files), "rows": self.rows}

    def to_json(self, partition: str) -> bytes:
        """The dataset's `_manifest.json` for `partition` (`window_partition`)."""
        return json.dumps({**self.entry(), "partition": partition}, indent=1).encode()

    @classmethod
    def from_entry(cls, data: Mapping, where: str = "dataset manifest") -> "DatasetManifest":
        """From a `_manifest.json` object or a commit's entry; CommitFormatError when a field is missing or of
        the wrong kind."""
        try:
            files = data["files"]
            if isinstance(files, (str, bytes)) or isinstance(data["rows"], bool):
                raise TypeError(f"files {files!r}, rows {data['rows']!r}")
            return cls(str(data["job_id"]), str(data["run"]), tuple(str(f) for f in files), int(data["rows"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitFormatError(f"{where}: not a dataset manifest ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def from_json(cls, raw: bytes, where: str = "dataset manifest") -> "DatasetManifest":
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CommitFormatError(f"{where}: not a dataset manifest ({exc})") from exc
        if not isinstance(data, dict):
            raise CommitFormatError(f"{where}: not a dataset manifest (a JSON {type(data).__name__})")
        return cls.from_entry(data, where)


@dataclass(frozen=True)
class WindowCommit:
    window_start_ms: int
    window_end_ms: int
    run_id: str
    batches: frozenset[str]  # landed batch keys (relative to the zone root) the run read
    datasets: Mapping[str, Mapping] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({
            "window_start_ms": self.window_start_ms, "window_end_ms": self.window_end_ms, "run_id": self.run_id,
            "batches": sorted(self.batches), "datasets": {k: dict(v) for k, v in self.datasets.items()},
        }, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str = "commit") -> "WindowCommit":
        try:
            data = json.loads(raw)
            commit = cls(int(data["window_start_ms"]), int(data["window_end_ms"]), str(data["run_id"]),
                         frozenset(str(k) for k in data["batches"]), dict(data.get("datasets") or {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise CommitFormatError(f"{where}: not a window commit ({exc})") from exc
        if commit.window_end_ms <= commit.window_start_ms:
            raise CommitFormatError(f"{where}: window end {commit.window_end_ms} is not after its start")
        return commit

    def dataset(self, name: str) -> DatasetManifest:
        """The commit's entry for dataset `name` (CommitFormatError: none, or not one)."""
        if name not in self.datasets:
            raise CommitFormatError(f"commit of window {window_partition(self.window_start_ms)}: no {name} dataset")
        return DatasetManifest.from_entry(self.datasets[name], f"commit of window "
                                          f"{window_partition(self.window_start_ms)}, dataset {name}")


def commit_key(window_start_ms: int) -> str:
    """`_commits/window=20240501T120000Z.json`, relative to the output root."""
    return f"{COMMITS}/{window_partition(window_start_ms)}.json"


def pending_commit_key(window_start_ms: int) -> str:
    """`_commits/pending/window=20240501T120000Z.json`: a run's commit before its window reconciled."""
    return f"{PENDING}/{commit_key(window_start_ms)[len(COMMITS) + 1:]}"


def publish_commit(output, window_start_ms: int) -> WindowCommit | None:
    """Move the window's pending commit into place (None: there is none). Put first, then the pending copy
    goes: a crash in between leaves both, and a later publish of the same bytes changes nothing."""
    pending = pending_commit_key(window_start_ms)
    raw = output.get_optional(pending)
    if raw is None:
        return None
    commit = WindowCommit.from_json(raw, f"{output.uri}/{pending}")
    output.put(commit_key(window_start_ms), raw)
    output.delete([pending])
    return commit


def is_commit_key(key: str) -> bool:
    if not (key.startswith(f"{COMMITS}/") and key.endswith(".json")):
        return False
    try:
        datetime.strptime(key[len(COMMITS) + 1:-len(".json")], _NAME_FORMAT)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Materialised:
    """What the committed manifests prove: per window start, the landed batch keys transformed."""

    batches_by_window: Mapping[int, frozenset[str]]

    @classmethod
    def from_commits(cls, commits: Iterable[WindowCommit]) -> "Materialised":
        return cls({c.window_start_ms: c.batches for c in commits})

    @property
    def windows(self) -> list[int]:
        return sorted(self.batches_by_window)

    def covers(self, window_start_ms: int, batch_key: str) -> bool:
        """True when the batch is named by its window's committed manifest."""
        return batch_key in self.batches_by_window.get(window_start_ms, frozenset())


def batch_materialised(materialised: "Materialised | Mapping[int, frozenset[str] | None] | set[int]",
                       window_start_ms: int, batch_key: str) -> bool:
    """The checkpoint plan's test for one landed batch.

    `materialised` is a `Materialised` (the committed manifests), or the plan's own window table: a window
    mapped to None (or a bare set of windows) is asserted whole by the caller (pure tests, older callers)."""
    if isinstance(materialised, Materialised):
        return materialised.covers(window_start_ms, batch_key)
    if window_start_ms not in materialised:
        return False
    batches = materialised.get(window_start_ms) if isinstance(materialised, Mapping) else None
    return batches is None or batch_key in batches


def late_batches(materialised: Materialised, landed: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    """Committed windows -> the landed batches (window start, key) their manifest does not name, sorted: each
    such window needs a new run before the checkpoint plan can advance past those batches."""
    late: dict[int, list[str]] = {}
    for w, key in landed:
        if w in materialised.batches_by_window and not materialised.covers(w, key):
            late.setdefault(w, []).append(key)
    return {w: sorted(keys) for w, keys in sorted(late.items())}


def reopened_windows(materialised: Materialised, landed: Iterable[tuple[int, str]]) -> list[int]:
    """The committed windows `late_batches` names."""
    return list(late_batches(materialised, landed))


def read_commit(output, window_start_ms: int) -> WindowCommit | None:
    """The window's published commit (None: none, or no output location yet): one GET."""
    key = commit_key(window_start_ms)
    try:
        raw = output.get_optional(key)
    except ZoneNotFoundError:
        return None
    return None if raw is None else WindowCommit.from_json(raw, f"{output.uri}/{key}")


DAY_MS = 86_400_000


def commit_windows(output, start_ms: int, end_ms: int) -> list[int]:
    """The windows in [start_ms, end_ms) with a commit, from the commit keys alone (no GET): one listing per
    UTC day (`_commits/window=YYYYMMDD`), so the cost follows the days asked for, not the output's history."""
    found: list[int] = []
    day = start_ms - start_ms % DAY_MS
    try:
        while day < end_ms:
            stem = f"{COMMITS}/{datetime.fromtimestamp(day / 1000, tz=timezone.utc):window=%Y%m%d}"
            for key in output.list_keys(stem):
                if is_commit_key(key) and start_ms <= (w := commit_window(key)) < end_ms:
                    found.append(w)
            day += DAY_MS
    except ZoneNotFoundError:
        return []
    return sorted(found)


def commit_window(key: str) -> int:
    """The window start (epoch millis) a commit key names (`is_commit_key` holds)."""
    start = datetime.strptime(key[len(COMMITS) + 1:-len(".json")], _NAME_FORMAT).replace(tzinfo=timezone.utc)
    return int(start.timestamp() * 1000)


def read_materialised_from(output, start_ms: int, end_ms: int) -> Materialised:
    """The commits of the windows in [start_ms, end_ms) (`commit_windows`, then one GET each): what the
    checkpoint run needs from its listing start on. Reading every commit ever written made each run's cost
    (time and memory: a commit names every batch of its window) grow with the output's history."""
    commits = []
    for w in commit_windows(output, start_ms, end_ms):
        commit = read_commit(output, w)
        if commit is not None:  # deleted since the listing (a re-run of the window began)
            commits.append(commit)
    return Materialised.from_commits(commits)


def read_materialised(output) -> Materialised:
    """Every committed manifest of an output location (any store with `list_keys(prefix)` and `get(key)`,
    e.g. zone/store/'s): the whole history, for audits and tests; the pipeline reads windows from a
    start (`read_materialised_from`). A missing location has none; an unreadable commit raises
    CommitFormatError."""
    try:
        keys = [k for k in output.list_keys(f"{COMMITS}/") if is_commit_key(k)]
    except ZoneNotFoundError:
        return Materialised({})
    return Materialised.from_commits(WindowCommit.from_json(output.get(k), f"{output.uri}/{k}") for k in keys)


__all__ = ["COMMITS", "DATASETS", "DATASET_MANIFEST", "PENDING", "QUARANTINE", "TRANSFORMED", "CommitFormatError",
           "DatasetManifest", "Materialised", "WindowCommit", "batch_materialised", "commit_key", "commit_window",
           "commit_windows", "dataset_manifest_key", "is_commit_key", "late_batches", "pending_commit_key",
           "publish_commit", "read_commit", "read_materialised", "read_materialised_from", "reopened_windows",
           "window_partition"]
