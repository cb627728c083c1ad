"""Our consumer in the world: the processes that run the shipped shells, in virtual time.

A `SimConsumer` is one consumer process. It runs the shipped `LeaseManager` (kcl/shells/fleet/manager.py) — its
effect handlers, its cycles and the waits between them, its reaping, spawning, keep-alive and shutdown —
as an engine task: `LeaseManager.consume`, what `kcl-pipeline consume` runs. A `SimWorkerProcess` is one
lease worker process: it runs the shipped `LeaseWorker` (kcl/shells/workers/worker.py) — every handler of a lease's
life, its fenced writes through `HeldLease`, its heartbeat, its checkpointer, its stop conditions — as
engine tasks. Nothing here decides anything or answers an effect: both are the shells' *transports*
(kcl/shells/transport.py), and answer only the transport's steps, in virtual time:

* `Call`: the request reaches the service shortly after it is sent (and runs there at one instant, even if
  the sender freezes or dies meanwhile, unless an attempt times out and is applied late); its answer comes
  back after the latency its client accumulated (retries, back-off, timeouts included); a frozen process
  receives nothing until it thaws. The clients are the simulated DynamoDB's and Kinesis'.
* `Sleep`, `AwaitLoss`, `NextResult`, `Join`: waits on the host's drifting clock, woken early by a stop, a
  changed hold, a worker's result or its exit.
* `Exclusive`, `Background`: the engine's lock and tasks.

Between a shell's steps the world may pause a process as a garbage collector or a busy host would
(`Pauses`): before a delivery (processing that the last validity check did not see), before a check, and
in the heartbeat.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Callable

from ...kcl.config import ConsumerConfig
from ...kcl.core.lease import effects as fx
from ...kcl.core.lease.lease_hold import LeaseTiming
from ...kcl.core.model import Checkpoint
from ...kcl.records.kpl import KplStats
from ...kcl.shells.fleet.manager import LeaseManager
from ...kcl.shells.lease_table import LeaseTable
from ...kcl.shells.metrics import Metrics
from ...kcl.shells.read.reader import ShardReader
from ...kcl.shells.transport import (
    KINESIS,
    AwaitLoss,
    Background,
    Call,
    Join,
    NextResult,
    Sleep,
    StartProcess,
    Step,
)
from ...kcl.shells.workers.worker import LEASE_TABLE_ATTEMPTS, LeaseWorker, WorkerResult, lease_table_read_timeout
from ...kcl.shells.workers.worker_processes import HeapTrimmer
from ...zone.sink import LandingProcessor
from ..aws.dynamodb import SimDynamoDBClient, retry_budget
from ..aws.kinesis import SimKinesisClient
from ..aws.landing import SimCrash
from ..runtime.engine import Host, Later, Lock, Scope, Task, Waiters
from ..runtime.pauses import InsideCall

if TYPE_CHECKING:
    from .stage import Stage


def lease_table_client(world: "Stage", host: Host, config: ConsumerConfig, actor: Any) -> SimDynamoDBClient:
    """The simulated twin of worker.lease_table_client: same attempts and read timeout."""
    return SimDynamoDBClient(world.dynamodb, world.child_rng(), host.faults, actor=actor,
                             max_attempts=LEASE_TABLE_ATTEMPTS, read_timeout=lease_table_read_timeout(config),
                             now=lambda: world.now, later=world.apply_later)


# `mixed-batch-sizes`: each worker process cuts batches at the old or the new size of a rolling change. Two
# sizes below one poll (10 records) and apart by more than one batch of the smaller: a writer's batch then
# reaches past another's cut, and a poll can end inside it with records left over from the cut.
ROLLING_BATCH_SIZES = (3, 8)
# `short-reads`, aimed: how many reads of a lease's new holder come back short once its start thawed a zombie.
SHORT_READS_AFTER_A_ZOMBIE = 3

# What a write is called in the shells' `Call` steps: a write the table applied must never be reported as
# not applied (an ambiguous outcome read as a lost race).
WRITES = frozenset({"acquire", "heartbeat", "checkpoint", "end", "release", "create", "delete", "initiate-handoff",
                    "finish-handoff", "cancel-handoff"})


class Paced(Exception):
    """The reader asked to sleep before its next call (virtual time: the world waits instead)."""

    def __init__(self, seconds: float):
        self.seconds = seconds


def _raise_paced(seconds: float) -> None:
    raise Paced(seconds)


class SimStop:
    """A process's stop event (threading.Event's part the shells use): setting it wakes its waiters."""

    def __init__(self, world: "Stage"):
        self.world = world
        self._set = False
        self.waiters: list[Waiters] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for waiters in self.waiters:
                waiters.wake(self.world)


class _NoGuard:
    """The hold's guard in one thread: nothing to exclude (writes are ordered by `Exclusive`)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_GUARD = _NoGuard()


