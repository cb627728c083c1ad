"""What the sans-I/O coroutines ask their drivers to do: one vocabulary of effects, the answers they
expect, and `drive`, which runs a coroutine against a handler.

Two families of coroutines yield these: a lease's life in a worker (lease_life.py: `lease_life`,
`heartbeat_once`) and a manager's cycle (cycle.py: `manager_cycle`, `watch_for_expiry`). An effect is a
small frozen dataclass; the answer each expects is in its docstring. A `LifeEffect` is answered by a
worker's drivers (shells/worker.py and the simulation's worker), a `CycleEffect` by a manager's drivers
(shells/manager.py and the simulation's consumer); a few (the clock, the scan, the shard listing, the
creation of a lease) are asked by both. Every driver dispatches through a handler table keyed by effect
type, and a test checks that each table covers its family.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, TypeVar

from .lease_hold import LeaseHold
from .model import Checkpoint, Lease


class Effect:
    """Something a coroutine needs done; its driver answers it (or throws the exception the I/O raised)."""

    __slots__ = ()


class LifeEffect(Effect):
    """Asked by a lease's life (lease_life.py): a worker's drivers answer it."""

    __slots__ = ()


class CycleEffect(Effect):
    """Asked by a manager's cycle (cycle.py): a manager's drivers answer it."""

    __slots__ = ()


# -- asked by both -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Now(LifeEffect, CycleEffect):
    """The driver's monotonic clock. → float"""


@dataclass(frozen=True)
class Scanned:
    """The answer to `ScanTable`."""

    leases: list[Lease]
    sent_at: float      # the driver's clock when the scan was sent
    returned_at: float  # ... and when its last page returned


@dataclass(frozen=True)
class ScanTable(LifeEffect, CycleEffect):
    """Every lease of the table (all pages). → Scanned"""


@dataclass(frozen=True)
class ListShards(LifeEffect, CycleEffect):
    """→ list[Shard]"""


@dataclass(frozen=True)
class Create(LifeEffect, CycleEffect):
    """Conditional put of a new lease. → bool"""

    lease: Lease


# -- a lease's life ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Status:
    """The answer to `Check`: the driver's clock, the current hold, and whether it was asked to stop."""

    now: float
    hold: LeaseHold
    stop: bool


class Notification(enum.Enum):
    """What `Notify` tells the processor."""

    LEASE_LOST = "lease_lost"                  # processor.lease_lost()
    SHUTDOWN_REQUESTED = "shutdown_requested"  # processor.shutdown_requested(checkpointer)


@dataclass(frozen=True)
class Acquire(LifeEffect):
    """Conditional take of the lease as observed (by the manager's scan, or `observed` when given); note
    the send time and install the hold. → Lease | None"""

    observed: Lease | None = None


@dataclass(frozen=True)
class InitiateHandoff(LifeEffect):
    """Ask the observed holder to hand the lease over (`LeaseTable.initiate_handoff`, conditioned on the
    observed owner and counter). → Lease (as written, with this worker's claim) | None"""


@dataclass(frozen=True)
class FinishHandoff(LifeEffect):
    """The old holder's last write of a hand-off (`LeaseTable.finish_handoff`, fenced on the hold's
    counter): the checkpoint, the counter moved on, `checkpointOwner` removed. → bool"""

    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class CancelHandoff(LifeEffect):
    """Withdraw this worker's unfinished hand-off request (`LeaseTable.cancel_handoff`, fenced on the
    asked lease's owner, counter and claim). → bool"""

    asked: Lease


@dataclass(frozen=True)
class ReleaseObserved(LifeEffect):
    """Release a lease this worker owns but never acquired a hold on (a finished hand-off it no longer
    wants), fenced on the counter it read. → bool"""

    lease: Lease


@dataclass(frozen=True)
class Stopping(LifeEffect):
    """Whether the worker was asked to stop (a signal, its manager gone, its parent dead), before it holds
    anything. → bool"""


