"""The lease-life and manager-cycle coroutines, driven by hand: each effect answered as a test decides.

These are the decisions worker.py and manager.py make (they only do the I/O); the simulation drives the
same coroutines over many seeds. Here each rule gets one small, readable history.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.lease import lease_life as life
from kcl_pipeline.kcl.core.lease.lease_hold import CurrentHold, LeaseHold, LeaseTiming, Outcome
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import SHARD_END, TRIM_HORIZON, Checkpoint, HashKeyRange, Lease, Shard

TIMING = LeaseTiming(10.0, 1.0)
SETTINGS = life.LifeSettings(TIMING, Checkpoint(TRIM_HORIZON), heartbeat_seconds=3.0)
STOLEN = SETTINGS.__class__(**{**SETTINGS.__dict__, "stolen": True})


@dataclass
class Batch:
    records: tuple = ()
    shard_ended: bool = False


class Script:
    """Answers a coroutine's effects from a small world: a clock, a hold, a lease table of dicts."""

    def __init__(self, lease: Lease, parents: dict | None = None, end_outcome=Outcome.APPLIED):
        self.now = 0.0
        self.lease = lease
        self.parents = parents or {}
        self.current = CurrentHold()
        self.effects: list = []
        self.batches = [Batch(), Batch(shard_ended=True)]
        self.end_outcome = end_outcome
        self.released = False
        self.released_at: float | None = None
        self.unsettled_releases: list[bool] = []  # each Release's `unsettled` mark, in order
        self.stop_at: float | None = None  # the worker is asked to stop from then on

    @property
    def hold(self) -> LeaseHold | None:
        """The hold the coroutines share (installed by the acquire)."""
        return self.current.hold if self.current.acquired else None

    @hold.setter
    def hold(self, hold: LeaseHold) -> None:
        self.current.move(hold)

    def __call__(self, effect):
        self.effects.append(type(effect).__name__)
        if isinstance(effect, fx.Acquire):
            self.lease = Lease(self.lease.lease_key, self.lease.checkpoint, "me", self.lease.lease_counter + 1,
                               parent_shard_ids=self.lease.parent_shard_ids)
            self.hold = LeaseHold.acquired(self.lease, self.now, TIMING)
            return self.lease
        if isinstance(effect, fx.ReadLeases):
            return {k: self.parents.get(k) for k in effect.keys}
        if isinstance(effect, fx.GetLease):
            return self.lease
        if isinstance(effect, fx.Check):
            self.hold = self.hold.held(self.now)
            return fx.Status(self.now, self.hold, self.stop_at is not None and self.now >= self.stop_at)
        if isinstance(effect, fx.Wait):
            self.now += effect.seconds
            self.hold = self.hold.after_renew(Outcome.APPLIED, self.now, TIMING, self.now)  # heartbeats meanwhile
            return None
        if isinstance(effect, fx.Poll):
            self.now += 0.5
            return self.batches.pop(0)
        if isinstance(effect, fx.ShardEnded):
            return True
        if isinstance(effect, fx.End):
            self.hold = self.hold.after_end(self.end_outcome)
            return self.end_outcome
        if isinstance(effect, fx.Release):
            self.released = True
            self.released_at = self.now
            self.unsettled_releases.append(effect.unsettled)
            self.hold = self.hold.after_release(Outcome.APPLIED)
            return True
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0", hash_key_range=HashKeyRange("0", "9"), ending_sequence_number="5"),
                    Shard("s-1", parent_shard_id="s-0", hash_key_range=HashKeyRange("0", "9"))]
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned([self.lease], self.now, self.now)
        if isinstance(effect, fx.Create):
            return True
        if isinstance(effect, fx.Locked):
            return fx.drive(effect.body, self)
        return None  # StartHeartbeats, Begin, Deliver, Notify, TakePending, ...


def test_a_lease_read_to_its_end_is_ended_and_its_children_created():
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4))
    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), script)
    assert result == life.LifeResult("s-0", LifeOutcome.SHARD_ENDED, children_created=("s-1",))
    assert script.effects.index("End") < script.effects.index("Create")


