"""Graceful hand-off for balance (KCL 3.x's checkpointOwner): the taker asks, the holder checkpoints and
steps aside, the taker starts at once; a holder that does not answer is taken from cold.

Pure histories of the coroutines first (each effect answered by hand), then the table's two writes
against dynalite and moto over HTTP.
"""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.lease import lease_life as life
from kcl_pipeline.kcl.core.lease.lease_hold import CurrentHold, LeaseHold, LeaseTiming, Outcome
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline_tests.kcl.cycle_support import drive_cycle

TIMING = LeaseTiming(10.0, 1.0)
MINE = {"leaseClaim": "this-process"}


def _settings(handoff_from="holder"):
    return life.LifeSettings(TIMING, Checkpoint(TRIM_HORIZON), heartbeat_seconds=3.0, stolen=True,
                             handoff_from=handoff_from)


class Taker:
    """Answers the new owner's effects; `steps_aside_after` seconds after the ask, the holder finishes."""

    def __init__(self, steps_aside_after: float | None, asked: bool = True, overtaken: Lease | None = None):
        self.now = 0.0
        self.asked = asked
        self.steps_aside_after = steps_aside_after
        self.overtaken = overtaken
        self.lease = Lease("s-0", Checkpoint("100"), "holder", 7)
        self.acquired_from: Lease | None = None
        self.current = CurrentHold()
        self.waited_before_delivering = 0.0
        self.delivered_at: float | None = None
        self.was_asked = False

    @property
    def hold(self) -> LeaseHold | None:
        """The hold the coroutines share (installed by the acquire)."""
        return self.current.hold if self.current.acquired else None

    @hold.setter
    def hold(self, hold: LeaseHold) -> None:
        self.current.move(hold)

    def __call__(self, effect):
        if isinstance(effect, fx.InitiateHandoff):
            self.was_asked = True
            if not self.asked:
                return None
            self.lease = Lease("s-0", Checkpoint("100"), "me", 7, extra={"checkpointOwner": "holder", **MINE})
            return self.lease
        if isinstance(effect, fx.Now):
            return self.now
        if isinstance(effect, fx.Stopping):
            return False
        if isinstance(effect, fx.GetLease):
            if not self.was_asked:
                return self.lease  # the holder's, as the steal saw it
            if self.overtaken:
                return self.overtaken
            if self.steps_aside_after is not None and self.now >= self.steps_aside_after:
                self.lease = Lease("s-0", Checkpoint("150"), "me", 8, extra=MINE)  # checkpoint written, counter moved
            return self.lease
        if isinstance(effect, fx.Wait):
            self.now += effect.seconds
            if self.hold is not None:  # heartbeats meanwhile
                self.hold = self.hold.after_renew(Outcome.APPLIED, self.now, TIMING, self.now)
            return None
        if isinstance(effect, fx.Acquire):
            self.acquired_from = effect.observed
            taken = Lease("s-0", effect.observed.checkpoint, "me", effect.observed.lease_counter + 1)
            self.hold = LeaseHold.acquired(taken, self.now, TIMING)
            return taken
        if isinstance(effect, fx.Check):
            self.hold = self.hold.held(self.now)
            return fx.Status(self.now, self.hold, False)
        if isinstance(effect, fx.Begin):
            self.delivered_at = self.now
            raise StopAsking()
        return None


class StopAsking(Exception):
    """The history under test ends at the first delivery."""


def _run(script, settings=None):
    observed = Lease("s-0", Checkpoint("100"), "holder", 7)
    return fx.drive(life.lease_life(observed, settings or _settings(), script.current, "me"), script)


def test_a_holder_that_steps_aside_lets_the_new_owner_start_at_once_from_its_checkpoint():
    """Before: every steal waited out the holder's validity (an expiry) and re-read from the last
    checkpoint the holder happened to write."""
    script = Taker(steps_aside_after=2.0)
    result = _run(script)
    assert result.outcome is LifeOutcome.FAILED  # StopAsking, thrown at the first delivery
    assert script.acquired_from.lease_owner == "me" and script.acquired_from.lease_counter == 8
    assert script.acquired_from.checkpoint == Checkpoint("150")  # the holder's final checkpoint
    assert script.delivered_at < TIMING.expiry_seconds / 2  # no expiry-long wait


