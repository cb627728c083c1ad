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
  * at most one steal per cycle, and only from an owner seen overloaded for a while (the manager's
    patience, two cycles: reports are smoothed but noisy, and a new holder catching up from the
    checkpoint reports a burst that is not the shard's load — acting on either made the fleet flap).
A lease alone heavier than the gap never moves: a hot shard ends up alone (or with the lightest leases)
on its consumer, and two hot shards on one consumer are split, since one of them fits the gap.

Tolerance stated: after convergence no consumer's load exceeds the mean by more than `tolerance` (20 %
by default), except where lease granularity forbids it — a consumer whose every lease is heavier than
the gap to the lightest consumer (e.g. a lone hot shard heavier than the mean).

Loads: a lease without a reported load counts as the mean of the reported ones (1.0 when none is
reported, which makes the rule a count balance; 0 when every report is 0, an idle fleet); every lease
also weighs `idle_weight` × the mean lease load (× 1.0 in an idle fleet), so idle leases still spread
by count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Mapping

from ..model import Lease
from ..table.lease_rules import THROUGHPUT_ATTRIBUTE


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


# Each heartbeat's rate is folded into an exponential moving average with this time constant (KCL 3.x
# averages too, with a weight of 0.5 per renewal): a shard's traffic is bursty at the scale of seconds,
# and the balance must act on its load, not on when its polls fell relative to the heartbeats.
SMOOTHING_SECONDS = 30.0
# Below this (KB/s, about one byte a second) a lease that delivered nothing is reported idle: the average
# only decays, and without a floor an idle stream would keep its old load ratios for ever. A lease that
# delivered nothing for a whole SMOOTHING_SECONDS is reported idle too: once a stream goes quiet, the decaying
# averages would take minutes to reach the floor (≈ 30 s × ln(load / floor)), reaching it one lease at a time,
# and the fleet would go on balancing the history of its traffic, then again by count.
IDLE_KBPS = 0.001


@dataclass
class ThroughputMeter:
    """Bytes delivered between heartbeats → KB/s for `throughputKBps`, smoothed (the caller passes the time).

    `smoothed` may start from the lease's last report (its previous holder's): a new holder then continues
    the average instead of reporting its catch-up from the checkpoint as the shard's load."""

    since: float | None = None
    bytes: int = 0
    smoothed: float | None = None
    quiet_since: float | None = None  # the start of the takes in a row that delivered nothing

    def add(self, delivered_bytes: int) -> None:
        self.bytes += delivered_bytes

    def continue_from(self, report: float | None) -> None:
        """Go on from a lease's report (its previous holder's) instead of the average so far."""
        self.smoothed = report

    def take(self, now: float) -> float | None:
        """The smoothed rate up to now (None on the first take, or when no time passed); starts anew."""
        since, delivered = self.since, self.bytes
        if since is not None and now <= since:
            return None
        self.since, self.bytes = now, 0
        if since is None:
            return None
        rate = delivered / 1024.0 / (now - since)
        if self.smoothed is None:
            smoothed = rate
        else:
            weight = 1.0 - math.exp(-(now - since) / SMOOTHING_SECONDS)
            smoothed = weight * rate + (1.0 - weight) * self.smoothed
        self.quiet_since = None if delivered else (since if self.quiet_since is None else self.quiet_since)
        quiet = self.quiet_since is not None and (smoothed < IDLE_KBPS or now - self.quiet_since >= SMOOTHING_SECONDS)
        self.smoothed = 0.0 if quiet else smoothed
        return self.smoothed


def reported_load(lease: Lease) -> float | None:
    """The throughput a lease's holder last reported (`throughputKBps`), or None when absent or corrupt."""
    value = lease.extra.get(THROUGHPUT_ATTRIBUTE)
    try:
        load = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    # A corrupt report (negative, NaN, infinite) counts as unknown rather than stopping the cycle.
    return load if load is not None and 0 <= load < float("inf") else None


def effective_loads(reported: Mapping[str, float | None], settings: BalanceSettings = BalanceSettings()
                    ) -> dict[str, float]:
    """Every lease's load for balancing: unknown → mean of the known (1.0 if none), plus the idle weight."""
    for key, value in reported.items():
        if value is not None and (value != value or value < 0):  # NaN or negative: a corrupt report
            raise ValueError(f"lease {key}: load must be a number >= 0, got {value!r}")
    known = [v for v in reported.values() if v is not None]
    # An unreported lease is taken to be an average one: of an idle fleet (every report 0), an idle one.
    mean = sum(known) / len(known) if known else 1.0
    floor = settings.idle_weight * (mean if mean > 0 else 1.0)
    return {key: (mean if value is None else value) + floor for key, value in reported.items()}


def _fleet_loads(me: str, mine: Mapping[str, float], owned: Mapping[str, Mapping[str, float]],
                 idle_consumers: int) -> tuple[dict[str, float], float, float]:
    """Each other owner's total load, ours, and the mean per consumer (idle consumers included)."""
    if idle_consumers < 0:
        raise ValueError(f"idle_consumers must be >= 0, got {idle_consumers}")
    if me in owned:
        raise ValueError(f"{me!r} is both this consumer and another owner")
    totals = {owner: sum(leases.values()) for owner, leases in owned.items()}
    my_load = sum(mine.values())
    return totals, my_load, (sum(totals.values()) + my_load) / (len(totals) + 1 + idle_consumers)


