"""Load-aware balance (kcl/balance.py) against the balance vectors, and convergence of whole fleets."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kcl_pipeline.kcl.core.fleet.balance import BalanceSettings, effective_loads, plan_steal
from kcl_pipeline.kcl.core.lease import effects as fx

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "balance_vectors.json").read_text())


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=[v["name"] for v in VECTORS["vectors"]])
def test_balance_vectors(vector):
    mine, owned = vector["mine"], vector["owned"]
    if vector.get("reported"):
        reported = dict(mine)
        for leases in owned.values():
            reported.update(leases)
        loads = effective_loads(reported)
        mine = {key: loads[key] for key in mine}
        owned = {owner: {key: loads[key] for key in leases} for owner, leases in owned.items()}
    steal = plan_steal(vector["me"], mine, owned)
    got = None if steal is None else {"lease_key": steal.lease_key, "owner": steal.owner}
    assert got == vector["expect"]


def settle(assignment: dict[str, dict[str, float]], rng: random.Random, settings=BalanceSettings(),
           max_rounds: int = 200) -> tuple[int, int]:
    """Rounds of every consumer (in random order) planning on the current table; (rounds, steals) to settle."""
    steals = 0
    for rounds in range(1, max_rounds + 1):
        moved = 0
        for me in rng.sample(sorted(assignment), len(assignment)):
            others = {o: leases for o, leases in assignment.items() if o != me and leases}
            idle = sum(1 for o, leases in assignment.items() if o != me and not leases)  # from worker metrics
            steal = plan_steal(me, assignment[me], others, settings, idle_consumers=idle)
            if steal is not None:
                assignment[me][steal.lease_key] = assignment[steal.owner].pop(steal.lease_key)
                moved += 1
        steals += moved
        if moved == 0:
            return rounds, steals
    raise AssertionError(f"no steady state after {max_rounds} rounds")


def within_tolerance_or_granular(assignment, settings=BalanceSettings()) -> bool:
    totals = {o: sum(leases.values()) for o, leases in assignment.items()}
    mean = sum(totals.values()) / len(totals)
    lightest = min(totals.values())
    for owner, load in totals.items():
        if load > mean * (1 + settings.tolerance):
            # allowed only when no single lease of it fits the gap to the lightest consumer
            if any(x <= load - lightest - settings.margin * mean for x in assignment[owner].values()):
                return False
    return True


@pytest.mark.parametrize("seed", range(20))
def test_a_fleet_with_a_10x_hot_shard_converges_and_then_never_steals(seed):
    rng = random.Random(seed)
    consumers, shards = rng.randint(2, 8), rng.randint(4, 40)
    reported = {f"shard-{i:03d}": rng.uniform(50, 150) for i in range(shards)}
    reported["shard-000"] *= 10  # the hot shard
    loads = effective_loads(reported)
    start = {f"c{j}": {} for j in range(consumers)}
    for key in sorted(loads):  # the worst start: everything on one consumer
        start["c0"][key] = loads[key]
    rounds, steals = settle(start, rng)
    assert within_tolerance_or_granular(start)
    assert settle(start, rng) == (1, 0)  # steady state: a further round steals nothing


def test_no_report_settles_to_a_count_balance():
    loads = effective_loads({f"s{i}": None for i in range(10)})
    assignment = {"a": dict(loads), "b": {}, "c": {}}
    settle(assignment, random.Random(1))
    counts = sorted(len(leases) for leases in assignment.values())
    assert counts[-1] - counts[0] <= 1


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_corrupt_load_report_is_a_specific_error(bad):
    with pytest.raises(ValueError, match="lease s1: load must be a number >= 0"):
        effective_loads({"s1": bad})


def test_me_among_the_other_owners_is_an_error():
    with pytest.raises(ValueError, match="both this consumer and another owner"):
        plan_steal("me", {}, {"me": {"a": 1.0}})


def test_an_idle_consumer_invisible_in_the_lease_table_counts_in_the_mean():
    """Visible mean 53.3 (ceiling 64) leaves b's 60 alone; two lease-less peers make the mean 32."""
    owned = {"a": {"h": 100.0}, "b": {"b1": 30.0, "b2": 30.0}}
    assert plan_steal("me", {}, owned) is None
    steal = plan_steal("me", {}, owned, idle_consumers=2)
    assert (steal.lease_key, steal.owner) == ("b1", "b")
    with pytest.raises(ValueError, match="idle_consumers"):
        plan_steal("me", {}, owned, idle_consumers=-1)


