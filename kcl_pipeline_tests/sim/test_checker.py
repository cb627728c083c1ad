"""The checker's judgement of holders, on histories written by hand: who may start delivering a shard
while an earlier holder is alive."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from kcl_pipeline.kcl.core.fleet.planner import START_PATIENCE_EXPIRIES
from kcl_pipeline.kcl.core.lease.lease_hold import LeaseTiming
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, UserRecord
from kcl_pipeline.kcl.core.table.lease_codec import lease_to_item
from kcl_pipeline.sim.actors.pipeline import SimPipeline
from kcl_pipeline.sim.aws.kinesis import SimStream
from kcl_pipeline.sim.aws.landing import SimZone
from kcl_pipeline.sim.judge.checker import Checker
from kcl_pipeline.sim.world import base_config
from kcl_pipeline.windows.followup import Outstanding, RunState
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.zone.batch import encode_batch
from kcl_pipeline.zone.layout import BatchKey
from kcl_pipeline.zone.store import MemoryZoneStore

KEY = "shardId-000000000000"
CONFIG = base_config("template", 1)


@dataclass
class Host:
    rate: float = 1.0


@dataclass
class Worker:
    """A worker as the checker sees it: its hold is valid for `valid_for` more seconds (its clock)."""

    serial: int
    worker_id: str
    valid_for: float = 5.0
    paused: float = 0.0
    finished: bool = False
    host: Host = field(default_factory=Host)
    config: object = CONFIG
    timing: LeaseTiming = LeaseTiming(10.0, 1.0)

    frozen_before: bool = False  # frozen by the world before its take
    works: bool = True

    def could_deliver(self) -> float:
        return self.valid_for

    def working(self) -> bool:
        return self.works

    def frozen_before_take(self) -> bool:
        return self.frozen_before


class Fleet:
    def __init__(self, workers):
        self.workers = workers
        self.consumers, self.java_peers = [], []

    def workers_by_key(self, key):
        return [w for w in self.workers if not w.finished]

    def worker_of(self, actor):
        return actor if isinstance(actor, Worker) else None


class Record:
    def __init__(self, position):
        self._position = position

    def position(self):
        return self._position


def _world(workers):
    now = [10.0]
    stream = SimStream("simstream", random.Random(0), 1, lambda: now[0])
    stream.produce(5.0)
    items: dict = {}
    violations: list[str] = []
    checker = Checker(stream=stream, zone=SimZone(stream), items=items, foreign={}, fleet=Fleet(workers),
                      config=CONFIG, liveness_slack=6.0, now=lambda: now[0], note=violations.append)

    def write(actor, owner, counter):
        after = lease_to_item(Lease(KEY, Checkpoint(TRIM_HORIZON), owner, counter))
        checker.on_write(CONFIG.lease_table, KEY, items.get(KEY), after, actor, now[0])
        items[KEY] = after
    first = Record(stream.shards[KEY].positions[0])
    return checker, write, first


def test_a_worker_whose_release_applied_while_its_answer_was_lost_is_not_taken_for_a_possible_deliverer():
    """Seed 1546: the release applied, its response was lost and retried, the hold still looked valid to its
    worker (it learns when the answer comes) — yet a worker sends its release only once done delivering."""
    a, b = Worker(1, "consumer-1"), Worker(2, "consumer-2")
    checker, write, record = _world([a, b])
    write(a, "consumer-1", 1)
    write(a, None, 2)  # a's release, applied; a's call still retrying
    write(b, "consumer-2", 3)
    checker.on_deliver(b, KEY, [record])
    assert checker.violations == []


def test_a_holder_still_valid_when_another_starts_delivering_is_a_violation():
    a, b = Worker(1, "consumer-1"), Worker(2, "consumer-2")
    checker, write, record = _world([a, b])
    write(a, "consumer-1", 1)
    write(b, "consumer-2", 2)  # stolen; a not told yet, its hold valid for 5 s more
    checker.on_deliver(b, KEY, [record])
    assert len(checker.violations) == 1 and "could still deliver it for 5.000s" in checker.violations[0]


def test_an_earlier_holder_delivering_for_the_first_time_while_its_stealer_waits_is_no_violation():
    """Seed 8727: the holder's first delivery came late (within its own validity), after the asker of a hand-off
    had taken the lease cold; the stealer, waiting out its expiry, is the later holder — its wait is what
    keeps the two apart."""
    a, b = Worker(1, "consumer-1"), Worker(2, "consumer-0")
    checker, write, record = _world([a, b])
    write(a, "consumer-1", 1)
    write(b, "consumer-0", 2)  # taken cold: b waits an expiry before delivering
    checker.on_deliver(a, KEY, [record])
    assert checker.violations == []


class Follower:
    """One of our consumers under a KCL 3.x leader: able, but it takes nothing (the leader assigns)."""

    worker_id = "follower"

    def able(self) -> bool:
        return True

    def retrying(self, key: str) -> bool:
        return False  # no worker of it failed


@dataclass
class Leader:
    """A KCL 3.x leader as the checker sees it."""

    leading: bool = True

    def leads(self) -> bool:
        return self.leading

    def works(self, key: str) -> bool:
        return False


def _look_past_the_bound(checker, before_look) -> None:
    """The checker's liveness look every 2 s from t=10 until 5 s past the bound, `before_look(now)` first."""
    bound = CONFIG.lease_expiry_seconds + CONFIG.cycle_seconds + 6.0
    clock = [10.0]
    checker.now = lambda: clock[0]
    while clock[0] < 10.0 + bound + 5.0:
        before_look(clock[0])
        checker.audit()
        clock[0] += 2.0


