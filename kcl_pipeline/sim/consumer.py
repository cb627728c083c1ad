"""Our consumer in the world: the lease manager's and the workers' I/O shells, in virtual time.

These shells do what manager.py and worker.py do — the I/O — and nothing else: every decision is made by
the coroutines they drive (kcl/cycle.py's `manager_cycle` and `watch_for_expiry`, kcl/lease_life.py's
`lease_life` and `heartbeat_once`), over the real `LeaseTable` (its requests evaluated by the simulated
DynamoDB) and the real `ShardReader` (over the simulated Kinesis). Each I/O call runs at one instant
(its linearisation point, shortly after it is sent) and its answer arrives after the latency its client
accumulated (retries, back-off, timeouts included); a frozen process receives nothing until it thaws.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..kcl.config import ConsumerConfig
from ..kcl.core import cycle as cyc
from ..kcl.core import effects as fx
from ..kcl.core import lease_life as life
from ..kcl.core.balance import ThroughputMeter, reported_load
from ..kcl.core.lease_codec import encode_value
from ..kcl.core.lease_hold import LeaseHold, LeaseTiming, Outcome
from ..kcl.core.lease_rules import HANDOFF_ATTRIBUTE, check_heartbeat_attributes
from ..kcl.core.model import Lease
from ..kcl.processor import InitializationInput, ProcessRecordsInput
from ..kcl.shells.lease_table import LeaseTable
from ..kcl.shells.reader import ShardReader
from ..kcl.shells.shards import list_shards
from ..kcl.shells.worker import LEASE_TABLE_ATTEMPTS, lease_table_read_timeout
from .dynamodb import SimDynamoDBClient, retry_budget
from .engine import Host, Later, Lock, Scope, Task
from .kinesis import SimKinesisClient
from .landing import SimLandingProcessor

if TYPE_CHECKING:
    from .stage import Stage

def lease_table_client(world: "Stage", host: Host, config: ConsumerConfig, actor: Any) -> SimDynamoDBClient:
    """The simulated twin of worker.lease_table_client: same attempts and read timeout."""
    return SimDynamoDBClient(world.dynamodb, world.child_rng(), host.faults, actor=actor,
                             max_attempts=LEASE_TABLE_ATTEMPTS, read_timeout=lease_table_read_timeout(config))


_WRITES = frozenset({"acquire", "heartbeat", "checkpoint", "end", "release", "create", "delete", "handoff",
                     "finish-handoff", "cancel-handoff"})


class _Paced(Exception):
    """The reader asked to sleep before its next call (virtual time: the world waits instead)."""

    def __init__(self, seconds: float):
        self.seconds = seconds


def _raise_paced(seconds: float) -> None:
    raise _Paced(seconds)


class Process:
    """What a consumer's manager and workers share: the world, the host, a way to call the table."""

    world: "Stage"
    host: Host
    scope: Scope

    def io(self, client: SimDynamoDBClient | SimKinesisClient, call: Callable[[], Any], what: str,
           actor: Any, finish: Callable[[Any, BaseException | None], Any] | None = None) -> Later:
        """One I/O call: it reaches the service shortly after it is sent (and runs there at one instant, even
        if the sender freezes or dies meanwhile); its answer comes back after the latency its client
        accumulated. `finish(value, error)` turns the outcome into the effect's answer when it arrives."""
        world = self.world
        outbound = world.rng.random() * 0.004 * self.host.faults.slow

        def execute():
            client.elapsed = 0.0
            applied = getattr(client, "applied_writes", 0)
            try:
                value, error = call(), None
            except Exception as exc:
                value, error = None, exc
            if error is None and what in _WRITES and getattr(client, "applied_writes", 0) > applied \
                    and (value is False or value is None):
                world.checker.violation(
                    f"{actor}: {what} was applied by DynamoDB but reported as not applied (an ambiguous outcome "
                    f"read as a lost race)")
            elapsed = client.elapsed

            def answer():
                if finish is not None:
                    return finish(value, error)
                if error is not None:
                    raise error
                return value
            return Later(elapsed, answer)
        return Later(outbound, execute, network=True)


