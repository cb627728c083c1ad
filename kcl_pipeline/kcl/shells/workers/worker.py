"""The lease worker: one process per lease (acquire · heartbeat · read · deliver · checkpoint · end · release).

Every decision of a lease's life is made by the coroutines of lease_life.py; `LeaseWorker` is their shell:
it answers each effect (the handlers below) with the lease table, the shard reader and the processor. The
heartbeat runs concurrently with the delivery loop, so a slow processor never lets the lease expire.
Delivery is gated on the lease being valid: once a heartbeat fails (condition failed: someone took the
lease, or the shard was ended) or none succeeded within the expiry, the worker stops delivering at once and
tells the processor `lease_lost`.

One shell, two transports (transport.py). Where a handler needs the machinery it runs on — a request to a
service, a sleep, the lease's write lock, the heartbeat's concurrency — it yields a transport step instead
of doing it. In production `Threads` answers them: the real clients, a heartbeat thread, a re-entrant
lock. The deterministic simulation (sim/actors/consumer.py) runs these very handlers with simulated services,
engine tasks and virtual time: nothing of this module is re-implemented there.

A worker also stops by itself (gracefully: shutdown_requested, release) when its manager stops
refreshing the keep-alive, or when its parent process dies (the host, or the forkserver it was forked from,
which exits with the host: worker_processes.py): a Dagster code server that reloads or is killed never leaves
workers behind holding leases.
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Generator, Mapping, Protocol

from ...config import ConsumerConfig
from ...core import coverage
from ...core.fleet.balance import ThroughputMeter, reported_load
from ...core.lease import effects as fx
from ...core.lease import lease_life as life
from ...core.lease.lease_hold import CurrentHold, LeaseHold, LeaseTiming, Outcome
from ...core.lease.lease_life import LifeOutcome, LifeResult, LifeSettings
from ...core.model import Checkpoint, Lease
from ...core.streams import StreamRecreated, scope_of
from ...core.table.lease_codec import encode_value
from ...core.table.lease_rules import HANDOFF_ATTRIBUTE, check_heartbeat_attributes
from ...processor import InitializationInput, ProcessRecordsInput, RecordProcessor
from ...records.kpl import KplStats
from ..aws import client
from ..lease_table import LeaseTable
from ..metrics import Metrics
from ..read.reader import ReadBatch
from ..read.retrieval import RecordReader, close_reader, open_reader
from ..shards import list_shards, stream_scope
from ..signals import stop_on_signals
from ..transport import (
    KINESIS,
    AwaitLoss,
    Background,
    Blocking,
    Call,
    Exclusive,
    Guard,
    Join,
    Sleep,
    Step,
    StopFlag,
    returning,
)
from .worker_processes import HeapTrimmer, detach_from_server, pin_mmap_threshold

log = logging.getLogger(__name__)

Steps = Generator[Any, Any, Any]


@dataclass(frozen=True)
class ProcessorSpec:
    """A picklable recipe for a record processor: `module:attr` called with kwargs in the worker process."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> RecordProcessor:
        module, _, attr = self.target.partition(":")
        if not attr:
            raise ValueError(f"processor target {self.target!r} must look like 'package.module:Factory'")
        processor = getattr(importlib.import_module(module), attr)(**self.kwargs)
        if not isinstance(processor, RecordProcessor):
            raise TypeError(f"{self.target} built {type(processor).__name__}, which lacks hooks of a RecordProcessor "
                            "(subclass kcl_pipeline.kcl.processor.RecordProcessor for the optional ones' defaults)")
        return processor


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


# What a worker tells its manager when it stops (its outcome: a LifeOutcome).
WorkerResult = LifeResult