class _Silent:
    """A throughput meter that reports nothing (a fleet without throughput reports: Java's count balance)."""

    def add(self, delivered_bytes: int) -> None:
        pass

    def take(self, now: float) -> None:
        return None

    def continue_from(self, report: float | None) -> None:
        pass


class Process:
    """What a consumer's manager and its workers share: the world, the host, and the transport's steps."""

    world: "Stage"
    host: Host
    scope: Scope
    client: SimDynamoDBClient
    kinesis: SimKinesisClient
    table: LeaseTable
    stop: SimStop
    driver: str  # "worker" or "manager": the coverage's name for who answered an effect

    def monotonic(self) -> float:
        return self.host.monotonic()

    def wall(self) -> float:
        return self.host.wall()

    def run(self, coroutine: Any) -> Any:
        raise NotImplementedError("a simulated process runs its steps as engine tasks, never synchronously "
                                  "(the simulated processor checkpoints on heartbeats only)")

    # -- the engine task's handler: effects go to the shell, steps are answered here ------------------------
    def answer(self, task: Task, item: Any) -> Any:
        if isinstance(item, Step):
            return self.step(task, item)
        self.world.effects_handled[(self.driver, type(item).__name__)] += 1
        return self.effect(task, item)

    def effect(self, task: Task, effect: Any) -> Any:
        raise NotImplementedError

    def step(self, task: Task, step: Step) -> Any:
        match step:
            case Call():
                return self.call(step)
            case Sleep():
                return Later(self.host.true_delay(step.seconds) + self.sleep_extra(task, step.seconds),
                             self.stop.is_set, waiters=self.stop_waiters)
            case Background():
                return self.background(task, step)
            case Join():
                if not handle_alive(step.handle):
                    return None
                return Later(self.host.true_delay(step.seconds), lambda: None, waiters=step.handle.exited)
            case AwaitLoss():
                if step.lost():
                    return None
                return Later(self.host.true_delay(step.seconds), lambda: None, waiters=self.hold_waiters,
                             counted=False)
            case NextResult():
                return self.next_result(step)
            case StartProcess():
                # Starting a process blocks its caller (the world's slow spawns: a busy host, a worker server
                # starting): what the caller reads on its clock afterwards is that much later.
                if not self.world.scenario.spawn_seconds:
                    return step.start()
                return Later(self.host.true_delay(self.world.scenario.spawn_seconds), step.start)
        raise TypeError(f"no transport step {step!r}")

    stop_waiters: Waiters
    hold_waiters: Waiters

    def sleep_extra(self, task: Task, seconds: float) -> float:
        return 0.0

    def background(self, task: Task, step: Background) -> Any:
        raise TypeError(f"{self!r} starts no concurrent activity")

    def next_result(self, step: NextResult) -> Any:
        raise TypeError(f"{self!r} has no worker results")

    def call(self, step: Call) -> Later:
        """One request: it reaches the service shortly after it is sent (and runs there at one instant, even if
        the sender freezes or dies meanwhile); its answer comes back after the latency its client
        accumulated. The reader's pacing sleeps first, in the process."""
        world = self.world
        kinesis = step.service == KINESIS
        client: Any = self.kinesis if kinesis else self.client
        sent = world.now
        outbound = world.rng.random() * 0.004 * self.host.faults.slow
        what = step.what

        def execute() -> Any:
            client.elapsed = 0.0
            applied = 0 if kinesis else client.applied_writes
            if not kinesis:
                client.sent_at = sent
            try:
                value, error = step.request(), None
            except Paced as paced:
                # The reader sleeps before it sends: in the process, which may freeze meanwhile.
                return Later(self.host.true_delay(paced.seconds) + 1e-6, lambda: self.call(step))
            except Exception as exc:
                value, error = None, exc
            finally:
                if not kinesis:
                    client.sent_at = None
            if (error is None and what in WRITES and not kinesis and client.applied_writes > applied
                    and (value is False or value is None)):
                world.checker.violation(
                    f"{self!r}: {what} was applied by DynamoDB but reported as not applied (an ambiguous outcome "
                    f"read as a lost race)")
            elapsed = client.elapsed

            def answer() -> Any:
                if error is not None:
                    raise error
                if what == "scan" and self.table.scan_page_size and world.rng.random() < 0.5:
                    # A scan of many pages reads its items over its whole duration, the last page just before
                    # it returns: half the time it is linearised there instead of at its first page.
                    return LeaseTable(self.table.table_name, world.reader, scan_page_size=None).scan()
                return value
            return Later(elapsed, answer)
        return Later(outbound, execute, network=True)


