"""One lease's life in a worker, as sans-I/O coroutines. Its states, in order, and the outcome (LifeOutcome)
each way out reports — as Java KCL's ConsumerStates documents its own:

    ASKING        (a hand-off only) ask the holder; wait for it to step aside ─ overtaken, stopped ▶ NOT_ACQUIRED
    ACQUIRING     the conditional take ─ the lease moved since it was observed ▶ NOT_ACQUIRED
    WAITING_ON_PARENTS   read the parents' leases ─ a parent unfinished: release ▶ BLOCKED_ON_PARENTS
    SETTLING      (stolen only) deliver nothing for one expiry
    PROCESSING    poll → deliver; heartbeats renew on their own timer
    SHARD_ENDING  after the last record: SHARD_END (or the pipeline's), the children's leases ▶ SHARD_ENDED

    from SETTLING, PROCESSING or SHARD_ENDING:
      asked to stop ▶ SHUTTING_DOWN: shutdown_requested, flush, release (or finish a hand-off) ▶ SHUTDOWN
      hold lost ▶ LOST: lease_lost, flush ▶ LEASE_LOST; asked to hand off: checkpoint, hand over ▶ HANDED_OFF
    any error: keep the lease (its manager holds it through a back-off) ▶ FAILED

The worker (worker.py) and the deterministic simulation (kcl_pipeline.sim) run these same generators. A
generator never touches a clock, a thread, a network or a processor: it yields an *effect* (effects.py: a
small dataclass saying what it needs done) and its driver sends back the answer, or throws the exception
the I/O raised into it. So every decision — when to check validity, what a refused write means, when to
give the lease back, what to flush — is made here once, and the two drivers only do I/O:

    life = lease_life(observed, settings, current)
    answer = None
    while True:
        effect = life.send(answer)          # StopIteration.value is the LifeResult
        answer = handle(effect)             # or life.throw(exc) when the I/O failed

Two coroutines share one lease, as the worker's two threads do: `lease_life` (the delivery loop) and
`heartbeat_once` (one tick of the heartbeat timer). Their fenced writes must not overlap — each is
conditioned on the counter the previous one left — so a write together with the decision that follows
it runs inside `Locked(...)`, which the driver runs under the lease's write lock.

The state of the held lease (its fencing counter and validity) is the pure `LeaseHold` (lease_hold.py), and
`CurrentHold` the one both coroutines share: they read it and make its transitions that need no I/O
themselves (under the write lock: inside `Locked`); the driver installs it on acquire and moves it through
`LeaseHold`'s transitions after each fenced write it sends.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeGuard

from .. import coverage
from ..lineage import blocked_on_parents, child_leases_on_end
from ..model import AT_TIMESTAMP, Checkpoint, Lease
from ..table.lease_codec import LeaseTableError, LeaseTableMissing, LeaseTableUnavailable
from ..table.lease_rules import CLAIM_ATTRIBUTE, HANDOFF_ATTRIBUTE
from .effects import (
    Acquire,
    Attributes,
    AttributesRejected,
    Begin,
    CancelHandoff,
    Check,
    Create,
    Deliver,
    End,
    FinishHandoff,
    GetLease,
    HeartbeatFailed,
    InitiateHandoff,
    LifeCoroutine,
    ListShards,
    Locked,
    Notification,
    Notify,
    Now,
    OwnerlessCheckpoint,
    Poll,
    ReadLeases,
    Release,
    ReleaseObserved,
    Renew,
    RenewAsked,
    RestorePending,
    ScanTable,
    ShardEnded,
    StartHeartbeats,
    Status,
    Stopping,
    TakePending,
    Wait,
    WaitForChange,
)
from .lease_hold import CurrentHold, LeaseHold, LeaseTiming, Outcome

# -- settings and results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LifeSettings:
    timing: LeaseTiming
    initial: Checkpoint               # where children's leases start (the consumer's initial position)
    heartbeat_seconds: float
    drained_attribute: str | None = None
    # The lease was taken from a live holder (a steal for balance). That holder may deliver until its own
    # validity passes (it learns of the take at its next heartbeat at the latest), so the new holder
    # delivers nothing for one expiry after its acquire returned: never two deliverers at once.
    stolen: bool = False
    # Take it by a graceful hand-off from this live holder (it runs this consumer's protocol: its worker
    # metrics are fresh): it checkpoints what it delivered and steps aside, and this worker delivers at
    # once — instead of waiting out the holder's validity. A holder that does not answer within
    # `handoff_timeout` is taken from cold, as any steal.
    handoff_from: str | None = None


class LifeOutcome(enum.StrEnum):
    """How a lease's life in a worker ended. Its value is what logs, the manager's cycle summary and the
    simulation's statistics print."""

    NOT_ACQUIRED = "not_acquired"
    BLOCKED_ON_PARENTS = "blocked_on_parents"
    SHARD_ENDED = "shard_ended"
    LEASE_LOST = "lease_lost"
    HANDED_OFF = "handed_off"
    SHUTDOWN = "shutdown"
    FAILED = "failed"


