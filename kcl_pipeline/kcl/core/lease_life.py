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
    any error: release ▶ FAILED

The worker (worker.py) and the deterministic simulation (kcl_pipeline.sim) run these same generators. A
generator never touches a clock, a thread, a network or a processor: it yields an *effect* (effects.py: a
small dataclass saying what it needs done) and its driver sends back the answer, or throws the exception
the I/O raised into it. So every decision — when to check validity, what a refused write means, when to
give the lease back, what to flush — is made here once, and the two drivers only do I/O:

    life = lease_life(observed, settings)
    answer = None
    while True:
        effect = life.send(answer)          # StopIteration.value is the LifeResult
        answer = handle(effect)             # or life.throw(exc) when the I/O failed

Two coroutines share one lease, as the worker's two threads do: `lease_life` (the delivery loop) and
`heartbeat_once` (one tick of the heartbeat timer). Their fenced writes must not overlap — each is
conditioned on the counter the previous one left — so a write together with the decision that follows
it runs inside `Locked(...)`, which the driver runs under the lease's write lock.

The state of the held lease (its fencing counter and validity) is the pure `LeaseHold`; the driver keeps
the current one (both coroutines read it) and updates it only through `renewed`, `finished_end`,
`finished_release` and `reinstated` below.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Generator, Sequence, TypeGuard

from . import coverage
from .effects import (
    Acquire,
    Asked,
    Attributes,
    AttributesRejected,
    Begin,
    CancelHandoff,
    Check,
    Checkpointed,
    Create,
    Deliver,
    End,
    FinishHandoff,
    GetLease,
    HeartbeatFailed,
    InitiateHandoff,
    LifeEffect,
    ListShards,
    Locked,
    MarkEnded,
    Notification,
    Notify,
    Now,
    OwnerlessCheckpoint,
    Poll,
    ReadLeases,
    Reinstate,
    Release,
    ReleaseObserved,
    Renew,
    RenewAsked,
    RestorePending,
    Scanned,
    ScanTable,
    ShardEnded,
    StartHeartbeats,
    Status,
    Stopping,
    TakePending,
    Wait,
    WaitForChange,
)
from .lease_codec import LeaseTableError, LeaseTableMissing, LeaseTableUnavailable
from .lease_hold import LeaseHold, LeaseTiming, Outcome
from .lease_rules import CLAIM_ATTRIBUTE, HANDOFF_ATTRIBUTE
from .model import AT_TIMESTAMP, Checkpoint, Lease, Shard
from .planner import blocked_on_parents, child_leases_on_end

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


class LeaseLost(Exception):
    """A fenced write was refused: this worker no longer holds its lease."""


Life = Generator[LifeEffect, Any, LifeResult]


# -- the hold's transitions the drivers apply (pure) ----------------------------------------------------

def may_write(hold: LeaseHold, now: float) -> bool:
    """A fenced write is sent only while the lease is ours as far as we know *and* still valid. Past its
    validity a renew that happens to succeed (nobody took the lease yet) would make the lease look alive to
    every peer for one more expiry while this worker, which has given it up, works it no more."""
    held = hold.held(now)
    return held.lost is None and not held.ended


def renewed(hold: LeaseHold, outcome: Outcome, sent_at: float, timing: LeaseTiming, now: float) -> LeaseHold:
    return hold.after_renew(outcome, sent_at, timing, now)


def finished_end(hold: LeaseHold, outcome: Outcome) -> LeaseHold:
    return hold.after_end(outcome)


def finished_release(hold: LeaseHold, outcome: Outcome) -> LeaseHold:
    return hold.after_release(outcome)


def reinstated(hold: LeaseHold, current: Lease | None) -> LeaseHold | None:
    """After a refused write that carried a checkpoint: the hold again when the table still shows our owner
    and counter (the checkpoint was not ahead of the table's), None when the lease is really gone."""
    if current is not None and not current.is_ended and current.lease_owner == hold.owner \
            and current.lease_counter == hold.counter:
        return replace(hold, lost=None)
    return None