class SimWorker(Process):
    """One lease worker process (worker.py's shell)."""

    def __init__(self, consumer: "SimConsumer", observed: Lease, stolen: bool, handoff: bool = False):
        self.consumer = consumer
        self.world = world = consumer.world
        self.host = consumer.host
        self.config = consumer.config
        self.key = observed.lease_key
        self.observed = observed
        self.serial = world.next_serial()
        self.scope = Scope(f"worker {self.serial}", consumer.group)
        self.timing = LeaseTiming(self.config.lease_expiry_seconds, self.config.validity_margin)
        self.settings = life.LifeSettings(self.timing, self.config.initial_position.checkpoint(),
                                          self.config.heartbeat_seconds, self.config.parent_drained_attribute, stolen,
                                          observed.lease_owner if handoff else None)
        self.client = lease_table_client(world, self.host, self.config, self)
        self.table = LeaseTable(self.config.lease_table, self.client)
        self.kinesis = SimKinesisClient(world.stream, world.child_rng(), world.scenario.kinesis_throttle)
        self.processor = SimLandingProcessor(world.store, flush_records=world.scenario.flush_records,
                                             pipeline_commits=world.scenario.pipeline_period is not None)
        self.hold: LeaseHold | None = None
        self.lock = Lock()
        self.reader: ShardReader | None = None
        self.pending = None
        self.checkpointed = None
        self.shard_end_reached = False
        self.end_requested = False
        self.stop = False
        self.finished = False
        self.throughput = ThroughputMeter(smoothed=reported_load(observed))  # worker.py's
        self.inflight_sent_true = 0.0   # true time the fenced write in flight was sent (ground truth)
        self.applied_sent_true = None   # ... of its last write the table applied
        self.checkpointer = _Checkpointer(self)

    def __repr__(self) -> str:
        return f"worker {self.serial} ({self.consumer.worker_id}, {self.key})"

    @property
    def worker_id(self) -> str:
        return self.consumer.worker_id

    def working(self) -> bool:
        """Alive, not frozen, and holding its lease as far as it knows (ground truth for the checker)."""
        return (not self.finished and self.scope.alive() and self.scope.thaw_time() <= self.world.now
                and self.hold is not None and self.hold.lost is None and not self.hold.ended)

    def start(self, delay: float) -> None:
        Task(self.world, self.scope, life.lease_life(self.observed, self.settings, self.worker_id), self.handle,
             lock=self.lock,
             on_done=self._done, name=f"{self!r}").start(delay)

    def _done(self, result: life.LifeResult) -> None:
        self.finished = True
        self.world.note(f"{self!r}: {result.outcome} {result.detail}")
        self.world.stats[f"worker {result.outcome}"] += 1
        self.consumer.worker_finished(self, result)

    def kill(self) -> None:
        """SIGKILL from its manager: no more events, nothing released."""
        self.scope.dead = True
        self.finished = True

    def stopping(self) -> bool:
        if not self.consumer.manager_scope.alive() and not self.stop:
            self.stop = True  # the parent died: the worker notices (os.getppid()) and stops gracefully
        return self.stop

    def local(self) -> float:
        return self.host.monotonic()

    # -- the effects (worker.py's handlers, in virtual time) ---------------------------------------------
    def handle(self, task: Task, effect: Any) -> Any:
        return self.HANDLERS[type(effect)](self, effect)

    def _acquire(self, effect):
        sent, observed = self.local(), effect.observed or self.observed

        def finish(lease, error):
            if error is not None:
                raise error
            if lease is not None:
                self.hold = LeaseHold.acquired(lease, sent, self.timing)
                self.world.note(f"{self!r}: acquired (counter {lease.lease_counter}, previous {observed.lease_owner})")
            return lease
        self.inflight_sent_true = self.world.now
        return self.io(self.client, lambda: self.table.acquire(self.key, self.worker_id, observed.lease_owner,
                                                               observed.lease_counter, claim=f"w{self.serial}"),
                       "acquire", self, finish)

    def _initiate_handoff(self, effect):
        observed = self.observed

        def finish(asked, error):
            if error is not None:
                raise error
            if asked is not None:
                self.world.note(f"{self!r}: asked {observed.lease_owner} for a hand-off")
            return asked
        self.inflight_sent_true = self.world.now
        return self.io(self.client, lambda: self.table.initiate_handoff(
            self.key, self.worker_id, observed.lease_owner, observed.lease_counter, f"w{self.serial}"),
            "handoff", self, finish)

    def _finish_handoff(self, effect):
        counter = self.hold.counter
        return self.io(self.client, lambda: self.table.finish_handoff(self.key, self.worker_id, counter,
                                                                      effect.checkpoint), "finish-handoff", self)

    def _cancel_handoff(self, effect):
        asked = effect.asked
        return self.io(self.client, lambda: self.table.cancel_handoff(
            self.key, self.worker_id, asked.extra.get(HANDOFF_ATTRIBUTE), asked.lease_counter, f"w{self.serial}"),
            "cancel-handoff", self)

    def _release_observed(self, effect):
        counter = effect.lease.lease_counter
        return self.io(self.client, lambda: self.table.release(self.key, self.worker_id, counter), "release", self)

    def _now(self, effect):
        return self.local()

    def _stopping(self, effect):
        return self.stopping()

    def _read_leases(self, effect):
        return self.io(self.client, lambda: {k: self.table.get(k) for k in effect.keys}, "get", self)

    def _get_lease(self, effect):
        return self.io(self.client, lambda: self.table.get(self.key), "get", self)

    def _check(self, effect):
        now = self.local()
        self.hold = self.hold.held(now)
        return fx.Status(now, self.hold, self.stopping())

    def _wait(self, effect):
        return Later(self.host.true_delay(effect.seconds), lambda: None)

    def _wait_for_change(self, effect):
        return Later(self.host.true_delay(effect.seconds), lambda: self.hold.lost is not None)

    def _start_heartbeats(self, effect):
        self._schedule_heartbeat()

    def _schedule_heartbeat(self) -> None:
        period = self.config.heartbeat_seconds * self.consumer.heartbeat_slowness

        def tick():
            if self.finished or not life.heartbeats_continue(self.hold):
                return
            Task(self.world, self.scope, life.heartbeat_once(), self.handle, lock=self.lock,
                 on_done=lambda _: self._after_heartbeat(), name=f"{self!r} heartbeat").start()
        self.world.schedule(self.host.true_delay(period), tick, self.scope)

    def _after_heartbeat(self) -> None:
        if not self.finished and life.heartbeats_continue(self.hold):
            self._schedule_heartbeat()

    def _begin(self, effect):
        lease = effect.lease
        self.processor.initialize(InitializationInput(self.key, self.worker_id, lease.checkpoint,
                                                      lease.child_shard_ids, dict(lease.extra)))
        start = life.start_position(lease.checkpoint, self.processor.resume_position())
        c = self.config
        self.reader = ShardReader(self.kinesis, c.stream, self.key, start, polling_interval=c.polling_interval_seconds,
                                  idle_interval=c.idle_interval_seconds, max_records=c.max_records_per_call,
                                  sleep=_raise_paced, monotonic=self.local, clock=self.host.wall,
                                  rng=self.world.child_rng())

    def _poll(self, effect):
        def attempt():
            self.kinesis.elapsed = 0.0
            try:
                batch = self.reader.poll()
            except _Paced as paced:
                return Later(self.host.true_delay(paced.seconds) + 1e-6, attempt)
            return Later(self.kinesis.elapsed, lambda: batch)
        return Later(0.0, attempt)

    def _deliver(self, effect):
        batch = effect.batch
        self.throughput.add(batch.bytes)
        if batch.records:
            self.world.checker.on_deliver(self, self.key, batch.records)
        if batch.shard_ended:
            self.shard_end_reached = True
        self.processor.process_records(ProcessRecordsInput(batch.records, batch.millis_behind_latest,
                                                           self.checkpointer, batch.service_time_ms))

    def _shard_ended(self, effect):
        self.end_requested = False
        self.processor.shard_ended(self.checkpointer)
        return self.end_requested

    def _notify(self, effect):
        if effect.event is fx.Notification.LEASE_LOST:
            self.processor.lease_lost()
        else:
            self.processor.shutdown_requested(self.checkpointer)

    def _fenced(self, what: str, write: Callable[[int], bool], after: Callable[[LeaseHold, Outcome, float], LeaseHold],
                refused_if_lost: bool = True, quiet: bool = False):
        """A fenced write through the hold (worker.py's _HeldLease): conditioned on the counter the hold has,
        the hold moved on by the outcome. `quiet`: a failure reads as not applied, the hold unchanged."""
        if refused_if_lost and not life.may_write(self.hold, self.local()):
            self.hold = self.hold.held(self.local())
            return Outcome.REFUSED
        sent, counter = self.local(), self.hold.counter
        self.inflight_sent_true = self.world.now

        def finish(applied, error):
            if error is not None:
                if quiet:
                    return False
                self.hold = after(self.hold, Outcome.ERROR, sent)
                raise error
            outcome = Outcome.APPLIED if applied else Outcome.REFUSED
            self.hold = after(self.hold, outcome, sent)
            return applied if quiet else outcome
        return self.io(self.client, lambda: write(counter), what, self, finish)

    def _renew(self, effect):
        key, me, attributes, cp = self.key, self.worker_id, effect.attributes, effect.checkpoint
        kbps = self.throughput.take(self.local()) if self.world.scenario.report_throughput else None
        return self._fenced("heartbeat", lambda c: self.table.heartbeat(key, me, c, attributes, checkpoint=cp,
                                                                        throughput_kbps=kbps),
                            lambda hold, outcome, sent: life.renewed(hold, outcome, sent, self.timing, self.local()))

    def _end(self, effect):
        return self._fenced("end", lambda c: self.table.end(self.key, self.worker_id, c),
                            lambda hold, outcome, sent: life.finished_end(hold, outcome)
                            if outcome is not Outcome.ERROR else hold)

    def _release(self, effect):
        if self.hold is None:
            return False
        return self._fenced("release", lambda c: self.table.release(self.key, self.worker_id, c, effect.unsettled),
                            lambda hold, outcome, sent: life.finished_release(hold, outcome),
                            refused_if_lost=False, quiet=True)

    def _reinstate(self, effect):
        hold = life.reinstated(self.hold, effect.current)
        if hold is not None:
            self.hold = hold
        return hold is not None

    def _mark_ended(self, effect):
        self.hold = self.hold.ended_by_pipeline()

    def _ownerless(self, effect):
        return self.io(self.client, lambda: self.table.checkpoint(
            self.key, effect.checkpoint, unless_held_by_another=self.worker_id), "checkpoint", self)

    def _checkpointed(self, effect):
        self.checkpointed = effect.checkpoint

    def _take_pending(self, effect):
        cp, self.pending = self.pending, None
        return cp

    def _restore_pending(self, effect):
        if effect.checkpoint is not None and self.pending is None:
            self.pending = effect.checkpoint

    def _attributes(self, effect):
        try:
            attrs = self.processor.heartbeat_attributes()
            if attrs:
                check_heartbeat_attributes(attrs)
                for value in attrs.values():
                    encode_value(value)
            return attrs
        except Exception:
            self.world.stats["heartbeat attribute errors"] += 1
            return None

    def _list_shards(self, effect):
        return self.io(self.kinesis, lambda: list_shards(self.kinesis, self.config.stream), "list", self)

    def _scan(self, effect):
        sent = self.local()

        def finish(leases, error):
            if error is not None:
                raise error
            return fx.Scanned(leases, sent, self.local())
        return self.io(self.client, self.table.scan, "scan", self, finish)

    def _create(self, effect):
        return self.io(self.client, lambda: self.table.create(effect.lease), "create", self)

    HANDLERS: dict[type, Callable] = {}  # every LifeEffect but Locked, which the engine's Task runs itself


