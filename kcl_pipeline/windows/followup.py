"""What becomes of a window after the sensor asked for its run: wait, ask again, or call it stalled.

The sensor's cursor moves past a window once it has requested the window's run. A run can still fail for
good (Dagster's own retries spent, the run deleted, its code server gone, its rows_reconcile check failed);
without a follow-up that window would never materialise, its shards' checkpoints would never move past it,
and nobody would be told. So the cursor keeps every window it asked a run for until the window's commit says
it is done ("outstanding", `Outstanding`: the requests so far, and what the commit must name), and each tick
decides, from the output's commit and what the Dagster instance says of the window's newest run:

  * its commit is there (and names every batch it must)   -> done, forgotten;
  * a run queued, running, or retrying    -> wait;
  * the newest run ended (failed for good, or succeeded without the commit) -> request it again (a new run
                                             key), up to `max_requests`; then given up (still named stalled);
  * no run known                          -> wait (the instance creates the requested run after the tick;
                                             re-requesting would race it); stalled once overdue;
  * still not done past its end (or, asked again later, past the request) + `overdue_ms` -> stalled,
    reported by name (status, metric, check).

Windows are asked for, and followed, for three reasons: the sensor reported them complete; the checkpoint
run found batches landed in them after their run (`late`: the commit must name those batches too); the
checkpoint run is stopped on them and they have no commit at all (`uncommitted`: a run failed for good
before this cursor knew it, a transform ran without its check, a commit was lost). The last two come from
the checkpoint run's report and are asked for once per report (`track_reports`); before, a window re-run
for late batches was requested once and never followed: when that run failed for good, the window showed
materialised in Dagster, nothing flagged it, and checkpoints stopped silently.

Given-up windows cost no run query: only their commit is looked at, a few per tick in turn
(`observation_slice`), so a tick's cost does not grow with them.

Pure: observations in, decision out (no clock, no I/O); the sensor gathers the observations.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Sequence

GIVEN_UP_PER_TICK = 4  # given-up windows a tick looks at (their commit only), in turn


class RunState(Enum):
    NONE = "none"            # no run of the window's partition is known
    ACTIVE = "active"        # queued, starting, running, or failed with a retry on its way
    FAILED = "failed"        # the newest run failed (or was canceled) and nothing will retry it
    SUCCEEDED = "succeeded"  # the newest run succeeded (materialisation may trail by an event)


@dataclass(frozen=True)
class WindowObservation:
    materialised: bool  # its commit is there and names every batch the entry needs
    run: RunState  # its newest window run (NONE, unasked, for a given-up window)


@dataclass(frozen=True)
class Outstanding:
    """A window the sensor asked a run for, followed until its commit says it is done."""

    requests: int = 1
    base: str = ""  # the run key of its first request ("": the window's own key, `window-<partition>`)
    need: tuple[str, ...] = ()  # batch keys its commit must name (it was asked again for late batches)
    since_ms: int | None = None  # asked again, for an old window, at this time (None: reported when complete)
    gave_up: bool = False  # `max_requests` spent: not requested again, only its commit is looked at

    def run_key(self, partition: str) -> str:
        """The run key of its latest request: each request has its own (Dagster runs a key once)."""
        base = self.base or f"window-{partition}"
        return base if self.requests <= 1 else f"{base}-request-{self.requests}"

    def due_ms(self, start_ms: int, window_ms: int, overdue_ms: int) -> int:
        """When it counts as stalled: `overdue_ms` after the window's end, or after it was asked again."""
        return (start_ms + window_ms if self.since_ms is None else self.since_ms) + overdue_ms

    def to_json(self) -> Any:
        """For the cursor: a plain reported window is its request count (the cursor's first format)."""
        if self == Outstanding(self.requests):
            return self.requests
        data: dict[str, Any] = {"requests": self.requests}
        if self.base:
            data["base"] = self.base
        if self.need:
            data["need"] = list(self.need)
        if self.since_ms is not None:
            data["since_ms"] = self.since_ms
        if self.gave_up:
            data["gave_up"] = True
        return data

    @classmethod
    def from_json(cls, value: Any) -> "Outstanding":
        if isinstance(value, bool) or not isinstance(value, (int, dict)):
            raise TypeError(f"an outstanding window is a request count or an object, got {value!r}")
        if isinstance(value, int):
            return cls(value)
        since = value.get("since_ms")
        return cls(_int(value.get("requests", 1)), str(value.get("base") or ""),
                   tuple(str(k) for k in value.get("need") or ()), None if since is None else _int(since),
                   bool(value.get("gave_up", False)))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def as_outstanding(value: "int | Outstanding") -> Outstanding:
    return value if isinstance(value, Outstanding) else Outstanding(value)


