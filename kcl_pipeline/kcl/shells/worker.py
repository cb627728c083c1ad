"""The lease worker: one process per lease (acquire · heartbeat · read · deliver · checkpoint · end · release).

Every decision of a lease's life is made by the coroutines of lease_life.py (the deterministic simulation
runs the same ones); this module is their I/O: the lease table, the shard reader, the processor, a
heartbeat thread and a lock. The heartbeat runs on its own thread, independent of record processing, so a
slow processor never lets the lease expire. Delivery is gated on the lease being valid: once a heartbeat
fails (condition failed: someone took the lease, or the shard was ended) or none succeeded within the
expiry, the worker stops delivering at once and tells the processor `lease_lost`.

A worker also stops by itself (gracefully: shutdown_requested, release) when its manager stops
refreshing the keep-alive, or when its parent process dies: a Dagster code server that reloads or is
killed never leaves workers behind holding leases.
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..config import ConsumerConfig
from ..core import lease_life as life
from ..core.balance import ThroughputMeter, reported_load
from ..core.lease_codec import encode_value
from ..core.lease_hold import LeaseHold, LeaseTiming, Outcome
from ..core.lease_life import LifeResult, LifeSettings
from ..core.lease_rules import HANDOFF_ATTRIBUTE, check_heartbeat_attributes
from ..core.model import Checkpoint, Lease
from ..core.streams import StreamRecreated, scope_of
from ..processor import InitializationInput, ProcessRecordsInput, RecordProcessor
from ..records.kpl import KplStats
from .aws import client
from .lease_table import LeaseTable
from .metrics import Metrics
from .reader import ShardReader
from .shards import list_shards, stream_scope
from .signals import stop_on_signals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessorSpec:
    """A picklable recipe for a record processor: `module:attr` called with kwargs in the worker process."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> RecordProcessor:
        module, _, attr = self.target.partition(":")
        if not attr:
            raise ValueError(f"processor target {self.target!r} must look like 'package.module:Factory'")
        return getattr(importlib.import_module(module), attr)(**self.kwargs)


# A lease-table call still retrying after the lease's validity has passed is useless, and one still retrying
# long after a network fault healed keeps its consumer deaf (with botocore's 8 attempts, a 5 s connect
# timeout and a 20 s read timeout, a call caught by a 30 s partition returned a minute after it healed).
# So lease I/O gets few attempts and a read timeout of a heartbeat: a failed call is simply retried by
# the next heartbeat or cycle.
LEASE_TABLE_ATTEMPTS = 3


def lease_table_read_timeout(config: ConsumerConfig) -> float:
    return max(2.0, config.heartbeat_seconds)


def lease_table_client(config: ConsumerConfig):
    """The DynamoDB client of a consumer's lease table (see LEASE_TABLE_ATTEMPTS)."""
    return client("dynamodb", config.aws, max_attempts=LEASE_TABLE_ATTEMPTS,
                  read_timeout=lease_table_read_timeout(config))


# What a worker tells its manager when it stops (outcome: not_acquired | blocked_on_parents | shard_ended |
# lease_lost | shutdown | failed).
WorkerResult = LifeResult


