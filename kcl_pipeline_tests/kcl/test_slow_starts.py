"""A lease whose workers each start slower than the start patience is still worked in the end.

On a loaded two-core host (four consumers racing for six free leases, the rest of the suite beside them) a spawned
worker took longer than two expiries to start and take its lease: its manager killed it as stuck before its take,
spawned another that started as slowly, and so on — every lease stayed unowned for the whole fleet test
("killed the worker of lease ...: its lease was not renewed for longer than the expiry", 42 times per consumer in
a minute). Each such kill now doubles the lease's next worker's patience (at most START_PATIENCE_DOUBLINGS times);
a shown take resets it."""
from __future__ import annotations

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.fleet.planner import START_PATIENCE_DOUBLINGS, START_PATIENCE_EXPIRIES, start_patience
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline_tests.kcl.cycle_support import drive_cycle

EXPIRY = 3.0
SETTINGS = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), EXPIRY, 1, 10)


FREE = Lease("s-0", Checkpoint(TRIM_HORIZON), None, 0)


def _run(start_seconds: float | None, until: float, lease: Lease = FREE, *, renews: bool = True,
         abandons: list[fx.Abandon] | None = None) -> tuple[list[float], list[float], cyc.ManagerState]:
    """Cycles every second over one lease not ours (free by default); each spawned worker takes it `start_seconds`
    after its spawn (None: never), then renews it every second (`renews`) or freezes. Returns the spawn times, the
    kill times and the state; the Abandon effects go to `abandons`."""
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    worked: set[str] = set()
    spawns: list[float] = []
    kills: list[float] = []
    now = 0.0
    while now < until:
        if start_seconds is not None and spawns and "s-0" in worked and now >= spawns[-1] + start_seconds \
                and lease.lease_owner != "me":
            lease = Lease("s-0", lease.checkpoint, "me", lease.lease_counter + 1)  # the take
        if renews and lease.lease_owner == "me" and "s-0" in worked:
            lease = Lease("s-0", lease.checkpoint, "me", lease.lease_counter + 1)  # its heartbeat

        def seen(effect, at=now):
            if isinstance(effect, fx.Spawn):
                spawns.append(at)
                worked.add(effect.lease.lease_key)
            elif isinstance(effect, fx.Abandon):
                kills.append(at)
                if abandons is not None:
                    abandons.append(effect)
                worked.discard(effect.lease.lease_key)
        drive_cycle(state, SETTINGS, [lease], now, locally_worked=frozenset(worked), seen=seen)
        now += 1.0
    return spawns, kills, state


def test_a_lease_whose_workers_start_slower_than_the_patience_is_worked_in_the_end():
    # Each worker needs 10 s (more than two expiries) to take: the first is killed, the second is given twice
    # the patience and takes.
    spawns, kills, state = _run(10.0, 60.0)
    assert len(kills) == 1 and len(spawns) == 2
    assert kills[0] - spawns[0] > START_PATIENCE_EXPIRIES * EXPIRY
    assert state.slow_starts == {}  # the shown take reset it


def test_the_start_patience_doubles_with_each_kill_before_a_take_and_stops_doubling():
    spawns, kills, _ = _run(None, 400.0)  # workers that never take (frozen before their take)
    waits = [kill - spawn for spawn, kill in zip(spawns, kills, strict=False)]
    assert len(waits) >= START_PATIENCE_DOUBLINGS + 2
    for n, wait in enumerate(waits):
        assert start_patience(n) * EXPIRY < wait <= start_patience(n) * EXPIRY + EXPIRY + 2
    assert start_patience(START_PATIENCE_DOUBLINGS + 5) == start_patience(START_PATIENCE_DOUBLINGS)