def _victims(totals: Mapping[str, float], my_load: float, mean: float, settings: BalanceSettings) -> list[str]:
    if mean <= 0 or my_load >= mean:
        return []
    ceiling = mean * (1 + settings.tolerance)
    return sorted((owner for owner, load in totals.items() if load > ceiling), key=lambda o: (-totals[o], o))


def overloaded_owners(me: str, mine: Mapping[str, float], owned: Mapping[str, Mapping[str, float]],
                      settings: BalanceSettings = BalanceSettings(), *, idle_consumers: int = 0) -> list[str]:
    """The owners `me` would steal from for load, richest first (owner name breaks ties): those above the
    mean × (1 + tolerance), when `me` is below the mean. Arguments as `plan_steal`'s."""
    return _victims(*_fleet_loads(me, mine, owned, idle_consumers), settings)


def plan_steal(me: str, mine: Mapping[str, float], owned: Mapping[str, Mapping[str, float]],
               settings: BalanceSettings = BalanceSettings(), *, idle_consumers: int = 0,
               movable: Collection[str] | None = None, confirmed: Collection[str] | None = None) -> Steal | None:
    """The one lease `me` steals this cycle, or None.

    `mine`: the leases `me` holds with their effective loads; `owned`: every other live owner's leases
    with their effective loads (see `effective_loads`). `idle_consumers`: other live consumers holding
    no lease, which the lease table cannot show (known from their worker metrics items); without them the
    mean is that of the visible consumers, and an idle consumer settles for less. `movable`, when given,
    limits which leases may be taken (the others still count for load: a lease in a graceful hand-off).
    `confirmed`, when given, limits the victims to owners already seen overloaded long enough (patience:
    a passing burst, such as a new holder catching up from the checkpoint, moves nothing).
    Ties break on owner then lease key, so the decision depends on its inputs alone.
    """
    totals, my_load, mean = _fleet_loads(me, mine, owned, idle_consumers)
    margin = settings.margin * mean
    for owner in _victims(totals, my_load, mean, settings):
        if confirmed is not None and owner not in confirmed:
            continue
        gap = totals[owner] - my_load
        fitting = [(key, x) for key, x in owned[owner].items()
                   if x <= gap - margin and (movable is None or key in movable)]
        if fitting:
            key, x = min(fitting, key=lambda kx: (abs(kx[1] - gap / 2), kx[0]))
            return Steal(key, owner, x)
    return None


def imbalance(held: Mapping[str, Mapping[str, float | None]],
              settings: BalanceSettings = BalanceSettings()) -> str | None:
    """Why the live consumers (each with its leases' reported KB/s) are not balanced, or None: the
    balance's stated outcome, which the simulation and the fleet tests check.

    While some lease reports traffic, the stated tolerance: no consumer's load above the mean × (1 +
    tolerance), unless none of its leases fits the gap to the lightest consumer (less the hysteresis) —
    lease granularity. Otherwise (nothing reported, or an idle stream): within one lease by count."""
    counts = {owner: len(leases) for owner, leases in held.items()}
    reported = {key: value for leases in held.values() for key, value in leases.items()}
    if not any(reported.values()):
        if max(counts.values()) - min(counts.values()) > 1:
            return f"the fleet is unbalanced: {dict(sorted(counts.items()))}"
        return None
    loads = effective_loads(reported, settings)
    totals = {owner: sum(loads[key] for key in leases) for owner, leases in held.items()}
    mean = sum(totals.values()) / len(totals)
    lightest = min(totals.values())
    for owner, total in sorted(totals.items()):
        gap = total - lightest
        if total > mean * (1 + settings.tolerance) and any(
                loads[key] <= gap - settings.margin * mean for key in held[owner]):
            shown = {o: round(t, 3) for o, t in sorted(totals.items())}
            return (f"the fleet is unbalanced by load: {owner} carries {total:.3f} KB/s against a mean of "
                    f"{mean:.3f} and has a lease that fits the gap ({shown})")
    return None


def confirmed_overloaded(overloaded_since: Mapping[str, float], now: float, patience_seconds: float) -> set[str]:
    """Owners seen overloaded without a break for at least `patience_seconds` (times on one clock)."""
    return {owner for owner, since in overloaded_since.items() if now - since >= patience_seconds}


def still_overloaded(overloaded_since: Mapping[str, float], overloaded: Collection[str], now: float
                     ) -> dict[str, float]:
    """Since when each owner overloaded now has been so without a break (a break starts it anew)."""
    return {owner: overloaded_since.get(owner, now) for owner in overloaded}


__all__ = ["BalanceSettings", "Steal", "ThroughputMeter", "THROUGHPUT_ATTRIBUTE", "confirmed_overloaded",
           "effective_loads", "imbalance", "overloaded_owners", "plan_steal", "reported_load", "still_overloaded"]