def asked(hold: LeaseHold, current: Lease | None) -> LeaseHold | None:
    """After a refused renewal: the hold again, handing the lease to its next owner, when the table shows a
    graceful hand-off asked of this holder (`asked_to_hand_off`); None otherwise. The holder then renews as
    `checkpointOwner` until its last write, as a Java 3.x holder does, and delivers no more."""
    if hold.ended or not asked_to_hand_off(hold, current):
        return None
    assert current is not None
    return replace(hold, lost=None, handing_to=current.lease_owner)


def handed_off(hold: LeaseHold) -> LeaseHold:
    """After the hand-off's last write applied: no longer ours (the heartbeats stop)."""
    return replace(hold, lost=f"handed off to {hold.handing_to or 'the next owner'}")


def heartbeats_continue(hold: LeaseHold) -> bool:
    return hold.lost is None and not hold.ended


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


def _await_handoff(me: str, settings: LifeSettings) -> Generator[LifeEffect, Any, tuple[Lease, bool] | None]:
    """Initiate a hand-off and wait for it: (the lease to acquire, whether the holder may still deliver),
    or None when the lease went elsewhere (or the worker was asked to stop).

    Handed over is judged from the item's owner and `checkpointOwner`, not from counter arithmetic: the lease
    still names this worker as its owner, with this worker's claim, and the holder removed `checkpointOwner`.
    This protocol's holder steps aside with one write (+1); a Java KCL 3.x holder keeps renewing while its
    processor shuts down (+1 each: its renewal is fenced by the counter alone), checkpoints (+1) and then
    assigns the lease to its new owner (+1, removing `checkpointOwner`). The claim proves nobody else took the
    lease meanwhile: every acquire writes its own (another process under the same worker id, or this one after
    a freeze, would have replaced it)."""
    asked = yield InitiateHandoff()
    if asked is None:
        return None
    coverage.hit("life.handoff.asked")
    claim = asked.extra.get(CLAIM_ATTRIBUTE)
    now = yield Now()
    stop = yield Stopping()
    deadline = now + handoff_timeout(settings)
    while not stop:
        current = yield GetLease()
        if not _still_asked_by(me, claim, current):
            coverage.hit("life.handoff.overtaken")
            return None
        if current.extra.get(HANDOFF_ATTRIBUTE) is None:
            coverage.hit("life.handoff.warm")
            return current, False  # the holder checkpointed and stepped aside: it delivers no more
        if now >= deadline:
            coverage.hit("life.handoff.timed-out-cold")
            return current, True  # no answer: take it from cold, which fences the holder
        yield Wait(min(wait_between_polls_for_end(settings), deadline - now))
        now = yield Now()
        stop = yield Stopping()
    coverage.hit("life.handoff.withdrawn")
    yield from _withdraw_handoff(me, asked)
    return None


def _still_asked_by(me: str, claim: Any, current: Lease | None) -> TypeGuard[Lease]:
    """The lease is still the one this worker asked for: not ended, owned by it, with its claim."""
    return (current is not None and not current.is_ended and current.lease_owner == me
            and current.extra.get(CLAIM_ATTRIBUTE) == claim)


def _withdraw_handoff(me: str, asked: Lease) -> Generator[LifeEffect, Any, None]:
    """Asked to stop while waiting: give the holder its lease back, or release it once handed over (the
    holder stepped aside: nobody else delivers). A lease SIGTERM leaves owned waits out an expiry."""
    claim = asked.extra.get(CLAIM_ATTRIBUTE)
    try:
        if (yield CancelHandoff(asked)):
            return
        current = yield GetLease()
        if _still_asked_by(me, claim, current) and HANDOFF_ATTRIBUTE not in current.extra:
            yield ReleaseObserved(current)
    except Exception:  # unreachable: the lease expires
        return