def _unworked_lease_clock(leader_crashes_at: float | None) -> list[str]:
    """A lease owned by a worker that stopped working it; the checker looks every few seconds for as long as
    the bound and a bit; the leader, the only one that could reassign it, may crash on the way."""
    gone = Worker(1, "consumer-1")
    checker, write, _ = _world([])
    leader = Leader()
    checker.fleet.consumers, checker.fleet.java_peers = [Follower()], [leader]
    write(gone, "consumer-1", 1)

    def before_look(now: float) -> None:
        leader.leading = leader_crashes_at is None or now < leader_crashes_at
    _look_past_the_bound(checker, before_look)
    return checker.violations


def test_a_crashed_kcl3_leader_restarts_the_liveness_clock_of_the_leases_it_alone_could_reassign():
    """Seed 6320 of 10,000: the 3.x leader crashed after a stopped consumer's lease expired; restarted, it must
    watch the lease for an expiry of its own before reassigning it — the failover the bound covered was its."""
    assert _unworked_lease_clock(leader_crashes_at=None)  # nobody reassigns it: the bound is still enforced
    assert _unworked_lease_clock(leader_crashes_at=10.0 + CONFIG.lease_expiry_seconds) == []


def _java_owned_lease_clock(delivers_at: float | None) -> list[str]:
    """A lease a Java peer owns and mostly does not work (it takes it, delivers, loses it again at once); the
    checker looks every few seconds."""
    peer = Leader(leading=False)
    checker, write, first = _world([])
    checker.fleet.consumers, checker.fleet.java_peers = [Follower()], [peer]
    write(peer, "java3-peer-0", 1)

    def before_look(now: float) -> None:
        if delivers_at is not None and now - 2.0 <= delivers_at < now:
            checker.on_deliver(peer, KEY, [first.position()], java=True, tenure=2)
    _look_past_the_bound(checker, before_look)
    return checker.violations


def test_a_lease_worked_between_two_looks_restarts_its_liveness_clock():
    """java3 seed 1044: a Java peer retook its own lease, delivered for a second and lost it again, all between
    two looks of the checker; the clock kept counting from before, and a failover within its bound was called
    a lease left unworked."""
    assert _java_owned_lease_clock(delivers_at=None)
    assert _java_owned_lease_clock(delivers_at=10.0 + CONFIG.lease_expiry_seconds) == []


