"""Where a stream's window reports start, when the sensor's cursor does not say yet (a fresh instance, a
cleared cursor, a new stream).

The first window is found as always (window_scan.first_window: the earliest landed batch, once every live
lease has reported progress, never before the first partition), then moved past the unbroken run of windows
whose transformed output is already committed in the output zone: a fresh Dagster instance must not
re-transform history. Everything from the first gap on is reported as usual.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..kcl.core.model import Lease
from ..transform.manifest import read_materialised
from .progress import ShardProgress
from .store import ZoneStore
from .window_report import earliest_landed_minute, iso
from .window_scan import first_window, skip_materialised


@dataclass(frozen=True)
class ReportStart:
    start_ms: int | None  # the first window to report (None: not decided yet)
    note: str  # what the tick says about it


def start_reports(store: ZoneStore, directory: str, output: ZoneStore, leases: Sequence[Lease],
                  progress: Mapping[str, ShardProgress], *, window_ms: int, grace_ms: int,
                  not_before_ms: int) -> ReportStart:
    """The first window of the stream (landed under `directory` of the landing zone `store`) to report: past
    every window whose output is committed in `output` already (its manifests only are read)."""
    first = first_window(window_ms, earliest_landed_minute(store, directory), leases, progress, grace_ms,
                         not_before_ms=not_before_ms)
    if first.start_ms is None:
        return ReportStart(None, f"first window not decided yet: {first.reason}"
                           + (f" ({', '.join(first.waiting_on)})" if first.waiting_on else ""))
    start = skip_materialised(first.start_ms, read_materialised(output).windows, window_ms)
    skipped = (start - first.start_ms) // window_ms
    return ReportStart(start, f"first window {iso(start)}: {first.reason}"
                       + (f"; {skipped} window(s) from {iso(first.start_ms)} already transformed (their output is "
                          f"committed): not reported again" if skipped else ""))