def test_negative_settings_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        BalanceSettings(tolerance=-0.1)


# -- wired into the planner and the lease writes ------------------------------------------------------
from kcl_pipeline.kcl.core.fleet.planner import leases_to_acquire  # noqa: E402
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease  # noqa: E402
from kcl_pipeline.kcl.core.table import lease_rules  # noqa: E402


def _lease(key, owner, kbps=None):
    return Lease(key, Checkpoint(TRIM_HORIZON), owner, 5, extra={} if kbps is None else {"throughputKBps": kbps})


def _plan(me, leases, local=()):
    return leases_to_acquire(me, leases, {lease.lease_key: 0.0 for lease in leases}, expiry_seconds=10.0,
                             leases_to_acquire=1, max_leases=100, locally_worked=set(local), rng=random.Random(0))


def test_the_planner_leaves_a_count_balanced_fleet_with_a_hot_shard_to_load_balance():
    """By count a (2 leases) and me (2) are balanced; by load a carries the hot shard and a companion."""
    leases = [_lease("hot", "a", 1000.0), _lease("a1", "a", 100.0), _lease("m1", "me", 100.0),
              _lease("m2", "me", 100.0), _lease("b1", "b", 100.0), _lease("b2", "b", 100.0)]
    plan = _plan("me", leases, local={"m1", "m2"})
    assert plan.take == [] and plan.steal is not None and plan.steal.lease_key == "a1"


def test_the_planner_keeps_counting_when_no_lease_reports_throughput():
    leases = [_lease(f"a{i}", "a") for i in range(4)]
    plan = _plan("me", leases)
    assert plan.steal is not None and plan.steal.lease_owner == "a"


@pytest.mark.parametrize("corrupt", [-5.0, float("nan"), "fast", True])
def test_a_corrupt_throughput_report_does_not_stop_the_cycle(corrupt):
    leases = [_lease("a1", "a", corrupt), _lease("a2", "a", 100.0), _lease("a3", "a", 100.0)]
    plan = _plan("me", leases)
    assert plan.steal is not None


def test_heartbeat_writes_throughput_kbps_and_refuses_a_bad_value():
    lease = _lease("s1", "me")
    after = lease_rules.heartbeat(lease, "me", 5, throughput_kbps=12.5)
    assert after.extra["throughputKBps"] == 12.5 and after.lease_counter == 6
    with pytest.raises(ValueError, match="throughputKBps must be a finite number >= 0"):
        lease_rules.heartbeat(lease, "me", 5, throughput_kbps=-1.0)


def test_throughput_meter_reports_kb_per_second_between_heartbeats():
    from kcl_pipeline.kcl.core.fleet.balance import ThroughputMeter
    meter = ThroughputMeter()
    assert meter.take(100.0) is None  # first heartbeat: no interval yet
    meter.add(10 * 1024)
    meter.add(10 * 1024)
    assert meter.take(104.0) == 5.0
    assert meter.take(104.0) is None  # no time passed: no rate


def test_one_bursty_heartbeat_interval_does_not_look_like_a_load_change():
    """A shard at a steady 4 KB/s whose polls fall alternately before and after the heartbeats measures
    0, 8, 0, 8 ... raw (the report swung by 100 % each heartbeat); the moving average keeps it near 4."""
    from kcl_pipeline.kcl.core.fleet.balance import ThroughputMeter
    meter = ThroughputMeter(smoothed=4.0)
    meter.take(0.0)
    reports = []
    for i in range(1, 61):
        meter.add(24 * 1024 if i % 2 else 0)
        reports.append(meter.take(3.0 * i))
    assert all(3.0 <= r <= 5.0 for r in reports), reports


def test_a_new_holder_continues_the_previous_holders_average_instead_of_reporting_its_catch_up():
    """Re-reading from the checkpoint delivers a burst: reported raw, it made the new holder's consumer
    look overloaded and the lease moved on again."""
    from kcl_pipeline.kcl.core.fleet.balance import ThroughputMeter
    meter = ThroughputMeter(smoothed=2.0)  # the lease's last report, by its previous holder
    meter.take(0.0)
    meter.add(60 * 1024)  # 20 KB/s for 3 s: the catch-up
    assert meter.take(3.0) < 4.0


