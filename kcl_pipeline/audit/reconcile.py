"""A window's commit is published by its rows_reconcile check, never before (the window run's last word).

The transform leaves its commit pending (windows/manifest.py `pending_commit_key`) and the check publishes it
only when the window reconciles: a commit written before the blocking check would stay when the check fails (a
failed check stops only its own run), and the next window's checkpoint run — which trusts commits alone
(windows/checkpoints/plan.py) — would advance through the window that did not reconcile. A window whose check fails, or
never runs (a run cut off between the two, a transform materialised without its checks), has no commit: no
checkpoint run passes it, the checkpoint run names it as blocking (`uncommitted` in its report), and the sensor
asks for its run again (docs/windows.md).

A check run on a window with no pending commit (by hand, later) judges the published one and changes nothing.
"""
from __future__ import annotations

from typing import Any, Mapping, cast

from ..windows.manifest import commit_key, pending_commit_key, publish_commit
from ..zone.store import ZoneStore
from .lineage import CheckOutcome, audit_window


class _PendingCommitView:
    """The output store as it will read once the pending commit is published: the audit judges the commit it
    would publish, without publishing it first (a checkpoint run must never see an unjudged commit)."""

    def __init__(self, output: ZoneStore, window_start_ms: int, pending: bytes) -> None:
        self._output, self._key, self._pending = output, commit_key(window_start_ms), pending

    def get_optional(self, key: str) -> bytes | None:
        return self._pending if key == self._key else self._output.get_optional(key)

    def get(self, key: str) -> bytes:
        return self._pending if key == self._key else self._output.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._output, name)


def reconcile_window(store: ZoneStore, output: ZoneStore, directory: str, t0: int, t1: int, *,
                     transform: Mapping[str, int] | None = None) -> list[CheckOutcome]:
    """The counts check of one window (audit/lineage.py) over the commit its run left pending, if any, and
    the consequence: published when it passed, left pending (the window stays un-materialised) when not."""
    pending = output.get_optional(pending_commit_key(t0))
    judged = output if pending is None else cast(ZoneStore, _PendingCommitView(output, t0, pending))
    outcomes = audit_window(store, judged, directory, t0, t1, checks=["counts"], transform=transform)
    if pending is not None and all(o.ok for o in outcomes):
        publish_commit(output, t0)
    return outcomes