def _respawned_taker_frozen_before_its_take(looks_until: float) -> list[str]:
    """A lease of consumer-1 whose holder stopped working it at t=10; at t=20 its manager spawns a worker to take
    it over, which the world freezes before its take; the checker looks every 2 s until `looks_until`."""
    holder, taker = Worker(1, "consumer-1", works=False), Worker(2, "consumer-1", works=False)
    workers = [holder]
    checker, write, _ = _world(workers)
    checker.fleet.consumers = [Follower()]
    write(holder, "consumer-1", 1)
    clock = [10.0]
    checker.now = lambda: clock[0]
    while clock[0] <= looks_until:
        if clock[0] >= 20.0 and taker not in workers:
            taker.frozen_before = True
            workers.append(taker)
        checker.audit()
        clock[0] += 2.0
    return checker.violations


def test_a_taker_frozen_before_its_take_restarts_the_liveness_clock_and_counts_its_start_patience():
    """Seed 105 of `slow-spawns,crash,freeze-worker`: a holder froze; its manager killed it an expiry later and
    spawned a worker to take the lease over, which the world froze before its take. The manager rightly waits out
    that worker's start patience (two expiries: a worker's start may take that long) before it kills it too; the
    bound, one expiry from the first freeze, called that a lease left unworked. As when a consumer that could take
    over freezes, the clock restarts, and the bound counts the start patience — and still holds past it."""
    bound = CONFIG.lease_expiry_seconds + CONFIG.cycle_seconds + 6.0
    patience = (START_PATIENCE_EXPIRIES - 1) * CONFIG.lease_expiry_seconds
    assert _respawned_taker_frozen_before_its_take(looks_until=20.0 + bound + patience - 2.0) == []
    violations = _respawned_taker_frozen_before_its_take(looks_until=20.0 + bound + patience + 4.0)
    assert len(violations) == 1 and "start patience for a worker frozen before its take" in violations[0]


@dataclass
class Frozen:
    frozen_until: float = 0.0


@dataclass
class Faults:
    healthy_since: float = -1000.0

    def healthy(self) -> bool:
        return True


@dataclass
class Stopping:
    """A consumer asked to stop (SIGTERM) at `stopped_at`, healthy and never frozen."""

    worker_id: str = "consumer-1"
    stopped_at: float = 10.0
    group: Frozen = field(default_factory=Frozen)
    manager_scope: Frozen = field(default_factory=Frozen)
    host: object = None

    def __post_init__(self):
        self.host = type("Host", (), {"faults": Faults()})()


def _exit_after_a_stop_without_release(killed_at_landing: bool, paused_in_a_put: bool = False) -> list[str]:
    consumer = Stopping()
    worker = Worker(1, consumer.worker_id)
    worker.consumer, worker.scope = consumer, Frozen()
    checker, write, _ = _world([worker])
    checker.fleet.workers_of = lambda c: [worker] if c is consumer else []
    write(worker, consumer.worker_id, 1)
    checker.on_graceful_stop(consumer)
    if killed_at_landing:
        checker.zone.crashed.append((worker, "after-link"))  # its last flush: the world killed it mid-landing
    if paused_in_a_put:
        checker.zone.stalled.append((worker, "batch", 30.0, True, False))  # zombie-flush: paused inside a put
    checker.on_consumer_exit(consumer)
    return checker.violations


def test_a_worker_the_world_killed_at_a_landing_step_during_a_stop_is_no_release_violation():
    """java3 seeds 530, 765, 1307, 1425: a stopping worker's flush on the way out was a landing the world killed
    (landing-crash); the lease it could not release then was the world's doing, as a freeze's is."""
    assert _exit_after_a_stop_without_release(killed_at_landing=False)  # not released, not disturbed: caught
    assert _exit_after_a_stop_without_release(killed_at_landing=True) == []


WINDOW = 60_000
FIRST_WINDOW = 1_699_999_980_000


def _pipeline_of_an_empty_zone(name: str, *, overdue_ms: int) -> SimPipeline:
    """A simulated pipeline of 1-minute windows from FIRST_WINDOW over an empty in-memory zone."""
    return SimPipeline(store=MemoryZoneStore(f"zone-{name}", "landing"), output_name=f"output-{name}", table=None,
                       kinesis=None, stream="simstream", window_ms=WINDOW, first_window_ms=FIRST_WINDOW,
                       grace_ms=15_000, overdue_ms=overdue_ms)


