"""A failed lease is retried with exponential back-off and jitter, per lease, held by its manager meanwhile; a
manager whose cycles all fail gives up with one line (kcl/core/fleet/retry.py, driven by cycle.py)."""
from __future__ import annotations

import random
from typing import Any

import pytest

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.fleet import retry
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome, LifeResult
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard

ME = "me"
POLICY = retry.RetryPolicy(first_seconds=2.0, max_seconds=60.0)


# -- the pure decisions --------------------------------------------------------------------------------------

def test_the_back_off_doubles_with_each_failure_in_a_row_within_its_jitter_and_stops_at_its_cap():
    for failures in range(1, 10):
        ceiling = min(60.0, 2.0 * 2 ** (failures - 1))
        assert retry.retry_delay(failures, 0.0, POLICY) == ceiling / 2
        assert ceiling / 2 <= retry.retry_delay(failures, 0.999, POLICY) < ceiling
    assert retry.retry_delay(500, 0.5, POLICY) == 45.0  # capped, never an overflow


@pytest.mark.parametrize("failures, draw", [(0, 0.5), (1, 1.0), (1, -0.1)])
def test_a_back_off_refuses_what_no_failure_or_draw_can_be(failures, draw):
    with pytest.raises(ValueError):
        retry.retry_delay(failures, draw, POLICY)


def test_failures_in_a_row_back_off_longer_and_any_other_end_clears_the_back_off():
    first = retry.after_worker_end(None, retry.WorkerEnd("s-0", True, 5, 1.0, "AccessDenied"), 100.0, 0.0, POLICY)
    assert first == retry.Backoff(1, 101.0, 5, "AccessDenied")
    second = retry.after_worker_end(first, retry.WorkerEnd("s-0", True, 7, 1.0), 110.0, 0.0, POLICY)
    assert (second.failures, second.until, second.held_at) == (2, 112.0, 7)
    assert retry.after_worker_end(second, retry.WorkerEnd("s-0", False), 120.0, 0.0, POLICY) is None


def test_a_failure_after_a_long_healthy_run_starts_a_new_streak():
    """A worker that ran longer than the longest back-off worked meanwhile: its failure is a new one, not the
    tenth of a streak that would make its lease wait the longest back-off at once."""
    streak = retry.Backoff(9, 0.0, None)
    again = retry.after_worker_end(streak, retry.WorkerEnd("s-0", True, 3, ran_seconds=3600.0), 4000.0, 0.0, POLICY)
    assert again.failures == 1


def test_a_back_off_ends_with_the_lease_taken_by_another_ended_or_gone_and_its_hold_with_a_foreign_write():
    backoffs = {key: retry.Backoff(1, 50.0, 4) for key in ("taken", "ended", "gone", "moved", "held", "free")}
    leases = [Lease("taken", Checkpoint("1"), "peer", 5), Lease("ended", Checkpoint("SHARD_END"), ME, 4),
              Lease("moved", Checkpoint("1"), ME, 9), Lease("held", Checkpoint("1"), ME, 4),
              Lease("free", Checkpoint("1"), None, 5)]
    seen = retry.seen_in_scan(backoffs, leases, ME)
    assert sorted(seen) == ["free", "held", "moved"]
    assert (seen["held"].held_at, seen["moved"].held_at, seen["free"].held_at) == (4, None, None)
    assert retry.held(seen) == {"held": 4}
    assert retry.waiting(seen, 49.0) == {"free", "held", "moved"} and retry.waiting(seen, 50.0) == set()
    # Due once over: a lease held here or free gets a worker; one in our name at a counter we did not leave is
    # another process's (the duplicate-id watch's business), and waits for the planner's expiry.
    assert [lease.lease_key for lease in retry.due(seen, leases, ME, 50.0, set())] == ["free", "held"]
    assert retry.due(seen, leases, ME, 50.0, {"held"})[0].lease_key == "free"
    assert retry.next_retry_at(seen, 10.0) == 50.0 and retry.next_retry_at(seen, 50.0) is None