def test_a_holder_that_does_not_answer_is_taken_from_cold_after_half_an_expiry():
    script = Taker(steps_aside_after=None)
    _run(script)
    assert script.acquired_from.extra.get("checkpointOwner") == "holder"  # taken as it stood: fences the holder
    assert script.delivered_at >= TIMING.expiry_seconds / 2 + TIMING.expiry_seconds  # then a cold steal's wait


@pytest.mark.parametrize("overtaken", [
    Lease("s-0", Checkpoint("100"), "third", 8),  # a third consumer took it
    # Found by the simulation: another process under the same worker id (or this one after a freeze)
    # took the handed-over lease and delivered; judged "stepped aside", it was delivered twice at once.
    Lease("s-0", Checkpoint("150"), "me", 9, extra={"leaseClaim": "another-process"}),
    # (A lease still ours, with our claim, moved by more than the holder's last write is a Java holder's
    # renew/checkpoint/assign sequence: handed over — test_kcl35_handoff.py.)
])
def test_a_refused_ask_or_an_overtaken_hand_off_takes_nothing(overtaken):
    assert _run(Taker(steps_aside_after=0.0, asked=False)).outcome is LifeOutcome.NOT_ACQUIRED
    assert _run(Taker(steps_aside_after=None, overtaken=overtaken)).outcome is LifeOutcome.NOT_ACQUIRED


def test_a_hand_off_needs_the_worker_id():
    script = Taker(steps_aside_after=0.0)
    result = fx.drive(life.lease_life(Lease("s-0", Checkpoint("100"), "holder", 7), _settings(), script.current),
                      script)
    assert result.outcome is LifeOutcome.FAILED and "worker id" in result.detail


class StoppedTaker(Taker):
    """Asked to stop while waiting; `finished` says whether the holder stepped aside before the cancel."""

    def __init__(self, finished: bool):
        super().__init__(steps_aside_after=None)
        self.finished = finished
        self.calls: list = []

    def __call__(self, effect):
        self.calls.append(type(effect).__name__)
        if isinstance(effect, fx.Stopping):
            return True
        if isinstance(effect, fx.CancelHandoff):
            return not self.finished
        if isinstance(effect, fx.GetLease) and self.finished and self.was_asked:
            return Lease("s-0", Checkpoint("150"), "me", 8, extra=MINE)
        if isinstance(effect, fx.ReleaseObserved):
            return True
        return super().__call__(effect)


@pytest.mark.parametrize("finished, expected", [(False, ["CancelHandoff"]),
                                                (True, ["CancelHandoff", "GetLease", "ReleaseObserved"])])
def test_a_taker_stopped_while_waiting_gives_the_lease_back(finished, expected):
    """Before: SIGTERM during a hand-off left the lease owned by a worker that was gone (found by the
    fleet test: a lease still owned after every consumer stopped)."""
    script = StoppedTaker(finished)
    assert _run(script).outcome is LifeOutcome.NOT_ACQUIRED
    assert script.calls[script.calls.index("Stopping") + 1:] == expected, script.calls


def test_a_holder_stopping_while_asked_finishes_the_hand_off_instead_of_leaving_it():
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    script = Holder(asked)
    script.release_ok = False
    result = fx.drive(life._shutdown("s-0", script.current, fx.Status(100.0, HOLD_LOST, True)), script)
    assert (result.outcome, result.detail) == (LifeOutcome.SHUTDOWN, "handed_off")
    assert [e.checkpoint for e in script.effects if isinstance(e, fx.FinishHandoff)] == [None]


class Holder:
    """Answers the old holder's effects once its heartbeat was refused: the table shows the hand-off."""

    def __init__(self, table_lease: Lease, finish_ok: bool = True):
        self.table_lease = table_lease
        self.finish_ok = finish_ok
        self.effects: list = []
        self.pending = Checkpoint("140")
        self.current = CurrentHold()
        self.current.move(HOLD_LOST)

    def __call__(self, effect):
        self.effects.append(effect)
        if isinstance(effect, fx.GetLease):
            return self.table_lease
        if isinstance(effect, fx.TakePending):
            cp, self.pending = self.pending, None
            return cp
        if isinstance(effect, fx.RestorePending):
            self.pending = self.pending or effect.checkpoint
            return None
        if isinstance(effect, fx.FinishHandoff):
            return self.finish_ok
        if isinstance(effect, fx.Check):
            return fx.Status(100.0, HOLD_LOST, False)
        if isinstance(effect, fx.OwnerlessCheckpoint):
            return True
        if isinstance(effect, fx.Release):
            return getattr(self, "release_ok", True)
        if isinstance(effect, fx.Locked):
            return fx.drive(effect.body, self)
        return None


