"""One lease's life in a worker, as a pure state machine: acquired → renewed … → lost / released / ended.

No clock and no I/O: the worker (worker.py) passes the monotonic time at which it *sent* each write and
what the table answered; the fleet simulation drives the same transitions. The state answers the two
questions a worker asks all the time: which counter fences my next write, and may I still deliver?

Validity is measured from when the last successful write was sent, not from when its answer arrived: a
peer starts its expiry clock when it observes the counter change, which is after the write was applied,
which is after it was sent. So `sent + expiry` is a time before which no peer can have taken the lease
by expiry; `margin` absorbs clock-rate drift between hosts and the scheduling delay between the check
and the delivery. A lease taken by a steal (a live lease moved for balance) is noticed at the next
heartbeat at the latest; landing writes are fenced separately (put-if-absent batch keys).

A write whose outcome is unknown (an error: unavailable, throttled, its response lost) may have applied all
the same, and a later write judged applied at the same counter may be its doing: the table cannot tell them
apart. So validity counts from the earliest unanswered send at the current counter (`unanswered_since`).

A worker's two coroutines (lease_life.py: the delivery loop and the heartbeat) share one hold: `CurrentHold`
keeps it, and every change goes through the transitions of `LeaseHold`, one at a time under the lease's
write lock (the coroutines make them inside `Locked`, the worker's shell under the same lock).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable

from .. import coverage
from ..model import Checkpoint, Lease
from ..table.lease_rules import HANDOFF_ATTRIBUTE


class Outcome(enum.Enum):
    APPLIED = "applied"    # the table holds our write
    REFUSED = "refused"    # the condition failed: the lease is no longer ours as we held it
    ERROR = "error"        # the write did not reach a verdict (unavailable, throttled): try again


@dataclass(frozen=True)
class LeaseTiming:
    expiry_seconds: float
    margin_seconds: float

    def __post_init__(self) -> None:
        if not 0 <= self.margin_seconds < self.expiry_seconds:
            raise ValueError(f"validity margin {self.margin_seconds}s must be in [0, expiry {self.expiry_seconds}s)")

    def valid_until(self, sent_at: float) -> float:
        return sent_at + self.expiry_seconds - self.margin_seconds


# Why a refused renewal loses the hold, unless the write says otherwise.
HEARTBEAT_REFUSED = "heartbeat condition failed: the lease was taken, released or ended"


@dataclass(frozen=True)
class LeaseHold:
    """What a worker knows of the lease it holds."""

    lease_key: str
    owner: str
    counter: int            # the leaseCounter our last applied write left: it fences the next one
    valid_until: float      # monotonic deadline for delivering (see the module docstring)
    lost: str | None = None  # why the lease is no longer ours; None while held
    ended: bool = False     # SHARD_END written (by us or by the pipeline's commit)
    # A graceful hand-off of this lease to that worker is in flight (we are its checkpointOwner): delivery
    # has stopped, but the hold is renewed until its last write steps aside.
    handing_to: str | None = None
    # The send time of the earliest write at the current counter whose outcome is unknown (see the module
    # docstring): a later write judged applied or refused counts its validity from it.
    unanswered_since: float | None = None

    @classmethod
    def acquired(cls, lease: Lease, sent_at: float, timing: LeaseTiming) -> "LeaseHold":
        if lease.lease_owner is None:
            raise ValueError(f"lease {lease.lease_key} has no owner: it was not acquired")
        return cls(lease.lease_key, lease.lease_owner, lease.lease_counter, timing.valid_until(sent_at))

    def may_deliver(self, now: float) -> bool:
        return self.lost is None and not self.ended and self.handing_to is None and now < self.valid_until

    def held(self, now: float) -> "LeaseHold":
        """The hold as of `now`: lost once the validity has passed without a successful write."""
        if self.lost is None and not self.ended and now >= self.valid_until:
            return replace(self, lost="no successful heartbeat within the lease expiry (minus the safety margin)")
        return self

    def may_write(self, now: float) -> bool:
        """A fenced write is sent only while the lease is ours as far as we know *and* still valid. Past its
        validity a renew that happens to succeed (nobody took the lease yet) would make the lease look alive to
        every peer for one more expiry while this worker, which has given it up, works it no more."""
        held = self.held(now)
        return held.lost is None and not held.ended

    def heartbeats_continue(self) -> bool:
        return self.lost is None and not self.ended

    def after_renew(self, outcome: Outcome, sent_at: float, timing: LeaseTiming, now: float,
                    why_refused: str = HEARTBEAT_REFUSED) -> "LeaseHold":
        """After a fenced write that moves the counter on (heartbeat, holder checkpoint), sent at `sent_at`."""
        if self.lost is not None or self.ended:
            return self
        if outcome is Outcome.ERROR:
            earliest = sent_at if self.unanswered_since is None else min(self.unanswered_since, sent_at)
            return replace(self, unanswered_since=earliest).held(now)
        if self.unanswered_since is not None:
            coverage.hit("hold.renew.counted-from-an-unanswered-send")
            sent_at = min(sent_at, self.unanswered_since)
        if outcome is Outcome.APPLIED:
            return replace(self, counter=self.counter + 1, unanswered_since=None,
                           valid_until=max(self.valid_until, timing.valid_until(sent_at)))
        return replace(self, lost=why_refused, unanswered_since=None)

    def after_end(self, outcome: Outcome) -> "LeaseHold":
        if outcome is Outcome.APPLIED:
            return replace(self, counter=self.counter + 1, ended=True)
        if outcome is Outcome.REFUSED:
            return replace(self, lost="end refused: the lease is no longer ours")
        return self

    def after_release(self, outcome: Outcome) -> "LeaseHold":
        if outcome is Outcome.APPLIED:
            return replace(self, counter=self.counter + 1, lost="released")
        return replace(self, lost=self.lost or "release refused: the lease is no longer ours")

    def ended_by_pipeline(self) -> "LeaseHold":
        """The pipeline's ownerless commit wrote SHARD_END (seen on re-read after a refused heartbeat)."""
        return replace(self, ended=True)

    def reinstated(self, current: Lease | None) -> "LeaseHold | None":
        """After a refused write that carried a checkpoint: the hold again when the table still shows our owner
        and counter (the checkpoint was not ahead of the table's), None when the lease is really gone."""
        if current is not None and not current.is_ended and current.lease_owner == self.owner \
                and current.lease_counter == self.counter:
            return replace(self, lost=None)
        return None

    def asked_to_hand_off(self, current: Lease | None) -> bool:
        """The table shows a graceful hand-off of our lease to another worker, still ours to finish: we are
        its `checkpointOwner` and nobody moved the counter since our last write."""
        return (current is not None and not current.is_ended and current.lease_owner != self.owner
                and current.extra.get(HANDOFF_ATTRIBUTE) == self.owner and current.lease_counter == self.counter)

    def handing_off(self, current: Lease | None) -> "LeaseHold | None":
        """After a refused renewal: the hold again, handing the lease to its next owner, when the table shows a
        graceful hand-off asked of this holder (`asked_to_hand_off`); None otherwise. The holder then renews as
        `checkpointOwner` until its last write, as a Java 3.x holder does, and delivers no more."""
        if self.ended or current is None or not self.asked_to_hand_off(current):
            return None
        return replace(self, lost=None, handing_to=current.lease_owner)

    def handed_off(self) -> "LeaseHold":
        """After the hand-off's last write applied: no longer ours (the heartbeats stop)."""
        return replace(self, lost=f"handed off to {self.handing_to or 'the next owner'}")


def _unwatched() -> None:
    return None


class CurrentHold:
    """The hold of a worker's lease as it stands, shared by the lease's two coroutines (the delivery loop and
    the heartbeat) and read by their driver. It changes only by `LeaseHold`'s transitions, each under the
    lease's write lock; `changed` tells the driver, which wakes what waits for a loss.

    Also the last checkpoint the table holds from this worker (for its driver's last word on the lease)."""

    def __init__(self, changed: Callable[[], None] = _unwatched):
        self._hold: LeaseHold | None = None
        self._changed = changed
        self.checkpointed: Checkpoint | None = None

    @property
    def acquired(self) -> bool:
        return self._hold is not None

    @property
    def hold(self) -> LeaseHold:
        if self._hold is None:
            raise RuntimeError("the lease was not acquired: there is no hold")
        return self._hold

    def move(self, hold: LeaseHold) -> LeaseHold:
        """The hold becomes `hold` (acquired, or after a transition of the current one)."""
        if hold != self._hold:
            self._hold = hold
            self._changed()
        return hold


__all__ = ["CurrentHold", "LeaseHold", "LeaseTiming", "Outcome"]