@dataclass(frozen=True)
class LifeResult:
    """How a lease's life in a worker ended (the worker reports it to its manager)."""

    lease_key: str
    outcome: LifeOutcome
    detail: str = ""
    children_created: tuple[str, ...] = ()
    # The counter at which the lease may still stand in this worker's name: it stopped without releasing it or
    # seeing it gone (the table unreachable). Its manager releases the lease fenced on this counter when it stops
    # (a write by anyone since, another process under the same worker id included, moved the counter on).
    left_at: int | None = None
    # FAILED only: the worker kept the lease (at `left_at`) for its manager to hold through a back-off and retry.
    kept: bool = False


class LeaseLost(Exception):
    """A fenced write was refused: this worker no longer holds its lease."""


Life = LifeCoroutine[LifeResult]


class AtTimestampUnknown(ValueError):
    """A lease starts AT_TIMESTAMP, and no timestamp is configured: reading it from anywhere would be a guess."""


def start_position(checkpoint: Checkpoint, landed: Checkpoint | None,
                   at_timestamp_ms: int | None = None) -> Checkpoint:
    """Where reading starts: after the lease checkpoint, or after the last record the processor says it
    already has (a landing processor's last landed record) when that is later.

    A lease at AT_TIMESTAMP starts at the application's configured timestamp (`at_timestamp_ms`), as Java's
    IteratorBuilder takes it from the initial position: Java writes the sentinel with sub-sequence 0, so the
    item holds no timestamp (reading its 0 as epoch millis would read the whole retention). Without a configured
    timestamp, a positive sub-sequence is the timestamp an earlier version of this consumer stored there;
    with neither, AtTimestampUnknown."""
    if landed is not None and (checkpoint.is_starting_sentinel or landed.key() > checkpoint.key()):
        return landed
    if checkpoint.sequence_number == AT_TIMESTAMP:
        timestamp = at_timestamp_ms if at_timestamp_ms is not None else checkpoint.sub_sequence_number or None
        if timestamp is None:
            raise AtTimestampUnknown(
                "the lease starts AT_TIMESTAMP (as Java KCL writes it, without the timestamp) and this consumer "
                "has no AT_TIMESTAMP initial position: configure --initial-position AT_TIMESTAMP --timestamp, the "
                "timestamp of the application that created the lease")
        return Checkpoint(AT_TIMESTAMP, timestamp)
    return checkpoint


def wait_between_polls_for_end(settings: LifeSettings) -> float:
    """How long an idle worker waits between looks at a lease whose end someone else writes."""
    return min(1.0, settings.heartbeat_seconds)


# -- the delivery coroutine -----------------------------------------------------------------------------

def handoff_timeout(settings: LifeSettings) -> float:
    """How long a hand-off may take before the lease is taken from cold: half an expiry. The holder hears
    of it at its next heartbeat (a third of an expiry apart) and its counter stops moving meanwhile, so
    waiting longer would let a third consumer see the lease expire and take it first."""
    return settings.timing.expiry_seconds / 2