def _counter(name: str):
    def handler(self, effect):
        self.world.stats[name] += 1
    return handler


SimWorker.HANDLERS = {
    fx.Acquire: SimWorker._acquire, fx.ReadLeases: SimWorker._read_leases, fx.GetLease: SimWorker._get_lease,
    fx.Check: SimWorker._check, fx.Wait: SimWorker._wait, fx.WaitForChange: SimWorker._wait_for_change,
    fx.StartHeartbeats: SimWorker._start_heartbeats, fx.Begin: SimWorker._begin, fx.Poll: SimWorker._poll,
    fx.Deliver: SimWorker._deliver, fx.ShardEnded: SimWorker._shard_ended, fx.Notify: SimWorker._notify,
    fx.Renew: SimWorker._renew, fx.End: SimWorker._end, fx.Release: SimWorker._release,
    fx.Reinstate: SimWorker._reinstate, fx.MarkEnded: SimWorker._mark_ended,
    fx.OwnerlessCheckpoint: SimWorker._ownerless, fx.Checkpointed: SimWorker._checkpointed,
    fx.TakePending: SimWorker._take_pending, fx.RestorePending: SimWorker._restore_pending,
    fx.Attributes: SimWorker._attributes, fx.AttributesRejected: _counter("heartbeat attributes rejected"),
    fx.HeartbeatFailed: _counter("heartbeat errors"), fx.ListShards: SimWorker._list_shards,
    fx.ScanTable: SimWorker._scan, fx.Create: SimWorker._create, fx.InitiateHandoff: SimWorker._initiate_handoff,
    fx.FinishHandoff: SimWorker._finish_handoff, fx.Now: SimWorker._now, fx.Stopping: SimWorker._stopping,
    fx.CancelHandoff: SimWorker._cancel_handoff, fx.ReleaseObserved: SimWorker._release_observed,
}


