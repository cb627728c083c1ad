"""The lease manager: one cycle = scan, list shards, delete, create, decide, spawn.

Every consumer runs one; none is a leader. The cycle itself is the coroutine of cycle.py over planner.py's
pure decisions; `LeaseManager` is its shell: it answers the cycle's effects, waits between cycles (waking
when a worker ended a shard or a peer's lease expired), reaps finished workers, spawns one worker per lease
it works, kills a stuck one, and stops them all on shutdown (asked, then killed once the timeout passed).

One shell, two transports (transport.py). In production `Processes` runs it: one worker process per lease
(daemonic, so workers die with a reloaded or killed host), forked from a preloaded server or spawned
(worker_processes.py), a results queue and a keep-alive they share, the real clients. The deterministic
simulation (sim/actors/consumer.py) runs these very handlers with simulated services, engine tasks and virtual
time. The same manager backs `kcl-pipeline consume` (`consume`: start, cycles until stopped, shutdown) and
the Dagster sensor (one `run_cycle` per tick).
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import random
import threading
import time
from typing import Any, Callable, ClassVar, Generator, Mapping, Protocol, Sequence

from ...config import ConsumerConfig, timings_beside_java
from ...core import coverage
from ...core.fleet import cycle as cyc
from ...core.fleet import fleet_mode, retry
from ...core.fleet.cycle import CycleReport
from ...core.fleet.planner import LeaseAges
from ...core.lease import effects as fx
from ...core.lease.lease_life import LifeOutcome
from ...core.model import Checkpoint, Lease, Shard
from ...core.table.worker_metrics import worker_metrics_table
from ..aws import client
from ..lease_table import LeaseTable
from ..metrics import WORKER_FAILURES, Metrics
from ..shards import describe_stream_summary, list_application_shards
from ..transport import KINESIS, Blocking, Call, Join, NextResult, StartProcess, StopFlag, WorkerHandle
from ..workers.worker import ProcessorSpec, WorkerResult, lease_table_client, worker_main
from ..workers.worker_processes import WorkerProcesses, preload_modules
from . import kcl3_tables

log = logging.getLogger(__name__)

Steps = Generator[Any, Any, Any]


def log_trimmed_unfinished(trimmed: Sequence[tuple[str, Checkpoint]]) -> None:
    """Say it loudly when a lease goes with its shard before it ended: the shard's records are gone from the
    stream, its lease now too, and nothing else will say that records after its checkpoint may be lost."""
    for key, checkpoint in trimmed:
        log.error("shard %s left the stream (its retention ran out) before its lease ended: lease deleted at "
                  "checkpoint %s; records after it may never have been processed by this application (a parent "
                  "held by a lost batch, a stalled window, a fleet down for longer than the retention)",
                  key, checkpoint)


def abandon_line(effect: fx.Abandon, pid: int | None, expiry_seconds: float) -> str:
    """The log line for a stuck worker killed: before its take (a start that outlasted its patience, after which
    the lease's next worker is given longer), or after its lease stopped changing."""
    key = effect.lease.lease_key
    if effect.before_take:
        return (f"killed the worker of lease {key} (pid {pid}) before its take: {effect.waited_seconds:.0f}s after "
                f"its spawn the lease still showed no take (a frozen or very slow start); a new worker takes the "
                f"lease, given longer to start")
    return (f"killed the worker of lease {key} (pid {pid}): its lease was not renewed for "
            f"{effect.waited_seconds:.0f}s, longer than the expiry ({expiry_seconds:.0f}s); the lease is taken again")


class ManagerStalled(RuntimeError):
    """No lease-manager cycle succeeded for the configured time (ConsumerConfig.stall_seconds): the consumer
    makes no progress and says so, in one line, instead of logging an error every cycle."""


# Why a stopping manager releases a lease in its name that no live worker of its holds (its log lines).
LEFT_HELD = "its manager through a back-off after its worker failed"
LEFT_UNREACHABLE = "a worker that could not reach the lease table"
LEFT_KILLED = ("a worker this consumer killed as stuck (its take came just before the kill, or the next worker was "
               "stopped before its own)")


def one_line(exc: BaseException) -> str:
    """An exception as the one line a log or an exit shows: its type and its first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def touch(path: str) -> None:
    """Set the file's modification time to now, creating it if missing (the liveness signal)."""
    with open(path, "a"):
        pass
    os.utime(path, None)


def shutdown_timeout(config: ConsumerConfig) -> float:
    """How long a stopping consumer waits for its workers to release before killing them: long enough for
    a release caught by a slow table (three heartbeats), never under 30 s."""
    return max(30.0, 3 * config.heartbeat_seconds)


class ManagerTransport(Protocol):
    """What a manager's shell needs of the machinery it runs on (production: `Processes`; the simulation's
    consumer process). Besides these, it answers the steps of transport.py."""

    table: LeaseTable
    kinesis: Any
    metrics: Metrics

    def bind(self, handle: Callable[[Any], Any]) -> None: ...

    def run(self, coroutine: Steps) -> Any:
        """Run steps synchronously on the calling thread."""
        ...

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def refresh_keepalive(self) -> None:
        """Tell this manager's workers it is alive (they stop once it goes stale)."""

    def start_worker(self, spawn: fx.Spawn) -> WorkerHandle:
        """Start a worker process for the spawn's lease (it acquires it itself), handing it the spawn unchanged."""
        ...

    def retime(self, config: ConsumerConfig) -> None:
        """Start the workers of from now on with this configuration (new timings)."""

    def collect_results(self) -> list[WorkerResult]:
        """The results workers reported since the last call (without waiting)."""
        ...


class LeaseManager:
    def __init__(self, config: ConsumerConfig, spec: ProcessorSpec | None = None, *,
                 keepalive_timeout: float | None = None, rng: random.Random | None = None,
                 worker_log_level: int = logging.INFO, clock: Callable[[], float] = time.monotonic,
                 predecessor: Callable[[str], bool] | None = None, transport: ManagerTransport | None = None):
        self.config = config
        self.spec = spec
        self.keepalive_timeout = keepalive_timeout
        self.rng = rng or random.Random()
        self.clock = clock
        self.predecessor = predecessor  # owner ids of earlier incarnations of this consumer (see planner)
        self.settings = cyc.CycleSettings.of(config)
        self.state = cyc.ManagerState()
        self.worker_log_level = worker_log_level
        if transport is None:
            if spec is None:
                raise ValueError("a lease manager of worker processes needs a processor spec")
            transport = Processes(config, spec, keepalive_timeout, worker_log_level)
        self.transport: ManagerTransport = transport
        self.transport.bind(self._handle)
        self.workers: dict[str, WorkerHandle] = {}
        self._pending: list[WorkerResult] = []
        self.table = self.transport.table
        self.kinesis = self.transport.kinesis
        self.metrics = self.transport.metrics
        self.health = retry.CycleHealth(self.clock())  # since when no cycle succeeded, and why

    @property
    def worker_processes(self) -> WorkerProcesses | None:
        """How this manager's workers start (production's transport only)."""
        return getattr(self.transport, "worker_processes", None)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Fail fast with a clear error when the stream is missing or a KCL 3.x fleet runs in 3.x mode; create the
        lease table when missing."""
        self.transport.run(self.starting())

    def starting(self) -> Steps:
        if self.config.multi_stream:  # a missing stream fails here, with its name (later it only waits)
            for stream in self.config.streams:
                yield Call("describe-stream", functools.partial(describe_stream_summary, self.kinesis, stream), KINESIS)
        self.shards = yield Call("list-shards", self._list_shards, KINESIS)
        # Before the lease table is created or touched: the mode a KCL 3.x fleet on this application runs in.
        self.state.fleet = yield Call("coordinator-state", lambda: kcl3_tables.start_watch(
            self.table.client, self.config.application, self.config.lease_table, self.clock(),
            self.config.coordinator_state_table_name))
        if (yield Call("ensure-table", self.table.ensure_table)):
            log.info("created lease table %s", self.config.lease_table)
        else:
            self._beside_java((yield Call("scan", self.table.scan)))

    def _beside_java(self, leases: Sequence[Lease]) -> bool:
        """Java KCL consumers share the table and this consumer runs on the default timings: switch to Java-safe
        ones (config.timings_beside_java), saying so. True when the timings changed."""
        safer = timings_beside_java(self.config, fleet_mode.java_fleet_seen(leases, self.state.fleet))
        if safer is None:
            return False
        coverage.hit("shell.manager.java-safe-timings")
        log.warning("Java KCL consumers share lease table %s and this consumer runs on the default timings "
                    "(heartbeat %gs, expiry %gs), under which Java (failoverTimeMillis 10 s by default) would take "
                    "its leases while it still delivers: switching to heartbeat %gs, expiry %gs (set the timings "
                    "explicitly to keep others)", self.config.lease_table, self.config.heartbeat_seconds,
                    self.config.lease_expiry_seconds, safer.heartbeat_seconds, safer.lease_expiry_seconds)
        self.config = safer
        self.settings = cyc.CycleSettings.of(safer)
        self.transport.retime(safer)
        return True

    def consume(self, stop: StopFlag) -> Steps:
        """A consumer's whole life (`kcl-pipeline consume`): start, cycles until `stop` is set, shutdown (every
        worker asked to stop, then killed past `shutdown_timeout`). Returns the workers' last results."""
        yield from self.starting()
        log.info("consumer %s on stream %s, lease table %s", self.config.worker_id, self.config.stream,
                 self.config.lease_table)
        try:
            yield from self.cycles(stop)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.stopping(shutdown_timeout(self.config))
            raise
        return (yield from self.stopping(shutdown_timeout(self.config)))

    # What the manager knows, kept in its ManagerState (the sensor and tests read these).
    @property
    def ages(self) -> LeaseAges:
        return self.state.ages

    @property
    def shards(self) -> list[Shard]:
        return self.state.shards

    @shards.setter
    def shards(self, shards: list[Shard]) -> None:
        self.state.shards = shards

    @property
    def leases(self) -> list[Lease]:
        return self.state.leases

    @property
    def recently_ended(self) -> set[str]:
        return self.state.recently_ended

    @property
    def duplicate_worker_id_sightings(self) -> int:
        return self.state.duplicate_worker_id_sightings

    def _handle(self, effect: fx.CycleEffect) -> Any:
        handler = self.HANDLERS.get(type(effect))
        if handler is None:
            raise TypeError(f"the lease manager cannot handle {effect!r}")
        return handler(self, effect)

    def _now(self, _effect: fx.Now) -> float:
        return self.clock()

    def _scan(self, _effect: fx.ScanTable) -> Steps:
        sent_at = self.clock()
        leases = yield Call("scan", self.table.scan)
        # Stamped when the scan returned, never earlier: a slow scan must not age what it saw.
        return fx.Scanned(leases, sent_at, self.clock())

    def _list_shards_effect(self, _effect: fx.ListShards) -> Steps:
        return (yield Call("list-shards", self._list_shards, KINESIS))

    def _delete(self, effect: fx.Delete) -> Steps:
        lease = effect.lease
        return (yield Call("delete", lambda: self.table.delete(lease.lease_key, lease.lease_counter)))

    def _create(self, effect: fx.Create) -> Steps:
        return (yield Call("create", lambda: self.table.create(effect.lease)))

    def _spawn_effect(self, effect: fx.Spawn) -> Steps:
        yield StartProcess(f"worker for {effect.lease.lease_key}", lambda: self._spawn(effect))

    def _abandon(self, effect: fx.Abandon) -> Steps:
        key = effect.lease.lease_key
        proc = self.workers.pop(key, None)
        if proc is not None:
            proc.kill()  # SIGKILL: a stopped (SIGSTOP) process ignores SIGTERM until it is continued
            yield Join(proc, 5)
            coverage.hit("shell.manager.abandoned-a-stuck-worker")
            self.metrics.count_many({"stuck_workers_killed": 1}, None)
            log.error("%s", abandon_line(effect, proc.pid, self.config.lease_expiry_seconds))

    def _renew_held(self, effect: fx.RenewHeld) -> Steps:
        key, counter = effect.lease_key, effect.counter
        renewed = yield Call("renew-held", lambda: self.table.heartbeat(key, self.config.worker_id, counter))
        if not renewed:
            log.warning("lease %s, held through its back-off after its worker failed, moved on (renewal at counter "
                        "%d refused): no longer held here", key, counter)
        return counter + 1 if renewed else None

    def _duplicate_worker_id(self, effect: fx.DuplicateWorkerId) -> None:
        self.metrics.count_many({"duplicate_worker_id": 1}, None)
        log.error("another live process is writing under this consumer's worker id %s (leases %s); worker ids "
                  "must be unique per process: this consumer will not touch those leases",
                  self.config.worker_id, ", ".join(effect.lease_keys))

    def _read_worker_metrics(self, _effect: fx.ReadWorkerMetrics) -> Steps:
        try:
            updates = yield Call("read-worker-metrics", lambda: kcl3_tables.read_last_updates(
                self.table.client, self.config.application, self.state.fleet.layout, self.config.lease_table,
                self.config.worker_metrics_table_name))
        except Exception as exc:  # the balance keeps the peers it knew; the next period reads again
            self.metrics.count_many({"worker_metrics_failed": 1}, None)
            log.warning("could not read the fleet's worker metrics (%s): %s: %s",
                        self.config.worker_metrics_table_name or worker_metrics_table(self.config.application),
                        type(exc).__name__, exc)
            return None
        return fx.PeerMetrics(updates, self.transport.wall())

    def _publish_worker_metrics(self, effect: fx.PublishWorkerMetrics) -> Steps:
        try:
            now = int(self.transport.wall())
            yield Call("publish-worker-metrics", lambda: kcl3_tables.publish(
                self.table.client, self.config.application, self.config.worker_id, now, effect.throughput_kbps,
                self.state.fleet.layout, self.config.lease_table, self.config.worker_metrics_table_name))
        except Exception as exc:  # metrics never stop consuming; the next period writes again
            self.metrics.count_many({"worker_metrics_failed": 1}, None)
            log.warning("could not write this consumer's worker metrics (%s): %s: %s",
                        self.config.worker_metrics_table_name or worker_metrics_table(self.config.application),
                        type(exc).__name__, exc)

    # Every effect a manager's cycle may yield, and the method that answers it (a test checks this covers
    # every CycleEffect).
    HANDLERS: ClassVar[Mapping[type[fx.CycleEffect], Callable[[Any, Any], Any]]] = {
        fx.Now: _now, fx.ScanTable: _scan, fx.ListShards: _list_shards_effect, fx.Delete: _delete,
        fx.Create: _create, fx.Spawn: _spawn_effect, fx.Abandon: _abandon, fx.DuplicateWorkerId: _duplicate_worker_id,
        fx.ReadWorkerMetrics: _read_worker_metrics, fx.PublishWorkerMetrics: _publish_worker_metrics,
        fx.RenewHeld: _renew_held,
    }

    def _list_shards(self) -> list[Shard]:
        return list_application_shards(self.kinesis, self.config.streams, self.config.multi_stream)

    def run_cycle(self) -> CycleReport:
        """One cycle (the Dagster sensor's tick). A failure is raised as it is until no cycle has succeeded for
        `stall_seconds`; from then on as `ManagerStalled`, whose one line says so."""
        try:
            report = self.transport.run(self.cycle())
        except Exception as exc:
            reason = self._cycle_failed(exc)
            if reason is not None:
                raise ManagerStalled(reason) from exc
            raise
        self._cycle_succeeded()
        return report

    def _cycle_succeeded(self) -> None:
        self.health = retry.after_cycle(self.health, self.clock(), None)
        if self.config.health_file:
            try:
                touch(self.config.health_file)
            except OSError as exc:  # the probe then fails, which says it better than a crash here would
                log.warning("could not touch the health file %s: %s", self.config.health_file, exc)

    def _cycle_failed(self, exc: BaseException) -> str | None:
        """Note a failed cycle (log, metrics, health); the line to give up with once the consumer stalled."""
        now = self.clock()
        self.health = retry.after_cycle(self.health, now, one_line(exc))
        self.metrics.record_cycle_failure()
        self.metrics.flush_due()
        reason = retry.stalled(self.health, now, self.config.stall_seconds)
        if reason is None:
            log.error("lease manager cycle failed: %s (no cycle succeeded for %.0f s; this consumer gives up after "
                      "%s)", self.health.failure, now - self.health.since,
                      f"{self.config.stall_seconds:g} s" if self.config.stall_seconds > 0 else "never")
        return reason

    def cycle(self) -> Steps:
        """One cycle: the keep-alive refreshed, finished workers reaped, the cycle's decisions carried out."""
        self.transport.refresh_keepalive()
        report = CycleReport(finished=self._reap())
        self.state.fleet = yield Call("coordinator-state", lambda: kcl3_tables.watch(  # once a minute, as Java
            self.table.client, self.config.application, self.config.lease_table, self.state.fleet, self.clock(),
            self.config.coordinator_state_table_name))
        result = yield from cyc.manager_cycle(self.state, self.settings, frozenset(self.workers), self.rng,
                                              self.predecessor)
        if self._beside_java(result.leases):
            # Workers started on the old timings heartbeat too rarely for Java: they release, and the next cycles
            # take their leases again on the new ones.
            for proc in self.workers.values():
                if proc.is_alive():
                    proc.terminate()
        report.total_shards = result.total_shards
        report.deleted, report.created, report.spawned = result.deleted, result.created, result.spawned
        report.stolen = result.stolen
        report.retried, report.backing_off = result.retried, result.backing_off
        report.fleet = self.state.fleet.summary()
        log_trimmed_unfinished(result.trimmed_unfinished)
        if result.fleet_change:
            log.warning("%s", result.fleet_change)
        self._fill_counts(report, result.leases)
        self.metrics.record_cycle(report.total_leases, report.total_shards if report.total_shards is not None
                                  else len(self.shards), report.unclaimed_leases, report.worker_leases,
                                  backing_off_leases=len(report.backing_off))
        self.metrics.flush_due()
        log.info("cycle %s", report.summary())
        return report

    def _fill_counts(self, report: CycleReport, leases: list[Lease]) -> None:
        report.total_leases = len(leases)
        live = [lease for lease in leases if not lease.is_ended]
        report.unclaimed_leases = sum(1 for lease in live if not lease.lease_owner)
        for lease in live:
            if lease.lease_owner:
                report.owners[lease.lease_owner] = report.owners.get(lease.lease_owner, 0) + 1
        report.worker_leases = len(self.workers)

    def run_forever(self, stop: threading.Event) -> None:
        self.transport.run(self.cycles(stop))

    def cycles(self, stop: StopFlag) -> Steps:
        """Cycles until `stop` is set. A failed cycle (throttling, network) is retried next cycle; once none has
        succeeded for `stall_seconds`, ManagerStalled ends the consumer (it stops its workers and exits non-zero)."""
        while not stop.is_set():
            try:
                yield from self.cycle()
            except Exception as exc:
                reason = self._cycle_failed(exc)
                if reason is not None:
                    raise ManagerStalled(reason) from exc
            else:
                self._cycle_succeeded()
            yield from self._wait_next_cycle(stop)

    def _wait_next_cycle(self, stop: StopFlag) -> Steps:
        """Sleep a cycle, waking at once when a local worker ended a shard (its children are ready) or
        when a peer's lease expired (the table is re-scanned every `cycle.watch_interval`, reads only)."""
        monotonic = self.transport.monotonic
        now = monotonic()
        deadline = now + self.config.cycle_seconds
        retry_at = retry.next_retry_at(self.state.backoffs, self.clock())
        if retry_at is not None:  # a failed lease's back-off ends before the next cycle: cycle then
            deadline = min(deadline, now + max(0.0, retry_at - self.clock()))
        interval = cyc.watch_interval(self.settings)
        next_watch = now + interval
        while not stop.is_set() and monotonic() < deadline:
            result = yield NextResult(max(0.01, min(deadline, next_watch) - monotonic()), stop)
            if result is not None:
                self._pending.append(result)
                if cyc.wakes_manager(result.outcome):
                    return
            if monotonic() >= next_watch:
                next_watch = monotonic() + interval
                yield from self._renew_held_leases()
                if (yield from self._peer_lease_expired()):
                    return

    def _renew_held_leases(self) -> Steps:
        """Between cycles, keep the leases held through their back-off alive (a cycle may be longer than a
        heartbeat); a failed renewal is tried again at the next watch or cycle."""
        try:
            yield from cyc.renew_held(self.state, frozenset(self.workers))
        except Exception as exc:
            log.warning("could not renew the leases held through their back-off: %s", one_line(exc))

    def _peer_lease_expired(self) -> Steps:
        return (yield from cyc.watch_for_expiry(self.state, self.settings, frozenset(self.workers)))

    def shutdown(self, timeout: float = 30.0) -> list[WorkerResult]:
        """Ask every worker to stop gracefully (SIGTERM: checkpoint, release), then wait for them."""
        return self.transport.run(self.stopping(timeout))

    def stopping(self, timeout: float) -> Steps:
        """Every worker asked to stop (it checkpoints and releases), waited for up to `timeout`, killed after. The
        leases held through a back-off are released first: nothing works them, and while the workers are waited for
        nobody renews them."""
        for key, counter in cyc.held_at_stop(self.state, frozenset(self.workers)):
            yield from self._release_left(key, counter, LEFT_HELD)
        for proc in self.workers.values():
            if proc.is_alive():
                coverage.hit("shell.manager.shutdown-terminated")
                proc.terminate()
        deadline = self.transport.monotonic() + timeout
        for key, proc in list(self.workers.items()):
            yield Join(proc, max(0.1, deadline - self.transport.monotonic()))
            if proc.is_alive():
                log.warning("worker %s did not release its lease within %.0fs; killing it: the lease expires by "
                            "itself %.0fs after its last heartbeat", key, timeout, self.config.lease_expiry_seconds)
                coverage.hit("shell.manager.shutdown-killed-a-straggler")
                proc.kill()
                yield Join(proc, 5)
        results = self._reap()
        self.workers.clear()
        killed = yield from self._killed_left_in_our_name()
        for key, counter in cyc.releases_at_stop(self.state):
            yield from self._release_left(key, counter, LEFT_UNREACHABLE)
        for key, counter in killed:
            yield from self._release_left(key, counter, LEFT_KILLED)
        self.metrics.flush()
        return results

    def _killed_left_in_our_name(self) -> Steps:
        """The leases whose worker this manager killed that are still in its name, read by one scan once every
        worker is gone (none when it killed none)."""
        if not self.state.killed:
            return []
        try:
            scanned = yield from self._scan(fx.ScanTable())
        except Exception as exc:  # unreachable: those leases expire
            log.warning("could not read the lease table for the leases of the workers this consumer killed (%s): "
                        "%s: %s; any left in its name expires %.0fs after its last heartbeat",
                        ", ".join(sorted(self.state.killed)), type(exc).__name__, exc,
                        self.config.lease_expiry_seconds)
            self.state.killed.clear()
            return []
        return cyc.killed_left_in_our_name(self.state, self.config.worker_id, scanned.leases)

    def _release_left(self, key: str, counter: int, why: str) -> Steps:
        try:
            released = yield Call("release", lambda: self.table.release(key, self.config.worker_id, counter))
        except Exception as exc:  # unreachable still: the lease expires
            log.warning("could not release lease %s, left in this consumer's name by %s: %s: %s; it expires %.0fs "
                        "after its last heartbeat", key, why, type(exc).__name__, exc,
                        self.config.lease_expiry_seconds)
            return
        self.state.left_at.pop(key, None)
        if released:
            coverage.hit("shell.manager.released-left-at-stop")
            log.info("released lease %s, left in this consumer's name by %s (counter %d)", key, why, counter)

    # -- workers -----------------------------------------------------------------------------
    def _spawn(self, spawn: fx.Spawn) -> None:
        lease = spawn.lease
        proc = self.transport.start_worker(spawn)  # the decision, unchanged: the worker reads it alone
        self.workers[lease.lease_key] = proc
        log.info("spawned worker pid %s for %s (previous owner %s)", proc.pid, lease.lease_key, lease.lease_owner)

    def _reap(self) -> list[WorkerResult]:
        finished = self._pending
        self._pending = []
        finished.extend(self.transport.collect_results())
        cyc.note_results(self.state, [(result.lease_key, result.outcome) for result in finished],
                         {result.lease_key: result.left_at for result in finished if result.left_at is not None})
        now = self.clock()
        cyc.note_worker_ends(self.state, finished, now, self.rng)
        failed = [result for result in finished if result.outcome is LifeOutcome.FAILED]
        if failed:
            self.metrics.count_many({WORKER_FAILURES: len(failed)}, None)
        for result in failed:
            backoff = self.state.backoffs.get(result.lease_key)
            if backoff is not None:
                log.error("worker for %s failed: %s; tried again in %.0f s (failure %d in a row), its lease %s",
                          result.lease_key, result.detail, backoff.until - now, backoff.failures,
                          "held here meanwhile" if backoff.held_at is not None else "not held (released or lost)")
        for key, proc in list(self.workers.items()):
            if not proc.is_alive():
                proc.join(0)
                if proc.exitcode not in (0, None):
                    log.warning("worker for %s exited with code %s", key, proc.exitcode)
                del self.workers[key]
        if finished:
            coverage.hit("shell.manager.reaped")
        return finished


