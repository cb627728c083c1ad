"""What the sans-I/O coroutines ask their drivers to do: one vocabulary of effects, the answers they
expect, and `drive`, which runs a coroutine against a handler.

Two families of coroutines yield these: a lease's life in a worker (lease_life.py: `lease_life`,
`heartbeat_once`) and a manager's cycle (cycle.py: `manager_cycle`, `watch_for_expiry`). An effect is a
small frozen dataclass, generic in the answer it expects: `Check` is a `LifeEffect[Status]`. A coroutine
asks with `answer = yield from effect.ask()`, so mypy knows each answer's type (a bare `yield` gives `object`),
and a coroutine's type names what it yields and returns: `LifeCoroutine[bool]` yields lease-life effects,
is sent their answers and returns a bool. A `LifeEffect` is answered by a worker's drivers (shells/workers/worker.py
and the simulation's worker), a `CycleEffect` by a manager's drivers (shells/fleet/manager.py and the simulation's
consumer); a few (the clock, the scan, the shard listing, the creation of a lease) are asked by both. Every
driver dispatches through a handler table keyed by effect type, and a test checks that each table covers
its family.

Only what needs the outside world is an effect: I/O, the clock, the stop signals, the processor, the
lease's write lock. What the coroutines know themselves — the hold and its transitions (`CurrentHold`,
lease_hold.py) — they read and change directly.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Generator, Generic, Mapping, Protocol, Self, TypeVar, cast

from ..model import Checkpoint, Lease, Shard
from .lease_hold import LeaseHold, Outcome

A = TypeVar("A", covariant=True)  # the answer an effect expects
T = TypeVar("T")


class Effect(Generic[A]):
    """Something a coroutine needs done; its driver answers it (or throws the exception the I/O raised)."""

    __slots__ = ()

    def ask(self) -> Generator[Self, object, A]:
        """Yield this effect; its answer, typed as the effect declares (drivers answer by the same
        declaration: their handler tables are checked to cover every effect)."""
        answer = yield self
        return cast(A, answer)


class LifeEffect(Effect[A]):
    """Asked by a lease's life (lease_life.py): a worker's drivers answer it."""

    __slots__ = ()


class CycleEffect(Effect[A]):
    """Asked by a manager's cycle (cycle.py): a manager's drivers answer it."""

    __slots__ = ()


# A coroutine of a lease's life, or of a manager's cycle, returning T.
LifeCoroutine = Generator[LifeEffect[object], object, T]
CycleCoroutine = Generator[CycleEffect[object], object, T]


# -- asked by both -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Now(LifeEffect[float], CycleEffect[float]):
    """The driver's monotonic clock."""


@dataclass(frozen=True)
class Scanned:
    """The answer to `ScanTable`."""

    leases: list[Lease]
    sent_at: float      # the driver's clock when the scan was sent
    returned_at: float  # ... and when its last page returned


@dataclass(frozen=True)
class ScanTable(LifeEffect[Scanned], CycleEffect[Scanned]):
    """Every lease of the table (all pages)."""


@dataclass(frozen=True)
class ListShards(LifeEffect[list[Shard]], CycleEffect[list[Shard]]):
    """The shards of the stream (the worker's) or of every stream of the application (the manager's)."""


@dataclass(frozen=True)
class Create(LifeEffect[bool], CycleEffect[bool]):
    """Conditional put of a new lease: created."""

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
class Acquire(LifeEffect[Lease | None]):
    """Conditional take of the lease as observed (by the manager's scan, or `observed` when given); note
    the send time and install the hold (`CurrentHold.move(LeaseHold.acquired(...))`). The lease as taken,
    or None."""

    observed: Lease | None = None


@dataclass(frozen=True)
class InitiateHandoff(LifeEffect[Lease | None]):
    """Ask the observed holder to hand the lease over (`LeaseTable.initiate_handoff`, conditioned on the
    observed owner and counter: the manager's scan, or `observed` when given). The lease as written, with this
    worker's claim, or None."""

    observed: Lease | None = None


@dataclass(frozen=True)
class FinishHandoff(LifeEffect[bool]):
    """The old holder's last write of a hand-off (`LeaseTable.finish_handoff`, fenced on the hold's
    `counter`): the checkpoint, the counter moved on, `checkpointOwner` removed. Written."""

    checkpoint: Checkpoint | None
    counter: int