def _commit(pipeline: SimPipeline, start: int, run: str, batches) -> None:
    """Window `start`'s commit by `run`, naming `batches`, in the pipeline's output."""
    pipeline.output.put(commit_key(start), WindowCommit(start, start + pipeline.window_ms, run, frozenset(batches),
                                                        {}).to_json())


def test_a_window_whose_commit_was_deleted_after_the_checkpoints_passed_it_is_rerun_when_the_faults_stop():
    """Seeds 819 and 1229 (10,000-seed run): the world deleted a window's commit after the checkpoints had passed
    the window. No checkpoint run waits on it and the sensor follows it no more (its commit had been there), so
    nothing but the shipped audit, which fails it, names it: the world's operator must re-run it, as a person
    does what the audit names, or the fleet never settles ('window ... is not committed')."""
    pipeline = _pipeline_of_an_empty_zone("h20", overdue_ms=300_000)
    lost, recommitted = FIRST_WINDOW, FIRST_WINDOW + WINDOW
    _commit(pipeline, recommitted, "run-2", set())
    pipeline.deleted = {lost, recommitted}
    pipeline.deleted_audits = [(lost, False), (recommitted, False)]  # the shipped audit failed both
    assert lost not in pipeline.outstanding  # the sensor forgot it once its commit was there
    pipeline.heal()
    assert pipeline.queue == [lost]  # re-run by hand; the window committed again since is left alone


def test_a_given_up_window_whose_commit_lacks_its_refilled_batches_is_rerun_when_the_faults_stop():
    """10,000-seed run, seed 8346 ("the fleet did not settle: shardId-000000000001's checkpoint TRIM_HORIZON is
    before its last landed record"): refills landed batches in a committed window, the sensor asked for it again
    (its commit must name them), and every run failed for good until the fix; the sensor gave up and named it
    stalled. Its old commit stayed, so the operator, who re-ran given-up windows without a commit only, never
    re-ran it, and the checkpoint plan rightly stayed before the refilled batches. The operator re-runs what the
    sensor waits for: a given-up window whose commit does not name every batch it needs."""
    pipeline = _pipeline_of_an_empty_zone("8346", overdue_ms=120_000)
    lacking, complete = FIRST_WINDOW, FIRST_WINDOW + WINDOW
    old, refilled = "simstream/old.parquet", "simstream/refilled.parquet"
    for start, named in ((lacking, {old}), (complete, {old, refilled})):
        _commit(pipeline, start, "run-1", named)
    given_up = Outstanding(3, "window-reopened", (refilled,), FIRST_WINDOW + 85_000, gave_up=True)
    pipeline.sensor_cursor = Cursor(next_window_ms=FIRST_WINDOW + 2 * WINDOW,
                                    outstanding={lacking: given_up, complete: given_up}).to_json()
    pipeline.heal()  # nothing fails for good any more: the person re-runs at once
    assert pipeline.queue == [lacking]  # the window whose commit names every batch it needs is done


def test_a_window_failing_for_good_is_fixed_within_half_the_retention_while_the_faults_go_on():
    """10,000-seed run, seed 2278 ("shardId-000000000001 left the stream (retention) with 13 records never
    delivered"): a window failed for good from t=158 s and held back its shard's end, so the children of the split
    at t=183 s could not be taken; the person fixed the cause only FIX_SECONDS after the faults stopped (t=430 s),
    and a child's first records left the stream (retention 257 s) before they were read. A person fixes a window
    failing for good within half the retention of its first failed run, faults or not, and re-runs what the sensor
    gave up on."""
    pipeline = _pipeline_of_an_empty_zone("2278", overdue_ms=120_000)
    pipeline.retention_ms, pipeline.period_ms = 257_000, 14_360
    failing = FIRST_WINDOW  # t=-20 s: the window ends at t=40 s and is overdue at t=160 s
    failed_at = FIRST_WINDOW + 178_000  # t=158 s
    pipeline.faults.fail_always.add(failing)
    pipeline.now_ms = failed_at
    pipeline._run(failing)
    assert pipeline.runs[failing] is RunState.FAILED and pipeline.fix_due_ms() == failed_at + 128_500
    pipeline.sensor_cursor = Cursor(next_window_ms=FIRST_WINDOW + WINDOW, outstanding={
        failing: Outstanding(3, "", (), None, gave_up=True)}).to_json()
    pipeline._fix_when_due(failed_at + 128_499)
    assert pipeline.failing_for_good() == {failing} and pipeline.queue == []
    pipeline._fix_when_due(failed_at + 128_500)
    assert pipeline.failing_for_good() == set() and pipeline.queue == [failing] and not pipeline.healed
    assert pipeline.fix_due_ms() is None


