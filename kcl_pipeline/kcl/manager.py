"""The lease manager: one cycle = scan, list shards, delete, create, decide, spawn.

Every consumer runs one; none is a leader. The decisions are the pure functions in planner.py; this
module only does their I/O and keeps one worker process per lease it works (multiprocessing spawn,
daemonic, so workers die with a reloaded or killed host). The same manager backs `kcl-pipeline consume`
(driven by `run_forever`) and the Dagster sensor (one `run_cycle` per tick).
"""
from __future__ import annotations

import logging
import multiprocessing
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .aws import client
from .config import ConsumerConfig
from .lease_table import LeaseTable
from .metrics import Metrics
from .model import Lease, Shard
from .planner import (
    LeaseAges,
    leases_to_acquire,
    leases_to_create,
    leases_to_delete,
    scoped_leases,
    unknown_lease_keys,
)
from .shards import list_shards
from .worker import ProcessorSpec, WorkerResult, worker_main

log = logging.getLogger(__name__)


@dataclass
class CycleReport:
    total_leases: int = 0
    total_shards: int | None = None  # None when this cycle did not list shards
    unclaimed_leases: int = 0
    worker_leases: int = 0
    deleted: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    spawned: list[str] = field(default_factory=list)
    stolen: str | None = None
    finished: list[WorkerResult] = field(default_factory=list)
    owners: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"leases={self.total_leases}", f"shards={self.total_shards if self.total_shards is not None else '-'}",
                 f"unclaimed={self.unclaimed_leases}", f"mine={self.worker_leases}"]
        for name in ("deleted", "created", "spawned"):
            if getattr(self, name):
                parts.append(f"{name}={','.join(getattr(self, name))}")
        if self.stolen:
            parts.append(f"stole={self.stolen}")
        for r in self.finished:
            parts.append(f"{r.lease_key}:{r.outcome}" + (f"({r.detail})" if r.detail else ""))
        return " ".join(parts)


