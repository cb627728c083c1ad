"""The lease worker: one process per lease (acquire · heartbeat · read · deliver · checkpoint · end · release).

The heartbeat runs on its own thread, independent of record processing, so a slow processor never lets
the lease expire. Delivery is gated on the lease being valid: once a heartbeat fails (condition failed:
someone took the lease, or the shard was ended) or none succeeded within the expiry, the worker stops
delivering at once and tells the processor `lease_lost`.

A worker also stops by itself (gracefully: shutdown_requested, release) when its manager stops
refreshing the keep-alive, or when its parent process dies: a Dagster code server that reloads or is
killed never leaves workers behind holding leases.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from .aws import client
from .config import ConsumerConfig
from .kpl import KplStats
from .lease_hold import LeaseHold, LeaseTiming, Outcome
from .lease_rules import check_heartbeat_attributes
from .lease_table import LeaseTable, LeaseTableError, LeaseTableMissing, LeaseTableUnavailable, encode_value
from .metrics import Metrics
from .model import Checkpoint, Lease
from .planner import blocked_on_parents, child_leases_on_end
from .processor import InitializationInput, ProcessRecordsInput, RecordProcessor
from .reader import ShardReader
from .shards import list_shards

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


@dataclass(frozen=True)
class WorkerResult:
    """What a worker tells its manager when it stops."""

    lease_key: str
    outcome: str  # not_acquired | blocked_on_parents | shard_ended | lease_lost | shutdown | failed
    detail: str = ""
    children_created: tuple[str, ...] = ()


class _HeldLease:
    """The worker's lease (a pure LeaseHold) shared by the heartbeat thread and the delivery loop.

    Every fenced write goes through `write`, one at a time: each is conditioned on the counter the previous
    one left, so two writes in flight would fence each other out.
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

    def valid(self) -> bool:
        with self._lock:
            self._set(self._hold.held(self._monotonic()))
            return self._hold.may_deliver(self._monotonic())

    def renew(self, write: Callable[[int], bool], why_refused: str | None = None) -> Outcome:
        """Run one fenced counter-moving write `write(counter) -> applied`; errors pass through."""
        with self._lock:
            if self._hold.lost is not None or self._hold.ended:
                return Outcome.REFUSED
            sent_at = self._monotonic()
            try:
                outcome = Outcome.APPLIED if write(self._hold.counter) else Outcome.REFUSED
            except Exception:
                self._set(self._hold.after_renew(Outcome.ERROR, sent_at, self._timing, self._monotonic()))
                raise
            kwargs = {"why_refused": why_refused} if why_refused else {}
            self._set(self._hold.after_renew(outcome, sent_at, self._timing, self._monotonic(), **kwargs))
            return outcome

    def finish(self, write: Callable[[int], bool], transition: str) -> bool:
        """A fenced final write (end or release); True when applied."""
        with self._lock:
            if self._hold.lost is not None and transition == "end":
                return False
            applied = write(self._hold.counter)
            outcome = Outcome.APPLIED if applied else Outcome.REFUSED
            self._set(self._hold.after_end(outcome) if transition == "end" else self._hold.after_release(outcome))
            return applied

    def writing(self):
        """Hold the write lock across a decision and its writes (e.g. a refusal and the re-read after it)."""
        return self._lock

    def still_held_after_refusal(self, current: Lease | None) -> bool:
        """A write carrying a checkpoint was refused: if the table still shows our owner and counter, the
        refusal was the checkpoint's own condition (not ahead of the table's), not a lost lease."""
        with self._lock:
            hold = self._hold
            if current is not None and not current.is_ended and current.lease_owner == hold.owner \
                    and current.lease_counter == hold.counter:
                self._set(replace(hold, lost=None))
                return True
            return False

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
        if not self._w.shard_end_reached:
            raise RuntimeError("end_shard() is only valid once every record of the shard was delivered")
        w = self._w
        if not w.lease.finish(lambda counter: w.table.end(w.lease_key, w.config.worker_id, counter), "end"):
            raise LeaseLost(f"{w.lease_key}: SHARD_END refused: the lease is no longer held by this worker")
        w.ended = True