def test_a_window_failing_for_good_stays_failing_until_the_checker_can_judge_its_stall_report():
    """The fix within the retention comes no earlier than a tick past the checker's bound for the window's stall
    report, or a sensor that never names a stalled window (the `stall-unreported` mutation) would go unjudged."""
    pipeline = _pipeline_of_an_empty_zone("stall", overdue_ms=120_000)
    pipeline.retention_ms, pipeline.period_ms = 150_000, 14_360
    failing = FIRST_WINDOW
    pipeline.faults.fail_always.add(failing)
    pipeline.now_ms = FIRST_WINDOW + 80_000  # failed 20 s after its end: half the retention is 5 s before overdue
    pipeline._run(failing)
    assert pipeline.fix_due_ms() == FIRST_WINDOW + WINDOW + 120_000 + 2 * 14_360


def test_a_worker_the_world_paused_inside_a_put_during_a_stop_is_no_release_violation():
    """10,000-seed run, seed 2399: a zombie-flush pause held the worker inside its flush through its consumer's
    graceful stop; it could not release, as a frozen worker cannot."""
    assert _exit_after_a_stop_without_release(killed_at_landing=False, paused_in_a_put=True) == []


def _one_shard_zone(now: list[float]) -> tuple[SimStream, SimZone, list]:
    """A one-shard stream with 5 s of records on the clock `now`, its zone, and the shard's record positions."""
    stream = SimStream("simstream", random.Random(0), 1, lambda: now[0])
    stream.produce(5.0)
    return stream, SimZone(stream), stream.shards[KEY].positions


def _land(zone: SimZone, positions) -> str:
    """A batch of minute 0 over these record positions, stored in the zone (the ground truth told); its key."""
    key = BatchKey("simstream", KEY, 0, Checkpoint(*positions[0][1:]), Checkpoint(*positions[-1][1:])).key()
    zone.store.put(key, b"rows")
    zone.stored(key)
    return key


