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
from dataclasses import dataclass, field
from typing import Any, Callable

from .aws import client
from .config import ConsumerConfig
from .kpl import KplStats
from .lease_table import LeaseTable
from .metrics import Metrics
from .model import Checkpoint, Lease
from .planner import child_leases_on_end
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
    outcome: str  # not_acquired | shard_ended | lease_lost | shutdown | failed
    detail: str = ""
    children_created: tuple[str, ...] = ()


class LeaseLost(Exception):
    pass


class _Lease:
    """The worker's view of its lease's validity, shared by the heartbeat thread and the delivery loop."""

    def __init__(self, expiry_seconds: float, monotonic: Callable[[], float] = time.monotonic):
        self._expiry = expiry_seconds
        self._monotonic = monotonic
        self._last_ok = monotonic()
        self._lost = threading.Event()
        self.reason = ""

    def renewed(self) -> None:
        self._last_ok = self._monotonic()

    def lose(self, reason: str) -> None:
        if not self._lost.is_set():
            self.reason = reason
            self._lost.set()

    def valid(self) -> bool:
        if self._lost.is_set():
            return False
        if self._monotonic() - self._last_ok >= self._expiry:
            self.lose(f"no successful heartbeat for {self._expiry:.1f}s (lease expiry)")
            return False
        return True

    def wait_lost(self, timeout: float) -> bool:
        return self._lost.wait(timeout)


class _Checkpointer:
    def __init__(self, worker: "LeaseWorker"):
        self._w = worker

    def _target(self, sequence_number: str | None, sub_sequence_number: int) -> Checkpoint | None:
        """The checkpoint asked for; no argument means the last record delivered (None before any)."""
        if sequence_number is None:
            return self._w.last_delivered
        return Checkpoint(sequence_number, sub_sequence_number)

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> bool:
        cp = self._target(sequence_number, sub_sequence_number)
        if cp is None:
            return False
        ok = self._w.table.checkpoint(self._w.lease_key, cp)
        if ok:
            self._w.checkpointed = cp
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
        self._w.table.end(self._w.lease_key)
        self._w.ended = True