class Processes:
    """Production's transport for a lease manager: one worker process per lease, the results queue and the
    keep-alive they share, the real clients."""

    def __init__(self, config: ConsumerConfig, spec: ProcessorSpec, keepalive_timeout: float | None,
                 worker_log_level: int):
        self.config = config
        self.spec = spec
        self.keepalive_timeout = keepalive_timeout
        self.worker_log_level = worker_log_level
        # Workers start in worker_processes' context (a forkserver by default); the queue and the keep-alive
        # reach them the same way under either method.
        self.worker_processes = WorkerProcesses(config.worker_start_method, preload_modules(spec.target))
        self._ctx = self.worker_processes.ipc_context
        self._results = self._ctx.Queue()
        self._keepalive = self._ctx.Value("d", time.time(), lock=False)
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, lease_table_client(config))
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id,
                               naming=config.metrics_naming)
        self._driver: Blocking | None = None

    def bind(self, handle: Callable[[Any], Any]) -> None:
        self._driver = Blocking(handle, results=self._results)

    def run(self, coroutine: Steps) -> Any:
        if self._driver is None:
            raise RuntimeError("the transport is not bound to a manager")
        return self._driver.run(coroutine)

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def refresh_keepalive(self) -> None:
        self._keepalive.value = time.time()

    def retime(self, config: ConsumerConfig) -> None:
        self.config = config

    def start_worker(self, spawn: fx.Spawn) -> WorkerHandle:
        # The spawn crosses into the process pickled whole: the worker reads the decision from it alone. The
        # other arguments are this transport's (configuration, processor, results, keep-alive, log level).
        proc = self.worker_processes.context().Process(
            target=worker_main,
            args=(self.config, spawn, self.spec, self._results),
            kwargs={"keepalive": self._keepalive, "keepalive_timeout": self.keepalive_timeout,
                    "log_level": self.worker_log_level},
            name=f"kcl-worker-{spawn.lease.lease_key}", daemon=True)
        proc.start()
        return proc

    def collect_results(self) -> list[WorkerResult]:
        results = []
        while True:
            try:
                results.append(self._results.get_nowait())
            except queue.Empty:
                return results