@dataclass(frozen=True)
class ReadLeases(LifeEffect):
    """Consistent reads of these leases. → Mapping[key, Lease | None]"""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class GetLease(LifeEffect):
    """A consistent read of our own lease. → Lease | None"""


@dataclass(frozen=True)
class Check(LifeEffect):
    """→ Status (the hold as of now: `LeaseHold.held(now)`)."""


@dataclass(frozen=True)
class Wait(LifeEffect):
    """Sleep, waking early when asked to stop. → None"""

    seconds: float


@dataclass(frozen=True)
class WaitForChange(LifeEffect):
    """Wait until the hold is lost or the timeout passes. → bool (lost)"""

    seconds: float


@dataclass(frozen=True)
class StartHeartbeats(LifeEffect):
    """Start the heartbeat timer (one `heartbeat_once` per period while `heartbeats_continue`). → None"""


@dataclass(frozen=True)
class Begin(LifeEffect):
    """processor.initialize(...) with this lease; open the reader at the start position. → None"""

    lease: Lease


@dataclass(frozen=True)
class Poll(LifeEffect):
    """One paced GetRecords. → a batch with `.shard_ended` (the driver's own type, handed back in Deliver)"""


@dataclass(frozen=True)
class Deliver(LifeEffect):
    """processor.process_records(batch) — empty polls too. → None"""

    batch: Any


@dataclass(frozen=True)
class ShardEnded(LifeEffect):
    """processor.shard_ended(checkpointer). → bool: the processor called end_shard()"""


@dataclass(frozen=True)
class Notify(LifeEffect):
    """Tell the processor: processor.lease_lost() or processor.shutdown_requested(checkpointer). → None"""

    event: Notification


@dataclass(frozen=True)
class Renew(LifeEffect):
    """A fenced, counter-moving write (heartbeat; the holder's checkpoint rides along) through the hold,
    skipped as refused when the hold is already lost or ended (`may_write`). → Outcome"""

    attributes: Mapping[str, Any] | None
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True)
class RenewAsked(LifeEffect):
    """Renew a lease this holder was asked to hand off (`LeaseTable.renew_asked`, fenced on the hold's counter)
    through the hold, as `Renew`. → Outcome"""


@dataclass(frozen=True)
class Asked(LifeEffect):
    """A renewal was refused; `asked(hold, current)` tells whether a graceful hand-off of the lease is asked of
    this holder (then the hold is kept, renewed by `RenewAsked`, and delivery stops). → bool"""

    current: Lease | None


@dataclass(frozen=True)
class End(LifeEffect):
    """The holder's fenced SHARD_END through the hold (`finished_end`). → Outcome"""


@dataclass(frozen=True)
class Release(LifeEffect):
    """The fenced release through the hold (`finished_release`); a failure reads as not released. → bool
    `unsettled`: the lease was stolen less than an expiry ago (lease_rules.UNSETTLED_ATTRIBUTE)."""

    unsettled: bool = False


@dataclass(frozen=True)
class Reinstate(LifeEffect):
    """A write carrying a checkpoint was refused; `reinstated(hold, current)` tells whether the lease is
    still ours (the checkpoint's own condition refused it). → bool"""

    current: Lease | None


@dataclass(frozen=True)
class MarkEnded(LifeEffect):
    """The pipeline's ownerless commit wrote SHARD_END: `hold.ended_by_pipeline()`. → None"""


@dataclass(frozen=True)
class OwnerlessCheckpoint(LifeEffect):
    """The forward-only checkpoint that needs no lease, written only while nobody else holds the lease
    (`LeaseTable.checkpoint(..., unless_held_by_another=me)`). → bool"""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class Checkpointed(LifeEffect):
    """Note a checkpoint the table now holds. → None"""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class TakePending(LifeEffect):
    """Take the checkpoint waiting for the next heartbeat (None when there is none). → Checkpoint | None"""


@dataclass(frozen=True)
class RestorePending(LifeEffect):
    """Put a checkpoint back for the next heartbeat, unless a newer one is waiting. → None"""

    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class Attributes(LifeEffect):
    """The processor's progress attributes for the next heartbeat, checked (None on any failure, which
    the driver logs and counts). → Mapping | None"""