def test_a_refused_shard_end_is_a_lost_lease_not_a_failure():
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4), end_outcome=Outcome.REFUSED)
    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), script)
    assert result.outcome is LifeOutcome.LEASE_LOST and "SHARD_END refused" in result.detail
    assert "Create" not in script.effects


def test_a_child_whose_parent_is_in_progress_is_given_back_before_any_read():
    child = Lease("s-2", Checkpoint(TRIM_HORIZON), None, 0, parent_shard_ids=("s-0", "s-1"))
    script = Script(child, parents={"s-0": Lease("s-0", Checkpoint(SHARD_END)),
                                    "s-1": Lease("s-1", Checkpoint("7"), "peer", 3)})
    result = fx.drive(life.lease_life(child, SETTINGS, script.current), script)
    assert (result.outcome, result.detail) == (LifeOutcome.BLOCKED_ON_PARENTS, "s-1")
    assert script.released and "Begin" not in script.effects and "Poll" not in script.effects


def test_a_stolen_lease_delivers_nothing_for_one_expiry_after_its_acquire():
    """The live holder it was taken from may deliver until its own validity passes."""
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), "peer", 9))
    begun_at = []
    original = script.__call__

    def watch(effect):
        if isinstance(effect, fx.Begin):
            begun_at.append(script.now)
        return original(effect)

    fx.drive(life.lease_life(script.lease, STOLEN, script.current), watch)
    assert begun_at == [TIMING.expiry_seconds]


def test_a_stolen_lease_asked_to_stop_during_its_wait_is_released_marked_unsettled():
    """Released plainly, the lease would be free: a third consumer takes a free lease and delivers at once,
    while the holder it was stolen from may still be within its validity. Released marked unsettled, its next
    owner waits one expiry first (cycle.py spawns it as stolen)."""
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), "peer", 9))
    script.stop_at = 2.0
    result = fx.drive(life.lease_life(script.lease, STOLEN, script.current), script)
    assert (result.outcome, result.detail) == (LifeOutcome.SHUTDOWN, "released=True")
    assert script.unsettled_releases == [True]
    assert script.released_at is not None and script.released_at < TIMING.expiry_seconds  # no slower stop
    assert "Begin" not in script.effects and "Poll" not in script.effects


def test_a_lease_stopped_after_its_wait_or_never_stolen_is_released_plainly():
    for stolen, stop_at in ((True, 12.0), (False, 0.0)):
        script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), "peer" if stolen else None, 9))
        script.stop_at = stop_at
        script.batches = [Batch()] * 20
        fx.drive(life.lease_life(script.lease, STOLEN if stolen else SETTINGS, script.current), script)
        assert script.unsettled_releases == [False]


def test_an_invalid_hold_never_delivers_what_it_polled():
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4))
    delivered = []
    original = script.__call__

    def freeze_during_poll(effect):
        if isinstance(effect, fx.Poll):
            script.now += 60.0  # frozen past the validity between the poll and the delivery
        if isinstance(effect, fx.Deliver):
            delivered.append(effect.batch)
        return original(effect)

    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), freeze_during_poll)
    assert result.outcome is LifeOutcome.LEASE_LOST and delivered == []


def test_an_io_failure_fails_the_life_and_keeps_the_lease_for_its_managers_retry():
    """Released on a failure, the lease was taken again at every cycle (by this consumer or a peer, each failing on
    it too) and its shard read again each time; kept, its manager holds it through a back-off (retry.py), as Java
    KCL keeps a failing shard's lease."""
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4))
    original = script.__call__

    def broken_reader(effect):
        if isinstance(effect, fx.Poll):
            raise ConnectionError("kinesis unreachable")
        return original(effect)

    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), broken_reader)
    assert result.outcome is LifeOutcome.FAILED and "kinesis unreachable" in result.detail
    assert not script.released and result.kept and result.left_at == script.current.hold.counter == 5


