"""Where a stream's window reports start, when the sensor's cursor does not say yet (a fresh instance, a
cleared cursor, a new stream).

The first window is found as always (window_scan.first_window: the earliest landed batch, once every live
lease has reported progress, never before the first partition), then moved past the unbroken run of windows
whose transformed output is already committed in the output zone: a fresh Dagster instance must not
re-transform history. Everything from the first gap on is reported as usual.

What it reads does not grow with the history: the checkpoint frontier the last checkpoint run stored beside
the commits (checkpoint_commit.py) says from which window on a live shard may still have records no window
committed — every window before it is checkpointed, so committed — and only the commit keys from there are
listed (a day's listing at a time, no commit read). Before, it read every commit ever written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..kcl.core.model import Lease
from ..transform.manifest import commit_windows
from .checkpoint_commit import read_frontier
from .progress import ShardProgress
from .store import ZoneStore
from .window_report import earliest_landed_minute, iso
from .window_scan import first_window, plan_listing_start, skip_materialised


@dataclass(frozen=True)
class ReportStart:
    start_ms: int | None  # the first window to report (None: not decided yet)
    note: str  # what the tick says about it


def start_reports(store: ZoneStore, directory: str, output: ZoneStore, leases: Sequence[Lease],
                  progress: Mapping[str, ShardProgress], *, window_ms: int, grace_ms: int,
                  not_before_ms: int, now_ms: int) -> ReportStart:
    """The first window of the stream (landed under `directory` of the landing zone `store`) to report: past
    every window whose output is committed in `output` already (from the stored checkpoint frontier on, by
    the commit keys alone)."""
    first = first_window(window_ms, earliest_landed_minute(store, directory), leases, progress, grace_ms,
                         not_before_ms=not_before_ms)
    if first.start_ms is None:
        return ReportStart(None, f"first window not decided yet: {first.reason}"
                           + (f" ({', '.join(first.waiting_on)})" if first.waiting_on else ""))
    # the frontier's windows are windows of landed batches, so aligned and never before the first one
    begin = plan_listing_start(first.start_ms, read_frontier(output), leases) or first.start_ms
    start = skip_materialised(begin, commit_windows(output, begin, now_ms + window_ms), window_ms)
    skipped = (start - first.start_ms) // window_ms
    return ReportStart(start, f"first window {iso(start)}: {first.reason}"
                       + (f"; {skipped} window(s) from {iso(first.start_ms)} already transformed (their output is "
                          f"committed): not reported again" if skipped else ""))
