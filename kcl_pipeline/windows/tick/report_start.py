"""Where a stream's window reports start, when the sensor's cursor does not say yet (a fresh instance, a
cleared cursor, a new stream).

The first window is found as always (window_scan.first_window: the earliest landed batch, once every live
lease has reported progress, never before the first partition), then moved past the unbroken run of windows
whose transformed output is already committed in the output zone: a fresh Dagster instance must not
re-transform history. Everything from the first gap on is reported as usual.

What it reads does not grow with the history: the frontier of the checkpoint record the last checkpoint run
stored beside the commits (windows/checkpoints/record.py) says from which window on a live shard may still have records
no window committed — every window before it is checkpointed, so committed — and only the commit keys from
there are listed (a day's listing at a time, no commit read). Before, it read every commit ever written. A
record that cannot be read only makes the listing start at the first window (the note says so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ...kcl.core.model import Lease
from ...zone.layout import iso
from ...zone.progress import ShardProgress
from ...zone.store import ZoneStore
from ..checkpoints.record import CheckpointRecordError, read_checkpoint_record
from ..manifest import commit_windows
from ..report import earliest_landed_minute
from ..scan import first_window, plan_listing_start, skip_materialised


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
    unread = ""
    try:
        record = read_checkpoint_record(output)
    except CheckpointRecordError as exc:
        record, unread = None, f"; {exc}: the committed windows are listed from the first window"
    frontier = dict(record.frontier) if record is not None else {}
    # the frontier's windows are windows of landed batches, so aligned and never before the first one
    begin = plan_listing_start(first.start_ms, frontier, leases) or first.start_ms
    start = skip_materialised(begin, commit_windows(output, begin, now_ms + window_ms), window_ms)
    skipped = (start - first.start_ms) // window_ms
    return ReportStart(start, f"first window {iso(start)}: {first.reason}"
                       + (f"; {skipped} window(s) from {iso(first.start_ms)} already transformed (their output is "
                          f"committed): not reported again" if skipped else "") + unread)