HOLD_LOST = LeaseHold("s-0", "holder", 12, valid_until=105.0, lost="heartbeat condition failed")


def test_a_holder_asked_to_hand_off_lands_its_work_checkpoints_and_steps_aside():
    """Before: a holder whose lease was handed to another treated it as a lost lease (lease_lost, no
    checkpoint of its own), and the new owner re-read what it had delivered."""
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    script = Holder(asked)
    result = fx.drive(life._lost("s-0", script.current, HOLD_LOST), script)
    assert result.outcome is LifeOutcome.HANDED_OFF and "taker" in result.detail
    kinds = [type(e).__name__ for e in script.effects]
    assert kinds.index("Notify") < kinds.index("FinishHandoff")
    assert [e.event for e in script.effects if isinstance(e, fx.Notify)] == [fx.Notification.SHUTDOWN_REQUESTED]
    assert [e.checkpoint for e in script.effects if isinstance(e, fx.FinishHandoff)] == [Checkpoint("140")]


def test_a_holder_whose_read_of_the_table_failed_still_reports_its_finished_hand_off():
    """Found by typing the effects' answers (mypy: the read's answer may be None): a holder already handing
    off (its heartbeat saw the ask) whose read after the loss failed finished the hand-off, then named the
    taker from the failed read — an AttributeError reported as a failed life, and a needless release."""
    from dataclasses import replace

    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    handing = replace(HOLD_LOST, lost=None, handing_to="taker")
    script = Holder(asked)
    script.current.move(handing)
    reads = iter([ConnectionError("dynamodb unreachable"), asked])
    original = script.__call__

    def answer(effect):
        if isinstance(effect, fx.GetLease):
            read = next(reads)
            if isinstance(read, Exception):
                raise read
            return read
        return original(effect)

    result = fx.drive(life._lost("s-0", script.current, handing), answer)
    assert (result.outcome, result.detail) == (LifeOutcome.HANDED_OFF, "to taker")


def test_a_hand_off_taken_over_before_it_finished_falls_back_to_the_ownerless_checkpoint():
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    script = Holder(asked, finish_ok=False)
    result = fx.drive(life._lost("s-0", script.current, HOLD_LOST), script)
    assert result.outcome is LifeOutcome.LEASE_LOST
    assert any(isinstance(e, fx.OwnerlessCheckpoint) for e in script.effects)


@pytest.mark.parametrize("table_lease", [
    Lease("s-0", Checkpoint("100"), "taker", 13, extra={"checkpointOwner": "holder"}),  # counter moved: taken
    Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "someone"}),
    Lease("s-0", Checkpoint("100"), "taker", 12),  # a plain steal
    None,
])
def test_only_a_hand_off_still_ours_to_finish_is_finished(table_lease):
    assert not HOLD_LOST.asked_to_hand_off(table_lease)
    script = Holder(table_lease)
    result = fx.drive(life._lost("s-0", script.current, HOLD_LOST), script)
    assert result.outcome is LifeOutcome.LEASE_LOST


# -- the manager asks only holders that run this protocol ------------------------------------------------------