class _Checkpointer:
    """worker.py's checkpointer, as the landing processor uses it (checkpoints ride on heartbeats)."""

    def __init__(self, worker: SimWorker):
        self.worker = worker

    def checkpoint(self, sequence_number=None, sub_sequence_number=0) -> bool:
        raise NotImplementedError("the simulated processor checkpoints on heartbeats only")

    def checkpoint_at_next_heartbeat(self, sequence_number=None, sub_sequence_number=0) -> None:
        from ..kcl.core.model import Checkpoint
        self.worker.pending = Checkpoint(sequence_number, sub_sequence_number)

    def end_shard(self) -> None:
        if not self.worker.shard_end_reached:
            raise RuntimeError("end_shard() is only valid once every record of the shard was delivered")
        self.worker.end_requested = True


class SimConsumer(Process):
    """One consumer process (manager.py's shell): its manager cycles, its workers, its lifecycle."""

    def __init__(self, world: "Stage", host: Host, worker_id: str, config: ConsumerConfig, name: str):
        self.world = world
        self.host = host
        self.worker_id = worker_id
        self.config = config
        self.name = name
        self.group = Scope(f"{name} group")
        self.manager_scope = Scope(f"{name} manager", self.group)
        self.scope = self.manager_scope
        self.settings = cyc.CycleSettings.of(config)
        self.state = cyc.ManagerState()
        self.rng = world.child_rng()
        self.client = lease_table_client(world, host, config, self)
        # Small scan pages stand for a big table: a scan is many requests, each with its latency.
        self.table = LeaseTable(config.lease_table, self.client, scan_page_size=world.scenario.scan_page_items)
        self.kinesis = SimKinesisClient(world.stream, world.child_rng())
        self.workers: dict[str, SimWorker] = {}
        self.results: list[tuple[str, str]] = []
        self.cycling = False
        self.token = 0
        self.stopping = False
        self.cycles = 0
        self.heartbeat_slowness = 1.0  # a fault: heartbeat timers firing late (a starved process)
        self.cycle_now = 0.0           # the manager's clock when its current cycle started

    def __repr__(self) -> str:
        return f"consumer {self.name} ({self.worker_id})"

    def alive(self) -> bool:
        return self.group.alive() and self.manager_scope.alive()

    def able(self) -> bool:
        """Could take over a lease now: alive, not frozen, not stopping, and reaching DynamoDB normally for
        long enough that no call caught by an earlier fault is still retrying."""
        faults, now = self.host.faults, self.world.now
        return (self.alive() and not self.stopping and self.group.thaw_time() <= now
                and self.manager_scope.thaw_time() <= now and faults.healthy()
                and now - faults.healthy_since >= retry_budget(self.client.max_attempts, self.client.read_timeout,
                                                                faults.connect_timeout))

    def start(self, delay: float = 0.0) -> None:
        self.world.schedule(delay, self._run_cycle_now, self.manager_scope)

    # -- the manager loop (run_forever / _wait_next_cycle) --------------------------------------------------
    def _run_cycle_now(self) -> None:
        if self.cycling or self.stopping or not self.alive():
            return
        self.cycling = True
        self.token += 1
        cyc.note_results(self.state, self.results)
        self.results = []
        Task(self.world, self.manager_scope,
             cyc.manager_cycle(self.state, self.settings, frozenset(self.workers), self.rng), self.handle,
             on_done=self._cycle_done, on_error=self._cycle_failed, name=f"{self!r} cycle").resume(None, None)

    def _cycle_done(self, result: cyc.CycleResult) -> None:
        self.cycles += 1
        self.world.stats["cycles"] += 1
        if result.created:
            self.world.stats["leases created by a manager"] += len(result.created)
        if result.deleted:
            self.world.stats["leases deleted"] += len(result.deleted)
        if result.stolen:
            self.world.stats["steals"] += 1
            self.world.steal_times.append(self.world.now)
        self._wait_next_cycle()

    def _cycle_failed(self, error: BaseException) -> None:
        self.world.stats["failed cycles"] += 1
        self.world.note(f"{self!r}: cycle failed: {type(error).__name__}: {error}")
        self._wait_next_cycle()

    def _wait_next_cycle(self) -> None:
        self.cycling = False
        token = self.token
        self.world.schedule(self.host.true_delay(self.config.cycle_seconds),
                            lambda: token == self.token and self._run_cycle_now(), self.manager_scope)
        self._schedule_watch(token)

    def _schedule_watch(self, token: int) -> None:
        def watch():
            if token != self.token or self.cycling or self.stopping:
                return
            Task(self.world, self.manager_scope, cyc.watch_for_expiry(self.state, self.settings, frozenset(self.workers)),
                 self.handle, on_done=lambda expired: self._after_watch(token, expired),
                 name=f"{self!r} watch").resume(None, None)
        self.world.schedule(self.host.true_delay(cyc.watch_interval(self.settings)), watch, self.manager_scope)

    def _after_watch(self, token: int, expired: bool) -> None:
        if token != self.token or self.cycling:
            return
        if expired:
            self._run_cycle_now()
        else:
            self._schedule_watch(token)

    def worker_finished(self, worker: SimWorker, result: life.LifeResult) -> None:
        if self.workers.get(worker.key) is worker:
            del self.workers[worker.key]
        self.results.append((result.lease_key, result.outcome))
        if self.stopping and not self.workers:
            self.group.dead = True  # every worker is done: the process exits
            self.world.note(f"{self!r}: stopped")
        elif cyc.wakes_manager(result.outcome) and self.alive():
            self.world.schedule(0.0, self._run_cycle_now, self.manager_scope)

    # -- lifecycle faults -----------------------------------------------------------------------------------
    def graceful_stop(self) -> None:
        """SIGTERM: stop cycling; every worker stops gracefully (flush, release); then the process exits."""
        self.stopping = True
        self.token += 1
        for worker in self.workers.values():
            worker.stop = True
        if not self.workers:
            self.group.dead = True

    def kill(self, whole_group: bool) -> None:
        """SIGKILL of the process group, or of the manager alone (its workers notice and stop gracefully)."""
        (self.group if whole_group else self.manager_scope).dead = True

    # -- the manager's effects (manager.py's handlers) ----------------------------------------------------------
    def handle(self, task: Task, effect: Any) -> Any:
        handler = self.HANDLERS.get(type(effect))
        if handler is None:
            raise TypeError(f"the simulated manager cannot handle {effect!r}")
        return handler(self, effect)

    def _now(self, effect):
        self.cycle_now = self.host.monotonic()
        return self.cycle_now

    def _scan(self, effect):
        sent = self.host.monotonic()
        return self.io(self.client, self.table.scan, "scan", self,
                       lambda leases, error: self._scanned(leases, error, sent))

    def _list_shards(self, effect):
        return self.io(self.kinesis, lambda: list_shards(self.kinesis, self.config.stream), "list", self)

    def _delete(self, effect):
        lease = effect.lease
        return self.io(self.client, lambda: self.table.delete(lease.lease_key, lease.lease_counter), "delete", self)

    def _create(self, effect):
        return self.io(self.client, lambda: self.table.create(effect.lease), "create", self)

    def _spawn_effect(self, effect):
        self._spawn(effect.lease, effect.stolen, effect.handoff)

    def _duplicate_worker_id(self, effect):
        self.world.stats["duplicate worker id detected"] += 1

    def _abandon(self, effect):
        worker = self.workers.pop(effect.lease.lease_key, None)
        if worker is not None:
            worker.kill()
            self.world.stats["stuck workers killed"] += 1
            self.world.note(f"{self!r}: killed {worker!r}: its lease was not renewed within the expiry")

    # The worker metrics table, as the world's dict (worker id → last update, on the true clock: hosts'
    # wall clocks are NTP-synced; their drift is the monotonic one). A partitioned host reaches neither.
    def _publish_worker_metrics(self, effect):
        if not self.host.faults.partitioned:
            self.world.worker_metrics[self.worker_id] = self.world.now
            self.world.stats["worker metrics published"] += 1

    def _read_worker_metrics(self, effect):
        if self.host.faults.partitioned:
            return None
        return fx.PeerMetrics(dict(self.world.worker_metrics), self.world.now)

    HANDLERS: dict[type, Callable] = {
        fx.Now: _now, fx.ScanTable: _scan, fx.ListShards: _list_shards, fx.Delete: _delete, fx.Create: _create,
        fx.Spawn: _spawn_effect, fx.DuplicateWorkerId: _duplicate_worker_id, fx.Abandon: _abandon,
        fx.PublishWorkerMetrics: _publish_worker_metrics, fx.ReadWorkerMetrics: _read_worker_metrics,
    }

    def _scanned(self, leases, error, sent):
        if error is not None:
            raise error
        if self.table.scan_page_size and self.world.rng.random() < 0.5:
            # A scan of many pages reads its items over its whole duration, the last page just before it
            # returns: half the time the sim linearises it there instead of at its first page.
            leases = LeaseTable(self.table.table_name, self.world.reader, scan_page_size=None).scan()
        if self.world.ages_stamped_at_cycle_start:  # a mutation: the defect the manager once had
            return fx.Scanned(leases, sent, self.cycle_now if self.cycling else sent)
        return fx.Scanned(leases, sent, self.host.monotonic())

    def _spawn(self, lease: Lease, stolen: bool, handoff: bool = False) -> None:
        worker = SimWorker(self, lease, stolen, handoff)
        self.workers[lease.lease_key] = worker
        self.world.workers.append(worker)
        how = " (hand-off)" if handoff else " (steal)" if stolen else ""
        self.world.note(f"{self!r}: spawn {worker!r}{how}")
        worker.start(self.world.rng.uniform(0.2, 1.0))  # a spawned process takes a moment to start


__all__ = ["SimConsumer", "SimWorker"]