class LeaseLost(Exception):
    """A fenced write was refused: this worker no longer holds its lease."""


class LeaseWorker:
    """Works one lease in the current process. `run()` returns a WorkerResult; it never raises.

    `observed` is the lease as the manager's scan saw it: acquire is conditioned on its owner and counter.
    """

    def __init__(self, config: ConsumerConfig, observed: Lease, processor: RecordProcessor, *,
                 keepalive: Callable[[], float] | None = None, keepalive_timeout: float | None = None,
                 stop: threading.Event | None = None, monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        self.lease_key = observed.lease_key
        self.observed = observed
        self.processor = processor
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.stop = stop or threading.Event()
        self.monotonic = monotonic
        self.timing = LeaseTiming(config.lease_expiry_seconds, config.validity_margin)
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, client("dynamodb", config.aws))
        # Few retries for metrics: a CloudWatch outage must not stall delivery.
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id)
        self.kpl_stats = KplStats()
        self._counted: dict[str, int] = {}
        self.lease: _HeldLease | None = None
        self.last_delivered: Checkpoint | None = None
        self.checkpointed: Checkpoint | None = None
        self.shard_end_reached = False
        self.ended = False
        self.pending_checkpoint: Checkpoint | None = None
        self.pending_lock = threading.Lock()
        self.heartbeat_attribute_errors = 0
        self._parent_pid = os.getppid()

    # -- the lease's life ----------------------------------------------------------------------
    def run(self) -> WorkerResult:
        try:
            return self._run()
        except Exception as exc:  # the manager retries the lease on a later cycle; say why here
            log.exception("worker for %s failed", self.lease_key)
            self._release_quietly()
            return WorkerResult(self.lease_key, "failed", f"{type(exc).__name__}: {exc}")

    def _run(self) -> WorkerResult:
        sent_at = self.monotonic()
        lease = self.table.acquire(self.lease_key, self.config.worker_id, self.observed.lease_owner,
                                   self.observed.lease_counter)
        if lease is None:
            return WorkerResult(self.lease_key, "not_acquired",
                                "the lease changed since it was observed (another consumer moved it first, or it ended)")
        self.lease = _HeldLease(LeaseHold.acquired(lease, sent_at, self.timing), self.timing, self.monotonic)
        log.info("acquired lease %s (counter %d, checkpoint %s, previous owner %s)", self.lease_key,
                 lease.lease_counter, lease.checkpoint, self.observed.lease_owner)
        waiting = self._unfinished_parents(lease)
        if waiting:
            # Java's BlockOnParentShard: never read a child before its parents are finished. Give the lease
            # back at once rather than sit on it; the planner takes it again once the parents are done.
            released = self._release_quietly()
            log.info("%s: parents %s not finished; lease released=%s", self.lease_key, waiting, released)
            return WorkerResult(self.lease_key, "blocked_on_parents", ",".join(waiting))
        hb = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.lease_key}", daemon=True)
        hb.start()
        checkpointer = _Checkpointer(self)
        try:
            self.processor.initialize(InitializationInput(
                self.lease_key, self.config.worker_id, lease.checkpoint, lease.child_shard_ids, dict(lease.extra)))
            return self._deliver(lease, checkpointer)
        finally:
            self.stop.set()  # stops the heartbeat thread
            hb.join(timeout=self.config.heartbeat_seconds + 5)
            self.metrics.flush()

    def _unfinished_parents(self, lease: Lease) -> list[str]:
        """Parents of this lease not yet finished, read now (consistent reads), not from the manager's scan."""
        parents = {p: self.table.get(p) for p in lease.parent_shard_ids}
        return blocked_on_parents(lease, parents, self.config.parent_drained_attribute)

    def _start_position(self, lease: Lease) -> Checkpoint:
        start = lease.checkpoint
        resume = getattr(self.processor, "resume_position", None)
        landed = resume() if resume else None
        if landed is not None and (start.is_starting_sentinel or landed.key() > start.key()):
            log.info("%s: resuming after the last landed record %s (lease checkpoint %s)",
                     self.lease_key, landed, start)
            return landed
        return start

    def _deliver(self, lease: Lease, checkpointer: _Checkpointer) -> WorkerResult:
        state = self.lease
        reader = ShardReader(self.kinesis, self.config.stream, self.lease_key, self._start_position(lease),
                             polling_interval=self.config.polling_interval_seconds,
                             idle_interval=self.config.idle_interval_seconds,
                             max_records=self.config.max_records_per_call, kpl_stats=self.kpl_stats,
                             sleep=self._interruptible_sleep)
        while True:
            if self._should_stop():
                return self._shutdown(checkpointer)
            if not state.valid():
                return self._lost()
            batch = reader.poll()
            if self._should_stop():
                # Records fetched but not delivered are re-read by the next owner (not checkpointed).
                return self._shutdown(checkpointer)
            if not state.valid():  # checked again right before delivering: a freeze may sit in between
                return self._lost()
            if batch.records:
                # checkpoint() with no argument means "the last record of this batch" (Java KCL's meaning).
                self.last_delivered = batch.records[-1].checkpoint
            # Empty polls are delivered too: they tell the processor the shard is idle / caught up.
            self.processor.process_records(ProcessRecordsInput(batch.records, batch.millis_behind_latest, checkpointer,
                                                                batch.service_time_ms))
            self.metrics.record_lease(self.lease_key, batch.millis_behind_latest, batch.bytes, len(batch.records))
            self._count_operational(reader)
            self.metrics.flush_due()
            if batch.shard_ended:
                self.shard_end_reached = True
                if not state.valid():
                    return self._lost()
                self._flush_pending_checkpoint()
                self.processor.shard_ended(checkpointer)
                return self._finish_ended(checkpointer)

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

    def _finish_ended(self, checkpointer: _Checkpointer) -> WorkerResult:
        """After the last record: create the children's leases once the lease is SHARD_END.

        A processor may leave the end to someone else (the landing pipeline ends a shard only after its
        last window is transformed): then the worker keeps heartbeating, idle, until the lease is ended
        (its heartbeat condition fails on SHARD_END), lost, or the worker is asked to stop.
        """
        state = self.lease
        while not self.ended:
            if self._should_stop():
                return self._shutdown(checkpointer)
            if state.wait_lost(min(1.0, self.config.heartbeat_seconds)):
                current = self.table.get(self.lease_key)
                if current is not None and current.is_ended:
                    state.mark_ended()
                    self.ended = True
                    break
                return self._lost()
        children = self._create_children()
        log.info("%s: shard ended; children leases created: %s", self.lease_key, list(children) or "none")
        return WorkerResult(self.lease_key, "shard_ended", children_created=children)

    def _create_children(self) -> tuple[str, ...]:
        shards = list_shards(self.kinesis, self.config.stream)
        leases = self.table.scan()
        created = []
        for child in child_leases_on_end(self.lease_key, shards, leases, self.config.initial_position.checkpoint(),
                                         self.config.parent_drained_attribute):
            if self.table.create(child):
                created.append(child.lease_key)
        return tuple(created)

    # -- writes ----------------------------------------------------------------------------------
    def write_checkpoint(self, cp: Checkpoint) -> bool:
        """The holder's synchronous checkpoint: a fenced heartbeat carrying it. False when it would not
        advance; LeaseLost when the lease is no longer ours."""
        state = self.lease
        with state.writing():
            attrs = self._heartbeat_attributes()
            outcome = state.renew(
                lambda counter: self.table.heartbeat(self.lease_key, self.config.worker_id, counter, attrs, checkpoint=cp))
            if outcome is Outcome.APPLIED:
                self.checkpointed = cp
                return True
            # Refused: not ours any more, or the checkpoint is not ahead of the table's: tell them apart.
            if state.still_held_after_refusal(self.table.get(self.lease_key)):
                return False
        raise LeaseLost(f"{self.lease_key}: checkpoint refused: {state.reason}")

    def _flush_pending_checkpoint(self) -> None:
        """Write a checkpoint still waiting for a heartbeat: fenced while held, else the ownerless forward-only
        write (the records were processed, whoever holds the lease now)."""
        with self.pending_lock:
            cp, self.pending_checkpoint = self.pending_checkpoint, None
        if cp is None:
            return
        if self.lease is not None and self.lease.valid():
            try:
                if self.write_checkpoint(cp):
                    return
            except LeaseLost:
                pass
        if self.table.checkpoint(self.lease_key, cp):
            self.checkpointed = cp

    def _release_quietly(self) -> bool:
        if self.lease is None:
            return False
        try:
            return self.lease.finish(
                lambda counter: self.table.release(self.lease_key, self.config.worker_id, counter), "release")
        except Exception as exc:
            log.warning("%s: could not release the lease: %s", self.lease_key, exc)
            return False

    def _shutdown(self, checkpointer: _Checkpointer) -> WorkerResult:
        if self.lease.valid():
            self.processor.shutdown_requested(checkpointer)
        else:
            self.processor.lease_lost()
        self._flush_pending_checkpoint()
        released = self._release_quietly()
        log.info("%s: shut down; lease released=%s, checkpoint %s", self.lease_key, released, self.checkpointed)
        return WorkerResult(self.lease_key, "shutdown", f"released={released}")

    def _lost(self) -> WorkerResult:
        log.warning("%s: lease lost (%s); stopped delivering", self.lease_key, self.lease.reason)
        self.processor.lease_lost()
        self._flush_pending_checkpoint()
        return WorkerResult(self.lease_key, "lease_lost", self.lease.reason)

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

    def _heartbeat_once(self) -> None:
        """One heartbeat: progress and a pending checkpoint ride along. An attribute the table rejects (an
        item over 400 KB, say) falls back to a plain heartbeat, so the lease never lapses over it."""
        state = self.lease
        with self.pending_lock:
            pending, self.pending_checkpoint = self.pending_checkpoint, None
        key, me = self.lease_key, self.config.worker_id
        try:
            with state.writing():
                attrs = self._heartbeat_attributes()
                try:
                    outcome = state.renew(lambda c: self.table.heartbeat(key, me, c, attrs, checkpoint=pending))
                except LeaseTableError as exc:
                    if not attrs or isinstance(exc, (LeaseTableUnavailable, LeaseTableMissing)):
                        raise
                    self._attribute_error(exc)
                    attrs = None
                    outcome = state.renew(lambda c: self.table.heartbeat(key, me, c, None, checkpoint=pending))
                if outcome is Outcome.APPLIED and pending is not None:
                    self.checkpointed = pending
                elif outcome is Outcome.REFUSED and pending is not None:
                    # Not holder, or the checkpoint is not ahead of the table's: tell them apart.
                    if state.still_held_after_refusal(self.table.get(key)):
                        state.renew(lambda c: self.table.heartbeat(key, me, c, attrs))
                    else:
                        self._restore_pending(pending)  # flushed by _lost: the records were processed
        except Exception as exc:  # transient: the lease stays valid until its validity passes
            log.warning("%s: heartbeat error (%s: %s); lease valid for %.1fs more", key, type(exc).__name__, exc,
                        max(0.0, state.hold.valid_until - self.monotonic()))
            self._restore_pending(pending)
            state.valid()

    def _heartbeat_loop(self) -> None:
        period = self.config.heartbeat_seconds
        while not self.stop.wait(period):
            self._heartbeat_once()
            hold = self.lease.hold
            if hold.lost is not None or hold.ended:
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


def worker_main(config: ConsumerConfig, observed: Lease, spec: ProcessorSpec,
                results, keepalive=None, keepalive_timeout: float | None = None,
                log_level: int = logging.INFO) -> None:
    """Entry point of a worker process (multiprocessing spawn)."""
    lease_key = observed.lease_key
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s [worker {lease_key}] %(message)s")
    stop = threading.Event()

    def _on_signal(signum, _frame):
        log.info("%s: signal %s: graceful shutdown", lease_key, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        processor = spec.build()
    except Exception as exc:
        results.put(WorkerResult(lease_key, "failed", f"cannot build processor {spec.target}: {exc}"))
        return
    ka = (lambda: keepalive.value) if keepalive is not None else None
    worker = LeaseWorker(config, observed, processor, keepalive=ka,
                         keepalive_timeout=keepalive_timeout, stop=stop)
    result = worker.run()
    results.put(result)