def test_the_manager_asks_for_a_hand_off_only_from_a_holder_with_fresh_worker_metrics():
    """A KCL 2.x holder publishes no worker metrics and ignores checkpointOwner: it is stolen from cold. (Metrics
    are read only in a table a KCL 3.x fleet upgrades; in a 2.x table this protocol's holders are known by their
    take instead: test_kcl2_table_items.py.)"""
    from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetView
    from kcl_pipeline.kcl.core.table.coordinator_state import MigrationState

    leases = [Lease(f"s-{i}", Checkpoint(TRIM_HORIZON), "peer", 5) for i in range(4)]
    shards = [Shard(lease.lease_key) for lease in leases]
    upgrading = FleetView(lease_table=MigrationState("CLIENT_VERSION_UPGRADE_FROM_2X"))

    def spawned_with(live_peers):
        state = cyc.ManagerState(shards=shards, list_next=False, live_peers=frozenset(live_peers), fleet=upgrading)
        settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
        spawns = []

        def seen(effect):
            if isinstance(effect, fx.Spawn):
                spawns.append((effect.stolen, effect.handoff))
        drive_cycle(state, settings, leases, 100.0, seen=seen)
        return spawns

    assert spawned_with({"peer"}) == [(True, True)]
    assert spawned_with(set()) == [(True, False)]


# -- the table's writes, against dynalite and moto over HTTP ---------------------------------------------------

@pytest.fixture
def table(any_dynamodb_client, unique_name) -> LeaseTable:
    t = LeaseTable(unique_name("handoff"), any_dynamodb_client)
    t.ensure_table()
    return t


def test_the_hand_off_writes_move_a_lease_from_its_holder_to_the_taker(table):
    table.create(Lease("s-0", Checkpoint(TRIM_HORIZON), "holder", 7))
    assert table.initiate_handoff("s-0", "taker", "holder", 6, "c1") is None  # counter moved since observed
    asked = table.initiate_handoff("s-0", "taker", "holder", 7, "c1")
    assert asked == table.get("s-0")
    assert (asked.lease_owner, asked.lease_counter, asked.extra["checkpointOwner"]) == ("taker", 7, "holder")
    assert asked.extra["leaseClaim"] == "c1"
    assert table.initiate_handoff("s-0", "other", "holder", 7, "c2") is None  # one hand-off at a time
    assert not table.heartbeat("s-0", "holder", 7)  # the holder's renewals stop: it learns of the ask
    assert not table.finish_handoff("s-0", "holder", 6, Checkpoint("100"))  # a stale holder cannot finish
    assert table.finish_handoff("s-0", "holder", 7, Checkpoint("100"))
    done = table.get("s-0")
    assert (done.lease_owner, done.lease_counter, done.checkpoint) == ("taker", 8, Checkpoint("100"))
    assert "checkpointOwner" not in done.extra
    taken = table.acquire("s-0", "taker", "taker", 8, claim="c1")
    assert (taken.lease_owner, taken.lease_counter) == ("taker", 9)


def test_a_hand_off_whose_checkpoint_is_not_ahead_still_finishes(table):
    table.create(Lease("s-0", Checkpoint("200"), "holder", 3))
    assert table.initiate_handoff("s-0", "taker", "holder", 3, "c1")
    assert table.finish_handoff("s-0", "holder", 3, Checkpoint("150"))
    done = table.get("s-0")
    assert (done.lease_counter, done.checkpoint) == (4, Checkpoint("200")) and "checkpointOwner" not in done.extra


def test_a_taker_that_gave_up_waiting_fences_the_holders_last_write(table):
    table.create(Lease("s-0", Checkpoint(TRIM_HORIZON), "holder", 7))
    assert table.initiate_handoff("s-0", "taker", "holder", 7, "c1")
    assert table.acquire("s-0", "taker", "taker", 7, claim="c1") is not None  # the cold take after the timeout
    assert not table.finish_handoff("s-0", "holder", 7, Checkpoint("100"))
    assert "checkpointOwner" not in table.get("s-0").extra


def test_a_withdrawn_hand_off_gives_the_holder_its_lease_back_as_it_was(table):
    table.create(Lease("s-0", Checkpoint(TRIM_HORIZON), "holder", 7))
    assert table.initiate_handoff("s-0", "taker", "holder", 7, "c1") is not None
    assert not table.cancel_handoff("s-0", "taker", "holder", 7, "another-process")
    assert table.cancel_handoff("s-0", "taker", "holder", 7, "c1")
    back = table.get("s-0")
    assert (back.lease_owner, back.lease_counter) == ("holder", 7) and "checkpointOwner" not in back.extra
    assert table.heartbeat("s-0", "holder", 7)  # its renewals go on
    assert table.initiate_handoff("s-0", "taker", "holder", 8, "c2") is not None
    assert table.finish_handoff("s-0", "holder", 8)
    assert not table.cancel_handoff("s-0", "taker", "holder", 8, "c2")  # too late: handed over
    assert table.release("s-0", "taker", 9)


