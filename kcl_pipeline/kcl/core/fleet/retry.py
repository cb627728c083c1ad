"""When a failed lease is tried again, and when a manager that cannot cycle gives up: pure decisions.

A worker that fails (its sink cannot write, its credentials are refused, a bug in the processor) keeps its lease,
and its manager holds it — renewing it at every cycle and table watch — through a back-off before the next worker
tries: exponential, with jitter, per lease. Java KCL's ShardConsumer does the same: a failed task is retried after
a back-off while the lease stays with the worker and its renewer keeps renewing it, so no peer takes the lease to
fail on it too, and the shard is not read again from its checkpoint every cycle. The next worker resumes where
the landing sink's last landed batch ends (the lease keeps the progress its holders published).

Jitter draws come in as numbers in [0, 1) (the manager's rng, or the simulation's); the times are the manager's
clock. A failure streak restarts when the failing worker had run longer than the longest back-off: it worked
meanwhile, so its failure is a new one.

A manager whose every cycle fails (lease table gone, credentials refused, endpoints unreachable) makes no
progress; `stalled` says when it has failed long enough to stop saying so in a log and fail loudly instead.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..model import Lease

# The first retry comes after about this long; each failure in a row doubles it, up to MAX_RETRY_SECONDS.
FIRST_RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 120.0


@dataclass(frozen=True)
class RetryPolicy:
    first_seconds: float = FIRST_RETRY_SECONDS
    max_seconds: float = MAX_RETRY_SECONDS


DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True)
class Backoff:
    """A lease whose worker failed: no worker for it before `until` (the manager's clock)."""

    failures: int  # failed workers in a row
    until: float
    # The counter the lease stands at in this consumer's name while it waits (the manager renews it there);
    # None: not held (the failed worker released it, or the table moved it on since).
    held_at: int | None
    detail: str = ""


@dataclass(frozen=True)
class WorkerEnd:
    """What the manager learnt of a finished worker."""

    lease_key: str
    failed: bool
    left_at: int | None = None  # the counter it left the lease at in our name (None: released, or not ours)
    ran_seconds: float | None = None  # since its spawn (None: unknown)
    detail: str = ""


def retry_delay(failures: int, draw: float, policy: RetryPolicy = DEFAULT_POLICY) -> float:
    """The back-off after `failures` failures in a row: a ceiling doubling from the first, capped, of which the
    upper half is drawn ("equal jitter"): it keeps growing with the streak, and leases that failed together (one
    outage) are not all tried again at the same moment."""
    if failures < 1:
        raise ValueError(f"failures must be >= 1, got {failures}")
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"a jitter draw is in [0, 1), got {draw}")
    ceiling = min(policy.max_seconds, policy.first_seconds * 2.0 ** min(failures - 1, 60))
    return ceiling / 2 + draw * ceiling / 2


def after_worker_end(previous: Backoff | None, end: WorkerEnd, now: float, draw: float,
                     policy: RetryPolicy = DEFAULT_POLICY) -> Backoff | None:
    """A lease's back-off once its worker ended: a failure backs it off (longer for each failure in a row);
    any other end (the shard ended, the lease was lost or handed off, the worker stopped) clears it."""
    if not end.failed:
        return None
    fresh = previous is None or (end.ran_seconds is not None and end.ran_seconds > policy.max_seconds)
    failures = 1 if fresh or previous is None else previous.failures + 1
    return Backoff(failures, now + retry_delay(failures, draw, policy), end.left_at, end.detail)


def seen_in_scan(backoffs: Mapping[str, Backoff], leases: Sequence[Lease], worker_id: str) -> dict[str, Backoff]:
    """The back-offs after a scan of the table. A lease gone, ended, or taken by another consumer is no longer
    ours to retry (its new holder works it); one whose counter moved away from where we hold it is no longer
    held (another process wrote it), and is not renewed."""
    by_key = {lease.lease_key: lease for lease in leases}
    out: dict[str, Backoff] = {}
    for key, backoff in backoffs.items():
        lease = by_key.get(key)
        if lease is None or lease.is_ended or lease.lease_owner not in (None, worker_id):
            continue
        if backoff.held_at is not None and (lease.lease_owner != worker_id or lease.lease_counter != backoff.held_at):
            backoff = replace(backoff, held_at=None)
        out[key] = backoff
    return out