def handle_alive(handle: Any) -> bool:
    """A joined activity (a Task) or process (SimWorkerProcess) still running."""
    if isinstance(handle, Task):
        return not handle.finished and handle.scope.alive()
    return bool(handle.is_alive())


class SimWorkerProcess(Process):
    """One lease worker process running the shipped `LeaseWorker`; to its manager, a worker process (pid,
    terminate, kill, exit code); to the checker, a worker (fleet.WorkerView)."""

    driver = "worker"

    def __init__(self, consumer: "SimConsumer", spawn: fx.Spawn):
        self.consumer = consumer
        self.world = world = consumer.world
        self.host = consumer.host
        self.config = consumer.config
        self.key = spawn.lease.lease_key
        self.serial = world.next_serial()
        self.pid = self.serial
        self.exitcode: int | None = None
        self.scope = Scope(f"worker {self.serial}", consumer.group)
        self.lock = Lock()
        self.stop = SimStop(world)
        self.stop_waiters = Waiters()
        self.hold_waiters = Waiters()
        self.stop.waiters.append(self.stop_waiters)
        self.exited = Waiters()
        self.finished = False
        self.client = lease_table_client(world, self.host, self.config, self)
        self.table = LeaseTable(self.config.lease_table, self.client)
        self.kinesis = SimKinesisClient(world.stream, world.child_rng(), world.scenario.kinesis_throttle,
                                        world.scenario.short_reads,
                                        random.Random(f"short-reads-{world.scenario.seed}-{self.serial}"))
        self.metrics = Metrics(None, None, self.config.application, self.config.worker_id, clock=self.host.wall)
        self.heap = HeapTrimmer(trim=lambda pad: 0)  # no process heap to give back
        self.guard = _NO_GUARD
        # The shipped landing sink over the world's zone (the shipped memory store, watched: sim/aws/landing.py).
        # Standalone (it checkpoints after each flush and ends the shard) unless the world runs the pipeline,
        # which commits checkpoints and SHARD_END once windows materialised.
        sc = world.scenario
        self.processor = LandingProcessor(
            world.zone.view(self, self.kill), world.stream.name,
            max_batch_records=self._batch_records(world),
            max_batch_age_seconds=sc.batch_age, batch_format="rows",
            checkpoint_after_flush=sc.pipeline_period is None, clock=self.host.wall, monotonic=self.host.monotonic)
        self.checked_at = 0.0  # when its last check before the delivery in progress was answered (true time)
        self.paused = 0.0  # true seconds from that check to the delivery
        self.heartbeat_pause_until = 0.0  # the world stalls this worker's heartbeat until then (true time)
        self.task: Task | None = None
        # The manager's spawn, unchanged, as production pickles it into the worker process.
        self.worker = LeaseWorker(self.config, spawn, self.processor, keepalive=lambda: consumer.keepalive_at,
                                  keepalive_timeout=consumer.keepalive_timeout, transport=self,
                                  claim=f"w{self.serial}")
        if not world.scenario.report_throughput:
            self.worker.throughput = _Silent()  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"worker {self.serial} ({self.consumer.worker_id}, {self.key})"

    @property
    def worker_id(self) -> str:
        return self.consumer.worker_id

    @property
    def hold(self) -> Any:
        return self.worker.lease.hold if self.worker.lease.acquired else None

    def working(self) -> bool:
        """Alive, not frozen, and holding its lease as far as it knows (ground truth for the checker)."""
        hold = self.hold
        return (not self.finished and self.scope.alive() and self.scope.thaw_time() <= self.world.now
                and hold is not None and hold.lost is None and not hold.ended)

    def frozen_before_take(self) -> bool:
        """Alive and frozen before it took its lease (ground truth for the checker)."""
        return (not self.finished and self.scope.alive() and self.scope.thaw_time() > self.world.now
                and not self.worker.lease.acquired)

    def could_deliver(self) -> float:
        """How much longer (its clock) it could still deliver, frozen or not: its hold neither lost nor ended
        and still valid, and not asked to stop (ground truth for the checker)."""
        hold = self.hold
        if self.finished or not self.scope.alive() or hold is None or hold.lost is not None or hold.ended \
                or self.stop.is_set():
            return 0.0
        return max(0.0, hold.valid_until - self.host.monotonic())

    def _batch_records(self, world: "Stage") -> int:
        """The world's batch size, or under `mixed-batch-sizes` this worker process's own (a stream of its own):
        the old or the new size of a rolling change, as its configuration was when it started."""
        if not world.scenario.mixed_batch_sizes:
            if ("rolling-change" in world.scenario.faults and world.zone.inside
                    and world.scenario.flush_records == max(ROLLING_BATCH_SIZES)):
                world.stats["rolling-change: a worker started beside a paused zombie cuts at the new size"] += 1
                return min(ROLLING_BATCH_SIZES)
            return world.scenario.flush_records
        size = random.Random(f"cuts-{world.scenario.seed}-{self.serial}").choice(ROLLING_BATCH_SIZES)
        world.stats[f"mixed-batch-sizes: a worker cutting batches of {size}"] += 1
        return size

    # -- the transport (worker.WorkerTransport) -----------------------------------------------------------
    def bind(self, handle: Callable[[Any], Any]) -> None:
        self.shell_handle = handle

    def parent_alive(self) -> bool:
        # The manager's process: its death is what os.getppid() shows a worker.
        return self.consumer.manager_scope.alive()

    def open_reader(self, stream: str, shard_id: str, start: Checkpoint, kpl_stats: KplStats) -> ShardReader:
        zombie = self.world.zone.zombies.get(self.key)
        if zombie is not None and zombie[0] is not self:
            # A zombie paused inside its flush until its lease was taken: the new holder resumed, its pause ends.
            del self.world.zone.zombies[self.key]
            _, scope, until, waiters = zombie
            if scope.frozen_until == until:  # not frozen longer by another fault meanwhile
                scope.frozen_until = self.world.now
            waiters.wake(self.world)
            self.world.stats["zombie-flush: thawed as the new holder started"] += 1
            faults = self.world.scenario.faults
            if "short-reads" in faults or ("rolling-change" in faults and self.processor.settings.max_batch_records
                                           < zombie[0].processor.settings.max_batch_records):
                # Aimed: the race a zombie and a new holder make is the new holder's polls ending inside the
                # batch the zombie lands now (the stale-predecessor class, issue 20's second defect).
                self.kinesis.short_next = SHORT_READS_AFTER_A_ZOMBIE
                self.world.stats["short-reads: aimed at a new holder that thawed a zombie"] += 1
        c = self.config
        return ShardReader(self.kinesis, stream, shard_id, start, polling_interval=c.polling_interval_seconds,
                           idle_interval=c.idle_interval_seconds, max_records=c.max_records_per_call,
                           kpl_stats=kpl_stats, sleep=_raise_paced, monotonic=self.host.monotonic,
                           clock=self.host.wall, rng=self.world.child_rng(), max_bytes_per_call=c.prefetch_bytes)

    def hold_changed(self) -> None:
        self.hold_waiters.wake(self.world)

    def effect(self, task: Task, effect: Any) -> Any:
        kind = type(effect)
        pauses = self.world.pauses
        if kind is fx.Deliver:
            # Processing the last check did not see (a GC, a busy host), within what the margin tolerates. The
            # check was answered at this very instant. A freeze of the world's (SIGSTOP) waits until the
            # delivery was made: stopped between the check and the delivery, no holder can keep within its
            # validity, and the documented tolerance says so (core/tolerance.py).
            self.checked_at = self.world.now
            pause = pauses.before_delivery(self.timing)
            if pause > 0.0:
                return Later(pause, lambda: self._deliver(effect), network=True)
            return self._deliver(effect)
        if kind is fx.TakePending and task.kind == "heartbeat" and self.world.now < self.heartbeat_pause_until:
            # The heartbeat thread is stuck (a hook blocking, a starved thread) at its next tick, outside the
            # write lock: the delivery goes on, the holder answers nothing until then.
            return Later(self.heartbeat_pause_until - self.world.now, lambda: self.shell_handle(effect))
        if kind is fx.FinishHandoff:
            # A holder slow between reading the ask and answering it (a GC, a busy host): its answer may come
            # after the asker gave up and took the lease cold, and must then be refused.
            pause = pauses.before_answering_a_handoff()
            if pause > 0.0:
                self.scope.frozen_until = max(self.scope.frozen_until, self.world.now + pause)
                return Later(0.0, lambda: self.shell_handle(effect))
        if kind is fx.Check:
            pause = pauses.before_check()  # a GC pause of the whole process, up to past the expiry: seen here
            if pause > 0.0:
                self.scope.frozen_until = max(self.scope.frozen_until, self.world.now + pause)
                return Later(0.0, lambda: self.shell_handle(effect))
        if kind is fx.ShardEnded or kind is fx.Notify:
            try:
                return self.shell_handle(effect)  # the sink flushes here
            except SimCrash:
                return Later(0.0, lambda: None)
        return self.shell_handle(effect)

    @property
    def timing(self) -> LeaseTiming:
        return self.worker.timing

    def _deliver(self, effect: fx.Deliver) -> Any:
        if not self.scope.alive():
            return Later(0.0, lambda: None)  # killed meanwhile: never resumed
        batch = effect.batch
        self.paused = self.world.now - self.checked_at
        if batch.records:
            self.world.checker.on_deliver(self, self.key, batch.records)
        try:
            if self in self.world.zone.stalls:
                # The world will pause it at a put of the flush this delivery makes (`zombie-flush`): the call
                # runs where it can stop part-way and go on after the pause.
                return self._inside(InsideCall(lambda: self.shell_handle(effect)))
            self.shell_handle(effect)
        except SimCrash:
            return Later(0.0, lambda: None)  # killed inside a landing (the zone's doing): never resumed
        return self._processed()

    def _processed(self) -> Any:
        processing = self.world.pauses.processing()
        return Later(processing, lambda: None) if processing > 0.0 else None

    def _inside(self, call: InsideCall) -> Any:
        """Run a delivery that may pause at the zone's put: the whole process stops (a GC pause, past the check
        that let the delivery start), and at its thaw the delivery goes on where it stopped, its lease taken
        meanwhile or not: the put-if-absent and the exclusion are all that protect the zone then."""
        kind, seconds = call.step()
        if kind != "pause":
            return self._processed()
        zone = self.world.zone
        zone.inside.append(call)
        _, _, _, whole, until_taken = zone.stalled[-1]
        if whole and self.world.freeze_allowance([self.consumer], seconds) < seconds:
            # The operator's promise (World.freeze_allowance): the fleet must run for a while within the retention.
            whole = False
            self.world.stats["zombie-flush: the worker alone, by the operator's promise"] += 1
        # The worker process alone (a GC pause: its manager, which is not, kills a worker whose lease went
        # unrenewed past the expiry), or its whole consumer (a host's stall: nothing watches it meanwhile).
        scope = self.consumer.group if whole else self.scope
        until = scope.frozen_until = max(scope.frozen_until, self.world.now + seconds)
        waiters = Waiters()
        if until_taken:
            # The pause ends when the lease's new holder opens its reader (see `open_reader`): the moment the
            # zombie's landing races the new holder's, which resumed below what the zombie is about to land.
            zone.zombies[self.key] = (self, scope, until, waiters)
        self.world.note(f"{self!r} paused {seconds:.1f}s inside a flush, at the zone's put"
                        f"{', with its whole consumer' if whole else ''}"
                        f"{', or until its lease is taken' if until_taken else ''}")

        def thawed() -> Any:
            zone.inside.remove(call)
            if zone.zombies.get(self.key, (None,))[0] is self:
                del zone.zombies[self.key]
            if not self.scope.alive():
                call.abandon(SimCrash("killed while paused"))
                return None
            stats = self.processor.stats
            before = (stats.batches_written, stats.links_lost, stats.records_already_landed)
            try:
                return self._inside(call)
            except SimCrash:
                return None  # killed inside a landing: never resumed
            finally:
                # How often the fault makes what it is for: a zombie landing, or meeting another writer's batches.
                counts = self.world.stats
                counts["zombie-flush: went on with its flush"] += 1
                if stats.batches_written > before[0]:
                    counts["zombie-flush: landed after its thaw"] += 1
                if (stats.links_lost, stats.records_already_landed) != before[1:]:
                    counts["zombie-flush: met another writer's batches"] += 1
        return Later(0.0, thawed, waiters=waiters)

    def sleep_extra(self, task: Task, seconds: float) -> float:
        if task.kind != "heartbeat":
            return 0.0
        # A starved heartbeat timer (the slow-heartbeats fault), a stalled heartbeat (the world's, e.g. while a
        # hand-off is asked of this holder), a GC pause.
        extra = self.host.true_delay(seconds) * (self.consumer.heartbeat_slowness - 1.0)
        extra += max(0.0, self.heartbeat_pause_until - self.world.now)
        return extra + self.world.pauses.in_heartbeat()

    def background(self, task: Task, step: Background) -> Task:
        return Task(self.world, self.scope, step.body, self.answer, lock=self.lock, name=f"{self!r} {step.name}",
                    kind="heartbeat", on_error=self._heartbeat_failed).start()

    def _heartbeat_failed(self, exc: BaseException) -> None:
        # A thread that raises ends alone (its traceback printed); the process goes on without it.
        self.world.stats[f"heartbeat raised {type(exc).__name__}"] += 1
        self.world.note(f"{self!r}: its heartbeat raised {type(exc).__name__}: {exc}")

    # -- the process ----------------------------------------------------------------------------------------
    def start(self, delay: float) -> None:
        self.task = Task(self.world, self.scope, self.worker.work(), self.answer, lock=self.lock,
                         on_done=self._done, on_error=self._task_failed, name=f"{self!r}")
        self.task.start(delay)

    def _done(self, result: WorkerResult) -> None:
        self.world.note(f"{self!r}: {result.outcome} {result.detail}")
        self.world.stats[f"worker {result.outcome}"] += 1
        self.consumer.worker_result(result)  # worker_main puts it on the results queue, then exits
        self._exit(0)

    def _task_failed(self, exc: BaseException) -> None:
        # worker_main has no handler above run(): an exception that escapes it ends the process (exit code 1).
        self.world.stats[f"worker raised {type(exc).__name__}"] += 1
        self.world.note(f"{self!r}: raised {type(exc).__name__}: {exc}")
        self._exit(1)

    def _exit(self, code: int) -> None:
        if not self.finished:
            self.finished = True
            self.exitcode = code
            self.scope.dead = True  # its other activities (the heartbeat) end with it
            self.exited.wake(self.world)

    # -- the manager's view (transport.WorkerHandle) --------------------------------------------------------
    def is_alive(self) -> bool:
        return not self.finished and self.scope.alive()

    def terminate(self) -> None:
        """SIGTERM: the signal watcher sets the stop event (once the process runs)."""
        if self.is_alive():
            self.stop.set()

    def kill(self) -> None:
        """SIGKILL: no more events, nothing released."""
        if self.is_alive():
            self.finished = True
            self.exitcode = -9
            self.scope.dead = True
            self.exited.wake(self.world)

    def join(self, timeout: float | None = None) -> None:
        if timeout:
            raise RuntimeError("a simulated process is joined through the Join step")