def lease_life(observed: Lease, settings: LifeSettings, me: str | None = None) -> Life:
    """The life of the lease `observed` (as the manager's scan saw it) in one worker (`me`: its worker id,
    needed for a hand-off)."""
    key = observed.lease_key
    acquired = False
    stolen = settings.stolen
    unsettled = False  # stolen, and the holder it was stolen from may still deliver: a release says so
    try:
        target = None
        if settings.handoff_from is not None:
            if me is None:
                raise ValueError("a hand-off needs the worker id")
            handed = yield from _await_handoff(me, settings)
            if handed is None:
                return LifeResult(key, LifeOutcome.NOT_ACQUIRED,
                                  "the hand-off was overtaken (the lease moved on, or the worker was asked to stop)")
            target, stolen = handed
        lease = yield Acquire(target)
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
            parents = yield ReadLeases(tuple(lease.parent_shard_ids))
            waiting = blocked_on_parents(lease, parents, settings.drained_attribute)
            if waiting:
                yield Release(unsettled)
                return LifeResult(key, LifeOutcome.BLOCKED_ON_PARENTS, ",".join(waiting))
        yield StartHeartbeats()
        if stolen:
            # The holder it was taken from may deliver until its validity passes: deliver nothing for one
            # expiry. Asked to stop meanwhile, release it marked unsettled: a free lease is otherwise taken
            # and delivered at once, while that holder may still be delivering.
            status = yield Check()
            deliver_from = status.now + settings.timing.expiry_seconds
            while status.now < deliver_from:
                if status.stop:
                    coverage.hit("life.steal.stopped-while-waiting-released-unsettled")
                    return (yield from _shutdown(key, status, unsettled))
                if not status.hold.may_deliver(status.now):
                    return (yield from _lost(key, status.hold))
                yield Wait(min(deliver_from - status.now, settings.heartbeat_seconds))
                status = yield Check()
            coverage.hit("life.steal.waited-an-expiry")
            unsettled = False
        yield Begin(lease)
        while True:
            status = yield Check()
            if status.stop:
                return (yield from _shutdown(key, status))
            if not status.hold.may_deliver(status.now):
                coverage.hit("life.validity.passed-before-poll")
                return (yield from _lost(key, status.hold))
            batch = yield Poll()
            status = yield Check()  # checked again right before delivering: a freeze may sit in between
            if status.stop:
                # Records fetched but not delivered are re-read by the next owner (not checkpointed).
                return (yield from _shutdown(key, status))
            if not status.hold.may_deliver(status.now):
                coverage.hit("life.validity.passed-before-delivery")
                return (yield from _lost(key, status.hold))
            yield Deliver(batch)
            if batch.shard_ended:
                status = yield Check()
                if not status.hold.may_deliver(status.now):
                    return (yield from _lost(key, status.hold))
                yield from flush_pending()
                end_requested = yield ShardEnded()
                return (yield from _finish_ended(key, end_requested, settings))
    except LeaseLost as exc:
        return LifeResult(key, LifeOutcome.LEASE_LOST, str(exc))
    except Exception as exc:  # the manager retries the lease on a later cycle; the driver logs why
        released = False
        if acquired:
            released = yield Release(unsettled)
        return LifeResult(key, LifeOutcome.FAILED, f"{type(exc).__name__}: {exc}" + ("" if released or not acquired
                                                                            else " (lease not released)"))


def _finish_ended(key: str, end_requested: bool, settings: LifeSettings) -> Life:
    """After the last record: once the lease is SHARD_END, create the children's leases.

    A processor may leave the end to someone else (the landing pipeline ends a shard only after its last
    window is transformed): then the worker keeps heartbeating, idle, until the lease is ended (its
    heartbeat condition fails on SHARD_END), lost, or the worker is asked to stop.
    """
    if end_requested:
        outcome = yield End()
        if outcome is not Outcome.APPLIED:
            raise LeaseLost(f"{key}: SHARD_END refused: the lease is no longer held by this worker")
    else:
        while True:
            status = yield Check()
            if status.stop:
                return (yield from _shutdown(key, status))
            if status.hold.ended:
                break
            if (yield WaitForChange(wait_between_polls_for_end(settings))):
                current = yield GetLease()
                if current is not None and current.is_ended:
                    yield MarkEnded()
                    break
                status = yield Check()
                return (yield from _lost(key, status.hold))
    shards: Sequence[Shard] = yield ListShards()
    scanned: Scanned = yield ScanTable()
    leases: Sequence[Lease] = scanned.leases
    created = []
    for child in child_leases_on_end(key, shards, leases, settings.initial, settings.drained_attribute):
        if (yield Create(child)):
            created.append(child.lease_key)
    return LifeResult(key, LifeOutcome.SHARD_ENDED, children_created=tuple(created))