class WorkerTransport(Protocol):
    """What a worker's shell needs of the machinery it runs on (production: `Threads`; the simulation's
    worker process). Besides these, it answers the steps of transport.py."""

    table: LeaseTable
    kinesis: Any
    metrics: Metrics
    heap: HeapTrimmer

    @property
    def stop(self) -> StopFlag: ...

    @property
    def guard(self) -> Guard:
        """Guards the hold against the other thread (re-entrant)."""
        ...

    def bind(self, handle: Callable[[Any], Any]) -> None:
        """The shell's handler of effects (the transport hands effects its sub-steps yield back to it)."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def parent_alive(self) -> bool: ...

    def open_reader(self, stream: str, shard_id: str, start: Checkpoint, kpl_stats: KplStats) -> RecordReader:
        """The shard's reader from `start`, its sleeps interruptible by stop, on this transport's clocks."""
        ...

    def hold_changed(self) -> None:
        """Wake whoever awaits a change of the hold (`AwaitLoss`)."""

    def run(self, coroutine: Steps) -> Any:
        """Run steps synchronously on the calling thread (a processor's `checkpoint()`)."""
        ...


class HeldLease:
    """The worker's lease hold (the core's `CurrentHold`) as its I/O meets it: the lock the heartbeat and the
    delivery loop share, the clock read around each fenced write, and the change notification.

    Every fenced write goes through it, one at a time under the lease's write lock (`Exclusive`): each is
    conditioned on the counter the previous one left, so two writes in flight would fence each other out.
    Its send time is read before the request; whether it may be sent, and what its outcome makes of the
    hold, are `LeaseHold`'s rules.
    """

    def __init__(self, timing: LeaseTiming, monotonic: Callable[[], float] = time.monotonic,
                 guard: Guard | None = None, changed: Callable[[], None] | None = None):
        self.state = CurrentHold(changed) if changed is not None else CurrentHold()
        self._timing = timing
        self._monotonic = monotonic
        self._guard = guard if guard is not None else threading.RLock()

    @property
    def acquired(self) -> bool:
        return self.state.acquired

    @property
    def hold(self) -> LeaseHold:
        with self._guard:
            return self.state.hold

    def install(self, lease: Lease, sent_at: float) -> None:
        """The lease was acquired by a write sent at `sent_at`."""
        with self._guard:
            self.state.move(LeaseHold.acquired(lease, sent_at, self._timing))

    def current(self) -> tuple[float, LeaseHold]:
        """The clock and the hold as of now (lost once its validity passed)."""
        with self._guard:
            now = self._monotonic()
            return now, self.state.move(self.state.hold.held(now))

    def renew(self, send: Callable[[int], Step]) -> Steps:
        """One fenced counter-moving write, `send(counter)` its request (→ applied); errors pass through."""
        return (yield Exclusive(self._renew(send)))

    def _renew(self, send: Callable[[int], Step]) -> Steps:
        hold = self.state.hold
        if not hold.may_write(self._monotonic()):
            coverage.hit("shell.renew.not-sent-past-validity")
            self.state.move(hold.held(self._monotonic()))
            return Outcome.REFUSED
        sent_at = self._monotonic()  # before the request: validity counts from the send, never the answer
        try:
            outcome = Outcome.APPLIED if (yield send(hold.counter)) else Outcome.REFUSED
        except Exception:
            coverage.hit("shell.renew.error")
            self.state.move(self.state.hold.after_renew(Outcome.ERROR, sent_at, self._timing, self._monotonic()))
            raise
        coverage.hit("shell.renew.applied" if outcome is Outcome.APPLIED else "shell.renew.refused")
        self.state.move(self.state.hold.after_renew(outcome, sent_at, self._timing, self._monotonic()))
        return outcome

    def end(self, send: Callable[[int], Step]) -> Steps:
        return (yield Exclusive(self._end(send)))

    def _end(self, send: Callable[[int], Step]) -> Steps:
        hold = self.state.hold
        if not hold.may_write(self._monotonic()):
            coverage.hit("shell.end.not-sent-past-validity")
            self.state.move(hold.held(self._monotonic()))
            return Outcome.REFUSED
        outcome = Outcome.APPLIED if (yield send(hold.counter)) else Outcome.REFUSED
        self.state.move(self.state.hold.after_end(outcome))
        return outcome

    def release(self, send: Callable[[int], Step]) -> Steps:
        return (yield Exclusive(self._release(send)))

    def _release(self, send: Callable[[int], Step]) -> Steps:
        applied = yield send(self.state.hold.counter)
        coverage.hit("shell.release.applied" if applied else "shell.release.refused")
        self.state.move(self.state.hold.after_release(Outcome.APPLIED if applied else Outcome.REFUSED))
        return applied


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
    """Works one lease: the shell of a lease's life. `run()` returns a WorkerResult; it never raises.

    `spawn` is the manager's decision, all the worker takes from it: its lease as the manager's scan saw it
    (acquire is conditioned on its owner and counter), whether it was taken from a live holder (see
    LifeSettings.stolen), and whether by asking that holder for a graceful hand-off first
    (LifeSettings.handoff_from). `transport`: what it runs on (production's threads and real clients by
    default); `claim`: its acquire claim (unique per process by default).
    """

    def __init__(self, config: ConsumerConfig, spawn: fx.Spawn, processor: RecordProcessor, *,
                 keepalive: Callable[[], float] | None = None, keepalive_timeout: float | None = None,
                 stop: threading.Event | None = None, monotonic: Callable[[], float] = time.monotonic,
                 transport: WorkerTransport | None = None, claim: str | None = None):
        self.config = config
        self.spawn = spawn
        observed = spawn.lease
        self.lease_key = observed.lease_key
        self.observed = observed
        self.scope = scope_of(config.streams, observed.lease_key)  # its stream, and the shard id the API knows
        # Unique to this worker process: an ambiguous acquire is ours only if the item carries it.
        self.claim = claim or uuid.uuid4().hex
        self.processor = processor
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.transport: WorkerTransport = transport if transport is not None else Threads(config, stop, monotonic)
        self.transport.bind(self._handle)
        self.stop = self.transport.stop
        self.monotonic = self.transport.monotonic
        self.timing = LeaseTiming(config.lease_expiry_seconds, config.validity_margin)
        self.settings = LifeSettings(self.timing, config.initial_position.checkpoint(), config.heartbeat_seconds,
                                     config.parent_drained_attribute, spawn.stolen,
                                     observed.lease_owner if spawn.handoff else None)
        self.kinesis = self.transport.kinesis
        self.table = self.transport.table
        self.metrics = self.transport.metrics
        self.kpl_stats = KplStats()
        self._counted: dict[str, int] = {}
        # The hold, installed by the acquire; shared by the delivery loop and the heartbeat.
        self.lease = HeldLease(self.timing, self.monotonic, self.transport.guard, self.transport.hold_changed)
        self._told_handing = False  # logged that the lease is being handed off
        self.reader: RecordReader | None = None
        self.last_delivered: Checkpoint | None = None
        self.shard_end_reached = False
        self.end_requested = False
        self.pending_checkpoint: Checkpoint | None = None
        self.pending_lock = threading.Lock()
        self.heartbeat_attribute_errors = 0
        # delivered bytes → throughputKBps on heartbeats (balance.py), continuing the previous holder's average
        # from the lease as taken (`_acquire`)
        self.throughput = ThroughputMeter()
        self._throughput_lock = threading.Lock()
        self._heartbeats: Any = None  # the heartbeat's concurrent activity, once started
        self._checkpointer = _Checkpointer(self)
        self.heap = self.transport.heap

    # -- the lease's life ----------------------------------------------------------------------
    def run(self) -> WorkerResult:
        try:
            return self.transport.run(self.work())
        finally:
            self.stop.set()
            close_reader(self.reader)  # a fan-out subscription's connection and thread

    def work(self) -> Steps:
        """The worker process's whole work: the lease's life, then the heartbeat stopped; a failure of the I/O
        itself still gives the lease back."""
        try:
            result = yield from life.lease_life(self.observed, self.settings, self.lease.state, self.config.worker_id)
        except Exception as exc:  # a bug in the I/O itself: still say why, and give the lease back
            log.exception("worker for %s failed", self.lease_key)
            coverage.hit("shell.worker.failed-released")
            yield from self._release_quietly()
            result = WorkerResult(self.lease_key, LifeOutcome.FAILED, f"{type(exc).__name__}: {exc}")
        self.stop.set()  # stops the heartbeat
        if self._heartbeats is not None:
            yield Join(self._heartbeats, self.config.heartbeat_seconds + 5)
        if result.kept and self.lease.state.acquired:
            # A heartbeat sent after the life ended moved the counter the manager holds the lease at: report the
            # hold as it stands now that the heartbeats stopped.
            hold = self.lease.state.hold
            kept = hold.heartbeats_continue()
            result = replace(result, left_at=hold.counter if kept else None, kept=kept)
        self.metrics.flush()
        if result.outcome is LifeOutcome.FAILED:
            log.error("worker for %s failed: %s", self.lease_key, result.detail)
        elif result.outcome is LifeOutcome.LEASE_LOST:
            log.warning("%s: lease lost (%s); stopped delivering", self.lease_key, result.detail)
        else:
            log.info("%s: %s %s (checkpoint %s)", self.lease_key, result.outcome, result.detail, self.checkpointed)
        return result

    @property
    def checkpointed(self) -> Checkpoint | None:
        """The last checkpoint the table holds from this worker (as its life noted it)."""
        return self.lease.state.checkpointed

    def _handle(self, effect: fx.LifeEffect[object]) -> Any:
        return self.HANDLERS[type(effect)](self, effect)

    def _locked(self, effect: fx.Locked) -> Steps:
        return (yield Exclusive(effect.body))

    def _acquire(self, effect: fx.Acquire) -> Steps:
        observed = effect.observed or self.observed
        sent_at = self.monotonic()
        lease = yield Call("acquire", lambda: self.table.acquire(self.lease_key, self.config.worker_id,
                                                                 observed.lease_owner, observed.lease_counter,
                                                                 claim=self.claim))
        if lease is not None:
            self.lease.install(lease, sent_at)
            with self._throughput_lock:
                # The average goes on from the report the lease carries as taken (its previous holder's
                # last): the one observed when the take was decided is a scan, a spawn and a start older,
                # and on a quieting stream that older, higher load made the taker look overloaded.
                self.throughput.continue_from(reported_load(lease))
            log.info("acquired lease %s (counter %d, checkpoint %s, previous owner %s)", self.lease_key,
                     lease.lease_counter, lease.checkpoint, self.observed.lease_owner)
        return lease

    def _initiate_handoff(self, effect: fx.InitiateHandoff) -> Steps:
        observed = effect.observed or self.observed
        holder = observed.lease_owner
        if holder is None:  # a hand-off is asked of a live holder only (LifeSettings.handoff_from)
            raise ValueError(f"{self.lease_key}: a hand-off needs a holder, the lease was observed free")
        asked = yield Call("initiate-handoff", lambda: self.table.initiate_handoff(
            self.lease_key, self.config.worker_id, holder, observed.lease_counter, self.claim))
        if asked is not None:
            log.info("%s: asked %s for a graceful hand-off", self.lease_key, holder)
        return asked

    def _finish_handoff(self, effect: fx.FinishHandoff) -> Steps:
        return (yield Call("finish-handoff", lambda: self.table.finish_handoff(
            self.lease_key, self.config.worker_id, effect.counter, effect.checkpoint)))

    def _renew_asked(self, _effect: fx.RenewAsked) -> Steps:
        key, me = self.lease_key, self.config.worker_id
        if not self._told_handing:
            self._told_handing = True
            log.info("%s: asked to hand off to %s: delivery stops, renewing until the hand-off's last write",
                     self.lease_key, self.lease.hold.handing_to)
        return (yield from self.lease.renew(lambda counter: Call("renew-asked", lambda: self.table.renew_asked(
            key, me, counter))))

    def _cancel_handoff(self, effect: fx.CancelHandoff) -> Steps:
        asked = effect.asked
        holder = asked.extra.get(HANDOFF_ATTRIBUTE)
        if not isinstance(holder, str):  # the asked lease names its holder: the hand-off's request wrote it
            raise ValueError(f"{self.lease_key}: the hand-off asked for names no holder")
        return (yield Call("cancel-handoff", lambda: self.table.cancel_handoff(
            self.lease_key, self.config.worker_id, holder, asked.lease_counter, self.claim)))

    def _release_observed(self, effect: fx.ReleaseObserved) -> Steps:
        counter = effect.lease.lease_counter
        return (yield Call("release", lambda: self.table.release(self.lease_key, self.config.worker_id, counter)))

    def _now(self, _effect: fx.Now) -> float:
        return self.monotonic()

    def _stopping(self, _effect: fx.Stopping) -> bool:
        return self._should_stop()

    def _read_leases(self, effect: fx.ReadLeases) -> Steps:
        return (yield Call("get", lambda: {key: self.table.get(key) for key in effect.keys}))

    def _get_lease(self, _effect: fx.GetLease) -> Steps:
        return (yield Call("get", lambda: self.table.get(self.lease_key)))

    def _check(self, _effect: fx.Check) -> Steps:
        # Under the write lock: a write in flight (a heartbeat) decides the hold this check reads.
        return (yield Exclusive(returning(self._status)))

    def _status(self) -> fx.Status:
        now, hold = self.lease.current()
        return fx.Status(now, hold, self._should_stop())

    def _wait(self, effect: fx.Wait) -> Steps:
        return (yield Sleep(effect.seconds))

    def _wait_for_change(self, effect: fx.WaitForChange) -> Steps:
        held = self.lease
        yield AwaitLoss(effect.seconds, lambda: held.hold.lost is not None)

    def _start_heartbeats(self, _effect: fx.StartHeartbeats) -> Steps:
        self._heartbeats = yield Background(self._heartbeat_loop(), f"heartbeat-{self.lease_key}")

    def _begin(self, effect: fx.Begin) -> Steps:
        lease = effect.lease
        scope = self.scope
        shard_id = scope.shard_id(self.lease_key)
        if scope.identifier is not None and not scope.pinned:  # a pinned identifier is the application's
            current = yield Call("describe-stream", lambda: stream_scope(self.kinesis, scope.stream), KINESIS)
            if current != scope:
                # The stream was deleted and re-created: its shard ids repeat, but this lease's checkpoint is
                # of the old stream. Fail (its manager retries it after a back-off, and it fails again); the new
                # stream's leases carry its new creation time.
                coverage.hit("shell.begin.stream-recreated")
                raise StreamRecreated(f"stream {scope.name} is no longer {scope.identifier} (deleted or "
                                      f"re-created): lease {self.lease_key} is not read")
        self.processor.initialize(InitializationInput(
            shard_id, self.config.worker_id, lease.checkpoint, lease.child_shard_ids, dict(lease.extra),
            stream=scope.identifier))
        self.reader = self.transport.open_reader(scope.stream, shard_id, self._start_position(lease), self.kpl_stats)

    def _start_position(self, lease: Lease) -> Checkpoint:
        start = life.start_position(lease.checkpoint, self.processor.resume_position(),
                                    self.config.initial_position.timestamp_ms)
        if start != lease.checkpoint and not start.is_starting_sentinel:
            log.info("%s: resuming after the last landed record %s (lease checkpoint %s)",
                     self.lease_key, start, lease.checkpoint)
        return start

    def _poll(self, _effect: fx.Poll) -> Steps:
        reader = self.reader
        if reader is None:
            raise RuntimeError(f"{self.lease_key}: polled before the reader was opened")
        return (yield Call("get-records", reader.poll, KINESIS))

    def _deliver(self, effect: fx.Deliver) -> None:
        batch = effect.batch
        if not isinstance(batch, ReadBatch):  # what this shell's reader polled (`_poll`)
            raise TypeError(f"{self.lease_key}: delivered {batch!r}, not a batch of this worker's reader")
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
            self.throughput.add(batch.new_bytes)
        if self.reader is not None:
            self._count_operational(self.reader)
        self.metrics.flush_due()
        if batch.millis_behind_latest == 0:
            self.heap.caught_up(self.monotonic())  # what a backlog left freed goes back to the OS

    def _shard_ended(self, _effect: fx.ShardEnded) -> bool:
        self.end_requested = False
        self.processor.shard_ended(self._checkpointer)
        return self.end_requested

    def _notify(self, effect: fx.Notify) -> None:
        if effect.event is fx.Notification.LEASE_LOST:
            self.processor.lease_lost()
        else:
            self.processor.shutdown_requested(self._checkpointer)

    def _renew(self, effect: fx.Renew) -> Steps:
        key, me, attributes, cp = self.lease_key, self.config.worker_id, effect.attributes, effect.checkpoint
        with self._throughput_lock:
            kbps = self.throughput.take(self.monotonic())
        return (yield from self.lease.renew(lambda counter: Call("heartbeat", lambda: self.table.heartbeat(
            key, me, counter, attributes, checkpoint=cp, throughput_kbps=kbps))))

    def _end(self, _effect: fx.End) -> Steps:
        return (yield from self.lease.end(lambda counter: Call("end", lambda: self.table.end(
            self.lease_key, self.config.worker_id, counter))))

    def _release(self, effect: fx.Release) -> Steps:
        return (yield from self._release_quietly(effect.unsettled))

    def _ownerless_checkpoint(self, effect: fx.OwnerlessCheckpoint) -> Steps:
        return (yield Call("checkpoint", lambda: self.table.checkpoint(
            self.lease_key, effect.checkpoint, unless_held_by_another=self.config.worker_id)))

    def _take_pending(self, _effect: fx.TakePending) -> Checkpoint | None:
        with self.pending_lock:
            cp, self.pending_checkpoint = self.pending_checkpoint, None
        return cp

    def _count_operational(self, reader: RecordReader) -> None:
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
        return bool(self.transport.run(self._locked(fx.Locked(life.write_checkpoint(self.lease.state, cp)))))

    def _release_quietly(self, unsettled: bool = False) -> Steps:
        if not self.lease.acquired:
            return False
        try:
            return (yield from self.lease.release(lambda counter: Call("release", lambda: self.table.release(
                self.lease_key, self.config.worker_id, counter, unsettled))))
        except Exception as exc:
            log.warning("%s: could not release the lease: %s", self.lease_key, exc)
            return False

    # -- heartbeats ------------------------------------------------------------------------------
    def _heartbeat_attributes(self) -> Mapping[str, Any] | None:
        """The processor's progress attributes; on any failure none (a plain heartbeat), counted and logged."""
        try:
            attrs = self.processor.heartbeat_attributes()
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

    def _attributes(self, _effect: fx.Attributes) -> Mapping[str, Any] | None:
        return self._heartbeat_attributes()

    def _attributes_rejected(self, effect: fx.AttributesRejected) -> None:
        self._attribute_error(effect.error)

    def _heartbeat_failed(self, effect: fx.HeartbeatFailed) -> None:
        exc = effect.error
        now, hold = self.lease.current()
        log.warning("%s: heartbeat error (%s: %s); lease valid for %.1fs more", self.lease_key, type(exc).__name__,
                    exc, max(0.0, hold.valid_until - now))

    def _heartbeat_once(self) -> None:
        """One heartbeat (lease_life.heartbeat_once), on the calling thread."""
        self.transport.run(life.heartbeat_once(self.lease.state))

    def _heartbeat_loop(self) -> Steps:
        """The heartbeat's own activity: one heartbeat per period until the worker stops or the hold is
        lost or ended."""
        period = self.config.heartbeat_seconds
        while not (yield Sleep(period)):
            yield from life.heartbeat_once(self.lease.state)
            if not self.lease.hold.heartbeats_continue():
                return
        coverage.hit("shell.heartbeats.stopped-with-the-worker")

    def _restore_pending(self, effect: fx.RestorePending) -> None:
        with self.pending_lock:
            if effect.checkpoint is not None and self.pending_checkpoint is None:
                self.pending_checkpoint = effect.checkpoint

    # -- what the life asks of the table and the stream beyond its lease --------------------------------
    def _list_shards(self, _effect: fx.ListShards) -> Steps:
        return (yield Call("list-shards", lambda: self.scope.shards(list_shards(self.kinesis, self.scope.stream)),
                           KINESIS))

    def _scan(self, _effect: fx.ScanTable) -> Steps:
        sent_at = self.monotonic()
        leases = yield Call("scan", self.table.scan)
        return fx.Scanned(leases, sent_at, self.monotonic())

    def _create(self, effect: fx.Create) -> Steps:
        return (yield Call("create", lambda: self.table.create(effect.lease)))

    # -- stopping ----------------------------------------------------------------------------------
    def _should_stop(self) -> bool:
        if self.stop.is_set():
            return True
        if not self.transport.parent_alive():
            log.warning("%s: parent process died; stopping", self.lease_key)
            coverage.hit("shell.worker.stops-when-its-parent-dies")
            self.stop.set()
        elif self.keepalive is not None and self.keepalive_timeout is not None:
            if self.transport.wall() - self.keepalive() > self.keepalive_timeout:
                log.warning("%s: manager stopped refreshing the keep-alive for %.0fs; stopping",
                            self.lease_key, self.keepalive_timeout)
                coverage.hit("shell.worker.stops-on-a-stale-keep-alive")
                self.stop.set()
        return self.stop.is_set()

    # Every effect a lease's life may yield, and the method that answers it (one per effect type: a test
    # checks this covers every LifeEffect).
    HANDLERS: ClassVar[Mapping[type[fx.LifeEffect[object]], Callable[[Any, Any], Any]]] = {
        fx.Acquire: _acquire, fx.InitiateHandoff: _initiate_handoff, fx.FinishHandoff: _finish_handoff,
        fx.CancelHandoff: _cancel_handoff, fx.ReleaseObserved: _release_observed, fx.Now: _now,
        fx.Stopping: _stopping, fx.ReadLeases: _read_leases, fx.GetLease: _get_lease, fx.Check: _check,
        fx.Wait: _wait, fx.WaitForChange: _wait_for_change, fx.StartHeartbeats: _start_heartbeats,
        fx.Begin: _begin, fx.Poll: _poll, fx.Deliver: _deliver, fx.ShardEnded: _shard_ended, fx.Notify: _notify,
        fx.RenewAsked: _renew_asked, fx.Renew: _renew, fx.End: _end, fx.Release: _release,
        fx.OwnerlessCheckpoint: _ownerless_checkpoint, fx.TakePending: _take_pending,
        fx.RestorePending: _restore_pending, fx.Attributes: _attributes,
        fx.AttributesRejected: _attributes_rejected, fx.HeartbeatFailed: _heartbeat_failed,
        fx.ListShards: _list_shards, fx.ScanTable: _scan, fx.Create: _create, fx.Locked: _locked,
    }


class Threads:
    """Production's transport for a worker process: the real clients, a heartbeat thread, a re-entrant lock
    (the lease's write lock, which also guards the hold), the parent process and the wall clock."""

    def __init__(self, config: ConsumerConfig, stop: threading.Event | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self.stop: threading.Event = stop or threading.Event()
        self.monotonic = monotonic
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, lease_table_client(config))
        # Few retries for metrics: a CloudWatch outage must not stall delivery.
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id,
                               naming=config.metrics_naming)
        self.heap = HeapTrimmer()
        self._driver: Blocking | None = None
        self.guard = threading.RLock()
        self._parent_pid = os.getppid()

    def bind(self, handle: Callable[[Any], Any]) -> None:
        self._driver = Blocking(handle, stop=self.stop, lock=self.guard)

    def run(self, coroutine: Steps) -> Any:
        if self._driver is None:
            raise RuntimeError("the transport is not bound to a worker")
        return self._driver.run(coroutine)

    def wall(self) -> float:
        return time.time()

    def parent_alive(self) -> bool:
        return os.getppid() == self._parent_pid

    def open_reader(self, stream: str, shard_id: str, start: Checkpoint, kpl_stats: KplStats) -> RecordReader:
        # Polling or enhanced fan-out (ConsumerConfig.retrieval): the same batches either way.
        return open_reader(self.config, self.kinesis, stream, shard_id, start, kpl_stats=kpl_stats,
                           sleep=self._interruptible_sleep)

    def hold_changed(self) -> None:
        if self._driver is not None:
            self._driver.hold_changed()

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


def worker_main(config: ConsumerConfig, spawn: fx.Spawn, spec: ProcessorSpec,
                results, keepalive=None, keepalive_timeout: float | None = None,
                log_level: int = logging.INFO) -> None:
    """Entry point of a worker process (forked from the preloaded server, or spawned: worker_processes.py)."""
    detach_from_server()  # else a forked worker keeps its server, its parent, alive after the host died
    pin_mmap_threshold()  # large transient blocks (responses, encoded batches) go back to the OS when freed
    lease_key = spawn.lease.lease_key
    name_process(WORKER_PROCESS_NAME)
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [worker {lease_key}] %(message)s")
    stop = threading.Event()
    stop_on_signals(stop, lambda name: log.info("%s: signal %s: graceful shutdown", lease_key, name))
    try:
        processor = spec.build()
    except Exception as exc:
        results.put(WorkerResult(lease_key, LifeOutcome.FAILED, f"cannot build processor {spec.target}: {exc}"))
        return
    ka = (lambda: keepalive.value) if keepalive is not None else None
    worker = LeaseWorker(config, spawn, processor, keepalive=ka, keepalive_timeout=keepalive_timeout, stop=stop)
    result = worker.run()
    results.put(result)
