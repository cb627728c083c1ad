"""The fleet as the sensor observes it (pure): lease counts, per-lease lag, how often it is observed."""
from __future__ import annotations

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.windows.fleet_view import OBSERVE_EVERY_MS, lease_counts, lease_lags, observation_due
from kcl_pipeline.zone.progress import ShardProgress

TH = Checkpoint("TRIM_HORIZON")


def test_counts_owned_and_unclaimed_leases_and_leaves_ended_ones_out():
    leases = [Lease("a", TH, lease_owner="w1"), Lease("b", TH, lease_owner="w1"), Lease("c", TH),
              Lease("d", Checkpoint("SHARD_END"), lease_owner="w2")]
    report = lease_counts(leases, [Shard("a"), Shard("b")])
    assert (report.total_leases, report.total_shards, report.unclaimed_leases) == (4, 2, 1)
    assert report.owners == {"w1": 2}


def test_lags_come_from_landing_progress_and_ended_leases_have_none():
    leases = [Lease("b", TH, lease_owner="w"), Lease("a", Checkpoint("SHARD_END")), Lease("c", TH)]
    progress = {"a": ShardProgress("a", None, None, 1, 500), "b": ShardProgress("b", None, None, 1, 20)}
    assert [(row.lease, row.owner, row.lag_ms) for row in lease_lags(leases, progress)] == \
        [("a", "", None), ("b", "w", 20), ("c", "", None)]


def test_the_fleet_is_observed_at_most_once_a_minute():
    assert observation_due(None, 0)
    assert not observation_due(1_000, 1_000 + OBSERVE_EVERY_MS - 1)
    assert observation_due(1_000, 1_000 + OBSERVE_EVERY_MS)