class _HeldLease:
    """The worker's lease (a pure LeaseHold) shared by the heartbeat thread and the delivery loop.

    Every fenced write goes through it, one at a time (`writing()`): each is conditioned on the counter the
    previous one left, so two writes in flight would fence each other out.
    """

    def __init__(self, hold: LeaseHold, timing: LeaseTiming, monotonic: Callable[[], float] = time.monotonic):
        self._hold = hold
        self._timing = timing
        self._monotonic = monotonic
        self._lock = threading.RLock()  # serialises fenced writes and guards _hold
        self._changed = threading.Condition(self._lock)

    @property
    def hold(self) -> LeaseHold:
        with self._lock:
            return self._hold

    @property
    def reason(self) -> str:
        return self.hold.lost or ""

    def current(self) -> tuple[float, LeaseHold]:
        """The clock and the hold as of now (lost once its validity passed)."""
        with self._lock:
            now = self._monotonic()
            self._set(self._hold.held(now))
            return now, self._hold

    def valid(self) -> bool:
        now, hold = self.current()
        return hold.may_deliver(now)

    def renew(self, write: Callable[[int], bool]) -> Outcome:
        """Run one fenced counter-moving write `write(counter) -> applied`; errors pass through."""
        with self._lock:
            if not life.may_write(self._hold, self._monotonic()):
                self._set(self._hold.held(self._monotonic()))
                return Outcome.REFUSED
            sent_at = self._monotonic()
            try:
                outcome = Outcome.APPLIED if write(self._hold.counter) else Outcome.REFUSED
            except Exception:
                self._set(life.renewed(self._hold, Outcome.ERROR, sent_at, self._timing, self._monotonic()))
                raise
            self._set(life.renewed(self._hold, outcome, sent_at, self._timing, self._monotonic()))
            return outcome

    def end(self, write: Callable[[int], bool]) -> Outcome:
        with self._lock:
            if not life.may_write(self._hold, self._monotonic()):
                self._set(self._hold.held(self._monotonic()))
                return Outcome.REFUSED
            outcome = Outcome.APPLIED if write(self._hold.counter) else Outcome.REFUSED
            self._set(life.finished_end(self._hold, outcome))
            return outcome

    def release(self, write: Callable[[int], bool]) -> bool:
        with self._lock:
            applied = write(self._hold.counter)
            self._set(life.finished_release(self._hold, Outcome.APPLIED if applied else Outcome.REFUSED))
            return applied

    def writing(self):
        """Hold the write lock across a decision and its writes (e.g. a refusal and the re-read after it)."""
        return self._lock

    def reinstate(self, current: Lease | None) -> bool:
        with self._lock:
            hold = life.reinstated(self._hold, current)
            if hold is not None:
                self._set(hold)
            return hold is not None

    def mark_ended(self) -> None:
        with self._lock:
            self._set(self._hold.ended_by_pipeline())

    def wait_lost(self, timeout: float) -> bool:
        with self._lock:
            if self._hold.lost is None:
                self._changed.wait(timeout)
            return self._hold.lost is not None

    def _set(self, hold: LeaseHold) -> None:
        if hold != self._hold:
            self._hold = hold
            self._changed.notify_all()