def test_a_hand_off_between_one_worker_is_refused():
    with pytest.raises(ValueError, match="two different workers"):
        LeaseTable("t", object()).initiate_handoff("s-0", "me", "me", 1, "c")


def test_a_lease_given_back_by_a_withdrawn_hand_off_is_released_not_left_owned():
    """Found by the fleet test (a lease still owned after every consumer stopped): the asker withdrew
    (stopping), which gave the lease back to the holder at its own counter after the holder had stopped
    delivering; the holder exited and the lease stayed owned by a worker that was gone."""
    given_back = Lease("s-0", Checkpoint("100"), "holder", 12)
    script = Holder(given_back)
    assert fx.drive(life._lost("s-0", script.current, HOLD_LOST), script).outcome is LifeOutcome.LEASE_LOST
    assert [e.lease for e in script.effects if isinstance(e, fx.ReleaseObserved)] == [given_back]
    stopping = Holder(given_back)
    stopping.release_ok = False  # its own release ran while the asker still owned the lease
    result = fx.drive(life._shutdown("s-0", stopping.current, fx.Status(100.0, HOLD_LOST, True)), stopping)
    assert result.outcome is LifeOutcome.SHUTDOWN
    assert [e.lease for e in stopping.effects if isinstance(e, fx.ReleaseObserved)] == [given_back]


def test_a_stopping_holder_whose_hand_off_finish_lost_to_the_askers_withdrawal_releases_the_lease():
    """Found by CI (a lease still owned after every consumer stopped): the holder, stopping, read the hand-off
    still asked for and tried to finish it, while the asker, stopping too, withdrew; the finish was refused,
    the lease was the holder's again at its own counter, and nobody released it."""
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    given_back = Lease("s-0", Checkpoint("100"), "holder", 12)
    script = Holder(asked, finish_ok=False)
    script.release_ok = False  # its own release ran while the asker still owned the lease
    reads = iter([asked, given_back])
    original = script.__call__

    def answer(effect):
        if isinstance(effect, fx.GetLease):
            script.effects.append(effect)
            return next(reads)
        return original(effect)

    result = fx.drive(life._shutdown("s-0", script.current, fx.Status(100.0, HOLD_LOST, True)), answer)
    assert result.outcome is LifeOutcome.SHUTDOWN
    assert [e.lease for e in script.effects if isinstance(e, fx.ReleaseObserved)] == [given_back]


class Renewing:
    """Answers one heartbeat of a holder: its renewal refused, the table showing `table_lease`."""

    def __init__(self, table_lease: Lease | None, hold: LeaseHold):
        self.table_lease = table_lease
        self.current = CurrentHold()
        self.hold = hold
        self.effects: list = []
        self.pending: Checkpoint | None = Checkpoint("140")

    @property
    def hold(self) -> LeaseHold | None:
        """The hold the coroutines share (installed by the acquire)."""
        return self.current.hold if self.current.acquired else None

    @hold.setter
    def hold(self, hold: LeaseHold) -> None:
        self.current.move(hold)

    def __call__(self, effect):
        self.effects.append(type(effect).__name__)
        if isinstance(effect, fx.Locked):
            return fx.drive(effect.body, self)
        if isinstance(effect, fx.Check):
            return fx.Status(100.0, self.hold, False)
        if isinstance(effect, fx.TakePending):
            cp, self.pending = self.pending, None
            return cp
        if isinstance(effect, fx.RestorePending):
            self.pending = effect.checkpoint
            return None
        if isinstance(effect, fx.Renew):
            self.hold = self.hold.after_renew(Outcome.REFUSED, 100.0, TIMING, 100.0)
            return Outcome.REFUSED
        if isinstance(effect, fx.GetLease):
            return self.table_lease
        if isinstance(effect, fx.RenewAsked):
            self.hold = self.hold.after_renew(Outcome.APPLIED, 100.0, TIMING, 100.0)
            return Outcome.APPLIED
        return None


HELD = LeaseHold("s-0", "holder", 12, valid_until=105.0)