def _shutdown(key: str, status: Status, unsettled: bool = False) -> Life:
    yield Notify(Notification.SHUTDOWN_REQUESTED if status.hold.may_deliver(status.now) else Notification.LEASE_LOST)
    yield from flush_pending()
    released = yield Release(unsettled)
    coverage.hit("life.shutdown.released" if released else "life.shutdown.release-refused")
    if not released and (yield from _hand_off_on_shutdown(status.hold)):
        return LifeResult(key, LifeOutcome.SHUTDOWN, "handed_off")
    return LifeResult(key, LifeOutcome.SHUTDOWN, f"released={released}")


def _hand_off_on_shutdown(hold: LeaseHold) -> Generator[LifeEffect, Any, bool]:
    """Stopping while a hand-off of our lease was asked for: finish it rather than leave it hanging (the
    release was refused: the table names the asker as owner). If the asker withdrew meanwhile (before our
    read, or racing our finish), the lease is ours again: release it."""
    try:
        current = yield GetLease()
        if hold.handing_to is not None or asked_to_hand_off(hold, current):
            if (yield Locked(_finish_handoff(None))):
                return True
            current = yield GetLease()  # refused: the asker may have withdrawn meanwhile, giving it back
        yield from _release_if_given_back(hold, current)
        return False
    except Exception:
        return False


def _release_if_given_back(hold: LeaseHold, current: Lease | None) -> Generator[LifeEffect, Any, None]:
    """The table shows the lease ours at our own counter after this worker stopped delivering (a withdrawn
    hand-off gave it back, or the validity passed with nobody taking it): release it, or it would stay
    owned by a worker that is gone until it expires."""
    if (current is not None and not current.is_ended and current.lease_owner == hold.owner
            and current.lease_counter == hold.counter and HANDOFF_ATTRIBUTE not in current.extra):
        coverage.hit("life.lost.released-given-back")
        yield ReleaseObserved(current)


def asked_to_hand_off(hold: LeaseHold, current: Lease | None) -> bool:
    """The table shows a graceful hand-off of our lease to another worker, still ours to finish: we are
    its `checkpointOwner` and nobody moved the counter since our last write."""
    return (current is not None and not current.is_ended and current.lease_owner != hold.owner
            and current.extra.get(HANDOFF_ATTRIBUTE) == hold.owner and current.lease_counter == hold.counter)


def _lost(key: str, hold: LeaseHold) -> Life:
    try:
        current = yield GetLease()
    except Exception:  # unreachable: treated as lost; a hand-off not finished is taken from cold
        current = None
    if hold.handing_to is not None or asked_to_hand_off(hold, current):
        # A graceful hand-off (KCL 3.x's checkpointOwner): delivery has stopped; the processor lands and
        # checkpoints what it delivered while the heartbeats go on renewing, then the last write hands the
        # lease over and the new owner starts.
        yield Notify(Notification.SHUTDOWN_REQUESTED)
        cp = yield TakePending()
        try:
            handed = yield Locked(_finish_handoff(cp))
        except Exception:
            handed = False
        if handed:
            coverage.hit("life.handoff.holder-finished")
            if cp is not None:
                yield Checkpointed(cp)
            return LifeResult(key, LifeOutcome.HANDED_OFF, f"to {current.lease_owner}")
        coverage.hit("life.handoff.holder-too-late")
        yield RestorePending(cp)
        yield from flush_pending()
        try:
            yield from _release_if_given_back(hold, (yield GetLease()))
        except Exception:  # unreachable: the lease expires
            pass
        return LifeResult(key, LifeOutcome.LEASE_LOST, "the hand-off was taken over before it finished")
    yield Notify(Notification.LEASE_LOST)
    yield from flush_pending()
    try:
        yield from _release_if_given_back(hold, current)
    except Exception:  # unreachable: the lease expires
        pass
    return LifeResult(key, LifeOutcome.LEASE_LOST, hold.lost or "no longer valid")


def _finish_handoff(cp: Checkpoint | None) -> Generator[LifeEffect, Any, bool]:
    """The hand-off's last write, under the write lock: the heartbeats' renewals move the counter it is fenced
    on, so the hand-off is judged from the hold and the table as they are now."""
    status = yield Check()
    if not asked_to_hand_off(status.hold, (yield GetLease())):
        return False
    return bool((yield FinishHandoff(cp)))


