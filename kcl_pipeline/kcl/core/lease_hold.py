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
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from .model import Lease


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

    def after_renew(self, outcome: Outcome, sent_at: float, timing: LeaseTiming, now: float,
                    why_refused: str = HEARTBEAT_REFUSED) -> "LeaseHold":
        """After a fenced write that moves the counter on (heartbeat, holder checkpoint)."""
        if self.lost is not None or self.ended:
            return self
        if outcome is Outcome.APPLIED:
            return replace(self, counter=self.counter + 1,
                           valid_until=max(self.valid_until, timing.valid_until(sent_at)))
        if outcome is Outcome.REFUSED:
            return replace(self, lost=why_refused)
        return self.held(now)

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


__all__ = ["LeaseHold", "LeaseTiming", "Outcome"]