class LeaseWorker:
    """Works one lease in the current process. `run()` returns a WorkerResult; it never raises."""

    def __init__(self, config: ConsumerConfig, lease_key: str, last_owner: str | None,
                 processor: RecordProcessor, *, keepalive: Callable[[], float] | None = None,
                 keepalive_timeout: float | None = None, stop: threading.Event | None = None):
        self.config = config
        self.lease_key = lease_key
        self.last_owner = last_owner
        self.processor = processor
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.stop = stop or threading.Event()
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, client("dynamodb", config.aws))
        # Few retries for metrics: a CloudWatch outage must not stall delivery.
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id)
        self.kpl_stats = KplStats()
        self._counted: dict[str, int] = {}
        self.last_delivered: Checkpoint | None = None
        self.checkpointed: Checkpoint | None = None
        self.shard_end_reached = False
        self.ended = False
        self.pending_checkpoint: Checkpoint | None = None
        self.pending_lock = threading.Lock()
        self._parent_pid = os.getppid()

    # -- the lease's life ----------------------------------------------------------------------
    def run(self) -> WorkerResult:
        try:
            return self._run()
        except Exception as exc:  # the manager restarts the lease on a later cycle; say why here
            log.exception("worker for %s failed", self.lease_key)
            return WorkerResult(self.lease_key, "failed", f"{type(exc).__name__}: {exc}")

    def _run(self) -> WorkerResult:
        lease = self.table.acquire(self.lease_key, self.config.worker_id, self.last_owner)
        if lease is None:
            return WorkerResult(self.lease_key, "not_acquired", "another consumer acquired it first")
        log.info("acquired lease %s (checkpoint %s, previous owner %s)", self.lease_key, lease.checkpoint,
                 self.last_owner)
        state = _Lease(self.config.lease_expiry_seconds)
        hb = threading.Thread(target=self._heartbeat_loop, args=(state,), name=f"heartbeat-{self.lease_key}",
                              daemon=True)
        hb.start()
        checkpointer = _Checkpointer(self)
        try:
            self.processor.initialize(InitializationInput(
                self.lease_key, self.config.worker_id, lease.checkpoint, lease.child_shard_ids, dict(lease.extra)))
            if lease.is_ended:
                return self._finish_ended(state, checkpointer, lease)
            outcome = self._deliver(lease, state, checkpointer)
            return outcome
        finally:
            self.stop.set()  # stops the heartbeat thread
            hb.join(timeout=self.config.heartbeat_seconds + 5)
            self.metrics.flush()

    def _start_position(self, lease: Lease) -> Checkpoint:
        start = lease.checkpoint
        resume = getattr(self.processor, "resume_position", None)
        landed = resume() if resume else None
        if landed is not None and (start.is_starting_sentinel or landed.key() > start.key()):
            log.info("%s: resuming after the last landed record %s (lease checkpoint %s)",
                     self.lease_key, landed, start)
            return landed
        return start

    def _deliver(self, lease: Lease, state: _Lease, checkpointer: _Checkpointer) -> WorkerResult:
        reader = ShardReader(self.kinesis, self.config.stream, self.lease_key, self._start_position(lease),
                             polling_interval=self.config.polling_interval_seconds,
                             idle_interval=self.config.idle_interval_seconds,
                             max_records=self.config.max_records_per_call, kpl_stats=self.kpl_stats,
                             sleep=self._interruptible_sleep)
        while True:
            if self._should_stop():
                return self._shutdown(state, checkpointer)
            batch = reader.poll()
            if self._should_stop():
                # Records fetched but not delivered are re-read by the next owner (not checkpointed).
                return self._shutdown(state, checkpointer)
            if not state.valid():
                return self._lost(state)
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
                    return self._lost(state)
                self._flush_pending_checkpoint()
                self.processor.shard_ended(checkpointer)
                return self._finish_ended(state, checkpointer, lease)

    def _count_operational(self, reader: ShardReader) -> None:
        """Feed the deltas of the reader's and the deaggregator's counters to the metrics."""
        current = {**self.kpl_stats.as_metrics(), "throttles": reader.stats.throttles,
                   "expired_iterators": reader.stats.expired_iterators}
        delta = {name: value - self._counted.get(name, 0) for name, value in current.items()
                 if value != self._counted.get(name, 0)}
        if delta:
            self.metrics.count_many(delta, self.lease_key)
            self._counted = current

    def _finish_ended(self, state: _Lease, checkpointer: _Checkpointer, lease: Lease) -> WorkerResult:
        """After the last record: create the children's leases once the lease is SHARD_END.

        A processor may leave the end to someone else (the landing pipeline ends a shard only after its
        last window is transformed): then the worker keeps heartbeating, idle, until the lease is ended
        (its heartbeat condition fails on SHARD_END), lost, or the worker is asked to stop.
        """
        if lease.is_ended:
            self.ended = True
        while not self.ended:
            if self._should_stop():
                return self._shutdown(state, checkpointer)
            if state.wait_lost(min(1.0, self.config.heartbeat_seconds)):
                current = self.table.get(self.lease_key)
                if current is not None and current.is_ended:
                    self.ended = True
                    break
                return self._lost(state)
        children = self._create_children()
        log.info("%s: shard ended; children leases created: %s", self.lease_key, list(children) or "none")
        return WorkerResult(self.lease_key, "shard_ended", children_created=children)

    def _create_children(self) -> tuple[str, ...]:
        shards = list_shards(self.kinesis, self.config.stream)
        leases = self.table.scan()
        created = []
        for child in child_leases_on_end(self.lease_key, shards, leases, self.config.initial_position.checkpoint()):
            if self.table.create(child):
                created.append(child.lease_key)
        return tuple(created)

    def _flush_pending_checkpoint(self) -> None:
        """Write a checkpoint still waiting for a heartbeat (allowed whoever owns the lease now)."""
        with self.pending_lock:
            cp, self.pending_checkpoint = self.pending_checkpoint, None
        if cp is not None and self.table.checkpoint(self.lease_key, cp):
            self.checkpointed = cp

    def _shutdown(self, state: _Lease, checkpointer: _Checkpointer) -> WorkerResult:
        if state.valid():
            self.processor.shutdown_requested(checkpointer)
        else:
            self.processor.lease_lost()
        self._flush_pending_checkpoint()
        released = self.table.release(self.lease_key, self.config.worker_id)
        log.info("%s: shut down; lease released=%s, checkpoint %s", self.lease_key, released, self.checkpointed)
        return WorkerResult(self.lease_key, "shutdown", f"released={released}")

    def _lost(self, state: _Lease) -> WorkerResult:
        log.warning("%s: lease lost (%s); stopped delivering", self.lease_key, state.reason)
        self.processor.lease_lost()
        self._flush_pending_checkpoint()
        return WorkerResult(self.lease_key, "lease_lost", state.reason)

    # -- heartbeat thread ----------------------------------------------------------------------
    def _heartbeat_loop(self, state: _Lease) -> None:
        period = self.config.heartbeat_seconds
        while not self.stop.wait(period):
            attrs_fn = getattr(self.processor, "heartbeat_attributes", None)
            with self.pending_lock:
                pending, self.pending_checkpoint = self.pending_checkpoint, None
            try:
                attrs = attrs_fn() if attrs_fn else None
                ok = self.table.heartbeat(self.lease_key, self.config.worker_id, attrs, checkpoint=pending)
                if ok and pending is not None:
                    self.checkpointed = pending
                elif pending is not None:
                    # Not owner, or the checkpoint is not ahead of the table's: tell them apart.
                    ok = self.table.heartbeat(self.lease_key, self.config.worker_id, attrs)
                    if not ok:
                        self._restore_pending(pending)  # flushed by _lost: the records were processed
            except Exception as exc:  # transient: the lease stays valid until the expiry passes
                log.warning("%s: heartbeat error (%s); lease valid until expiry", self.lease_key, exc)
                self._restore_pending(pending)
                state.valid()
                continue
            if ok:
                state.renewed()
            else:
                state.lose("heartbeat condition failed: lease taken by another consumer or shard ended")
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


def worker_main(config: ConsumerConfig, lease_key: str, last_owner: str | None, spec: ProcessorSpec,
                results, keepalive=None, keepalive_timeout: float | None = None,
                log_level: int = logging.INFO) -> None:
    """Entry point of a worker process (multiprocessing spawn)."""
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
    worker = LeaseWorker(config, lease_key, last_owner, processor, keepalive=ka,
                         keepalive_timeout=keepalive_timeout, stop=stop)
    result = worker.run()
    results.put(result)