@dataclass(frozen=True)
class AttributesRejected(LifeEffect):
    """The table rejected the attributes (say, an item over 400 KB): log and count. → None"""

    error: Exception


@dataclass(frozen=True)
class HeartbeatFailed(LifeEffect):
    """A heartbeat did not reach a verdict (unreachable, throttled): log; the hold stays valid until its
    validity passes. → None"""

    error: Exception


@dataclass(frozen=True)
class Locked(LifeEffect):
    """Run this sub-coroutine under the lease's write lock, with these same effects. → its return value"""

    body: Generator[LifeEffect, Any, Any]


# -- a manager's cycle ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Delete(CycleEffect):
    """DeleteItem conditioned on the observed counter. → bool"""

    lease: Lease


@dataclass(frozen=True)
class Spawn(CycleEffect):
    """Start a worker for this lease (it acquires it itself, conditioned on what was observed). → None"""

    lease: Lease
    stolen: bool = False
    handoff: bool = False  # ask the holder for a graceful hand-off first (it runs our protocol)


@dataclass(frozen=True)
class Abandon(CycleEffect):
    """Stop, for good, the local worker of a lease whose heartbeats stopped longer than the expiry ago (a
    frozen or stuck process): until it exits nobody works the lease. → None"""

    lease: Lease


@dataclass(frozen=True)
class DuplicateWorkerId(CycleEffect):
    """Another live process writes under our worker id: log it as an error and count it. → None"""

    lease_keys: tuple[str, ...]


@dataclass(frozen=True)
class PeerMetrics:
    """The answer to `ReadWorkerMetrics`."""

    last_updates: dict[str, float]  # worker id → its item's `lut` (epoch seconds)
    now_epoch_seconds: float        # this host's wall clock when the read returned


@dataclass(frozen=True)
class ReadWorkerMetrics(CycleEffect):
    """Every worker's last update in the worker metrics table. → PeerMetrics, or None when the read failed
    (logged; the last known peers stay in use)"""


@dataclass(frozen=True)
class PublishWorkerMetrics(CycleEffect):
    """Write this consumer's item in the worker metrics table (KCL 3.x's format; worker_metrics.py): its
    recent throughput in KB/s, most recent last. A failed write is logged, never fails the cycle. → None"""

    throughput_kbps: tuple[float, ...]


# -- driving -------------------------------------------------------------------------------------------------

T = TypeVar("T")


def drive(coroutine: Generator[Any, Any, T], handle: Callable[[Any], Any]) -> T:
    """Run a coroutine to its end synchronously: `handle(effect)` answers each effect; an exception it
    raises is thrown into the coroutine (which decides what it means). Returns the coroutine's value."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = coroutine.throw(error) if error is not None else coroutine.send(answer)
        except StopIteration as stop:
            return stop.value
        try:
            answer, error = handle(effect), None
        except Exception as exc:
            answer, error = None, exc


__all__ = [
    "Abandon", "Acquire", "Asked", "Attributes", "AttributesRejected", "Begin", "CancelHandoff", "Check",
    "Checkpointed", "Create", "CycleEffect", "Delete", "Deliver", "DuplicateWorkerId", "Effect", "End",
    "FinishHandoff", "GetLease", "HeartbeatFailed", "InitiateHandoff", "LifeEffect", "ListShards", "Locked",
    "MarkEnded", "Notification", "Notify", "Now", "OwnerlessCheckpoint", "PeerMetrics", "Poll",
    "PublishWorkerMetrics", "ReadLeases", "ReadWorkerMetrics", "Reinstate", "Release", "ReleaseObserved", "Renew",
    "RenewAsked", "RestorePending", "ScanTable", "Scanned", "ShardEnded", "Spawn", "StartHeartbeats", "Status",
    "Stopping", "TakePending", "Wait", "WaitForChange", "drive",
]