@pytest.mark.parametrize("table_down", [False, True])
def test_a_failed_worker_writes_its_pending_checkpoint_before_keeping_the_lease_and_keeps_it_if_it_cannot(table_down):
    """The processor's last asked-for checkpoint is not lost with the worker; a table that refuses the write too
    (it may be what failed) does not turn the failure into another one."""
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4))
    original = script.__call__
    renewed: list = []

    def failing(effect):
        if isinstance(effect, fx.Poll):
            raise PermissionError("AccessDenied")
        if isinstance(effect, fx.TakePending):
            return Checkpoint("42")
        if isinstance(effect, fx.Renew):
            if table_down:
                raise ConnectionError("dynamodb unreachable")
            renewed.append(effect.checkpoint)
            script.hold = script.hold.after_renew(Outcome.APPLIED, script.now, TIMING, script.now)
            return Outcome.APPLIED
        if isinstance(effect, fx.Locked):
            return fx.drive(effect.body, failing)
        return original(effect)

    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), failing)
    assert result.outcome is LifeOutcome.FAILED and result.kept and not script.released
    assert renewed == ([] if table_down else [Checkpoint("42")])
    assert result.left_at == script.current.hold.counter


def test_the_manager_cycle_stamps_lease_ages_when_the_scan_returns():
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    peer = Lease("s-0", Checkpoint("5"), "peer", 3)

    def handle(effect):
        if isinstance(effect, fx.Now):
            return 100.0 if not hasattr(handle, "started") else 112.0
        if isinstance(effect, fx.ScanTable):
            handle.started = True
            return fx.Scanned([peer], sent_at=100.0, returned_at=111.0)  # a 11 s throttled scan
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        return None

    result = fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert state.ages.age("s-0", 112.0) == 1.0
    assert result.spawned == [] and result.stolen is None  # a live peer's lease is not expired


def test_the_manager_notices_a_second_process_under_its_worker_id():
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    seen = [Lease("s-0", Checkpoint("5"), "me", 3)]
    told = []

    def handle(effect):
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(list(seen), 0.0, 0.0)
        if isinstance(effect, fx.DuplicateWorkerId):
            told.append(effect.lease_keys)
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        return 0.0 if isinstance(effect, fx.Now) else None

    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    seen[0] = Lease("s-0", Checkpoint("5"), "me", 4)
    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert told == [("s-0",)] and state.duplicate_worker_id_sightings == 1


def test_a_frozen_local_worker_whose_lease_a_peer_took_and_stopped_working_is_killed_and_the_lease_taken():
    """Simulation seed 3407: our worker froze; a Java peer took its lease, then dropped it (its own checkpoint,
    retried after a lost answer, failed its condition) and never renewed it again. The lease stood unworked,
    owned by the peer, and this manager — the only consumer — never took it: the frozen worker, alive, counted
    it as worked here. A worker spawned moments ago for an expired lease is not judged stuck."""
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    table = {"lease": Lease("s-0", Checkpoint("5"), None, 0), "now": 0.0}
    effects: list[fx.CycleEffect] = []

    def handle(effect):
        effects.append(effect)
        if isinstance(effect, fx.Now):
            return table["now"]
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned([table["lease"]], table["now"], table["now"])
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        return None

    def cycle(at: float, lease: Lease, worked=("s-0",)) -> list[fx.CycleEffect]:
        table["now"], table["lease"] = at, lease
        effects.clear()
        fx.drive(cyc.manager_cycle(state, settings, frozenset(worked), random.Random(0)), handle)
        return [e for e in effects if isinstance(e, (fx.Spawn, fx.Abandon))]

    assert [type(e) for e in cycle(0.0, table["lease"], worked=())] == [fx.Spawn]  # a free lease: our worker
    assert cycle(5.0, Lease("s-0", Checkpoint("5"), "me", 1)) == []  # it took the lease, then froze
    assert cycle(20.0, Lease("s-0", Checkpoint("7"), "java-peer", 3)) == []  # the peer took it, then dropped it
    acted = cycle(31.0, Lease("s-0", Checkpoint("7"), "java-peer", 3))  # unchanged for longer than the expiry
    assert [(type(e), e.lease.lease_key) for e in acted] == [(fx.Abandon, "s-0"), (fx.Spawn, "s-0")], \
        "the frozen worker kept the peer's unworked lease from being taken"
    # The worker just spawned for that expired lease has not taken it yet: it is not stuck.
    assert cycle(33.0, Lease("s-0", Checkpoint("7"), "java-peer", 3)) == []
    assert not fx.drive(cyc.watch_for_expiry(state, settings, frozenset({"s-0"})), handle)