def test_a_batch_lost_after_its_windows_commit_was_deleted_is_no_checkpoint_violation():
    """10,000-seed run, seed 6811: the checkpoints passed a window while its commit stood; then the world deleted
    the commit, and lost one of the batches it had named. The loss was judged by the commits published at that
    moment (none), so the batch's records counted as owed by a committed window and the checkpoint 'passed a
    record in 0 committed windows'. A batch a deleted commit named is lost after a commit, as when the batch
    goes first; the shipped audit must fail the window, and the operator repairs it."""
    now = [10.0]
    stream, zone, positions = _one_shard_zone(now)
    batch = _land(zone, positions)
    pipeline = SimPipeline(store=zone.store, output_name="output-6811", table=None, kinesis=None,
                           stream="simstream", window_ms=60_000, first_window_ms=0, grace_ms=15_000,
                           overdue_ms=300_000)
    pipeline.output.put(commit_key(0), WindowCommit(0, 60_000, "run-1", frozenset({batch}), {}).to_json())
    pipeline.cursor = 60_000
    items = {KEY: lease_to_item(Lease(KEY, Checkpoint(*positions[-1][1:])))}  # the checkpoints passed the window
    checker = Checker(stream=stream, zone=zone, items=items, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    checker.on_pipeline_tick(pipeline)
    assert pipeline.delete_newest_commit() == 0
    pipeline.deleted_audits = [(0, False)]  # the audit's verdict on a batch written by hand is not the subject here
    checker.on_pipeline_tick(pipeline)
    checker.on_batch_lost(batch, pipeline)
    zone.lose(batch)
    checker.on_pipeline_tick(pipeline)
    assert checker.violations == []


def test_a_commit_deleted_before_its_window_ended_or_of_an_empty_window_owes_no_failed_audit():
    """Seeds 18 and 58 (`--faults zombie-flush,latest-start,landing-crash,reshard,refill,late-batch,deleted-commit,
    freeze-consumer,freeze-worker`): the operator's run after a refill committed a window before its end, and the
    world deleted that commit before the end too; seeds 33, 99 and 225: the deleted commit was an empty window's.
    The shipped audit's counts check fails a window with no commit once it is past its end (+ grace) with rows
    landed, as documented; before its end the window is "not transformed yet" (the sensor reports it after its
    end), and an empty window loses nothing. The oracle owed FAILED anyway ("window ...'s commit was deleted, and
    the shipped audit reports it OK"); it owes it where the audit promises it, judged at the world's time."""
    window_ms = 60_000
    store = MemoryZoneStore("zone-deleted-early", "landing")
    store.ensure_zone(create=True)
    records = [UserRecord(KEY, f"{100 + i}", 0, "pk", None, 1_000 + i, b"row", aggregated=False) for i in range(3)]
    batch = encode_batch("simstream", KEY, records, Checkpoint(TRIM_HORIZON))
    store.put(batch.key.key(), batch.body)
    pipeline = SimPipeline(store=store, output_name="output-deleted-early", table=None, kinesis=None,
                           stream="simstream", window_ms=window_ms, first_window_ms=0, grace_ms=15_000,
                           overdue_ms=300_000)
    pipeline.cursor = 2 * window_ms

    def commit(start, batches):
        _commit(pipeline, start, "run-1", batches)

    stream = SimStream("simstream", random.Random(0), 1, lambda: 10.0)
    checker = Checker(stream=stream, zone=SimZone(stream), items={}, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: 10.0, note=lambda text: None)
    commit(0, [batch.key.key()])
    commit(window_ms, [])
    assert pipeline.delete_newest_commit(now_ms=3 * window_ms) == window_ms  # an empty window, long ended
    assert pipeline.delete_newest_commit(now_ms=window_ms - 5_000) == 0  # its batch landed, the window still open
    checker.on_pipeline_tick(pipeline)
    assert checker.violations == []
    commit(0, [batch.key.key()])
    pipeline.now_ms = window_ms - 5_000  # the last tick's time, before the window's end: the world's time counts
    assert pipeline.delete_newest_commit(now_ms=window_ms + 1_000) == 0
    assert pipeline.deleted_audits == [(0, False)]  # owed and given: the audit fails it
    pipeline.deleted_audits = [(0, True)]
    checker.on_pipeline_tick(pipeline)
    assert checker.violations  # an audit reporting such a window OK is still caught


def test_an_empty_window_whose_commit_was_deleted_is_no_settling_violation():
    """Seed 391 (the fault subset of seeds 18 and 33): the world deleted an empty window's commit after the sensor had
    stopped following it. Nothing is owed (no batch, no checkpoint waits on it), the audit passes it and nothing runs
    it again; the fleet 'did not settle: window ... is not committed'. A deleted window that holds a batch still must
    be committed again."""
    now = [10.0]
    stream = SimStream("simstream", random.Random(0), 1, lambda: now[0])
    stream.produce(5.0)
    zone = SimZone(stream)
    positions = stream.shards[KEY].positions
    (_, first_seq, first_sub), (_, last_seq, last_sub) = positions[0], positions[-1]
    window_ms = 60_000
    batch = BatchKey("simstream", KEY, window_ms, Checkpoint(first_seq, first_sub), Checkpoint(last_seq, last_sub))
    zone.stored(batch.key())  # the second window holds a batch, the first none
    pipeline = SimPipeline(store=zone.store, output_name="output-391", table=None, kinesis=None, stream="simstream",
                           window_ms=window_ms, first_window_ms=0, grace_ms=15_000, overdue_ms=300_000)
    pipeline.cursor, pipeline.now_ms = 2 * window_ms, 2 * window_ms + 300_000
    pipeline.deleted = {0, window_ms}
    checker = Checker(stream=stream, zone=zone, items={}, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    assert checker.pipeline_settled(pipeline) == [f"window {window_ms} is not committed"]


def _refill_after_a_rerun_without_the_lost_batch(checkpoint_passed_it: bool) -> list[str]:
    """A window of two batches, committed by run 1; the world loses the first (after run 1 named it); run 2 (a re-run
    for late batches) commits the window without it; an operator's backfill lands it again before any run reads it;
    then a checkpoint run moves the checkpoint to the second batch's last record. `checkpoint_passed_it`: the
    checkpoint had passed the lost batch when it was refilled (else it had passed nothing)."""
    now = [10.0]
    stream, zone, positions = _one_shard_zone(now)
    assert len(positions) >= 2
    half = len(positions) // 2
    first, second = _land(zone, positions[:half]), _land(zone, positions[half:])
    pipeline = SimPipeline(store=zone.store, output_name="output-219", table=None, kinesis=None,
                           stream="simstream", window_ms=60_000, first_window_ms=0, grace_ms=15_000,
                           overdue_ms=300_000)
    pipeline.cursor = 60_000
    pipeline.output.put(commit_key(0), WindowCommit(0, 60_000, "run-1", frozenset({first, second}), {}).to_json())
    start = Checkpoint(*positions[half - 1][1:]) if checkpoint_passed_it else Checkpoint(TRIM_HORIZON)
    items = {KEY: lease_to_item(Lease(KEY, start))}
    checker = Checker(stream=stream, zone=zone, items=items, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    zone.on_land = checker.on_land
    checker.on_pipeline_tick(pipeline)
    checker.on_batch_lost(first, pipeline)
    zone.lose(first)
    pipeline.output.put(commit_key(0), WindowCommit(0, 60_000, "run-2", frozenset({second}), {}).to_json())
    checker.on_pipeline_tick(pipeline)
    _land(zone, positions[:half])  # the refill; no run has read it again
    items[KEY] = lease_to_item(Lease(KEY, Checkpoint(*positions[-1][1:])))
    checker.on_pipeline_tick(pipeline)
    return checker.violations


def test_a_batch_lost_after_its_commit_and_refilled_behind_the_checkpoint_is_no_violation_before_its_window_reruns():
    """Seed 219 (lost-batch, refill): the checkpoint passed a batch while run 1's commit named it; the world lost it,
    run 2 (a re-run for late batches) committed the window without it (exempt: lost after a commit), and a backfill
    left to the live side on another shard landed it again, re-running nothing. The exemption ended with the loss
    ('damaged'), so the checkpoint 'passed a record in 0 committed windows' until the window's next run read the
    batch. What the checkpoint had passed when the batch landed again stays the world's loss until then; a
    checkpoint that passes the refilled batch while no commit names it is still a violation."""
    assert _refill_after_a_rerun_without_the_lost_batch(checkpoint_passed_it=True) == []
    violations = _refill_after_a_rerun_without_the_lost_batch(checkpoint_passed_it=False)
    assert len(violations) == 1 and "which is in 0 committed windows" in violations[0]


def _refill_of_a_lost_batch(under_its_own_key: bool) -> list[str]:
    """A shard's batch lost, then its records landed again by a refill: under the lost batch's own key, or split
    in two batches (a refill whose first batch went through a start chain of its own, cut where its buffer
    flushed)."""
    now = [10.0]
    stream, zone, positions = _one_shard_zone(now)
    assert len(positions) >= 2
    half = len(positions) // 2
    lost = _land(zone, positions)
    checker = Checker(stream=stream, zone=zone, items={}, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    zone.lose(lost)
    parts = [positions] if under_its_own_key else [positions[:half], positions[half:]]
    for part in parts:
        _land(zone, part)
    checker.on_refilled(lost)
    return checker.violations


def test_a_refill_that_lands_a_lost_batchs_records_under_other_keys_is_a_violation():
    """Issue 20's unfenced refill (the mutation `unfenced-refill`): a refill whose first batch starts a chain of its
    own (`_start_sink` without `live_predecessor`) is cut where its buffer flushes, so the lost batch's records land
    under other keys while the live link after its predecessor still names the lost one: the chain is broken for
    ever with no record missing, and the audit's FAILED passed for damage the operator could not repair. A refill
    must land a lost batch exactly, under its own key."""
    assert _refill_of_a_lost_batch(under_its_own_key=True) == []
    violations = _refill_of_a_lost_batch(under_its_own_key=False)
    assert len(violations) == 1 and "under other keys" in violations[0]


def _relanded_with_claims(names_its_predecessor: bool) -> list[str]:
    """A shard's second batch lost and landed again under its own key: its footer naming its predecessor's
    position and key as the live writer's did, or the position alone while the zone holds that batch."""
    now = [10.0]
    stream, zone, positions = _one_shard_zone(now)
    records = [UserRecord(KEY, sequence, sub, "pk", None, 1_000, b"x") for _, sequence, sub in positions]
    half = len(records) // 2
    first = encode_batch("simstream", KEY, records[:half], Checkpoint(TRIM_HORIZON), batch_format="rows")
    second = encode_batch("simstream", KEY, records[half:], first.key.last, prev_key=first.key.key(),
                          batch_format="rows")
    for batch in (first, second):
        zone.store.put(batch.key.key(), batch.body)
        zone.stored(batch.key.key())
    checker = Checker(stream=stream, zone=zone, items={}, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    zone.on_relanded = checker.on_relanded
    zone.lose(second.key.key())
    again = encode_batch("simstream", KEY, records[half:], first.key.last,
                         prev_key=first.key.key() if names_its_predecessor else None, batch_format="rows")
    zone.store.put(again.key.key(), again.body)
    zone.stored(again.key.key())
    return checker.violations


def test_a_lost_batch_landed_again_naming_no_predecessor_the_zone_holds_is_a_violation():
    """Issue 29, item 6: a refill's sink whose first flush found a later batch of the minute (another writer's)
    took that batch for its tail and named no predecessor key, where the live writer named the batch before it.
    The chain is followed back by the footers' claims: a batch landed again must make the claims of the one it
    replaces."""
    assert _relanded_with_claims(names_its_predecessor=True) == []
    violations = _relanded_with_claims(names_its_predecessor=False)
    assert len(violations) == 1 and "naming predecessor key None" in violations[0]


def _window_committed_ahead_of_the_sensor(committed: bool) -> list[str]:
    """A shard's records in the second window; the sensor still waits on the first (its cursor there); a person's
    run after a refill committed the second window (or nothing did), and the checkpoint plan passed its records."""
    now = [10.0]
    stream, zone, positions = _one_shard_zone(now)
    window_ms = 60_000
    batch = BatchKey("simstream", KEY, window_ms, Checkpoint(*positions[0][1:]), Checkpoint(*positions[-1][1:])).key()
    zone.store.put(batch, b"rows")
    zone.stored(batch)
    pipeline = SimPipeline(store=zone.store, output_name=f"output-5722-{committed}", table=None, kinesis=None,
                           stream="simstream", window_ms=window_ms, first_window_ms=0, grace_ms=15_000,
                           overdue_ms=300_000)
    pipeline.now_ms = window_ms + 30_000
    if committed:
        pipeline.output.put(commit_key(window_ms), WindowCommit(window_ms, 2 * window_ms, "run-1", frozenset({batch}),
                                                                {}).to_json())
    items = {KEY: lease_to_item(Lease(KEY, Checkpoint(*positions[-1][1:])))}
    checker = Checker(stream=stream, zone=zone, items=items, foreign={}, fleet=Fleet([]), config=CONFIG,
                      liveness_slack=6.0, now=lambda: now[0], note=lambda text: None)
    checker.on_pipeline_tick(pipeline)
    return checker.violations


def test_a_window_committed_by_hand_ahead_of_the_sensors_cursor_counts_as_committed():
    """Seeds 2604, 5722 and 6043 of the 10,000-seed run: an operator's refill re-landed a batch and the person's run
    committed its window while the sensor still waited on an earlier window; the checkpoint plan passed the window's
    records, each in that one commit. The checker listed commits only up to the sensor's cursor and judged them
    'in 0 committed windows'. A checkpoint past records no commit names is still a violation."""
    assert _window_committed_ahead_of_the_sensor(committed=True) == []
    violations = _window_committed_ahead_of_the_sensor(committed=False)
    assert len(violations) == 1 and "which is in 0 committed windows" in violations[0]