def flush_pending() -> Generator[LifeEffect, Any, None]:
    """Write a checkpoint still waiting for a heartbeat: fenced while held, else the ownerless forward-only
    write while the lease is free (the records were processed; a new holder re-reads them otherwise)."""
    cp = yield TakePending()
    if cp is None:
        return
    status = yield Check()
    if status.hold.may_deliver(status.now):
        try:
            if (yield Locked(write_checkpoint(cp))):
                return
        except LeaseLost:
            pass
    if (yield OwnerlessCheckpoint(cp)):
        coverage.hit("life.lost.flushed-ownerless")
        yield Checkpointed(cp)


def write_checkpoint(cp: Checkpoint) -> Generator[LifeEffect, Any, bool]:
    """The holder's synchronous checkpoint, run under the write lock: a fenced heartbeat carrying it. True
    when written, False when it would not advance; LeaseLost when the lease is no longer ours."""
    attributes = yield Attributes()
    outcome = yield Renew(attributes, cp)
    if outcome is Outcome.APPLIED:
        yield Checkpointed(cp)
        return True
    # Refused: not ours any more, or the checkpoint is not ahead of the table's: tell them apart.
    if (yield Reinstate((yield GetLease()))):
        coverage.hit("life.checkpoint.refused-then-reinstated")
        return False
    coverage.hit("life.checkpoint.refused-lease-lost")
    status = yield Check()
    raise LeaseLost(f"checkpoint refused: {status.hold.lost or 'the lease is no longer ours'}")


# -- the heartbeat coroutine ----------------------------------------------------------------------------

def heartbeat_once() -> Generator[LifeEffect, Any, None]:
    """One heartbeat: progress and a pending checkpoint ride along. An attribute the table rejects falls
    back to a plain heartbeat, so the lease never lapses over it; an error without a verdict keeps the
    hold until its validity passes."""
    pending = yield TakePending()
    try:
        yield Locked(_heartbeat_locked(pending))
    except Exception as exc:  # transient: the lease stays valid until its validity passes
        yield RestorePending(pending)
        yield HeartbeatFailed(exc)


def _heartbeat_locked(pending: Checkpoint | None) -> Generator[LifeEffect, Any, None]:
    status = yield Check()
    if status.hold.handing_to is not None:
        yield from _renew_asked(pending)
        return
    attributes = yield Attributes()
    try:
        outcome = yield Renew(attributes, pending)
    except LeaseTableError as exc:
        if not attributes or isinstance(exc, (LeaseTableUnavailable, LeaseTableMissing)):
            raise
        yield AttributesRejected(exc)
        attributes = None
        outcome = yield Renew(None, pending)
    if outcome is Outcome.APPLIED and pending is not None:
        yield Checkpointed(pending)
    elif outcome is Outcome.REFUSED:
        current = yield GetLease()
        if (yield Asked(current)):
            coverage.hit("life.handoff.holder-asked-renews")
            yield from _renew_asked(pending)
            return
        if pending is None:
            return
        # Not holder, or the checkpoint is not ahead of the table's: tell them apart.
        if (yield Reinstate(current)):
            coverage.hit("life.checkpoint.refused-then-reinstated")
            yield Renew(attributes, None)
        else:
            coverage.hit("life.checkpoint.refused-lease-lost")
            yield RestorePending(pending)  # flushed when the delivery loop sees the loss: the records were processed


def _renew_asked(pending: Checkpoint | None) -> Generator[LifeEffect, Any, None]:
    """Renew a lease being handed off; a pending checkpoint waits for the hand-off's last write."""
    if pending is not None:
        yield RestorePending(pending)
    yield RenewAsked()


__all__ = [
    "AtTimestampUnknown", "LeaseLost", "Life", "LifeOutcome", "LifeResult", "LifeSettings", "asked",
    "asked_to_hand_off", "finished_end", "finished_release", "flush_pending", "handed_off", "handoff_timeout",
    "heartbeat_once", "heartbeats_continue", "lease_life", "may_write", "reinstated", "renewed", "start_position",
    "wait_between_polls_for_end", "write_checkpoint",
]