def test_a_worker_just_spawned_for_a_stale_lease_of_ours_is_not_killed_before_its_take_shows():
    """Simulation seed 192 (`short-reads`): a lease still owned by an earlier incarnation under our worker id
    stood unchanged past the expiry; this manager spawned a worker to take it, and the next scan — from before the
    take — judged the new worker stuck (its lease ours and unchanged past the expiry) and killed it a second
    after its spawn. Killed, it released nothing, and the consumer's graceful stop left the lease held."""
    from kcl_pipeline.kcl.core.fleet.planner import LeaseAges, stuck_local_leases

    stale = Lease("s-0", Checkpoint("5"), "me", 4)  # ours, by an incarnation gone since
    ages = LeaseAges()
    ages.observe([stale], 0.0)
    assert stuck_local_leases("me", [stale], {"s-0"}, ages, 31.0, 10.0, {"s-0": 30.0}) == []
    assert stuck_local_leases("me", [stale], {"s-0"}, ages, 51.0, 10.0, {"s-0": 30.0}) == [stale]  # still stuck
    assert stuck_local_leases("me", [stale], {"s-0"}, ages, 31.0, 10.0, {}) == [stale]  # no spawn on record


def test_a_worker_whose_spawn_took_seconds_is_not_killed_as_stuck_a_cycle_later():
    """A consumer's first spawn starts its worker server (seconds on a busy host): the spawn was stamped with the
    time read before it, so the next cycle, one second after the spawn returned, judged the new worker stuck
    (the free lease unchanged for longer than the expiry, the spawn apparently older than one) and killed it
    before its take could show; on a loaded host every respawn was killed the same way and the lease was never
    worked. A spawn counts from when it returned."""
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 3.0, 1, 10)
    free = Lease("s-0", Checkpoint(TRIM_HORIZON), None, 0)
    clock = [0.0]
    acted: list[fx.CycleEffect] = []

    def handle(effect):
        if isinstance(effect, fx.Now):
            return clock[0]
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned([free], clock[0], clock[0])
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        if isinstance(effect, fx.Spawn):
            clock[0] += 5.5  # the worker server starting (longer than the start patience less a cycle)
        if isinstance(effect, (fx.Spawn, fx.Abandon)):
            acted.append(effect)
        return None

    fx.drive(cyc.manager_cycle(state, settings, frozenset(), random.Random(0)), handle)
    assert [type(e) for e in acted] == [fx.Spawn]
    acted.clear()
    clock[0] += 1.0  # the next cycle: the worker has not taken the lease yet
    fx.drive(cyc.manager_cycle(state, settings, frozenset({"s-0"}), random.Random(0)), handle)
    assert acted == [], "a worker spawned a second ago was killed as stuck"

def test_a_lost_lease_whose_table_could_not_be_read_is_reported_left_at_its_counter():
    """Cut off from the table when its validity passed, a worker cannot tell whether the lease still stands in its
    name: it reports the counter it left it at (LifeResult.left_at), and its manager releases it at that counter
    when it stops (seed 6197: the consumer otherwise exited with the lease in its name)."""
    script = Script(Lease("s-0", Checkpoint(TRIM_HORIZON), None, 4))
    answer = script.__call__

    def cut_off(effect):
        if isinstance(effect, fx.Poll):
            script.now += 20.0  # frozen past its validity inside the poll
        if isinstance(effect, fx.GetLease) and script.now > 10.0:
            raise ConnectionError("DynamoDB unreachable")
        return answer(effect)
    result = fx.drive(life.lease_life(script.lease, SETTINGS, script.current), cut_off)
    assert result.outcome is LifeOutcome.LEASE_LOST and result.left_at == 5
    assert not script.released