class SimConsumer(Process):
    """One consumer process running the shipped `LeaseManager`'s `consume` (start, cycles, shutdown); its
    workers are `SimWorkerProcess`es in its process group."""

    driver = "manager"

    def __init__(self, world: "Stage", host: Host, worker_id: str, config: ConsumerConfig, name: str,
                 keepalive_timeout: float | None = None):
        self.world = world
        self.host = host
        self.worker_id = worker_id
        self.config = config
        self.name = name
        self.keepalive_timeout = keepalive_timeout  # None: a headless consumer; else a hosted one's (the sensor)
        self.group = Scope(f"{name} group")
        self.manager_scope = Scope(f"{name} manager", self.group)
        self.scope = self.manager_scope
        self.client = lease_table_client(world, host, config, self)
        # Small scan pages stand for a big table: a scan is many requests, each with its latency.
        self.table = LeaseTable(config.lease_table, self.client, scan_page_size=world.scenario.scan_page_items)
        self.kinesis = SimKinesisClient(world.stream, world.child_rng())
        self.metrics = Metrics(None, None, config.application, worker_id, clock=host.wall)
        self.stop = SimStop(world)
        self.stop_waiters = Waiters()
        self.hold_waiters = Waiters()
        self.result_waiters = Waiters()
        self.stop.waiters += [self.stop_waiters, self.result_waiters]
        self.results: list[WorkerResult] = []
        self.keepalive_at = host.wall()
        self.stopping = False
        self.exited = False
        self.cycles = 0
        self.heartbeat_slowness = 1.0  # a fault: heartbeat timers firing late (a starved process)
        self.manager = LeaseManager(config, rng=world.child_rng(), clock=host.monotonic, transport=self)
        self.stopped_at: float | None = None  # when it was asked to stop gracefully (true time)

    def __repr__(self) -> str:
        return f"consumer {self.name} ({self.worker_id})"

    @property
    def workers(self) -> dict[str, Any]:
        return self.manager.workers

    def alive(self) -> bool:
        return self.group.alive() and self.manager_scope.alive()

    def retrying(self, key: str) -> bool:
        """Holds the lease through the back-off after its worker failed (kcl/core/fleet/retry.py), not over yet on
        its own clock: the lease is not worked meanwhile by design, and the checker's liveness bound counts from
        the back-off's end."""
        backoff = self.manager.state.backoffs.get(key)
        return (self.alive() and backoff is not None and backoff.held_at is not None
                and self.host.monotonic() < backoff.until)

    def able(self) -> bool:
        """Could take over a lease now: alive, not frozen, not stopping, and reaching DynamoDB normally for
        long enough that no call caught by an earlier fault is still retrying."""
        faults, now = self.host.faults, self.world.now
        return (self.alive() and not self.stopping and self.group.thaw_time() <= now
                and self.manager_scope.thaw_time() <= now and faults.healthy()
                and now - faults.healthy_since >= retry_budget(self.client.max_attempts, self.client.read_timeout,
                                                                faults.connect_timeout))

    def start(self, delay: float = 0.0) -> None:
        Task(self.world, self.manager_scope, self.manager.consume(self.stop), self.answer, on_done=self._exit,
             on_error=self._failed, name=f"{self!r}").start(delay)

    # -- the transport (manager.ManagerTransport) ---------------------------------------------------------
    def bind(self, handle: Callable[[Any], Any]) -> None:
        self.shell_handle = handle

    def effect(self, task: Task, effect: Any) -> Any:
        return self.shell_handle(effect)

    def refresh_keepalive(self) -> None:
        self.keepalive_at = self.host.wall()
        self.cycles += 1
        self.world.stats["cycles"] += 1

    def retime(self, config: ConsumerConfig) -> None:
        self.config = config

    def start_worker(self, spawn: fx.Spawn) -> SimWorkerProcess:
        worker = SimWorkerProcess(self, spawn)
        self.world.workers.append(worker)
        if spawn.stolen and spawn.lease.lease_owner is not None:
            self.world.stats["steals"] += 1
            self.world.steal_times.append(self.world.now)
            if not spawn.handoff:  # a cold steal waits out an expiry: a stop may come meanwhile
                self.world.stop_while_taking(self, self.config.lease_expiry_seconds, 0.15)
        how = " (hand-off)" if spawn.handoff else " (steal)" if spawn.stolen else ""
        self.world.note(f"{self!r}: spawn {worker!r}{how}")
        # A spawned process takes a moment to start, longer on a host whose spawns are slow, and longer than its
        # manager's first start patience on a host loaded past it (`Scenario.start_seconds`).
        worker.start(self.world.scenario.worker_start(self.world.rng))
        return worker

    def worker_result(self, result: WorkerResult) -> None:
        self.results.append(result)
        self.result_waiters.wake(self.world)

    def collect_results(self) -> list[WorkerResult]:
        results, self.results = self.results, []
        return results

    def next_result(self, step: NextResult) -> Any:
        if self.results:
            return self.results.pop(0)
        if step.stop.is_set():
            return None
        # An idle look that found nothing is no step of the system.
        return Later(self.host.true_delay(step.seconds), lambda: self.results.pop(0) if self.results else None,
                     waiters=self.result_waiters, counted=False)

    # -- the process ----------------------------------------------------------------------------------------
    def _exit(self, results: list[WorkerResult]) -> None:
        """`consume` returned: the process exits (daemonic workers still running die with it)."""
        self.exited = True
        self.world.note(f"{self!r}: exited after its shutdown ({len(results)} worker results)")
        self.world.consumer_exited(self)
        self.group.dead = True

    def _failed(self, error: BaseException) -> None:
        self.world.stats["consumers failed"] += 1
        self.world.note(f"{self!r}: exited with {type(error).__name__}: {error}")
        self.group.dead = True
        self.world.consumer_failed(self)

    # -- lifecycle faults -----------------------------------------------------------------------------------
    def graceful_stop(self) -> None:
        """SIGTERM: the manager stops cycling and shuts its workers down (each releases); then it exits."""
        self.stopping = True
        self.stopped_at = self.world.now
        self.world.checker.on_graceful_stop(self)
        self.stop.set()

    def kill(self, whole_group: bool) -> None:
        """SIGKILL of the process group, or of the manager alone (its workers notice and stop gracefully)."""
        (self.group if whole_group else self.manager_scope).dead = True


__all__ = ["Paced", "SimConsumer", "SimStop", "SimWorkerProcess", "WRITES"]