def still_held_by_the_same(observed: Lease, current: Lease | None) -> Lease | None:
    """The lease to steal now: `current` when the holder the steal was decided against still holds it — its
    renewals since the manager's scan moved only the counter — else None (released, taken by another, ended).

    A steal is decided on a scan that is older by the spawn (seconds on a busy host) and the worker's start:
    a live holder renews every heartbeat meanwhile, and a take or a hand-off conditioned on the scan's counter
    would then fail every time and the fleet never balance. Re-targeting is as safe as a fresh scan: the steal
    still waits out an expiry (or the holder's hand-off) before it delivers. A free or expired lease is never
    re-targeted: there the counter is the evidence that nobody took it."""
    if current is None or current.is_ended or current.lease_owner != observed.lease_owner:
        return None
    return current


def _await_handoff(me: str, settings: LifeSettings,
                   target: Lease | None) -> LifeCoroutine[tuple[Lease, bool] | None]:
    """Initiate a hand-off and wait for it: (the lease to acquire, whether the holder may still deliver),
    or None when the lease went elsewhere (or the worker was asked to stop).

    Handed over is judged from the item's owner and `checkpointOwner`, not from counter arithmetic: the lease
    still names this worker as its owner, with this worker's claim, and the holder removed `checkpointOwner`.
    This protocol's holder steps aside with one write (+1); a Java KCL 3.x holder keeps renewing while its
    processor shuts down (+1 each: its renewal is fenced by the counter alone), checkpoints (+1) and then
    assigns the lease to its new owner (+1, removing `checkpointOwner`). The claim proves nobody else took the
    lease meanwhile: every acquire writes its own (another process under the same worker id, or this one after
    a freeze, would have replaced it)."""
    asked = yield from InitiateHandoff(target).ask()
    if asked is None:
        return None
    coverage.hit("life.handoff.asked")
    claim = asked.extra.get(CLAIM_ATTRIBUTE)
    now = yield from Now().ask()
    stop = yield from Stopping().ask()
    deadline = now + handoff_timeout(settings)
    while not stop:
        current = yield from GetLease().ask()
        if not _still_asked_by(current, me, claim):
            coverage.hit("life.handoff.overtaken")
            return None
        if current.extra.get(HANDOFF_ATTRIBUTE) is None:
            coverage.hit("life.handoff.warm")
            return current, False  # the holder checkpointed and stepped aside: it delivers no more
        if now >= deadline:
            coverage.hit("life.handoff.timed-out-cold")
            return current, True  # no answer: take it from cold, which fences the holder
        yield from Wait(min(wait_between_polls_for_end(settings), deadline - now)).ask()
        now = yield from Now().ask()
        stop = yield from Stopping().ask()
    coverage.hit("life.handoff.withdrawn")
    yield from _withdraw_handoff(me, asked)
    return None


def _still_asked_by(current: Lease | None, me: str, claim: Any) -> TypeGuard[Lease]:
    """The lease is still the one this worker asked for: not ended, owned by it, with its claim."""
    return (current is not None and not current.is_ended and current.lease_owner == me
            and current.extra.get(CLAIM_ATTRIBUTE) == claim)


def _withdraw_handoff(me: str, asked: Lease) -> LifeCoroutine[None]:
    """Asked to stop while waiting: give the holder its lease back, or release it once handed over (the
    holder stepped aside: nobody else delivers). A lease SIGTERM leaves owned waits out an expiry."""
    claim = asked.extra.get(CLAIM_ATTRIBUTE)
    try:
        if (yield from CancelHandoff(asked).ask()):
            return
        current = yield from GetLease().ask()
        if _still_asked_by(current, me, claim) and HANDOFF_ATTRIBUTE not in current.extra:
            yield from ReleaseObserved(current).ask()
    except Exception:  # unreachable: the lease expires
        return


