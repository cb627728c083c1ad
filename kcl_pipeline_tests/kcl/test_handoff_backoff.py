"""A steal by graceful hand-off that keeps being overtaken backs off and moves to another lease.

Three consumers (heartbeat 1 s, expiry 3 s, cycle 2 s), one killed: the two survivors stayed 3 / 1 for 25–40 s,
the stealer asking for the same lease ten cycles in a row, each ending "the hand-off was overtaken", before it
tried another. The cycle now remembers overtaken hand-offs per lease and backs each off exponentially
(expiry × 2^n, at most 8 expiries), so the next cycle asks for another of the richest owner's leases."""
from __future__ import annotations

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetView
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.table.coordinator_state import MigrationState
from kcl_pipeline_tests.kcl.cycle_support import drive_cycle

EXPIRY = 3.0
LEASES = [Lease(f"s-{i}", Checkpoint(TRIM_HORIZON), "peer", 5) for i in range(4)]


def _state() -> cyc.ManagerState:
    # A table a KCL 3.x fleet is upgrading (2.x-compatible, leaderless): worker metrics are published and read,
    # so a live peer of this protocol is asked for hand-offs.
    return cyc.ManagerState(shards=[Shard(lease.lease_key) for lease in LEASES], list_next=False,
                            live_peers=frozenset({"peer"}),
                            fleet=FleetView(lease_table=MigrationState("CLIENT_VERSION_UPGRADE_FROM_2X")))


def _steal(state: cyc.ManagerState, now: float) -> tuple[str, bool] | None:
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), EXPIRY, 1, 10)
    spawns: list[tuple[str, bool]] = []

    def seen(effect):
        if isinstance(effect, fx.Spawn):
            spawns.append((effect.lease.lease_key, effect.handoff))
    # The peer is alive: its heartbeats move every counter between cycles.
    renewed = [Lease(lease.lease_key, lease.checkpoint, "peer", int(now * 10)) for lease in LEASES]
    drive_cycle(state, settings, renewed, now, seen=seen)
    return spawns[0] if spawns else None


def test_an_overtaken_hand_off_is_not_asked_again_next_cycle_another_lease_is():
    state = _state()
    asked = []
    now = 100.0
    for _ in range(10):
        spawned = _steal(state, now)
        now += 2.0
        if spawned is None:
            continue  # every lease is backing off: the balance waits
        key, handoff = spawned
        assert handoff
        asked.append((now - 2.0, key))
        cyc.note_results(state, [(key, LifeOutcome.NOT_ACQUIRED)])
    assert len({key for _, key in asked[:3]}) == 3  # three cycles, three different leases
    for i, (at, key) in enumerate(asked):  # a lease is asked again only after its back-off, which doubles
        before = [earlier for earlier, same in asked[:i] if same == key]
        if before:
            assert at - before[-1] >= EXPIRY * 2 ** len(before)
    assert max(sum(1 for _, key in asked if key == lease.lease_key) for lease in LEASES) <= 3


def test_the_back_off_doubles_with_each_overtaken_hand_off_and_ends():
    state = _state()
    state.handoffs_overtaken = {"s-0": (1, 100.0), "s-1": (2, 100.0), "s-2": (9, 100.0)}
    backing_off = [cyc.handoffs_backing_off(state.handoffs_overtaken, 100.0 + expiries * EXPIRY, EXPIRY)
                   for expiries in (1.9, 2, 4, 8)]
    assert backing_off == [{"s-0", "s-1", "s-2"}, {"s-1", "s-2"}, {"s-2"}, set()]  # doubling, capped at 8


def test_every_lease_backing_off_waits_and_a_hand_off_that_took_the_lease_clears_its_back_off():
    state = _state()
    state.handoffs_overtaken = {lease.lease_key: (1, 100.0) for lease in LEASES}
    assert _steal(state, 101.0) is None  # nothing to ask now: the balance waits out the back-off
    key, _ = _steal(state, 100.0 + 2 * EXPIRY)
    cyc.note_results(state, [(key, LifeOutcome.SHUTDOWN)])  # it took the lease (and later stopped)
    assert key not in state.handoffs_overtaken and key not in state.handoff_asked