class LeaseManager:
    def __init__(self, config: ConsumerConfig, spec: ProcessorSpec, *, keepalive_timeout: float | None = None,
                 rng: random.Random | None = None, worker_log_level: int = logging.INFO,
                 clock: Callable[[], float] = time.monotonic,
                 predecessor: Callable[[str], bool] | None = None):
        self.config = config
        self.spec = spec
        self.keepalive_timeout = keepalive_timeout
        self.rng = rng or random.Random()
        self.clock = clock
        self.predecessor = predecessor  # owner ids of earlier incarnations of this consumer (see planner)
        self._unknown_keys: frozenset[str] = frozenset()
        self._our_counters: dict[str, int] = {}  # leases owned by our id without a local worker
        self.duplicate_worker_id_sightings = 0
        self.worker_log_level = worker_log_level
        self._ctx = multiprocessing.get_context("spawn")
        self._results = self._ctx.Queue()
        self._keepalive = self._ctx.Value("d", time.time(), lock=False)
        self.workers: dict[str, multiprocessing.process.BaseProcess] = {}
        self.ages = LeaseAges()
        self.recently_ended: set[str] = set()
        self._pending: list[WorkerResult] = []
        self._list_next = True
        self.shards: list[Shard] = []
        self.leases: list[Lease] = []
        self.kinesis = client("kinesis", config.aws)
        self.table = LeaseTable(config.lease_table, client("dynamodb", config.aws))
        cw = client("cloudwatch", config.aws, max_attempts=2) if config.metrics_namespace else None
        self.metrics = Metrics(config.metrics_namespace, cw, config.application, config.worker_id)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Fail fast with a clear error when the stream is missing; create the lease table when missing."""
        self.shards = list_shards(self.kinesis, self.config.stream)
        if self.table.ensure_table():
            log.info("created lease table %s", self.config.lease_table)

    def _scan(self) -> list[Lease]:
        """Scan, and stamp what it saw when the scan returned (never earlier: a slow, throttled scan must
        not make live peers' leases look older than they are)."""
        leases = self.table.scan()
        self.ages.observe(leases, self.clock())
        return leases

    def run_cycle(self) -> CycleReport:
        self._keepalive.value = time.time()
        report = CycleReport(finished=self._reap())
        leases = self._scan()
        unknown = unknown_lease_keys(leases, self.shards)
        # New keys outside the last listing: new shards (a peer created children), or other streams' leases
        # sharing the table. List again when that set changes, not every cycle.
        relist = bool(unknown - self._unknown_keys)
        if self._list_next or relist or not leases or self.rng.random() < self.config.list_shards_probability:
            # Shards are listed after the scan, so a lease is never deleted for a shard created meanwhile.
            self.shards = list_shards(self.kinesis, self.config.stream)
            self._list_next = False
            report.total_shards = len(self.shards)
            for lease in leases_to_delete(leases, self.shards):
                if self.table.delete(lease.lease_key, lease.lease_counter):
                    report.deleted.append(lease.lease_key)
            for lease in leases_to_create(self.config.initial_position.checkpoint(), self.shards, leases,
                                          self.config.parent_drained_attribute):
                if self.table.create(lease):
                    report.created.append(lease.lease_key)
            if report.deleted or report.created:
                leases = self._scan()
        self._unknown_keys = unknown_lease_keys(leases, self.shards)
        leases = scoped_leases(leases, self.shards)
        self.leases = leases
        self._watch_our_id(leases)
        now = self.clock()
        plan = leases_to_acquire(
            self.config.worker_id, leases, self.ages.ages(now), expiry_seconds=self.config.lease_expiry_seconds,
            leases_to_acquire=self.config.leases_to_acquire, max_leases=self.config.max_leases,
            recently_ended_by_us=self.recently_ended, locally_worked=set(self.workers),
            drained_attribute=self.config.parent_drained_attribute, predecessor=self.predecessor, rng=self.rng)
        for lease in plan.take:
            self._spawn(lease)
            report.spawned.append(lease.lease_key)
        if plan.steal is not None:
            self._spawn(plan.steal)
            report.stolen = plan.steal.lease_key
        if plan.take or plan.steal:
            self.recently_ended.clear()
        self._fill_counts(report, leases)
        self.metrics.record_cycle(report.total_leases, report.total_shards if report.total_shards is not None
                                  else len(self.shards), report.unclaimed_leases, report.worker_leases)
        self.metrics.flush_due()
        log.info("cycle %s", report.summary())
        return report

    def _watch_our_id(self, leases: list[Lease]) -> None:
        """Another live process writing under our worker id (a copy-pasted --worker-id, say) is an error:
        its writes move the counters of leases we own but do not work. Said loudly and counted."""
        ours = {lease.lease_key: lease.lease_counter for lease in leases
                if lease.lease_owner == self.config.worker_id and lease.lease_key not in self.workers
                and not lease.is_ended}
        moved = sorted(key for key, counter in ours.items()
                       if key in self._our_counters and self._our_counters[key] != counter)
        if moved:
            self.duplicate_worker_id_sightings += 1
            self.metrics.count_many({"duplicate_worker_id": 1}, None)
            log.error("another live process is writing under this consumer's worker id %s (leases %s); worker ids "
                      "must be unique per process: this consumer will not touch those leases",
                      self.config.worker_id, ", ".join(moved))
        self._our_counters = ours

    def _fill_counts(self, report: CycleReport, leases: list[Lease]) -> None:
        report.total_leases = len(leases)
        live = [lease for lease in leases if not lease.is_ended]
        report.unclaimed_leases = sum(1 for lease in live if not lease.lease_owner)
        for lease in live:
            if lease.lease_owner:
                report.owners[lease.lease_owner] = report.owners.get(lease.lease_owner, 0) + 1
        report.worker_leases = len(self.workers)

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_cycle()
            except Exception as exc:  # a failed cycle (throttling, network) is retried next cycle
                log.error("lease manager cycle failed: %s: %s", type(exc).__name__, exc)
            self._wait_next_cycle(stop)

    def _wait_next_cycle(self, stop: threading.Event) -> None:
        """Sleep a cycle, waking at once when a local worker ended a shard (its children are ready) or
        when a peer's lease expired.

        Between cycles the table is re-scanned every expiry/4 (reads only, no ListShards): the planner
        measures a lease's age from when this consumer saw its counter change, so without these scans a
        dead peer's lease would be noticed up to a whole cycle late (failover = expiry + cycle).
        """
        now = time.monotonic()
        deadline = now + self.config.cycle_seconds
        next_watch = now + self.config.lease_expiry_seconds / 4
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                result = self._results.get(timeout=min(0.5, max(0.01, min(deadline, next_watch) - time.monotonic())))
                self._pending.append(result)
                if result.outcome == "shard_ended":
                    return
            except queue.Empty:
                pass
            if time.monotonic() >= next_watch:
                next_watch = time.monotonic() + self.config.lease_expiry_seconds / 4
                if self._peer_lease_expired():
                    return

    def _peer_lease_expired(self) -> bool:
        try:
            leases = self.table.scan()
        except Exception as exc:
            log.warning("lease scan between cycles failed: %s", exc)
            return False
        now = self.clock()
        self.ages.observe(leases, now)
        return any(not lease.is_ended and lease.lease_key not in self.workers
                   and self.ages.expired(lease.lease_key, now, self.config.lease_expiry_seconds)
                   for lease in scoped_leases(leases, self.shards))

    def shutdown(self, timeout: float = 30.0) -> list[WorkerResult]:
        """Ask every worker to stop gracefully (SIGTERM: checkpoint, release), then wait for them."""
        for proc in self.workers.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + timeout
        for key, proc in list(self.workers.items()):
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("worker %s did not stop within %.0fs; killing it", key, timeout)
                proc.kill()
                proc.join(5)
        results = self._reap()
        self.workers.clear()
        self.metrics.flush()
        return results

    # -- workers -----------------------------------------------------------------------------
    def _spawn(self, lease: Lease) -> None:
        proc = self._ctx.Process(
            target=worker_main,
            args=(self.config, lease, self.spec, self._results),
            kwargs={"keepalive": self._keepalive, "keepalive_timeout": self.keepalive_timeout,
                    "log_level": self.worker_log_level},
            name=f"kcl-worker-{lease.lease_key}", daemon=True)
        proc.start()
        self.workers[lease.lease_key] = proc
        log.info("spawned worker pid %s for %s (previous owner %s)", proc.pid, lease.lease_key, lease.lease_owner)

    def _reap(self) -> list[WorkerResult]:
        finished = self._pending
        self._pending = []
        while True:
            try:
                finished.append(self._results.get_nowait())
            except queue.Empty:
                break
        for result in finished:
            if result.outcome == "shard_ended":
                self.recently_ended.add(result.lease_key)
                self._list_next = True
            elif result.outcome == "failed":
                # The worker released its lease itself (fenced), so the fleet retries it next cycle.
                log.error("worker for %s failed: %s", result.lease_key, result.detail)
        for key, proc in list(self.workers.items()):
            if not proc.is_alive():
                proc.join(0)
                if proc.exitcode not in (0, None):
                    log.warning("worker for %s exited with code %s", key, proc.exitcode)
                del self.workers[key]
        return finished