@dataclass(frozen=True)
class CancelHandoff(LifeEffect[bool]):
    """Withdraw this worker's unfinished hand-off request (`LeaseTable.cancel_handoff`, fenced on the
    asked lease's owner, counter and claim). Withdrawn."""

    asked: Lease


@dataclass(frozen=True)
class ReleaseObserved(LifeEffect[bool]):
    """Release a lease this worker owns but never acquired a hold on (a finished hand-off it no longer
    wants), fenced on the counter it read. Released."""

    lease: Lease


@dataclass(frozen=True)
class Stopping(LifeEffect[bool]):
    """Whether the worker was asked to stop (a signal, its manager gone, its parent dead), before it holds
    anything."""


@dataclass(frozen=True)
class ReadLeases(LifeEffect[Mapping[str, Lease | None]]):
    """Consistent reads of these leases, by key (None: no such lease)."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class GetLease(LifeEffect[Lease | None]):
    """A consistent read of our own lease (None: no such lease)."""


@dataclass(frozen=True)
class Check(LifeEffect[Status]):
    """The clock, the hold as of now (`LeaseHold.held(now)`, kept), and the stop signals, read under the
    lease's write lock: a write in flight (a heartbeat) decides the hold this check reads."""


@dataclass(frozen=True)
class Wait(LifeEffect[None]):
    """Sleep, waking early when asked to stop."""

    seconds: float


@dataclass(frozen=True)
class WaitForChange(LifeEffect[None]):
    """Wait until the hold is lost or the timeout passes."""

    seconds: float


@dataclass(frozen=True)
class StartHeartbeats(LifeEffect[None]):
    """Start the heartbeat timer (one `heartbeat_once` per period while the hold's `heartbeats_continue`)."""


@dataclass(frozen=True)
class Begin(LifeEffect[None]):
    """processor.initialize(...) with this lease; open the reader at the start position."""

    lease: Lease


class Polled(Protocol):
    """What the life reads of a polled batch (the rest is the driver's)."""

    @property
    def shard_ended(self) -> bool: ...


@dataclass(frozen=True)
class Poll(LifeEffect[Polled]):
    """One paced GetRecords: a batch of the driver's own type, handed back in `Deliver`."""


@dataclass(frozen=True)
class Deliver(LifeEffect[None]):
    """processor.process_records(batch) — empty polls too."""

    batch: Polled


@dataclass(frozen=True)
class ShardEnded(LifeEffect[bool]):
    """processor.shard_ended(checkpointer): whether the processor called end_shard()."""


@dataclass(frozen=True)
class Notify(LifeEffect[None]):
    """Tell the processor: processor.lease_lost() or processor.shutdown_requested(checkpointer)."""

    event: Notification


@dataclass(frozen=True)
class Renew(LifeEffect[Outcome]):
    """A fenced, counter-moving write (heartbeat; the holder's checkpoint rides along) through the hold,
    skipped as refused when the hold may not write (`LeaseHold.may_write`)."""

    attributes: Mapping[str, Any] | None
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True)
class RenewAsked(LifeEffect[Outcome]):
    """Renew a lease this holder was asked to hand off (`LeaseTable.renew_asked`, fenced on the hold's counter)
    through the hold, as `Renew`."""


@dataclass(frozen=True)
class End(LifeEffect[Outcome]):
    """The holder's fenced SHARD_END through the hold (`LeaseHold.after_end`)."""


@dataclass(frozen=True)
class Release(LifeEffect[bool]):
    """The fenced release through the hold (`LeaseHold.after_release`): released (a failure reads as not).
    `unsettled`: the lease was stolen less than an expiry ago (lease_rules.UNSETTLED_ATTRIBUTE)."""

    unsettled: bool = False


@dataclass(frozen=True)
class OwnerlessCheckpoint(LifeEffect[bool]):
    """The forward-only checkpoint that needs no lease, written only while nobody else holds the lease
    (`LeaseTable.checkpoint(..., unless_held_by_another=me)`): written."""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class TakePending(LifeEffect[Checkpoint | None]):
    """Take the checkpoint the processor left for the next heartbeat (None when there is none): the
    processor sets it from its own thread, under the driver's lock."""


@dataclass(frozen=True)
class RestorePending(LifeEffect[None]):
    """Put a checkpoint back for the next heartbeat, unless the processor left a newer one meanwhile."""

    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class Attributes(LifeEffect[Mapping[str, Any] | None]):
    """The processor's progress attributes for the next heartbeat, checked (None on any failure, which
    the driver logs and counts)."""