def test_a_worker_frozen_after_its_take_is_still_killed_an_expiry_after_it():
    """The patience grows only for kills before a take: a worker that took and then froze is found an expiry
    after its last change, whatever the lease's history of slow starts."""
    from kcl_pipeline.kcl.core.fleet.planner import LeaseAges, stuck_local_leases

    taken = Lease("s-0", Checkpoint(TRIM_HORIZON), "me", 1)
    ages = LeaseAges()
    ages.observe([Lease("s-0", Checkpoint(TRIM_HORIZON), None, 0)], 0.0)
    ages.observe([taken], 11.0)
    assert stuck_local_leases("me", [taken], {"s-0"}, ages, 14.5, EXPIRY, {"s-0": 10.0}, {"s-0": 3}) == [taken]


# A lease left expired in the name of a consumer that stopped (a worker of its hung through its shutdown and was
# killed there).
STALE = Lease("s-0", Checkpoint("5"), "gone", 7)


def test_a_lease_expired_in_a_stopped_consumers_name_gets_its_slow_starting_workers_the_start_patience():
    """A lease left expired in another consumer's name (it stopped; its hung worker was killed at the shutdown)
    is taken by a worker that starts like any other: nothing of the lease changes until its take. Given one
    expiry instead of the start patience, and no growing patience after each kill, every worker whose start
    outlasted the expiry was killed before its take, for as long as the host stayed slow: the lease stayed in the
    stopped consumer's name, worked by nobody."""
    spawns, kills, _ = _run(5.0, 60.0, STALE)  # a start longer than one expiry, shorter than the first patience
    assert kills == [] and len(spawns) == 1, f"workers killed before their take at {kills}"
    spawns, kills, _ = _run(10.0, 90.0, STALE)  # longer than the first patience: the second, twice as patient, takes
    assert len(kills) == 1 and len(spawns) == 2
    assert kills[0] - spawns[0] > START_PATIENCE_EXPIRIES * EXPIRY


def test_a_worker_killed_before_its_take_is_not_logged_as_a_lease_that_stopped_being_renewed():
    """A worker killed because its take never showed was logged as "its lease was not renewed for longer than the
    expiry", which sends an operator looking for a frozen worker when the host starts workers too slowly."""
    from kcl_pipeline.kcl.shells.fleet.manager import abandon_line

    abandons: list[fx.Abandon] = []
    _run(None, 10.0, abandons=abandons)  # never takes: killed after its start patience
    before = abandons[0]
    assert before.before_take and before.waited_seconds > START_PATIENCE_EXPIRIES * EXPIRY
    line = abandon_line(before, 42, EXPIRY)
    assert "before its take" in line and "not renewed" not in line, line
    assert f"{before.waited_seconds:.0f}s after its spawn" in line

    abandons.clear()
    _run(1.0, 10.0, renews=False, abandons=abandons)  # takes a second after its spawn, then never renews
    after = abandons[0]
    assert not after.before_take and EXPIRY < after.waited_seconds <= EXPIRY + 1
    line = abandon_line(after, 42, EXPIRY)
    assert "not renewed for" in line and "before its take" not in line, line


def test_a_killed_workers_lease_is_watched_while_in_our_name_and_never_once_another_process_writes_under_our_id():
    """What a stopping manager may release of its killed workers' leases: only those still in our name, not ended,
    and not moving under our id by another process (a duplicate worker id: never touched)."""
    leases = [Lease("ours", Checkpoint("5"), "me", 3), Lease("taken", Checkpoint("5"), "peer", 4),
              Lease("ended", Checkpoint("SHARD_END"), "me", 5), Lease("copied-id", Checkpoint("5"), "me", 9)]
    killed = {"ours", "taken", "ended", "copied-id", "deleted"}
    assert cyc.killed_still_ours(killed, "me", leases, written_by_another={"copied-id"}) == {"ours"}
    state = cyc.ManagerState(killed=set(killed), left_at={})
    assert cyc.killed_left_in_our_name(state, "me", leases[:3]) == [("ours", 3)]
    assert state.killed == set()
    state = cyc.ManagerState(killed={"ours"}, left_at={"ours": 2})  # a finished worker's report: released at its own
    assert cyc.killed_left_in_our_name(state, "me", leases) == []