class _Checkpointer:
    def __init__(self, worker: "LeaseWorker"):
        self._w = worker

    def _target(self, sequence_number: str | None, sub_sequence_number: int) -> Checkpoint | None:
        """The checkpoint asked for; no argument means the last record delivered (None before any)."""
        if sequence_number is None:
            return self._w.last_delivered
        return Checkpoint(sequence_number, sub_sequence_number)

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> bool:
        """Durable now: a fenced write of the holder (it renews the lease too, as Java's checkpoint does)."""
        cp = self._target(sequence_number, sub_sequence_number)
        if cp is None:
            return False
        ok = self._w.write_checkpoint(cp)
        log.debug("checkpoint %s %s -> %s", self._w.lease_key, cp, ok)
        return ok

    def checkpoint_at_next_heartbeat(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> None:
        cp = self._target(sequence_number, sub_sequence_number)
        if cp is not None:
            with self._w.pending_lock:
                self._w.pending_checkpoint = cp

    def end_shard(self) -> None:
        """SHARD_END is written, fenced, as soon as `shard_ended` returns (a refusal: the lease was lost)."""
        if not self._w.shard_end_reached:
            raise RuntimeError("end_shard() is only valid once every record of the shard was delivered")
        self._w.end_requested = True


class LeaseWorker:
    """Works one lease in the current process. `run()` returns a WorkerResult; it never raises.

    `observed` is the lease as the manager's scan saw it: acquire is conditioned on its owner and counter.
    `stolen`: it was taken from a live holder (see LifeSettings.stolen); `handoff`: by asking that holder
    for a graceful hand-off first (LifeSettings.handoff_from).
    """

    def __init__(self, config: ConsumerConfig, observed: Lease, processor: RecordProcessor, *,
                 keepalive: Callable[[], float] | None = None, keepalive_timeout: float | None = None,
                 stop: threading.Event | None = None, monotonic: Callable[[], float] = time.monotonic,
                 stolen: bool = False, handoff: bool = False):
        self.config = config
        self.lease_key = observed.lease_key
        self.observed = observed
        self.scope = scope_of(config.streams, observed.lease_key)  # its stream, and the shard id the API knows
        # Unique to this worker process: an ambiguous acquire is ours only if the item carries it.
        self.claim = uuid.uuid4().hex
        self.processor = processor
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.stop = stop or threading.Event()
        self.monotonic = monotonic
        self.timing = LeaseTiming(config.lease_expiry_seconds, config.validity_margin)
        self.settings = LifeSettings(self.timing, config.initial_position.checkpoint(), config.heartbeat_seconds,
                                     config.parent_drained_attribute, stolen,
                                     observed.lease_owner if handoff else None)
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, lease_table_client(config))
        # Few retries for metrics: a CloudWatch outage must not stall delivery.
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id,
                               naming=config.metrics_naming)
        self.kpl_stats = KplStats()
        self._counted: dict[str, int] = {}
        self.lease: _HeldLease | None = None
        self.reader: ShardReader | None = None
        self.last_delivered: Checkpoint | None = None
        self.checkpointed: Checkpoint | None = None
        self.shard_end_reached = False
        self.end_requested = False
        self.pending_checkpoint: Checkpoint | None = None
        self.pending_lock = threading.Lock()
        self.heartbeat_attribute_errors = 0
        # delivered bytes → throughputKBps on heartbeats (balance.py), continuing the previous holder's average
        self.throughput = ThroughputMeter(smoothed=reported_load(observed))
        self._throughput_lock = threading.Lock()
        self._heartbeat_thread: threading.Thread | None = None
        self._checkpointer = _Checkpointer(self)
        self._parent_pid = os.getppid()
        self._handlers: dict[type, Callable[[Any], Any]] = {
            life.Acquire: self._acquire, life.ReadLeases: self._read_leases, life.GetLease: self._get_lease,
            life.InitiateHandoff: self._initiate_handoff, life.FinishHandoff: self._finish_handoff,
            life.CancelHandoff: lambda e: self.table.cancel_handoff(
                self.lease_key, self.config.worker_id, e.asked.extra.get(HANDOFF_ATTRIBUTE), e.asked.lease_counter,
                self.claim),
            life.ReleaseObserved: lambda e: self.table.release(self.lease_key, self.config.worker_id,
                                                               e.lease.lease_counter),
            life.Clock: lambda e: (self.monotonic(), self._should_stop()),
            life.Check: self._check, life.Wait: lambda e: self.stop.wait(e.seconds),
            life.WaitForChange: lambda e: self.lease.wait_lost(e.seconds),
            life.StartHeartbeats: self._start_heartbeats, life.Begin: self._begin, life.Poll: self._poll,
            life.Deliver: self._deliver, life.ShardEnded: self._shard_ended, life.Notify: self._notify,
            life.Renew: self._renew, life.End: self._end, life.Release: lambda e: self._release_quietly(e.unsettled),
            life.Reinstate: lambda e: self.lease.reinstate(e.current), life.MarkEnded: lambda e: self.lease.mark_ended(),
            life.OwnerlessCheckpoint: lambda e: self.table.checkpoint(
                self.lease_key, e.checkpoint, unless_held_by_another=self.config.worker_id),
            life.Checkpointed: self._checkpointed, life.TakePending: self._take_pending,
            life.RestorePending: lambda e: self._restore_pending(e.checkpoint),
            life.Attributes: lambda e: self._heartbeat_attributes(),
            life.AttributesRejected: lambda e: self._attribute_error(e.error),
            life.HeartbeatFailed: self._heartbeat_failed,
            life.ListShards: lambda e: self.scope.shards(list_shards(self.kinesis, self.scope.stream)),
            life.Scan: lambda e: self.table.scan(), life.Create: lambda e: self.table.create(e.lease),
            life.Locked: self._locked,
        }

    # -- the lease's life ----------------------------------------------------------------------
    def run(self) -> WorkerResult:
        try:
            result = self._drive(life.lease_life(self.observed, self.settings, self.config.worker_id))
        except Exception as exc:  # a bug in the I/O itself: still say why, and give the lease back
            log.exception("worker for %s failed", self.lease_key)
            self._release_quietly()
            result = WorkerResult(self.lease_key, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            self.stop.set()  # stops the heartbeat thread
            if self._heartbeat_thread is not None:
                self._heartbeat_thread.join(timeout=self.config.heartbeat_seconds + 5)
            self.metrics.flush()
        if result.outcome == "failed":
            log.error("worker for %s failed: %s", self.lease_key, result.detail)
        elif result.outcome == "lease_lost":
            log.warning("%s: lease lost (%s); stopped delivering", self.lease_key, result.detail)
        else:
            log.info("%s: %s %s (checkpoint %s)", self.lease_key, result.outcome, result.detail, self.checkpointed)
        return result

    def _drive(self, coroutine):
        return life.drive(coroutine, self._handle)

    def _handle(self, effect):
        return self._handlers[type(effect)](effect)

    def _locked(self, effect: life.Locked):
        with self.lease.writing():
            return self._drive(effect.body)

    def _acquire(self, effect: life.Acquire) -> Lease | None:
        observed = effect.observed or self.observed
        sent_at = self.monotonic()
        lease = self.table.acquire(self.lease_key, self.config.worker_id, observed.lease_owner,
                                   observed.lease_counter, claim=self.claim)
        if lease is not None:
            self.lease = _HeldLease(LeaseHold.acquired(lease, sent_at, self.timing), self.timing, self.monotonic)
            log.info("acquired lease %s (counter %d, checkpoint %s, previous owner %s)", self.lease_key,
                     lease.lease_counter, lease.checkpoint, self.observed.lease_owner)
        return lease

    def _initiate_handoff(self, _effect) -> Lease | None:
        asked = self.table.initiate_handoff(self.lease_key, self.config.worker_id, self.observed.lease_owner,
                                            self.observed.lease_counter, self.claim)
        if asked is not None:
            log.info("%s: asked %s for a graceful hand-off", self.lease_key, self.observed.lease_owner)
        return asked

    def _finish_handoff(self, effect: life.FinishHandoff) -> bool:
        _, hold = self.lease.current()
        return self.table.finish_handoff(self.lease_key, self.config.worker_id, hold.counter, effect.checkpoint)

    def _read_leases(self, effect: life.ReadLeases) -> dict[str, Lease | None]:
        return {key: self.table.get(key) for key in effect.keys}

    def _get_lease(self, _effect) -> Lease | None:
        return self.table.get(self.lease_key)

    def _check(self, _effect) -> life.Status:
        now, hold = self.lease.current()
        return life.Status(now, hold, self._should_stop())

    def _start_heartbeats(self, _effect) -> None:
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.lease_key}",
                                                  daemon=True)
        self._heartbeat_thread.start()

    def _begin(self, effect: life.Begin) -> None:
        lease = effect.lease
        scope = self.scope
        shard_id = scope.shard_id(self.lease_key)
        if scope.identifier is not None and stream_scope(self.kinesis, scope.stream) != scope:
            # The stream was deleted and re-created: its shard ids repeat, but this lease's checkpoint is of
            # the old stream. Fail (the lease is released); the new stream's leases carry its new creation time.
            raise StreamRecreated(f"stream {scope.name} is no longer {scope.identifier} (deleted or re-created): "
                                  f"lease {self.lease_key} is not read")
        self.processor.initialize(InitializationInput(
            shard_id, self.config.worker_id, lease.checkpoint, lease.child_shard_ids, dict(lease.extra),
            stream=scope.identifier))
        self.reader = ShardReader(self.kinesis, scope.stream, shard_id, self._start_position(lease),
                                  polling_interval=self.config.polling_interval_seconds,
                                  idle_interval=self.config.idle_interval_seconds,
                                  max_records=self.config.max_records_per_call, kpl_stats=self.kpl_stats,
                                  sleep=self._interruptible_sleep)

    def _start_position(self, lease: Lease) -> Checkpoint:
        resume = getattr(self.processor, "resume_position", None)
        start = life.start_position(lease.checkpoint, resume() if resume else None)
        if start != lease.checkpoint:
            log.info("%s: resuming after the last landed record %s (lease checkpoint %s)",
                     self.lease_key, start, lease.checkpoint)
        return start

    def _poll(self, _effect):
        return self.reader.poll()

    def _deliver(self, effect: life.Deliver) -> None:
        batch = effect.batch
        if batch.records:
            # checkpoint() with no argument means "the last record of this batch" (Java KCL's meaning).
            self.last_delivered = batch.records[-1].checkpoint
        if batch.shard_ended:
            self.shard_end_reached = True
        # Empty polls are delivered too: they tell the processor the shard is idle / caught up.
        self.processor.process_records(ProcessRecordsInput(batch.records, batch.millis_behind_latest,
                                                           self._checkpointer, batch.service_time_ms))
        self.metrics.record_lease(self.lease_key, batch.millis_behind_latest, batch.bytes, len(batch.records))
        with self._throughput_lock:
            self.throughput.add(batch.bytes)
        self._count_operational(self.reader)
        self.metrics.flush_due()

    def _shard_ended(self, _effect) -> bool:
        self.end_requested = False
        self.processor.shard_ended(self._checkpointer)
        return self.end_requested

    def _notify(self, effect: life.Notify) -> None:
        if effect.event == "lease_lost":
            self.processor.lease_lost()
        else:
            self.processor.shutdown_requested(self._checkpointer)

    def _renew(self, effect: life.Renew) -> Outcome:
        key, me, attributes, cp = self.lease_key, self.config.worker_id, effect.attributes, effect.checkpoint
        with self._throughput_lock:
            kbps = self.throughput.take(self.monotonic())
        return self.lease.renew(lambda counter: self.table.heartbeat(key, me, counter, attributes, checkpoint=cp,
                                                                     throughput_kbps=kbps))

    def _end(self, _effect) -> Outcome:
        return self.lease.end(lambda counter: self.table.end(self.lease_key, self.config.worker_id, counter))

    def _checkpointed(self, effect: life.Checkpointed) -> None:
        self.checkpointed = effect.checkpoint

    def _take_pending(self, _effect) -> Checkpoint | None:
        with self.pending_lock:
            cp, self.pending_checkpoint = self.pending_checkpoint, None
        return cp

    def _count_operational(self, reader: ShardReader) -> None:
        """Feed the deltas of the reader's and the deaggregator's counters to the metrics."""
        current = {**self.kpl_stats.as_metrics(), "throttles": reader.stats.throttles,
                   "expired_iterators": reader.stats.expired_iterators,
                   "ambiguous_lease_writes": self.table.ambiguous_writes,
                   "heartbeat_attribute_errors": self.heartbeat_attribute_errors}
        delta = {name: value - self._counted.get(name, 0) for name, value in current.items()
                 if value != self._counted.get(name, 0)}
        if delta:
            self.metrics.count_many(delta, self.lease_key)
            self._counted = current

    # -- writes ----------------------------------------------------------------------------------
    def write_checkpoint(self, cp: Checkpoint) -> bool:
        """The holder's synchronous checkpoint: a fenced heartbeat carrying it. False when it would not
        advance; LeaseLost when the lease is no longer ours."""
        return self._locked(life.Locked(life.write_checkpoint(cp)))

    def _release_quietly(self, unsettled: bool = False) -> bool:
        if self.lease is None:
            return False
        try:
            return self.lease.release(
                lambda counter: self.table.release(self.lease_key, self.config.worker_id, counter, unsettled))
        except Exception as exc:
            log.warning("%s: could not release the lease: %s", self.lease_key, exc)
            return False

    # -- heartbeat thread ----------------------------------------------------------------------
    def _heartbeat_attributes(self) -> Mapping[str, Any] | None:
        """The processor's progress attributes; on any failure none (a plain heartbeat), counted and logged."""
        attrs_fn = getattr(self.processor, "heartbeat_attributes", None)
        if attrs_fn is None:
            return None
        try:
            attrs = attrs_fn()
            if attrs:
                check_heartbeat_attributes(attrs)
                for value in attrs.values():
                    encode_value(value)
            return attrs
        except Exception as exc:
            self._attribute_error(exc)
            return None

    def _attribute_error(self, exc: Exception) -> None:
        self.heartbeat_attribute_errors += 1
        log.error("%s: heartbeat attributes unusable (%s: %s); heartbeating without them", self.lease_key,
                  type(exc).__name__, exc)

    def _heartbeat_failed(self, effect: life.HeartbeatFailed) -> None:
        exc = effect.error
        now, hold = self.lease.current()
        log.warning("%s: heartbeat error (%s: %s); lease valid for %.1fs more", self.lease_key, type(exc).__name__,
                    exc, max(0.0, hold.valid_until - now))

    def _heartbeat_once(self) -> None:
        """One heartbeat (lease_life.heartbeat_once)."""
        self._drive(life.heartbeat_once())

    def _heartbeat_loop(self) -> None:
        period = self.config.heartbeat_seconds
        while not self.stop.wait(period):
            self._heartbeat_once()
            if not life.heartbeats_continue(self.lease.hold):
                return

    def _restore_pending(self, cp: Checkpoint | None) -> None:
        with self.pending_lock:
            if cp is not None and self.pending_checkpoint is None:
                self.pending_checkpoint = cp

    # -- stopping ----------------------------------------------------------------------------------
    def _should_stop(self) -> bool:
        if self.stop.is_set():
            return True
        if os.getppid() != self._parent_pid:
            log.warning("%s: parent process died; stopping", self.lease_key)
            self.stop.set()
        elif self.keepalive is not None and self.keepalive_timeout is not None:
            if time.time() - self.keepalive() > self.keepalive_timeout:
                log.warning("%s: manager stopped refreshing the keep-alive for %.0fs; stopping",
                            self.lease_key, self.keepalive_timeout)
                self.stop.set()
        return self.stop.is_set()

    def _interruptible_sleep(self, seconds: float) -> None:
        self.stop.wait(seconds)