def waiting(backoffs: Mapping[str, Backoff], now: float) -> frozenset[str]:
    """Leases no worker may take yet: counted as this consumer's, never taken by its planner."""
    return frozenset(key for key, backoff in backoffs.items() if now < backoff.until)


def due(backoffs: Mapping[str, Backoff], leases: Sequence[Lease], worker_id: str, now: float,
        locally_worked: frozenset[str] | set[str]) -> list[Lease]:
    """Leases whose back-off is over and that no local worker works: held by us (where we hold them) or free,
    so a worker is spawned for each (sorted by key)."""
    out = []
    for lease in leases:
        backoff = backoffs.get(lease.lease_key)
        if backoff is None or now < backoff.until or lease.lease_key in locally_worked or lease.is_ended:
            continue
        held = lease.lease_owner == worker_id and lease.lease_counter == backoff.held_at
        if held or lease.lease_owner is None:
            out.append(lease)
    return sorted(out, key=lambda lease: lease.lease_key)


def held(backoffs: Mapping[str, Backoff]) -> dict[str, int]:
    """The leases this manager holds through their back-off, and the counter each stands at: renewed at every
    cycle and table watch, so that peers see them alive (as Java's renewer keeps a failing shard's lease)."""
    return {key: backoff.held_at for key, backoff in sorted(backoffs.items()) if backoff.held_at is not None}


def renewed(backoffs: Mapping[str, Backoff], key: str, counter: int | None) -> dict[str, Backoff]:
    """The back-offs after renewing `key`: held at its new counter, or no longer held (refused)."""
    out = dict(backoffs)
    if key in out:
        out[key] = replace(out[key], held_at=counter)
    return out


def next_retry_at(backoffs: Mapping[str, Backoff], now: float) -> float | None:
    """When the next back-off ends (the manager's wait wakes then), None when none is pending."""
    ends = [backoff.until for backoff in backoffs.values() if backoff.until > now]
    return min(ends) if ends else None


# -- a manager that cannot cycle ----------------------------------------------------------------------------

# How long a consumer's lease-manager cycles may all fail before it gives up (exits non-zero; the Dagster tick
# fails): long enough to ride out a throttling burst or a DynamoDB failover, short enough that an orchestrator
# sees a dead consumer within minutes.
STALL_SECONDS = 300.0


@dataclass(frozen=True)
class CycleHealth:
    """Since when the manager has made no progress, and why (the last cycle's failure)."""

    since: float  # the last successful cycle's end, or when the manager started
    failure: str | None = None  # the last failed cycle's error; None after a success
    failures: int = 0  # failed cycles since `since`


def after_cycle(health: CycleHealth, now: float, failure: str | None) -> CycleHealth:
    """The health after a cycle: a success restarts the count, a failure adds to it."""
    if failure is None:
        return CycleHealth(now)
    return CycleHealth(health.since, failure, health.failures + 1)


def stalled(health: CycleHealth, now: float, limit_seconds: float) -> str | None:
    """The one line a consumer gives up with, once no cycle has succeeded for `limit_seconds` (0: never)."""
    if limit_seconds <= 0 or health.failure is None or now - health.since < limit_seconds:
        return None
    return (f"no lease-manager cycle succeeded for {now - health.since:.0f} s ({health.failures} failed): "
            f"{health.failure}")


__all__ = [
    "DEFAULT_POLICY", "FIRST_RETRY_SECONDS", "MAX_RETRY_SECONDS", "STALL_SECONDS", "Backoff", "CycleHealth",
    "RetryPolicy", "WorkerEnd", "after_cycle", "after_worker_end", "due", "held", "next_retry_at", "renewed",
    "retry_delay", "seen_in_scan", "stalled", "waiting",
]
