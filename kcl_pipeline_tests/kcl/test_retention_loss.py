"""A lease deleted because its shard left the stream (retention) before the lease ended: the manager says so."""
from __future__ import annotations

import logging

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.model import SHARD_END, TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.shells.fleet.manager import log_trimmed_unfinished
from kcl_pipeline_tests.kcl.cycle_support import drive_cycle


def _cycle(leases: list[Lease], shards: list[Shard]) -> cyc.CycleResult:
    """One manager cycle over in-memory answers: every delete applied."""
    state = cyc.ManagerState(shards=shards, list_next=True)
    return drive_cycle(state, cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10), leases, 100.0)


def test_a_lease_deleted_because_its_shard_left_the_stream_before_it_ended_is_reported_loudly(caplog):
    """Simulation seeds 1485 and 3161: a merged child waited for a parent a lost batch held and left the stream with
    its retention, never read; the manager deleted its lease and said only `deleted=` in its cycle line."""
    # t was not read to its end (a checkpoint inside it), e was; both are gone from the listing and named as parents
    # by the listed child k: both leases go, and only t's left records unread.
    leases = [Lease("t", checkpoint=Checkpoint("4000", 0)), Lease("e", checkpoint=Checkpoint(SHARD_END)),
              Lease("k", checkpoint=Checkpoint("5000", 0))]
    result = _cycle(leases, [Shard("k", "t", "e")])
    assert sorted(result.deleted) == ["e", "t"]
    assert result.trimmed_unfinished == [("t", Checkpoint("4000", 0))]
    with caplog.at_level(logging.ERROR, logger="kcl_pipeline.kcl.shells.fleet.manager"):
        log_trimmed_unfinished(result.trimmed_unfinished)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "shard t left the stream" in errors[0] and "4000" in errors[0] and "retention" in errors[0]


def test_leases_of_finished_shards_deleted_in_the_usual_way_are_not_reported():
    leases = [Lease("p", checkpoint=Checkpoint(SHARD_END)), Lease("c", checkpoint=Checkpoint("7", 0))]
    result = _cycle(leases, [Shard("p"), Shard("c", "p")])
    assert result.deleted == ["p"] and result.trimmed_unfinished == []