def test_a_manager_gives_up_only_once_no_cycle_succeeded_for_the_stall_time():
    health = retry.CycleHealth(since=0.0)
    health = retry.after_cycle(health, 100.0, "ResourceNotFoundException: table gone")
    assert retry.stalled(health, 100.0, 120.0) is None
    health = retry.after_cycle(health, 125.0, "ResourceNotFoundException: table gone")
    assert retry.stalled(health, 125.0, 120.0) == (
        "no lease-manager cycle succeeded for 125 s (2 failed): ResourceNotFoundException: table gone")
    assert retry.stalled(health, 10_000.0, 0.0) is None  # 0: never
    assert retry.stalled(retry.after_cycle(health, 130.0, None), 131.0, 120.0) is None  # a success restarts it


# -- driven by the manager's cycle ---------------------------------------------------------------------------

class Table:
    """The lease table as one manager's cycles meet it: a scan, renewals of held leases (fenced on the counter)."""

    def __init__(self, *leases: Lease):
        self.leases = {lease.lease_key: lease for lease in leases}
        self.renewals: list[tuple[str, int]] = []
        self.spawned: list[str] = []
        self.duplicates: list[tuple[str, ...]] = []
        self.now = 0.0

    def cycle(self, state: cyc.ManagerState, locally_worked: frozenset[str] = frozenset()) -> cyc.CycleResult:
        settings = cyc.CycleSettings(ME, Checkpoint(TRIM_HORIZON), 30.0, 1, 10)
        return fx.drive(cyc.manager_cycle(state, settings, locally_worked, random.Random(0)), self.answer)

    def answer(self, effect: Any) -> Any:
        if isinstance(effect, fx.Now):
            return self.now
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(list(self.leases.values()), self.now, self.now)
        if isinstance(effect, fx.ListShards):
            return [Shard(key) for key in self.leases]
        if isinstance(effect, fx.RenewHeld):
            lease = self.leases[effect.lease_key]
            self.renewals.append((effect.lease_key, effect.counter))
            if (lease.lease_owner, lease.lease_counter) != (ME, effect.counter):
                return None
            self.leases[effect.lease_key] = Lease(lease.lease_key, lease.checkpoint, ME, effect.counter + 1)
            return effect.counter + 1
        if isinstance(effect, fx.Spawn):
            self.spawned.append(effect.lease.lease_key)
        if isinstance(effect, fx.DuplicateWorkerId):
            self.duplicates.append(effect.lease_keys)
        return None


def failed(key: str, counter: int) -> LifeResult:
    return LifeResult(key, LifeOutcome.FAILED, "AccessDenied: s3 refused", left_at=counter, kept=True)


def test_a_failed_lease_is_not_spawned_again_every_cycle_but_held_renewed_and_retried_after_its_back_off():
    """The outage found by the issue: with S3 refused the manager spawned a new worker for the lease at every
    cycle (counter 14, 16, 18 …), each reading the shard again. Now the failed lease waits out its back-off,
    renewed by the manager (peers see it alive and leave it), and gets one worker when the back-off ends."""
    table = Table(Lease("s-0", Checkpoint("7"), ME, 14), Lease("s-1", Checkpoint("3"), "peer", 2))
    state = cyc.ManagerState(shards=[Shard("s-0"), Shard("s-1")], list_next=False)
    state.spawned_at["s-0"] = 0.0
    table.now = 1.0
    cyc.note_results(state, [("s-0", LifeOutcome.FAILED)], {"s-0": 14})
    cyc.note_worker_ends(state, [failed("s-0", 14)], table.now, random.Random(0), POLICY)
    backoff = state.backoffs["s-0"]
    assert backoff.failures == 1 and 1.0 + 1.0 <= backoff.until < 1.0 + 2.0 and backoff.held_at == 14

    result = table.cycle(state)  # within the back-off: renewed, not spawned, not taken by the planner
    assert table.spawned == [] and table.renewals == [("s-0", 14)] and result.backing_off == ["s-0"]
    assert state.left_at["s-0"] == 15  # a stop meanwhile releases it at the counter it stands at
    table.now = backoff.until - 0.01
    table.cycle(state)
    assert table.spawned == [] and table.renewals[-1] == ("s-0", 15) and table.duplicates == []

    table.now = backoff.until
    result = table.cycle(state)  # over: one worker, spawned for the lease as the table holds it
    assert table.spawned == ["s-0"] and result.retried == ["s-0"] and table.renewals[-1] == ("s-0", 15)
    assert state.backoffs["s-0"].held_at is None, "a lease a worker holds must not be renewed beside it"
    table.cycle(state, locally_worked=frozenset({"s-0"}))
    assert table.spawned == ["s-0"] and len(table.renewals) == 2

    # It fails again: twice as long (within its jitter); then it works, and the back-off is forgotten.
    table.now += 5.0
    cyc.note_worker_ends(state, [failed("s-0", 16)], table.now, random.Random(0), POLICY)
    assert state.backoffs["s-0"].failures == 2 and state.backoffs["s-0"].until >= table.now + 2.0
    cyc.note_worker_ends(state, [LifeResult("s-0", LifeOutcome.SHUTDOWN)], table.now, random.Random(0), POLICY)
    assert state.backoffs == {}