def lease_life(observed: Lease, settings: LifeSettings, current: CurrentHold, me: str | None = None) -> Life:
    """The life of the lease `observed` (as the manager's scan saw it) in one worker (`me`: its worker id,
    needed for a hand-off); `current` is the hold its driver installs on acquire, shared with the heartbeat."""
    key = observed.lease_key
    acquired = False
    stolen = settings.stolen
    unsettled = False  # stolen, and the holder it was stolen from may still deliver: a release says so
    try:
        target = None
        if settings.handoff_from is not None and me is None:
            raise ValueError("a hand-off needs the worker id")
        if stolen and observed.lease_owner is not None:
            target = still_held_by_the_same(observed, (yield from GetLease().ask()))
            if target is None:
                coverage.hit("life.steal.holder-moved-on")
                return LifeResult(key, LifeOutcome.NOT_ACQUIRED,
                                  "the lease moved on since the steal was decided (its holder released it, another "
                                  "consumer took it, or it ended)")
        if settings.handoff_from is not None and me is not None:
            handed = yield from _await_handoff(me, settings, target)
            if handed is None:
                return LifeResult(key, LifeOutcome.NOT_ACQUIRED,
                                  "the hand-off was overtaken (the lease moved on, or the worker was asked to stop)")
            target, stolen = handed
        lease = yield from Acquire(target).ask()
        if lease is None:
            coverage.hit("life.acquire.not-acquired")
            return LifeResult(key, LifeOutcome.NOT_ACQUIRED,
                              "the lease changed since it was observed (another consumer moved it first, or it ended)")
        acquired = True
        unsettled = stolen
        if lease.parent_shard_ids:
            # Java's BlockOnParentShard: never read a child before its parents are finished, read now (not
            # from the manager's scan: peers create merged children early). Give the lease back at once
            # rather than sit on it; the planner takes it again once the parents are done.
            parents = yield from ReadLeases(tuple(lease.parent_shard_ids)).ask()
            waiting = blocked_on_parents(lease, parents, settings.drained_attribute)
            if waiting:
                yield from Release(unsettled).ask()
                return LifeResult(key, LifeOutcome.BLOCKED_ON_PARENTS, ",".join(waiting))
        yield from StartHeartbeats().ask()
        if stolen:
            # The holder it was taken from may deliver until its validity passes: deliver nothing for one
            # expiry. Asked to stop meanwhile, release it marked unsettled: a free lease is otherwise taken
            # and delivered at once, while that holder may still be delivering.
            status = yield from Check().ask()
            deliver_from = status.now + settings.timing.expiry_seconds
            while status.now < deliver_from:
                if status.stop:
                    coverage.hit("life.steal.stopped-while-waiting-released-unsettled")
                    return (yield from _shutdown(key, current, status, unsettled))
                if not status.hold.may_deliver(status.now):
                    return (yield from _lost(key, current, status.hold))
                yield from Wait(min(deliver_from - status.now, settings.heartbeat_seconds)).ask()
                status = yield from Check().ask()
            coverage.hit("life.steal.waited-an-expiry")
            unsettled = False
        yield from Begin(lease).ask()
        while True:
            status = yield from Check().ask()
            if status.stop:
                return (yield from _shutdown(key, current, status))
            if not status.hold.may_deliver(status.now):
                coverage.hit("life.validity.passed-before-poll")
                return (yield from _lost(key, current, status.hold))
            batch = yield from Poll().ask()
            status = yield from Check().ask()  # checked again right before delivering: a freeze may sit in between
            if status.stop:
                # Records fetched but not delivered are re-read by the next owner (not checkpointed).
                return (yield from _shutdown(key, current, status))
            if not status.hold.may_deliver(status.now):
                coverage.hit("life.validity.passed-before-delivery")
                return (yield from _lost(key, current, status.hold))
            yield from Deliver(batch).ask()
            if batch.shard_ended:
                status = yield from Check().ask()
                if not status.hold.may_deliver(status.now):
                    return (yield from _lost(key, current, status.hold))
                yield from flush_pending(current)
                end_requested = yield from ShardEnded().ask()
                return (yield from _finish_ended(key, current, end_requested, settings))
    except LeaseLost as exc:
        return LifeResult(key, LifeOutcome.LEASE_LOST, str(exc))
    except Exception as exc:  # the manager retries the lease after a back-off (retry.py); the driver logs why
        detail = f"{type(exc).__name__}: {exc}"
        if acquired and unsettled:
            # Stolen less than an expiry ago, its previous holder may still deliver: a retry here would not wait
            # for it. Given back marked unsettled, whoever takes it next waits an expiry.
            released = yield from Release(unsettled).ask()
            left = not released and current.acquired
            return LifeResult(key, LifeOutcome.FAILED, detail + ("" if released else " (lease not released)"),
                              left_at=current.hold.counter if left else None)
        # Otherwise the lease is kept, not released: its manager holds it through the back-off, as Java KCL keeps
        # a failing shard's lease, so that no peer takes it only to fail on it too. A checkpoint the processor
        # asked for is written first (best effort: the table may be what failed).
        kept = acquired and current.acquired and current.hold.heartbeats_continue()
        if kept:
            try:
                yield from flush_pending(current)
            except Exception:  # the next worker resumes from what was landed all the same
                coverage.hit("life.failed.pending-checkpoint-not-flushed")
            kept = current.hold.heartbeats_continue()
        return LifeResult(key, LifeOutcome.FAILED, detail, left_at=current.hold.counter if kept else None, kept=kept)