def test_a_worker_slow_to_start_on_a_loaded_host_is_not_killed_before_its_take_shows():
    """On a loaded host (two cores under the whole suite) a worker's start took longer than the expiry: its manager
    judged it stuck an expiry after its spawn and killed it, spawned another that started as slowly, and the lease
    was never worked (a fleet test's "every lease owned" timed out). A spawned worker has two expiries to show its
    take; one frozen before its take is found after those."""
    from kcl_pipeline.kcl.core.fleet.planner import LeaseAges, stuck_local_leases

    free = Lease("s-0", Checkpoint(TRIM_HORIZON), None, 0)
    ages = LeaseAges()
    ages.observe([free], 0.0)
    assert stuck_local_leases("me", [free], {"s-0"}, ages, 15.0, 3.0, {"s-0": 10.0}) == []  # 5 s after its spawn
    assert stuck_local_leases("me", [free], {"s-0"}, ages, 16.5, 3.0, {"s-0": 10.0}) == [free]
    # Its take showed (a change since the spawn), then it froze: stuck an expiry after the take, as before.
    taken = Lease("s-0", Checkpoint(TRIM_HORIZON), "me", 1)
    ages.observe([taken], 11.0)
    assert stuck_local_leases("me", [taken], {"s-0"}, ages, 14.5, 3.0, {"s-0": 10.0}) == [taken]

def test_a_worker_past_its_validity_never_renews_its_lease():
    """A worker that thaws after its validity passed must not renew: if nobody took the lease yet the renew
    succeeds, and every peer then waits one more expiry for a lease this worker no longer works."""
    from kcl_pipeline.kcl.shells.transport import Blocking, Call
    from kcl_pipeline.kcl.shells.workers.worker import HeldLease

    clock = [0.0]
    held = HeldLease(TIMING, monotonic=lambda: clock[0])
    held.install(Lease("shardId-000000000001", Checkpoint("5"), "me", 3), 0.0)
    hold = held.hold
    writes: list[int] = []
    driver = Blocking(lambda effect: None)  # production's transport: the request runs on the calling thread

    def heartbeat(counter: int) -> Call:
        return Call("heartbeat", lambda: writes.append(counter) or True)
    assert driver.run(held.renew(heartbeat)) is Outcome.APPLIED
    clock[0] = 30.0  # frozen well past the validity (sent at 0 + 10 - 1)
    assert driver.run(held.renew(heartbeat)) is Outcome.REFUSED
    assert writes == [3], "a renew was sent after the lease's validity had passed"
    assert held.hold.lost is not None
    assert not hold.may_write(9.5) and hold.may_write(8.5)


def test_a_free_lease_released_unsettled_is_spawned_to_wait_one_expiry_before_delivering():
    """Found by reading the stop path of a cold steal: its release freed a lease whose previous holder may
    still deliver, and a free lease was spawned to deliver at once."""
    from kcl_pipeline.kcl.core.table.lease_rules import UNSETTLED_ATTRIBUTE

    for extra, stolen in (({UNSETTLED_ATTRIBUTE: True}, True), ({}, False)):
        state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
        settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
        free = Lease("s-0", Checkpoint("5"), None, 4, extra=dict(extra))
        spawned = []

        def handle(effect, free=free, spawned=spawned):
            if isinstance(effect, fx.Now):
                return 0.0
            if isinstance(effect, fx.ScanTable):
                return fx.Scanned([free], 0.0, 0.0)
            if isinstance(effect, fx.ListShards):
                return [Shard("s-0")]
            if isinstance(effect, fx.Spawn):
                spawned.append(effect.stolen)
            return None

        fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
        assert spawned == [stolen]


