"""Load-aware, leaderless balance: which one lease (if any) this consumer steals so that load converges.

Pure: the live ownership and each lease's recent load (KCL's `throughputKBps`, written by its holder on
heartbeats) in, one decision out. Every consumer runs it on the same table, no leader needed.

The rule (`plan_steal`), for consumer `me` whose load is below the fleet mean:
  * the victims are live owners whose load exceeds mean × (1 + tolerance), richest first;
  * from a victim, a lease of load x may move only when x <= (victim − me) − margin: both ends of the
    move then stay strictly inside the old gap, so the move can never reverse the imbalance (no flapping)
    and the sum of squared loads falls by at least 2·x·margin — a bounded quantity that keeps falling, so
    the fleet settles after finitely many steals and then steals nothing (zero steals in steady state);
  * among movable leases the one closest to half the gap is taken (the largest reduction);
  * at most one steal per cycle.
A lease alone heavier than the gap never moves: a hot shard ends up alone (or with the lightest leases)
on its consumer, and two hot shards on one consumer are split, since one of them fits the gap.

Tolerance stated: after convergence no consumer's load exceeds the mean by more than `tolerance` (20 %
by default), except where lease granularity forbids it — a consumer whose every lease is heavier than
the gap to the lightest consumer (e.g. a lone hot shard heavier than the mean).

Loads: a lease without a reported load counts as the mean of the reported ones (1.0 when none is
reported, which makes the rule a count balance); every lease also weighs `idle_weight` × the mean lease
load, so idle leases still spread by count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from .lease_rules import THROUGHPUT_ATTRIBUTE


@dataclass(frozen=True)
class BalanceSettings:
    tolerance: float = 0.2  # max load <= mean × (1 + tolerance) after convergence (granularity permitting)
    margin: float = 0.05  # hysteresis, as a fraction of the mean consumer load: smaller gains are not worth a move
    idle_weight: float = 0.01  # per-lease weight, as a fraction of the mean lease load

    def __post_init__(self) -> None:
        if self.tolerance < 0 or self.margin < 0 or self.idle_weight < 0:
            raise ValueError(f"balance settings must be >= 0: {self}")


@dataclass(frozen=True)
class Steal:
    lease_key: str
    owner: str
    load: float


@dataclass
class ThroughputMeter:
    """Bytes delivered since the last heartbeat → KB/s for `throughputKBps` (the caller passes the time)."""

    since: float | None = None
    bytes: int = 0

    def add(self, delivered_bytes: int) -> None:
        self.bytes += delivered_bytes

    def take(self, now: float) -> float | None:
        """The rate since the previous take (None on the first, or when no time passed); starts anew."""
        since, delivered = self.since, self.bytes
        if since is not None and now <= since:
            return None
        self.since, self.bytes = now, 0
        if since is None:
            return None
        return delivered / 1024.0 / (now - since)


def effective_loads(reported: Mapping[str, float | None], settings: BalanceSettings = BalanceSettings()
                    ) -> dict[str, float]:
    """Every lease's load for balancing: unknown → mean of the known (1.0 if none), plus the idle weight."""
    for key, value in reported.items():
        if value is not None and (value != value or value < 0):  # NaN or negative: a corrupt report
            raise ValueError(f"lease {key}: load must be a number >= 0, got {value!r}")
    known = [v for v in reported.values() if v is not None]
    mean = sum(known) / len(known) if known and sum(known) > 0 else 1.0
    floor = settings.idle_weight * mean
    return {key: (mean if value is None else value) + floor for key, value in reported.items()}


def plan_steal(me: str, mine: Mapping[str, float], owned: Mapping[str, Mapping[str, float]],
               settings: BalanceSettings = BalanceSettings(), *, idle_consumers: int = 0,
               movable: Collection[str] | None = None) -> Steal | None:
    """The one lease `me` steals this cycle, or None.

    `mine`: the leases `me` holds with their effective loads; `owned`: every other live owner's leases
    with their effective loads (see `effective_loads`). `idle_consumers`: other live consumers holding
    no lease, which the lease table cannot show (known from their worker metrics items); without them the
    mean is that of the visible consumers, and an idle consumer settles for less. `movable`, when given,
    limits which leases may be taken (the others still count for load: a lease in a graceful hand-off).
    Ties break on owner then lease key, so the decision depends on its inputs alone.
    """
    if idle_consumers < 0:
        raise ValueError(f"idle_consumers must be >= 0, got {idle_consumers}")
    if me in owned:
        raise ValueError(f"{me!r} is both this consumer and another owner")
    totals = {owner: sum(leases.values()) for owner, leases in owned.items()}
    my_load = sum(mine.values())
    consumers = len(totals) + 1 + idle_consumers
    mean = (sum(totals.values()) + my_load) / consumers
    if mean <= 0 or my_load >= mean:
        return None
    margin = settings.margin * mean
    ceiling = mean * (1 + settings.tolerance)
    for owner in sorted(totals, key=lambda o: (-totals[o], o)):
        load = totals[owner]
        if load <= ceiling:
            break  # richest first: nobody left above the tolerance
        gap = load - my_load
        fitting = [(key, x) for key, x in owned[owner].items()
                   if x <= gap - margin and (movable is None or key in movable)]
        if fitting:
            key, x = min(fitting, key=lambda kx: (abs(kx[1] - gap / 2), kx[0]))
            return Steal(key, owner, x)
    return None


__all__ = ["BalanceSettings", "Steal", "ThroughputMeter", "THROUGHPUT_ATTRIBUTE", "effective_loads", "plan_steal"]