@dataclass(frozen=True)
class FollowUp:
    outstanding: dict[int, Outstanding]  # window start ms -> its entry, for the cursor
    rerequest: tuple[int, ...]   # windows to request again now
    stalled: tuple[int, ...]     # windows past their due time, not done
    gave_up: tuple[int, ...]     # stalled windows the sensor will not request again (max_requests reached)


def follow_up(outstanding: Mapping[int, "int | Outstanding"], observed: Mapping[int, WindowObservation], *,
              now_ms: int, window_ms: int, overdue_ms: int, max_requests: int) -> FollowUp:
    """Decide the next step for every outstanding window (see the module docstring).

    A window without an observation is kept as it is (the instance could not be asked this tick)."""
    if max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    keep: dict[int, Outstanding] = {}
    again: list[int] = []
    stalled: list[int] = []
    gave_up: list[int] = []
    for start in sorted(outstanding):
        entry = as_outstanding(outstanding[start])
        seen = observed.get(start)
        if seen is not None and seen.materialised:
            continue
        # The newest run ended and the commit is not there: it failed for good, or succeeded without a
        # commit (its check did not pass, or it ran without it) — waiting would wait for ever.
        ended = seen is not None and seen.run in (RunState.FAILED, RunState.SUCCEEDED)
        if ended and not entry.gave_up:
            if entry.requests < max_requests:
                again.append(start)
                entry = replace(entry, requests=entry.requests + 1)
            else:
                entry = replace(entry, gave_up=True)
        if entry.gave_up:
            gave_up.append(start)
        keep[start] = entry
        if now_ms >= entry.due_ms(start, window_ms, overdue_ms):
            stalled.append(start)
    return FollowUp(keep, tuple(again), tuple(stalled), tuple(gave_up))


def observation_slice(outstanding: Mapping[int, Outstanding], rotation: int, given_up_per_tick: int
                      ) -> tuple[list[int], int]:
    """The windows a tick looks at, and the next rotation: every window still followed, and at most
    `given_up_per_tick` given-up ones, in turn (they need no run query, but many of them must not make every
    tick slower). Returns (windows, rotation for the next tick)."""
    followed = sorted(w for w, e in outstanding.items() if not e.gave_up)
    given_up = sorted(w for w, e in outstanding.items() if e.gave_up)
    if not given_up or given_up_per_tick < 1:
        return followed, 0
    start = rotation % len(given_up)
    turn = (given_up[start:] + given_up[:start])[:given_up_per_tick]
    return sorted(followed + turn), (start + len(turn)) % len(given_up)


@dataclass(frozen=True)
class Tracked:
    """What a checkpoint run's report adds to the follow-up: the new entries, and the windows to ask for now."""

    outstanding: dict[int, Outstanding]
    request: tuple[int, ...]


def track_reports(outstanding: Mapping[int, Outstanding], late: Mapping[int, Sequence[str]],
                  uncommitted: Iterable[int], *, report: str, reported_before_ms: int | None, now_ms: int,
                  partition: Callable[[int], str]) -> Tracked:
    """Windows the checkpoint run (`report`: an id of that run's report, unique) is stopped on, asked for once
    and followed like reported ones:

    * `late`: a committed window with batches its commit does not name -> a run whose commit must name them
      (a window already followed must name them too: its entry takes them in, no second request);
    * `uncommitted`: a window without a commit -> a run, when the sensor reported it already (before
      `reported_before_ms`) and follows it no more (a window still followed is on its way, or given up)."""
    out = dict(outstanding)
    request: list[int] = []
    for start, keys in sorted(late.items()):
        need = tuple(sorted(set(keys)))
        entry = out.get(start)
        if entry is not None:
            out[start] = replace(entry, need=tuple(sorted(set(entry.need) | set(need))))
            continue
        out[start] = Outstanding(1, reopen_run_key(partition(start), need), need, now_ms)
        request.append(start)
    for start in sorted(set(uncommitted)):
        if start in out or reported_before_ms is None or start >= reported_before_ms:
            continue
        out[start] = Outstanding(1, f"window-{partition(start)}-uncommitted-{report}", (), now_ms)
        request.append(start)
    return Tracked(out, tuple(sorted(request)))


def stall_metric_due(stalled: Sequence[int], previous: Mapping[int, "int | Outstanding"], *, now_ms: int,
                     window_ms: int, overdue_ms: int) -> bool:
    """Whether the tick reports the stall metric and check: on every tick while windows are `stalled`, and
    once when they no longer are (the windows `previous`ly outstanding that are overdue now differ)."""
    overdue_before = {w for w, e in previous.items()
                      if now_ms >= as_outstanding(e).due_ms(w, window_ms, overdue_ms)}
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
    return Outstanding(request).run_key(partition)


def shard_end_run_key(shards: Sequence[str], now_ms: int, window_ms: int) -> str:
    """The run key of a checkpoint plan requested to end `shards`: one request per window period."""
    return f"shard-end-{'+'.join(shards)}-{now_ms // window_ms}"