def _finish_ended(key: str, current: CurrentHold, end_requested: bool, settings: LifeSettings) -> Life:
    """After the last record: once the lease is SHARD_END, create the children's leases.

    A processor may leave the end to someone else (the landing pipeline ends a shard only after its last
    window is transformed): then the worker keeps heartbeating, idle, until the lease is ended (its
    heartbeat condition fails on SHARD_END), lost, handed off, or the worker is asked to stop. A hand-off
    asked of it meanwhile is finished at once, as while delivering: its heartbeats would otherwise renew the
    asked lease for as long as the pipeline takes, so no peer could take it from an asker that froze or died
    after asking (the asker's own timeout counts on its clock, which a freeze stops).
    """
    if end_requested:
        outcome = yield from End().ask()
        if outcome is not Outcome.APPLIED:
            raise LeaseLost(f"{key}: SHARD_END refused: the lease is no longer held by this worker")
    else:
        while True:
            status = yield from Check().ask()
            if status.stop:
                return (yield from _shutdown(key, current, status))
            if status.hold.ended:
                break
            yield from WaitForChange(wait_between_polls_for_end(settings)).ask()
            if current.hold.handing_to is not None:
                coverage.hit("life.ended.handed-off-while-waiting-for-the-end")
                status = yield from Check().ask()
                return (yield from _lost(key, current, status.hold))
            if current.hold.lost is not None:
                table = yield from GetLease().ask()
                if table is not None and table.is_ended:
                    yield from Locked(_ended_by_pipeline(current)).ask()
                    break
                status = yield from Check().ask()
                return (yield from _lost(key, current, status.hold))
    shards = yield from ListShards().ask()
    scanned = yield from ScanTable().ask()
    created = []
    for child in child_leases_on_end(key, shards, scanned.leases, settings.initial, settings.drained_attribute):
        if (yield from Create(child).ask()):
            created.append(child.lease_key)
    return LifeResult(key, LifeOutcome.SHARD_ENDED, children_created=tuple(created))


def _ended_by_pipeline(current: CurrentHold) -> LifeCoroutine[None]:
    """The pipeline's ownerless commit wrote SHARD_END: the hold is ended (under the write lock, as every
    transition: a heartbeat in flight must not undo it)."""
    current.move(current.hold.ended_by_pipeline())
    return
    yield  # pragma: no cover - a coroutine that needs nothing of its driver


def _shutdown(key: str, current: CurrentHold, status: Status, unsettled: bool = False) -> Life:
    yield from Notify(Notification.SHUTDOWN_REQUESTED if status.hold.may_deliver(status.now)
                      else Notification.LEASE_LOST).ask()
    yield from flush_pending(current)
    released = yield from Release(unsettled).ask()
    coverage.hit("life.shutdown.released" if released else "life.shutdown.release-refused")
    if not released and (yield from _hand_off_on_shutdown(current, status.hold)):
        return LifeResult(key, LifeOutcome.SHUTDOWN, "handed_off")
    return LifeResult(key, LifeOutcome.SHUTDOWN, f"released={released}")


