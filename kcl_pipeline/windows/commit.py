"""The window-commit protocol: how a run replaces a window's output so that the window counts as materialised
only once the whole of it is in place (the commit object: manifest.py; why: docs/transform-commits.md).

    write = begin_window(output, t0, t1, publish=False)   # both commit keys deleted: un-materialised from here
    ... the run writes each dataset's partition, ending with its `_manifest.json` (`write.manifest_key`) ...
    commit = write.finish(batches_read)                     # the commit, last

`finish` reads each dataset's manifest back, so the commit names exactly the runs and files the datasets'
own switches name, and writes the commit naming the landed batches the run read: pending
(`publish=False`, the pipeline: the window's rows_reconcile check publishes it, audit/reconcile.py) or
published. A run that stops anywhere before `finish` returns leaves the window without a commit.

One protocol for the Spark transform (transform/job.py) and the simulation's stand-in for Spark's writes
(sim/actors/pipeline.py), so what the simulation proves about commits is what the transform does.

`window_done` is the follow-up's test of a window asked for (the sensor's, and the simulation's stand-in for
it): its published commit names every batch the request needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..zone.store import ZoneStore
from .manifest import (
    DATASETS,
    TRANSFORMED,
    DatasetManifest,
    WindowCommit,
    commit_key,
    dataset_manifest_key,
    pending_commit_key,
)


@dataclass(frozen=True)
class WindowWrite:
    """A run's write of one window, begun (its commits deleted) and not finished yet."""

    output: ZoneStore  # the output location
    window_start_ms: int
    window_end_ms: int
    publish: bool  # False: the commit is left pending for the window's rows_reconcile check

    @property
    def commit_key(self) -> str:
        """Where `finish` writes the commit."""
        return commit_key(self.window_start_ms) if self.publish else pending_commit_key(self.window_start_ms)

    def manifest_key(self, dataset: str) -> str:
        """The dataset's `_manifest.json` of this window, relative to the output root."""
        return dataset_manifest_key(dataset, self.window_start_ms)

    def finish(self, batches: Iterable[str]) -> WindowCommit:
        """Write the window's commit — last: every dataset's manifest is read back first (CommitFormatError
        when one is not a dataset manifest; a missing one raises the store's own not-found error), and the
        commit names the run that wrote the transformed dataset and the landed `batches` the run read."""
        manifests = {name: DatasetManifest.from_json(self.output.get(self.manifest_key(name)),
                                                     f"{self.output.uri}/{self.manifest_key(name)}")
                     for name in DATASETS}
        commit = WindowCommit(self.window_start_ms, self.window_end_ms, manifests[TRANSFORMED].job_id,
                              frozenset(batches), {name: m.entry() for name, m in manifests.items()})
        self.output.put(self.commit_key, commit.to_json())
        return commit


def begin_window(output: ZoneStore, window_start_ms: int, window_end_ms: int, *, publish: bool) -> WindowWrite:
    """Delete the window's commit and pending commit: from here until `finish` the window is not materialised
    (it may have been before: from now on it is being replaced), and a run that fails leaves it so."""
    output.delete([commit_key(window_start_ms), pending_commit_key(window_start_ms)])
    return WindowWrite(output, window_start_ms, window_end_ms, publish)


def window_done(commit: WindowCommit | None, need: Iterable[str] = ()) -> bool:
    """Whether a window asked for is done: its published `commit` is there and names every batch in `need`
    (the batches that landed in it after an earlier run, when it was asked for again because of them)."""
    return commit is not None and set(need) <= commit.batches


__all__ = ["WindowWrite", "begin_window", "window_done"]