# What `ps -o comm` / `top` show for a lease worker (Linux; 15 characters at most), so an operator tells
# them apart from the other spawned processes of a code server (Dagster's run workers are spawned too).
WORKER_PROCESS_NAME = "kcl-lease"


def name_process(name: str) -> None:
    """Best effort: set this process's short name (/proc/self/comm); elsewhere a no-op."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass


def worker_main(config: ConsumerConfig, observed: Lease, spec: ProcessorSpec,
                results, keepalive=None, keepalive_timeout: float | None = None,
                log_level: int = logging.INFO, stolen: bool = False, handoff: bool = False) -> None:
    """Entry point of a worker process (multiprocessing spawn)."""
    lease_key = observed.lease_key
    name_process(WORKER_PROCESS_NAME)
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [worker {lease_key}] %(message)s")
    stop = threading.Event()
    stop_on_signals(stop, lambda name: log.info("%s: signal %s: graceful shutdown", lease_key, name))
    try:
        processor = spec.build()
    except Exception as exc:
        results.put(WorkerResult(lease_key, "failed", f"cannot build processor {spec.target}: {exc}"))
        return
    ka = (lambda: keepalive.value) if keepalive is not None else None
    worker = LeaseWorker(config, observed, processor, keepalive=ka,
                         keepalive_timeout=keepalive_timeout, stop=stop, stolen=stolen, handoff=handoff)
    result = worker.run()
    results.put(result)