def _hand_off_on_shutdown(current: CurrentHold, hold: LeaseHold) -> LifeCoroutine[bool]:
    """Stopping while a hand-off of our lease was asked for: finish it rather than leave it hanging (the
    release was refused: the table names the asker as owner). If the asker withdrew meanwhile (before our
    read, or racing our finish), the lease is ours again: release it."""
    try:
        table = yield from GetLease().ask()
        if hold.handing_to is not None or hold.asked_to_hand_off(table):
            if (yield from Locked(_finish_handoff(current, None)).ask()):
                return True
            table = yield from GetLease().ask()  # refused: the asker may have withdrawn meanwhile, giving it back
        yield from _release_if_given_back(hold, table)
        return False
    except Exception:
        return False


def _release_if_given_back(hold: LeaseHold, table: Lease | None) -> LifeCoroutine[None]:
    """The table shows the lease ours at our own counter after this worker stopped delivering (a withdrawn
    hand-off gave it back, or the validity passed with nobody taking it): release it, or it would stay
    owned by a worker that is gone until it expires."""
    if (table is not None and not table.is_ended and table.lease_owner == hold.owner
            and table.lease_counter == hold.counter and HANDOFF_ATTRIBUTE not in table.extra):
        coverage.hit("life.lost.released-given-back")
        yield from ReleaseObserved(table).ask()


def _lost(key: str, current: CurrentHold, hold: LeaseHold) -> Life:
    try:
        table = yield from GetLease().ask()
    except Exception:  # unreachable: treated as lost; a hand-off not finished is taken from cold
        table = None
    if hold.handing_to is not None or hold.asked_to_hand_off(table):
        # A graceful hand-off (KCL 3.x's checkpointOwner): delivery has stopped; the processor lands and
        # checkpoints what it delivered while the heartbeats go on renewing, then the last write hands the
        # lease over and the new owner starts.
        yield from Notify(Notification.SHUTDOWN_REQUESTED).ask()
        cp = yield from TakePending().ask()
        try:
            handed = yield from Locked(_finish_handoff(current, cp)).ask()
        except Exception:
            handed = False
        if handed:
            coverage.hit("life.handoff.holder-finished")
            if cp is not None:
                current.checkpointed = cp
            # The table's read may have failed: the hold names whom it was handing to.
            taker = table.lease_owner if table is not None else hold.handing_to
            return LifeResult(key, LifeOutcome.HANDED_OFF, f"to {taker}")
        coverage.hit("life.handoff.holder-too-late")
        yield from RestorePending(cp).ask()
        yield from flush_pending(current)
        try:
            yield from _release_if_given_back(hold, (yield from GetLease().ask()))
        except Exception:  # unreachable: the lease expires
            pass
        return LifeResult(key, LifeOutcome.LEASE_LOST, "the hand-off was taken over before it finished")
    yield from Notify(Notification.LEASE_LOST).ask()
    yield from flush_pending(current)
    left_at = hold.counter if table is None else None  # unread: it may still stand in our name
    try:
        yield from _release_if_given_back(hold, table)
    except Exception:  # unreachable: the lease expires, or the manager releases it when it stops
        left_at = hold.counter
    return LifeResult(key, LifeOutcome.LEASE_LOST, hold.lost or "no longer valid", left_at=left_at)


def _finish_handoff(current: CurrentHold, cp: Checkpoint | None) -> LifeCoroutine[bool]:
    """The hand-off's last write, under the write lock: the heartbeats' renewals move the counter it is fenced
    on, so the hand-off is judged from the hold and the table as they are now."""
    status = yield from Check().ask()
    if not status.hold.asked_to_hand_off((yield from GetLease().ask())):
        return False
    if not (yield from FinishHandoff(cp, status.hold.counter).ask()):
        return False
    current.move(current.hold.handed_off())
    return True


def flush_pending(current: CurrentHold) -> LifeCoroutine[None]:
    """Write a checkpoint still waiting for a heartbeat: fenced while held, else the ownerless forward-only
    write while the lease is free (the records were processed; a new holder re-reads them otherwise)."""
    cp = yield from TakePending().ask()
    if cp is None:
        return
    status = yield from Check().ask()
    if status.hold.may_deliver(status.now):
        try:
            if (yield from Locked(write_checkpoint(current, cp)).ask()):
                return
        except LeaseLost:
            pass
    if (yield from OwnerlessCheckpoint(cp).ask()):
        coverage.hit("life.lost.flushed-ownerless")
        current.checkpointed = cp