def test_a_held_lease_taken_by_a_peer_is_no_longer_backed_off_here():
    table = Table(Lease("s-0", Checkpoint("7"), ME, 14))
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    cyc.note_worker_ends(state, [failed("s-0", 14)], 0.0, random.Random(0), POLICY)
    table.leases["s-0"] = Lease("s-0", Checkpoint("7"), "peer", 15)  # it expired meanwhile; a peer took it
    table.cycle(state)
    assert state.backoffs == {} and table.renewals == [] and table.spawned == []


def test_a_refused_renewal_ends_the_hold_and_the_lease_is_retried_only_if_free():
    table = Table(Lease("s-0", Checkpoint("7"), ME, 14))
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    cyc.note_worker_ends(state, [failed("s-0", 14)], 0.0, random.Random(0), POLICY)
    table.leases["s-0"] = Lease("s-0", Checkpoint("7"), ME, 20)  # another process under our id wrote it
    table.cycle(state)
    assert state.backoffs["s-0"].held_at is None and table.renewals == []
    table.now = 10.0  # the back-off is over, the lease not expired
    table.cycle(state)
    assert table.spawned == [], "a lease in our name we do not hold is the duplicate-id watch's, not retried"


def test_a_failure_wakes_the_manager_to_hold_the_lease_its_worker_left():
    assert cyc.wakes_manager(LifeOutcome.FAILED) and cyc.wakes_manager(LifeOutcome.SHARD_ENDED)
    assert not cyc.wakes_manager(LifeOutcome.LEASE_LOST)


def test_under_a_kcl3_leader_a_held_lease_is_retried_by_its_own_manager(monkeypatch):
    """Found by the simulation (`zone-refuses` beside a Java 3.x leader): a follower adopts a lease of its own take
    only once its counter stood still for an expiry, and its manager's renewals kept moving it: the failed lease
    was renewed for ever and never worked again."""
    from kcl_pipeline.kcl.core.fleet import fleet_mode

    class Follower(fleet_mode.FleetView):
        @property
        def mode(self):  # what the 3.x tables' migration state makes of a fleet with a leader
            return fleet_mode.FleetMode.FOLLOWER

    monkeypatch.setattr(cyc, "_see_fleet", lambda state, scanned: None)
    taken_by_us = Lease("s-0", Checkpoint("7"), ME, 14, extra={fleet_mode.CLAIM_OWNER_ATTRIBUTE: ME})
    table = Table(taken_by_us)
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False, fleet=Follower())
    cyc.note_worker_ends(state, [failed("s-0", 14)], 0.0, random.Random(0), POLICY)
    table.cycle(state)
    assert table.spawned == [] and table.renewals == [("s-0", 14)]
    table.now = state.backoffs["s-0"].until
    result = table.cycle(state)
    assert table.spawned == ["s-0"] and result.retried == ["s-0"]


def test_a_stopping_manager_releases_its_held_leases_first_not_after_waiting_for_its_workers():
    """Found by the simulation (`zone-refuses`, seed 293): held leases were released only after the workers had
    been waited for, and nobody renewed them meanwhile, so a peer could take one by expiry from a consumer that
    was stopping gracefully."""
    state = cyc.ManagerState()
    cyc.note_worker_ends(state, [failed("s-0", 14), failed("s-1", 3)], 0.0, random.Random(0), POLICY)
    state.backoffs["s-1"] = retry.Backoff(1, 5.0, None)  # not held: its worker released it, or the table moved it
    assert cyc.held_at_stop(state, frozenset({"s-2"})) == [("s-0", 14)]
    assert "s-0" not in state.backoffs and "s-1" in state.backoffs
