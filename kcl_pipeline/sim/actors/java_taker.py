"""The lease taker of the Java peer models, as DynamoDBLeaseTaker takes leases: the KCL 2.x peer's (java.py) and
the KCL 3.x peer's in its 2.x-compatible client versions (java3.py).

Each round lists the table and judges a lease expired by its own clock: a lease whose (leaseCounter, leaseOwner) the
taker has not seen change for the expiry, timed from when it first saw it so; an unowned lease is free at once. It
takes a lease by `SET leaseOwner = me, leaseCounter + 1` conditioned on the counter it saw, never a SHARD_END one.
How many it takes, and whether it steals, is each peer's (the target it computes from the round).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

from ...kcl.core.model import Lease

TAKE = "SET leaseOwner = :me, leaseCounter = :next ADD ownerSwitchesSinceCheckpoint :one"

# The peer's conditional UpdateItem: (lease key, update expression, condition, values) -> whether it applied.
Update = Callable[[str, str, str, dict], bool]


@dataclass(frozen=True)
class TakerRound:
    """What one round of the taker sees: the leases not ended, and of those the ones it may take (not its own,
    unowned or expired), in lease-key order."""

    live: list[Lease]
    available: list[Lease]


@dataclass
class LeaseTaker:
    worker_id: str
    expiry: float
    also: str = ""  # what a take writes besides TAKE (KCL 3.x: `REMOVE checkpointOwner`)
    # Per lease key, its (leaseCounter, leaseOwner) and when (the peer's monotonic clock) the taker first saw it so.
    seen: dict[str, tuple[int, str | None, float]] = field(default_factory=dict)

    def round(self, leases: Sequence[Lease], now: float, held: Collection[str]) -> TakerRound:
        """A round over these (listed) leases at `now`; forgets the leases no longer there."""
        seen = {}
        for lease in leases:
            previous = self.seen.get(lease.lease_key)
            state = (lease.lease_counter, lease.lease_owner)
            seen[lease.lease_key] = previous if previous and previous[:2] == state else (*state, now)
        self.seen = seen
        live = [lease for lease in leases if not lease.is_ended]
        available = sorted((lease for lease in live if lease.lease_key not in held and (
            lease.lease_owner is None or now - seen[lease.lease_key][2] > self.expiry)), key=lambda x: x.lease_key)
        return TakerRound(live, available)

    def take(self, update: Update, lease: Lease) -> bool:
        """Take (or steal) `lease` as the round saw it: whether the conditional write applied."""
        return update(lease.lease_key, TAKE + self.also, "leaseCounter = :c",
                      {":me": {"S": self.worker_id}, ":c": {"N": str(lease.lease_counter)},
                       ":next": {"N": str(lease.lease_counter + 1)}, ":one": {"N": "1"}})


__all__ = ["TAKE", "LeaseTaker", "TakerRound", "Update"]