def write_checkpoint(current: CurrentHold, cp: Checkpoint) -> LifeCoroutine[bool]:
    """The holder's synchronous checkpoint, run under the write lock: a fenced heartbeat carrying it. True
    when written, False when it would not advance; LeaseLost when the lease is no longer ours."""
    attributes = yield from Attributes().ask()
    outcome = yield from Renew(attributes, cp).ask()
    if outcome is Outcome.APPLIED:
        current.checkpointed = cp
        return True
    # Refused: not ours any more, or the checkpoint is not ahead of the table's: tell them apart.
    if _reinstated(current, (yield from GetLease().ask())):
        coverage.hit("life.checkpoint.refused-then-reinstated")
        return False
    coverage.hit("life.checkpoint.refused-lease-lost")
    raise LeaseLost(f"checkpoint refused: {current.hold.lost or 'the lease is no longer ours'}")


def _reinstated(current: CurrentHold, table: Lease | None) -> bool:
    """After a refused write that carried a checkpoint: the hold again when the lease is still ours
    (`LeaseHold.reinstated`; called under the write lock)."""
    hold = current.hold.reinstated(table)
    if hold is None:
        return False
    current.move(hold)
    return True


# -- the heartbeat coroutine ----------------------------------------------------------------------------

def heartbeat_once(current: CurrentHold) -> LifeCoroutine[None]:
    """One heartbeat: progress and a pending checkpoint ride along. An attribute the table rejects falls
    back to a plain heartbeat, so the lease never lapses over it; an error without a verdict keeps the
    hold until its validity passes."""
    pending = yield from TakePending().ask()
    try:
        yield from Locked(_heartbeat_locked(current, pending)).ask()
    except Exception as exc:  # transient: the lease stays valid until its validity passes
        yield from RestorePending(pending).ask()
        yield from HeartbeatFailed(exc).ask()


def _heartbeat_locked(current: CurrentHold, pending: Checkpoint | None) -> LifeCoroutine[None]:
    status = yield from Check().ask()
    if status.hold.handing_to is not None:
        yield from _renew_asked(pending)
        return
    attributes = yield from Attributes().ask()
    try:
        outcome = yield from Renew(attributes, pending).ask()
    except LeaseTableError as exc:
        if not attributes or isinstance(exc, (LeaseTableUnavailable, LeaseTableMissing)):
            raise
        yield from AttributesRejected(exc).ask()
        attributes = None
        outcome = yield from Renew(None, pending).ask()
    if outcome is Outcome.APPLIED and pending is not None:
        current.checkpointed = pending
    elif outcome is Outcome.REFUSED:
        table = yield from GetLease().ask()
        handing = current.hold.handing_off(table)
        if handing is not None:
            # A graceful hand-off asked of this holder: the hold is kept, renewed by `RenewAsked`, and
            # delivery stops.
            current.move(handing)
            coverage.hit("life.handoff.holder-asked-renews")
            yield from _renew_asked(pending)
            return
        if pending is None:
            return
        # Not holder, or the checkpoint is not ahead of the table's: tell them apart.
        if _reinstated(current, table):
            coverage.hit("life.checkpoint.refused-then-reinstated")
            yield from Renew(attributes, None).ask()
        else:
            coverage.hit("life.checkpoint.refused-lease-lost")
            # Flushed when the delivery loop sees the loss: the records were processed.
            yield from RestorePending(pending).ask()


def _renew_asked(pending: Checkpoint | None) -> LifeCoroutine[None]:
    """Renew a lease being handed off; a pending checkpoint waits for the hand-off's last write."""
    if pending is not None:
        yield from RestorePending(pending).ask()
    yield from RenewAsked().ask()


__all__ = [
    "AtTimestampUnknown", "LeaseLost", "Life", "LifeOutcome", "LifeResult", "LifeSettings", "flush_pending",
    "handoff_timeout", "heartbeat_once", "lease_life", "start_position", "wait_between_polls_for_end",
    "write_checkpoint",
]
