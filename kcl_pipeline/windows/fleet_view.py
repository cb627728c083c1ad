"""The consumer fleet as the pipeline reports it (pure): lease counts from a scan, and per lease its owner,
checkpoint and lag.

The sensor's tick observes the stream with these (an observation of `kinesis_stream`, at most once a minute):
a host's own lease-manager cycle counts its fleet itself; an observer, or one stream of several, counts it
from the lease table's scan the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..kcl.core.fleet.cycle import CycleReport
from ..kcl.core.model import Lease, Shard
from ..zone.progress import ShardProgress

OBSERVE_EVERY_MS = 60_000  # fleet observations (lag, leases per consumer): at most once a minute


def lease_counts(leases: Sequence[Lease], shards: Sequence[Shard]) -> CycleReport:
    """The fleet's lease counts as a scan shows them: owned leases per owner, unclaimed ones (ended leases
    count towards the total only)."""
    report = CycleReport(total_leases=len(leases), total_shards=len(shards))
    for lease in leases:
        if lease.is_ended:
            continue
        if lease.lease_owner:
            report.owners[lease.lease_owner] = report.owners.get(lease.lease_owner, 0) + 1
        else:
            report.unclaimed_leases += 1
    return report


@dataclass(frozen=True)
class LeaseLag:
    lease: str
    owner: str  # "" when unclaimed
    counter: int
    checkpoint: str
    lag_ms: int | None  # millis behind the stream's tip at its last settled poll (None: unknown, or ended)


def lease_lags(leases: Iterable[Lease], progress: Mapping[str, ShardProgress]) -> list[LeaseLag]:
    """Every lease, by key, with its lag from its landing progress."""
    rows = []
    for lease in sorted(leases, key=lambda lease: lease.lease_key):
        p = progress.get(lease.lease_key)
        lag = p.millis_behind_latest if p is not None and not lease.is_ended else None
        rows.append(LeaseLag(lease.lease_key, lease.lease_owner or "", lease.lease_counter, str(lease.checkpoint), lag))
    return rows


def observation_due(observed_at_ms: int | None, now_ms: int) -> bool:
    """Whether a tick observes the fleet again (never observed, or the last observation is a minute old)."""
    return observed_at_ms is None or now_ms - observed_at_ms >= OBSERVE_EVERY_MS