def test_a_stolen_lease_given_back_on_a_failure_before_its_wait_ended_is_marked_unsettled():
    child = Lease("s-2", Checkpoint(TRIM_HORIZON), "peer", 4, parent_shard_ids=("s-0",))
    script = Script(child)
    original = script.__call__

    def failing(effect):
        if isinstance(effect, fx.ReadLeases):
            raise ConnectionError("dynamodb unreachable")
        return original(effect)

    result = fx.drive(life.lease_life(child, STOLEN, script.current), failing)
    assert result.outcome is LifeOutcome.FAILED and script.unsettled_releases == [True]


def test_a_heartbeat_judged_applied_after_an_unanswered_one_counts_validity_from_the_unanswered_send():
    """Found by the simulation (seed 8209): a heartbeat applied, its response lost and its retries throttled,
    ended in an error, so the hold kept its counter; the next heartbeat, conditioned on that counter, failed
    its condition on a retry, and the re-read ("our owner, our counter + 1") judged it applied — but the
    earlier heartbeat had written that counter. Validity counted from the later send let the worker deliver
    after peers, who start their expiry from the earlier write, could take the lease."""
    from kcl_pipeline.kcl.shells.transport import Blocking, Call
    from kcl_pipeline.kcl.shells.workers.worker import HeldLease

    clock = [0.0]
    held = HeldLease(TIMING, monotonic=lambda: clock[0])
    held.install(Lease("shardId-000000000001", Checkpoint("5"), "me", 3), 0.0)
    driver = Blocking(lambda effect: None)

    def unanswered() -> bool:
        raise RuntimeError("throttled after the first attempt's response was lost")
    clock[0] = 3.0
    with pytest.raises(RuntimeError):
        driver.run(held.renew(lambda counter: Call("heartbeat", unanswered)))
    clock[0] = 6.0
    assert driver.run(held.renew(lambda counter: Call("heartbeat", lambda: True))) is Outcome.APPLIED
    assert held.hold.counter == 4
    assert held.hold.valid_until == TIMING.valid_until(3.0), "validity counted from the later heartbeat's send"
    clock[0] = 9.0
    assert driver.run(held.renew(lambda counter: Call("heartbeat", lambda: True))) is Outcome.APPLIED
    assert held.hold.valid_until == TIMING.valid_until(9.0)  # answered writes count from their own send again


def test_a_lease_whose_worker_this_manager_spawned_and_lost_is_no_second_process_under_its_worker_id():
    """A worker this manager spawned for one of its own unworked leases (its previous worker was killed) takes
    the lease — the counter moves — and is killed itself before the next cycle. That write was this manager's
    own worker's, not a second process's under the same id: the cycle must neither warn "worker ids must be
    unique per process" nor leave the lease untouched (seen in the chaos test, one worker SIGKILLed every 10 s)."""
    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    seen = [Lease("s-0", Checkpoint("5"), "me", 3)]
    told, spawned = [], []
    clock = [0.0]

    def handle(effect):
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(list(seen), clock[0], clock[0])
        if isinstance(effect, fx.DuplicateWorkerId):
            told.append(effect.lease_keys)
        if isinstance(effect, fx.Spawn):
            spawned.append(effect.lease.lease_key)
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        return clock[0] if isinstance(effect, fx.Now) else None

    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)  # our lease, its worker gone
    clock[0] = 11.0
    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert spawned == ["s-0"], "the manager takes its own unworked lease back once it expired"
    seen[0] = Lease("s-0", Checkpoint("5"), "me", 4)  # the new worker took it, and was killed before this cycle
    clock[0] = 12.0
    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert told == [] and state.duplicate_worker_id_sightings == 0
    clock[0] = 23.0  # unchanged for an expiry since that take: taken back again
    fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert told == [] and spawned == ["s-0", "s-0"], "the lease is worked again"