def test_a_taker_continues_the_load_the_lease_carries_at_its_take_not_the_older_one_it_was_spawned_with():
    """The manager decides a steal on its scan; a slow spawn, the worker's start and the hand-off later the
    holder has reported a lower load on a quieting stream. Continuing from the scan's report, the taker wrote
    the moved lease back up (0.026 → 0.031 KB/s while every other lease decayed), its consumer looked
    overloaded and the lease was stolen back: the fleet never settled."""
    from kcl_pipeline.kcl.aws_settings import AwsSettings
    from kcl_pipeline.kcl.config import ConsumerConfig
    from kcl_pipeline.kcl.core.lease.effects import Spawn
    from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker

    config = ConsumerConfig("stream", "app", worker_id="me", aws=AwsSettings(region="eu-west-1"))
    seen_at_scan = _lease("shardId-000000000003", "peer", 0.0345)
    worker = LeaseWorker(config, Spawn(seen_at_scan, stolen=True, handoff=True), object())  # type: ignore[arg-type]
    as_taken = Lease("shardId-000000000003", Checkpoint(TRIM_HORIZON), "me", 7, extra={"throughputKBps": 0.0256})
    acquire = worker._acquire(fx.Acquire())
    next(acquire)  # the take's request
    with pytest.raises(StopIteration):
        acquire.send(as_taken)
    worker.throughput.take(0.0)  # the first heartbeat: no interval yet
    report = worker.throughput.take(3.0)  # a quiet interval: nothing delivered
    assert report is not None and report < 0.0256


def test_an_idle_lease_reports_zero_instead_of_its_old_load_for_ever():
    """An average never reaches 0: without the idle floor an idle stream kept its old load ratios, and
    the balance kept weighing leases that carried nothing."""
    from kcl_pipeline.kcl.core.fleet.balance import ThroughputMeter
    meter = ThroughputMeter()
    meter.take(0.0)
    meter.add(300 * 1024)
    assert meter.take(3.0) == 100.0
    reports = [meter.take(3.0 * t) for t in range(2, 300)]
    assert reports[-1] == 0.0 and reports.index(0.0) * 3 < 600


def test_a_stream_gone_quiet_reports_idle_a_smoothing_time_later_not_minutes_later_lease_by_lease():
    """Simulation seed 3579: production stopped, each lease's average decayed towards the idle floor over minutes
    (≈ 30 s × ln(load / floor)), keeping its ratios, and the fleet went on balancing that history by load, steal
    after steal, then by count once the last lease reached the floor — not settled within 240 s. A lease that
    delivered nothing for a whole smoothing time now reports idle."""
    from kcl_pipeline.kcl.core.fleet.balance import SMOOTHING_SECONDS, ThroughputMeter
    meter = ThroughputMeter()
    meter.take(0.0)
    meter.add(300 * 1024)
    assert meter.take(3.0) == 100.0
    reports = {3.0 * t: meter.take(3.0 * t) for t in range(2, 30)}  # nothing delivered after t = 3 s
    assert all(load > 0 for at, load in reports.items() if at - 3.0 < SMOOTHING_SECONDS)
    assert all(load == 0.0 for at, load in reports.items() if at - 3.0 >= SMOOTHING_SECONDS)
    meter.add(3 * 1024)  # traffic again: the average starts over from the idle report
    assert 0 < meter.take(90.0) < 1.0


def test_a_taker_continuing_a_quiet_leases_report_reports_idle_a_smoothing_time_after_its_take():
    """A new holder that delivers nothing goes idle like any other holder, from its first heartbeat."""
    from kcl_pipeline.kcl.core.fleet.balance import SMOOTHING_SECONDS, ThroughputMeter
    meter = ThroughputMeter()
    meter.continue_from(0.2)
    meter.take(0.0)
    assert meter.take(3.0) > 0
    assert meter.take(SMOOTHING_SECONDS + 0.1) == 0.0


def test_an_unreported_lease_in_an_idle_fleet_weighs_as_little_as_the_idle_ones():
    """Every report 0 (the stream went quiet) and one fresh lease unreported: it weighed 100x the others,
    and a consumer holding it looked overloaded to the whole fleet."""
    loads = effective_loads({"a": 0.0, "b": 0.0, "fresh": None})
    assert loads["fresh"] == loads["a"] == loads["b"] > 0


