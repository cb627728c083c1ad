"""What becomes of a window after the sensor reported it: wait, ask again, or call it stalled.

The sensor's cursor moves past a window once it has requested the window's run. A run can still fail for
good (Dagster's own retries spent, the run deleted, its code server gone); without a follow-up that window
would never materialise, its shards' checkpoints would never move past it, and nobody would be told. So
the cursor keeps every reported window that has not materialised yet ("outstanding", with the number of
times the sensor requested it), and each tick decides, from what the Dagster instance says about them:

  * materialised                          -> done, forgotten;
  * a run queued, running, or retrying    -> wait;
  * the last run failed for good          -> request it again (a new run key), up to `max_requests`;
  * no run known                          -> wait (the instance creates the requested run after the tick;
                                             re-requesting would race it); stalled once overdue;
  * still not materialised past its end + `overdue_ms` -> stalled, reported by name (status, metric, check).

Pure: observations in, decision out (no clock, no I/O); the sensor gathers the observations.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping, Sequence


class RunState(Enum):
    NONE = "none"            # no run of the window's partition is known
    ACTIVE = "active"        # queued, starting, running, or failed with a retry on its way
    FAILED = "failed"        # the newest run failed (or was canceled) and nothing will retry it
    SUCCEEDED = "succeeded"  # the newest run succeeded (materialisation may trail by an event)


@dataclass(frozen=True)
class WindowObservation:
    materialised: bool
    run: RunState


@dataclass(frozen=True)
class FollowUp:
    outstanding: dict[int, int]  # window start ms -> requests so far, for the cursor
    rerequest: tuple[int, ...]   # windows to request again now
    stalled: tuple[int, ...]     # windows past their end + overdue, not materialised
    gave_up: tuple[int, ...]     # stalled windows the sensor will not request again (max_requests reached)


def follow_up(outstanding: Mapping[int, int], observed: Mapping[int, WindowObservation], *, now_ms: int,
              window_ms: int, overdue_ms: int, max_requests: int) -> FollowUp:
    """Decide the next step for every outstanding window (see the module docstring).

    A window without an observation is kept as it is (the instance could not be asked this tick)."""
    if max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    keep: dict[int, int] = {}
    again: list[int] = []
    stalled: list[int] = []
    gave_up: list[int] = []
    for start in sorted(outstanding):
        requests = outstanding[start]
        seen = observed.get(start)
        if seen is not None and seen.materialised:
            continue
        if seen is not None and seen.run is RunState.FAILED:
            if requests < max_requests:
                again.append(start)
                requests += 1
            else:
                gave_up.append(start)
        keep[start] = requests
        if now_ms >= start + window_ms + overdue_ms:
            stalled.append(start)
    return FollowUp(keep, tuple(again), tuple(stalled), tuple(gave_up))


def stall_metric_due(stalled: Sequence[int], previous: Iterable[int], *, now_ms: int, window_ms: int,
                     overdue_ms: int) -> bool:
    """Whether the tick reports the stall metric and check: on every tick while windows are `stalled`, and
    once when they no longer are (the windows `previous`ly outstanding that are overdue now differ)."""
    overdue_before = {w for w in previous if now_ms >= w + window_ms + overdue_ms}
    return bool(stalled) or set(stalled) != overdue_before


def stall_description(stalled: list[str], overdue_seconds: float) -> str:
    """The windows_not_stalled check's verdict, naming every stalled window."""
    if not stalled:
        return "no reported window is overdue"
    return (f"{len(stalled)} window(s) not materialised {overdue_seconds:.0f}s after their end: "
            + ", ".join(stalled))


def reopen_run_key(partition: str, late_keys: Sequence[str]) -> str:
    """The run key of a materialised window re-run because batches landed in it after its run listed the zone
    (a backfill's refill, a late writer): one request per set of late batches, whatever the tick."""
    digest = hashlib.sha1("\n".join(sorted(late_keys)).encode()).hexdigest()[:12]
    return f"window-{partition}-reopened-{digest}"


def rerun_key(partition: str, request: int) -> str:
    """The run key of the sensor's `request`-th request of a window (the first is the plain window key)."""
    return f"window-{partition}" if request <= 1 else f"window-{partition}-request-{request}"


def shard_end_run_key(shards: Sequence[str], now_ms: int, window_ms: int) -> str:
    """The run key of a checkpoint plan requested to end `shards`: one request per window period."""
    return f"shard-end-{'+'.join(shards)}-{now_ms // window_ms}"
