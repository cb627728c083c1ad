"""Named branch points of the lease protocol and of the sensor's window decisions, counted only while someone
records them (the simulation).

`hit("name")` marks a branch of the fencing, validity, steal, hand-off and shutdown paths where it is taken,
in the pure core and in the shells alike, and of the sensor's tick, the window completeness rule and the
checkpoint plan (windows/).
In production nothing records: a hit costs a global lookup and a test. The simulation records every seed's hits
(`recording()`), and `kcl-pipeline simulate --coverage` reports which branches a run exercised; CI fails when a
branch of `REQUIRED` was not hit within its seeds.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

_hits: Counter[str] | None = None


def hit(name: str) -> None:
    """The branch `name` was taken (counted only while recording)."""
    if _hits is not None:
        _hits[name] += 1


@contextlib.contextmanager
def recording() -> Iterator[Counter[str]]:
    """Count the branches hit inside the block (one at a time: the simulation runs a seed per process)."""
    global _hits
    outer, _hits = _hits, Counter()
    try:
        yield _hits
    finally:
        _hits = outer


# The branches every run of 500 seeds must exercise: the paths whose bugs the simulation is there to catch.
# Each name is hit where the branch is taken (grep for it); sim/coverage tests that each was hit.
REQUIRED: dict[str, str] = {
    # fencing: the shells' fenced writes and what a refusal means
    "shell.renew.applied": "a fenced heartbeat applied: the hold renewed from its send time",
    "shell.renew.refused": "a fenced heartbeat refused: the hold lost",
    "shell.renew.error": "a fenced heartbeat without a verdict: the hold kept until its validity passes",
    "shell.renew.not-sent-past-validity": "no fenced write sent once the validity has passed",
    "shell.release.applied": "a release applied",
    "shell.release.refused": "a release refused (the lease was no longer ours)",
    "life.checkpoint.refused-then-reinstated": "a refused checkpoint whose lease is still ours",
    "life.checkpoint.refused-lease-lost": "a refused checkpoint: the lease was taken",
    "life.lost.flushed-ownerless": "a lost worker's pending checkpoint written ownerless (the lease was free)",
    "life.lost.released-given-back": "a lease the table still shows at our counter released after the loss",
    # validity
    "life.validity.passed-before-poll": "the validity passed while delivering: stopped before the poll",
    "life.validity.passed-before-delivery": "the validity passed between the poll and the delivery: not delivered",
    "life.acquire.not-acquired": "an acquire refused: the lease moved since it was observed",
    # steal
    "cycle.steal": "a manager stole a lease from a live holder",
    "life.steal.waited-an-expiry": "a stolen lease delivered only after one expiry",
    "life.steal.stopped-while-waiting-released-unsettled": "a stealer stopped during its wait released the "
                                                           "lease marked unsettled",
    "cycle.take-unsettled-waits": "a lease released unsettled taken to wait one expiry",
    # hand-off
    "life.handoff.asked": "a hand-off asked of a live holder",
    "life.handoff.warm": "the holder stepped aside: the new owner delivered at once",
    "life.handoff.timed-out-cold": "the holder did not answer in time: taken from cold",
    "life.handoff.overtaken": "the hand-off was overtaken (the lease moved on)",
    "life.handoff.withdrawn": "a taker asked to stop while waiting withdrew its hand-off",
    "life.handoff.holder-finished": "a holder checkpointed and stepped aside",
    "life.handoff.holder-too-late": "a holder answered after the asker had taken the lease",
    # shutdown
    "life.shutdown.released": "a worker asked to stop released its lease",
    "life.shutdown.release-refused": "a worker asked to stop found its lease no longer its own",
    "shell.heartbeats.stopped-with-the-worker": "the heartbeat stopped when its worker was asked to stop",
    "shell.worker.stops-when-its-parent-dies": "a worker whose manager died stopped by itself",
    "shell.worker.stops-on-a-stale-keep-alive": "a worker whose manager stopped refreshing the keep-alive stopped",
    "shell.manager.shutdown-terminated": "a manager's shutdown asked its workers to stop",
    "shell.manager.shutdown-killed-a-straggler": "a worker that did not stop in time was killed",
    "shell.manager.abandoned-a-stuck-worker": "a frozen local worker was killed and its lease taken again",
    "shell.manager.reaped": "finished workers reaped",
    # the sensor's tick (windows/tick/decisions.py)
    "sensor.cursor-past-complete-windows": "the sensor reported complete windows and moved its cursor past them",
    "sensor.waits-on-an-incomplete-window": "the next window is not complete: the tick names the shards it waits on",
    "sensor.failed-run-requested-again": "a window whose run ended without a commit requested again",
    "sensor.reran-late-batches": "a window whose batches landed after its run requested again (checkpoint report)",
    "sensor.shard-end-run": "shards whose last record landed: the checkpoint plan requested to end them",
    # the completeness rule (windows/completeness.py): how each shard passes a window
    "completeness.waits-on-a-shard": "a window held back: a shard had not passed it yet",
    "completeness.window-complete": "every listed shard passed the window",
    "completeness.passed.lease-ended": "a shard passed a window: its lease is SHARD_END",
    "completeness.passed.last-record-landed": "a shard passed a window: its last record landed",
    "completeness.passed.landed-past-the-end": "a shard passed a window: it landed a record arriving after the end",
    "completeness.passed.next-record-past-the-end": "a shard passed a window: the record after its last landed "
                                                    "one, read and held, arrived after the end",
    "completeness.passed.caught-up-after-the-grace": "a shard passed a window: caught up after its end and grace",
    "completeness.passed.born-after": "a shard passed a window: born after it (an ancestor was open then)",
    "completeness.passed.descendant-leased": "a shard without a lease passed a window: a descendant is leased",
    # the checkpoint plan (windows/checkpoints/plan.py)
    "plan.commit-stops-at-an-unmaterialised-window": "a shard's commit stopped before a window not materialised",
    "plan.commit-stops-at-a-chain-break": "a shard's commit stopped before a batch not proven to follow",
    "plan.shard-ended": "a shard whose last record landed and whose earlier windows materialised ended",
    "plan.shard-end-held": "a shard whose last record landed not ended: a window or a batch before it is missing",
}


__all__ = ["REQUIRED", "hit", "recording"]