def test_a_lease_in_a_kcl3_graceful_handoff_is_never_stolen():
    """leaseOwner names the new owner, checkpointOwner the old one still checkpointing: hands off."""
    handing = Lease("a1", Checkpoint(TRIM_HORIZON), "a", 5, extra={"checkpointOwner": "old"})
    by_count = [handing, _lease("a2", "a"), _lease("a3", "a"), _lease("a4", "a")]
    assert _plan("me", by_count).steal.lease_key in {"a2", "a3", "a4"}
    only_handing = [handing, Lease("a2", Checkpoint(TRIM_HORIZON), "a", 5, extra={"checkpointOwner": "old"})]
    assert _plan("me", only_handing).steal is None
    # h is the lease closest to half the gap (300 of 600), but in a hand-off: the next best moves
    by_load = [Lease("h", Checkpoint(TRIM_HORIZON), "a", 5, extra={"checkpointOwner": "old", "throughputKBps": 300.0}),
               _lease("a2", "a", 50.0), _lease("a3", "a", 250.0)]
    assert _plan("me", by_load).steal.lease_key == "a3"


# -- patience: a load-aware steal waits until the imbalance has lasted ----------------------------------------

def test_only_a_confirmed_overloaded_owner_is_stolen_from():
    owned = {"a": {"h": 100.0, "a1": 30.0}, "b": {"b1": 10.0}}
    assert plan_steal("me", {}, owned).owner == "a"
    assert plan_steal("me", {}, owned, confirmed=set()) is None
    assert plan_steal("me", {}, owned, confirmed={"a"}).owner == "a"


def _patience_world():
    """me (idle, one lease), a hot owner 'a' with a movable lease, a light owner 'b'; all live."""
    from kcl_pipeline.kcl.core.model import Shard
    leases = [_lease("h", "a", 100.0), _lease("a1", "a", 40.0), _lease("b1", "b", 30.0), _lease("m1", "me", 5.0)]
    return leases, [Shard(lease.lease_key) for lease in leases]


def _cycle(state, settings, leases, now):
    from dataclasses import replace

    from kcl_pipeline_tests.kcl.cycle_support import drive_cycle
    spawned = []

    # Live holders heartbeat between cycles: every counter moves.
    leases = [replace(lease, lease_counter=int(now)) for lease in leases]

    def seen(effect):
        if isinstance(effect, fx.Spawn):
            spawned.append((effect.lease.lease_key, effect.stolen))
    drive_cycle(state, settings, leases, now, locally_worked={"m1"}, seen=seen)
    return spawned


def test_a_passing_overload_moves_nothing_and_a_lasting_one_moves_a_lease_after_the_patience():
    """Without patience one noisy scan (or a new holder's catch-up burst) moved a lease, and the
    fleet flapped in the simulation."""
    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    leases, shards = _patience_world()
    state = cyc.ManagerState(shards=shards, list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10, balance_patience_seconds=20.0)
    assert _cycle(state, settings, leases, 100.0) == []
    assert _cycle(state, settings, leases, 110.0) == []
    assert _cycle(state, settings, leases, 120.0) == [("a1", True)]


def test_a_move_anywhere_in_the_fleet_restarts_the_patience():
    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    leases, shards = _patience_world()
    state = cyc.ManagerState(shards=shards, list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10, balance_patience_seconds=20.0)
    _cycle(state, settings, leases, 100.0)
    _cycle(state, settings, leases, 110.0)
    # a took b's lease meanwhile: the loads are judged afresh, from when the ownership last changed
    moved = [lease if lease.lease_key != "b1" else _lease("b1", "a", 30.0) for lease in leases]
    assert _cycle(state, settings, moved, 120.0) == []
    assert _cycle(state, settings, moved, 130.0) == []
    assert _cycle(state, settings, moved, 140.0) != []


def test_the_patience_is_two_cycles():
    from kcl_pipeline.kcl.config import ConsumerConfig
    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    config = ConsumerConfig(stream="s", application="app", worker_id="me", cycle_seconds=10.0)
    assert cyc.CycleSettings.of(config).balance_patience_seconds == 20.0


def test_without_patience_the_first_scan_that_sees_the_overload_steals():
    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    leases, shards = _patience_world()
    state = cyc.ManagerState(shards=shards, list_next=False)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    assert _cycle(state, settings, leases, 100.0) == [("a1", True)]