def test_a_holder_asked_to_hand_off_keeps_renewing_and_keeps_its_checkpoint_for_the_last_write():
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    script = Renewing(asked, HELD)
    fx.drive(life.heartbeat_once(script.current), script)
    assert script.effects.count("RenewAsked") == 1
    assert script.hold.lost is None and script.hold.handing_to == "taker" and script.hold.counter == 13
    assert not script.hold.may_deliver(100.0)  # delivery stops; the hand-off's last write follows
    assert script.pending == Checkpoint("140")
    fx.drive(life.heartbeat_once(script.current), script)  # the next heartbeat renews as checkpointOwner straight away
    assert script.effects.count("Renew") == 1 and script.effects.count("RenewAsked") == 2
    assert script.hold.counter == 14 and script.pending == Checkpoint("140")


@pytest.mark.parametrize("table_lease", [
    Lease("s-0", Checkpoint("100"), "thief", 13),  # a plain steal
    Lease("s-0", Checkpoint("100"), "taker", 13, extra={"checkpointOwner": "holder"}),  # taken over meanwhile
    None,
])
def test_a_refused_renewal_without_a_hand_off_asked_of_this_holder_still_loses_the_lease(table_lease):
    script = Renewing(table_lease, HELD)
    fx.drive(life.heartbeat_once(script.current), script)
    assert "RenewAsked" not in script.effects and script.hold.lost is not None


def test_the_renewal_of_an_asked_holder_is_fenced_on_its_counter_and_its_checkpoint_owner(table):
    table.create(Lease("s-0", Checkpoint(TRIM_HORIZON), "holder", 7))
    assert table.initiate_handoff("s-0", "taker", "holder", 7, "c1")
    assert table.renew_asked("s-0", "holder", 7) and table.get("s-0").lease_counter == 8
    assert not table.renew_asked("s-0", "holder", 7)  # a stale counter
    assert not table.renew_asked("s-0", "someone", 8)
    assert table.finish_handoff("s-0", "holder", 8, Checkpoint("100"))
    assert not table.renew_asked("s-0", "holder", 9)  # stepped aside: nothing more to renew


class EndedHolder(Holder):
    """A holder idle at its shard's end (the pipeline ends the shard): its heartbeat sees a hand-off asked of it
    during the first wait; the pipeline never ends the shard in this history."""

    def __init__(self, asked: Lease, waits_allowed: int = 5):
        super().__init__(asked)
        self.current = CurrentHold()
        self.current.move(HELD)
        self.waits = 0
        self.waits_allowed = waits_allowed

    def __call__(self, effect):
        if isinstance(effect, fx.WaitForChange):
            self.effects.append(effect)
            self.waits += 1
            if self.waits > self.waits_allowed:
                raise AssertionError(f"still waiting for the end after {self.waits_allowed} waits, "
                                     f"renewing a lease asked of it")
            if self.waits == 1:
                self.current.move(self.current.hold.handing_off(self.table_lease))  # the heartbeat's RenewAsked
            return None
        if isinstance(effect, fx.Check):
            self.effects.append(effect)
            return fx.Status(100.0, self.current.hold, False)
        return super().__call__(effect)


def test_a_holder_waiting_for_the_pipeline_to_end_its_shard_finishes_a_hand_off_asked_of_it():
    """Seed 1935 of the 10,000-seed run: a holder whose shard end had landed waited, idle, for the pipeline to end
    the shard; a taker asked it for a hand-off and froze right after. The holder renewed the asked lease every
    heartbeat instead of stepping aside, so no other consumer could see it expire: owned by the frozen asker and
    unworked for 28 s. Waiting for the end, it finishes the hand-off at once, as while delivering."""
    asked = Lease("s-0", Checkpoint("100"), "taker", 12, extra={"checkpointOwner": "holder"})
    script = EndedHolder(asked)
    settings = life.LifeSettings(TIMING, Checkpoint(TRIM_HORIZON), heartbeat_seconds=3.0)
    result = fx.drive(life._finish_ended("s-0", script.current, False, settings), script)
    assert (result.outcome, result.detail) == (LifeOutcome.HANDED_OFF, "to taker")
    assert script.waits == 1
    assert [e.checkpoint for e in script.effects if isinstance(e, fx.FinishHandoff)] == [Checkpoint("140")]