@dataclass(frozen=True)
class AttributesRejected(LifeEffect[None]):
    """The table rejected the attributes (say, an item over 400 KB): log and count."""

    error: Exception


@dataclass(frozen=True)
class HeartbeatFailed(LifeEffect[None]):
    """A heartbeat did not reach a verdict (unreachable, throttled): log; the hold stays valid until its
    validity passes."""

    error: Exception


@dataclass(frozen=True)
class Locked(LifeEffect[T]):
    """Run this sub-coroutine under the lease's write lock, with these same effects: its return value."""

    body: LifeCoroutine[T]


# -- a manager's cycle ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Delete(CycleEffect[bool]):
    """DeleteItem conditioned on the observed counter: deleted."""

    lease: Lease


@dataclass(frozen=True)
class Spawn(CycleEffect[None]):
    """Start a worker for this lease (it acquires it itself, conditioned on what was observed): the cycle's
    whole decision about that worker. Both transports hand this very object to the worker they start
    (production's pickled into the worker process), and the worker takes its lease, steal and hand-off from
    it and from nowhere else, so nothing of the decision is lost between the cycle and the worker."""

    lease: Lease  # as the cycle observed it: the acquire is conditioned on its owner and counter
    stolen: bool = False  # taken from a live holder: deliver only once an expiry has passed (LifeSettings.stolen)
    handoff: bool = False  # ask the holder for a graceful hand-off first (it runs our protocol)


@dataclass(frozen=True)
class Abandon(CycleEffect[None]):
    """Stop, for good, the local worker of a lease whose heartbeats stopped longer than the expiry ago (a
    frozen or stuck process), or that never showed its take within its start patience: until it exits nobody
    works the lease."""

    lease: Lease
    before_take: bool = False  # spawned and never seen taking the lease (a frozen or very slow start)
    waited_seconds: float = 0.0  # since its spawn (before its take), or since the lease last changed


@dataclass(frozen=True)
class RenewHeld(CycleEffect[int | None]):
    """Renew a lease this manager holds through its back-off (retry.py): the fenced heartbeat of our worker id at
    `counter`. The new counter, or None when refused (the lease moved on)."""

    lease_key: str
    counter: int


@dataclass(frozen=True)
class DuplicateWorkerId(CycleEffect[None]):
    """Another live process writes under our worker id: log it as an error and count it."""

    lease_keys: tuple[str, ...]


@dataclass(frozen=True)
class PeerMetrics:
    """The answer to `ReadWorkerMetrics`."""

    last_updates: dict[str, float]  # worker id → its item's `lut` (epoch seconds)
    now_epoch_seconds: float        # this host's wall clock when the read returned


@dataclass(frozen=True)
class ReadWorkerMetrics(CycleEffect[PeerMetrics | None]):
    """Every worker's last update in the worker metrics table, or None when the read failed (logged; the
    last known peers stay in use)."""


@dataclass(frozen=True)
class PublishWorkerMetrics(CycleEffect[None]):
    """Write this consumer's item in the worker metrics table (KCL 3.x's format; worker_metrics.py): its
    recent throughput in KB/s, most recent last. A failed write is logged, never fails the cycle."""

    throughput_kbps: tuple[float, ...]


# -- driving -------------------------------------------------------------------------------------------------

E = TypeVar("E", bound=Effect[object])


def drive(coroutine: Generator[E, object, T], handle: Callable[[E], object]) -> T:
    """Run a coroutine to its end synchronously: `handle(effect)` answers each effect; an exception it
    raises is thrown into the coroutine (which decides what it means). Returns the coroutine's value."""
    answer: object = None
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
    "Abandon", "Acquire", "Attributes", "AttributesRejected", "Begin", "CancelHandoff", "Check", "Create",
    "CycleCoroutine", "CycleEffect", "Delete", "Deliver", "DuplicateWorkerId", "Effect", "End", "FinishHandoff",
    "GetLease", "HeartbeatFailed", "InitiateHandoff", "LifeCoroutine", "LifeEffect", "ListShards", "Locked",
    "Notification", "Notify", "Now", "OwnerlessCheckpoint", "PeerMetrics", "Poll", "Polled",
    "PublishWorkerMetrics", "ReadLeases", "ReadWorkerMetrics", "Release", "ReleaseObserved", "Renew",
    "RenewAsked", "RenewHeld", "RestorePending", "ScanTable", "Scanned", "ShardEnded", "Spawn", "StartHeartbeats",
    "Status", "Stopping", "TakePending", "Wait", "WaitForChange", "drive",
]
