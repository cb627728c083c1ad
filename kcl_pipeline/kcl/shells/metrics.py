"""Consumer and lease metrics, kept in memory and published to CloudWatch.

Per consumer, every lease-manager cycle: total_leases, total_shards, unclaimed_leases, worker_leases, and
backing_off_leases (leases whose worker failed, held until their retry: kcl/core/fleet/retry.py). Counted:
cycle_failures (lease-manager cycles that failed) and worker_failures (workers that ended failed).
Per lease, every `lease_interval` (10 s): millis_behind_latest (the latest value Kinesis gave), bytes
(payload bytes Kinesis served) and records (user records after deaggregation), summed over the interval.
Extra operational counters (kpl_bad_aggregates, throttles, expired_iterators, ...) are summed the same
way, per lease or per consumer.

Dimensions: Application and WorkerId, plus ShardId for lease metrics. Publishing is best effort: a
failing CloudWatch is logged and counted, never raised into the worker (metrics must not stop records).
The callers are the worker's read loop and its heartbeat thread: every method is thread-safe, and the
(slow) PutMetricData call happens outside the lock.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)

CONSUMER_METRICS = ("total_leases", "total_shards", "unclaimed_leases", "worker_leases")
LEASE_METRICS = ("millis_behind_latest", "bytes", "records")
UNITS = {"millis_behind_latest": "Milliseconds", "bytes": "Bytes"}  # everything else: Count
MAX_DATUMS_PER_CALL = 1000  # PutMetricData limit
NAMINGS = ("pipeline", "kcl")
# naming="kcl": Java KCL 2.x's metric names and (Operation, ShardId / WorkerIdentifier) dimensions, so its
# dashboards and alarms carry over. Metrics Java does not have keep their name, under these operations.
KCL_NAMES = {
    "millis_behind_latest": ("MillisBehindLatest", "ProcessTask"),
    "records": ("RecordsProcessed", "ProcessTask"),
    "bytes": ("DataBytesProcessed", "ProcessTask"),
    "worker_leases": ("CurrentLeases", "RenewAllLeases"),
    "total_leases": ("TotalLeases", "TakeLeases"),
    # Java's LeaseTaker reports each takeLeases run as Success 1 or 0 (its average is the success rate): one per
    # cycle here. Java counts neither failed workers nor backed-off leases; those keep their own names.
    "cycle_success": ("Success", "TakeLeases"),
}
# Counters and gauges of failure (docs/deployment.md, "Failure is visible"), published under these names.
CYCLE_FAILURES, WORKER_FAILURES, BACKING_OFF_LEASES = "cycle_failures", "worker_failures", "backing_off_leases"
KCL_SHARD_OPERATION = "ProcessTask"
KCL_WORKER_OPERATION = "LeaseManager"


@dataclass
class _Window:
    """What accumulated since the last publish (one lease, or the consumer's counters)."""

    started: float | None = None
    millis_behind_latest: int | None = None
    bytes: int = 0
    records: int = 0
    samples: int = 0
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class _LeaseTotals:
    millis_behind_latest: int | None = None
    bytes: int = 0
    records: int = 0
    polls: int = 0
    updated_at: float | None = None
    counters: dict[str, int] = field(default_factory=dict)


class Metrics:
    def __init__(self, namespace: str | None, cloudwatch: Any | None, application: str, worker_id: str,
                 clock: Callable[[], float] = time.time, *, lease_interval: float = 10.0,
                 naming: str = "pipeline"):
        if naming not in NAMINGS:
            raise ValueError(f"metrics naming must be one of {', '.join(NAMINGS)}, got {naming!r}")
        self.naming = naming
        if namespace is not None and cloudwatch is None:
            raise ValueError(f"metrics namespace {namespace!r} given but no CloudWatch client to publish with")
        if lease_interval <= 0:
            raise ValueError(f"lease_interval must be > 0, got {lease_interval}")
        self.namespace = namespace
        self.cloudwatch = cloudwatch if namespace is not None else None
        self.application = application
        self.worker_id = worker_id
        self.clock = clock
        self.lease_interval = lease_interval
        self._lock = threading.Lock()
        self._cycle: dict[str, int] | None = None  # latest values, for snapshot()
        self._cycle_pending: tuple[float, dict[str, int]] | None = None
        self._cycle_outcomes: list[tuple[float, bool]] = []  # (when, succeeded), published as kcl's Success
        self._cycles = 0
        self._consumer_window = _Window()
        self._lease_windows: dict[str, _Window] = {}
        self._lease_totals: dict[str, _LeaseTotals] = {}
        self._counters: dict[str, int] = {}
        self._published = 0
        self._failures = 0
        self._last_error: str | None = None

    # -- recording --------------------------------------------------------------------------------
    def record_cycle(self, total_leases: int, total_shards: int, unclaimed_leases: int, worker_leases: int,
                     backing_off_leases: int | None = None) -> None:
        """A successful cycle's counts (`backing_off_leases` published with them when given)."""
        values = dict(zip(CONSUMER_METRICS, (total_leases, total_shards, unclaimed_leases, worker_leases), strict=True))
        for name, value in values.items():
            if value is None or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if backing_off_leases is not None and backing_off_leases < 0:
            raise ValueError(f"{BACKING_OFF_LEASES} must be an integer >= 0, got {backing_off_leases!r}")
        now = self.clock()
        with self._lock:
            self._cycle = values
            published = values if backing_off_leases is None else {**values, BACKING_OFF_LEASES: backing_off_leases}
            self._cycle_pending = (now, published)
            self._cycles += 1
            self._note_outcome(now, True)

    def record_cycle_failure(self) -> None:
        """A lease-manager cycle failed: counted (cycle_failures), and with Java KCL's names a Success of 0."""
        self.count(CYCLE_FAILURES)
        with self._lock:
            self._note_outcome(self.clock(), False)

    def _note_outcome(self, at: float, succeeded: bool) -> None:
        if self.naming == "kcl":
            self._cycle_outcomes.append((at, succeeded))

    def record_lease(self, shard_id: str, millis_behind_latest: int | None, bytes: int, records: int) -> None:
        """One poll's outcome for a lease; millis_behind_latest None = unknown (no successful call)."""
        if bytes < 0 or records < 0:
            raise ValueError(f"bytes and records must be >= 0, got {bytes}, {records}")
        now = self.clock()
        with self._lock:
            window = self._lease_windows.setdefault(shard_id, _Window())
            if window.started is None:
                window.started = now
            window.samples += 1
            window.bytes += bytes
            window.records += records
            totals = self._lease_totals.setdefault(shard_id, _LeaseTotals())
            totals.polls += 1
            totals.bytes += bytes
            totals.records += records
            totals.updated_at = now
            if millis_behind_latest is not None:
                window.millis_behind_latest = millis_behind_latest
                totals.millis_behind_latest = millis_behind_latest

    def count(self, name: str, value: int = 1, shard_id: str | None = None) -> None:
        """Add to an operational counter (e.g. throttles), for one lease or for the consumer."""
        if not name or name in CONSUMER_METRICS or name in LEASE_METRICS:
            raise ValueError(f"counter name {name!r} is empty or clashes with a standard metric")
        if value == 0:
            return
        now = self.clock()
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + value
            if shard_id is None:
                window = self._consumer_window
            else:
                window = self._lease_windows.setdefault(shard_id, _Window())
                totals = self._lease_totals.setdefault(shard_id, _LeaseTotals())
                totals.counters[name] = totals.counters.get(name, 0) + value
            if window.started is None:
                window.started = now
            window.counters[name] = window.counters.get(name, 0) + value

    def count_many(self, counters: Mapping[str, int], shard_id: str | None = None) -> None:
        for name, value in counters.items():
            self.count(name, value, shard_id)

    # -- publishing -------------------------------------------------------------------------------
    def flush_due(self, now: float | None = None) -> int:
        """Publish what is due: the last cycle's values, and leases whose interval has passed."""
        return self._publish(self._take(self.clock() if now is None else now, force=False))

    def flush(self) -> int:
        """Publish everything pending now (shutdown, lease end). Returns the datums sent."""
        return self._publish(self._take(self.clock(), force=True))

    def _take(self, now: float, force: bool) -> list[dict[str, Any]]:
        datums: list[dict[str, Any]] = []
        with self._lock:
            if self._cycle_pending is not None:
                at, values = self._cycle_pending
                datums.extend(self._datum(name, value, at) for name, value in values.items())
                self._cycle_pending = None
            datums.extend(self._datum("cycle_success", 1.0 if ok else 0.0, at) for at, ok in self._cycle_outcomes)
            self._cycle_outcomes = []
            if self._consumer_window.counters and (force or self._is_due(self._consumer_window, now)):
                datums.extend(self._window_datums(self._consumer_window, now, None))
                self._consumer_window = _Window()
            for shard_id in list(self._lease_windows):
                window = self._lease_windows[shard_id]
                if force or self._is_due(window, now):
                    datums.extend(self._window_datums(window, now, shard_id))
                    del self._lease_windows[shard_id]
        return datums

    def _is_due(self, window: _Window, now: float) -> bool:
        return window.started is not None and now - window.started >= self.lease_interval

    def _window_datums(self, window: _Window, at: float, shard_id: str | None) -> list[dict[str, Any]]:
        out = []
        if window.samples:
            if window.millis_behind_latest is not None:
                out.append(self._datum("millis_behind_latest", window.millis_behind_latest, at, shard_id))
            out.append(self._datum("bytes", window.bytes, at, shard_id))
            out.append(self._datum("records", window.records, at, shard_id))
        out.extend(self._datum(name, value, at, shard_id) for name, value in sorted(window.counters.items()))
        return out

    def _datum(self, name: str, value: float, at: float, shard_id: str | None = None) -> dict[str, Any]:
        if self.naming == "kcl":
            metric_name, dims = kcl_name_and_dimensions(name, self.worker_id, shard_id)
        else:
            metric_name = name
            dims = [{"Name": "Application", "Value": self.application}, {"Name": "WorkerId", "Value": self.worker_id}]
            if shard_id is not None:
                dims.append({"Name": "ShardId", "Value": shard_id})
        return {"MetricName": metric_name, "Dimensions": dims,
                "Timestamp": datetime.fromtimestamp(at, tz=timezone.utc),
                "Value": float(value), "Unit": UNITS.get(name, "Count")}

    def _publish(self, datums: list[dict[str, Any]]) -> int:
        if not datums or self.cloudwatch is None:
            return 0
        sent = 0
        for i in range(0, len(datums), MAX_DATUMS_PER_CALL):
            batch = datums[i:i + MAX_DATUMS_PER_CALL]
            try:
                self.cloudwatch.put_metric_data(Namespace=self.namespace, MetricData=batch)
            except Exception as exc:  # best effort: metrics never stop the consumer
                log.warning("PutMetricData of %d datums to %s failed (dropped): %s", len(batch), self.namespace, exc)
                with self._lock:
                    self._failures += 1
                    self._last_error = f"{type(exc).__name__}: {exc}"
                continue
            sent += len(batch)
        with self._lock:
            self._published += sent
        return sent

    # -- reading back -----------------------------------------------------------------------------
    def forget_lease(self, shard_id: str) -> None:
        """Stop reporting a lease (it ended or was lost) after publishing what it accumulated."""
        with self._lock:
            window = self._lease_windows.pop(shard_id, None)
            self._lease_totals.pop(shard_id, None)
        if window is not None:
            self._publish(self._window_datums(window, self.clock(), shard_id))

    def snapshot(self) -> dict[str, Any]:
        """Latest values: the consumer's last cycle, per lease the latest lag and totals, counters."""
        with self._lock:
            return {
                "application": self.application,
                "worker_id": self.worker_id,
                "namespace": self.namespace,
                "consumer": dict(self._cycle) if self._cycle else {name: None for name in CONSUMER_METRICS},
                "cycles": self._cycles,
                "leases": {
                    shard_id: {
                        "millis_behind_latest": t.millis_behind_latest,
                        "bytes": t.bytes,
                        "records": t.records,
                        "polls": t.polls,
                        "updated_at": t.updated_at,
                        "counters": dict(t.counters),
                    }
                    for shard_id, t in self._lease_totals.items()
                },
                "counters": dict(self._counters),
                "published_datums": self._published,
                "publish_failures": self._failures,
                "last_publish_error": self._last_error,
            }


def kcl_name_and_dimensions(name: str, worker_id: str, shard_id: str | None) -> tuple[str, list[dict[str, str]]]:
    """Java KCL 2.x's name and dimensions for one of this consumer's metrics (the application is the namespace)."""
    default_operation = KCL_SHARD_OPERATION if shard_id is not None else KCL_WORKER_OPERATION
    metric_name, operation = KCL_NAMES.get(name, (name, default_operation))
    dims = [{"Name": "Operation", "Value": operation}]
    if shard_id is not None:
        dims.append({"Name": "ShardId", "Value": shard_id})
    dims.append({"Name": "WorkerIdentifier", "Value": worker_id})
    return metric_name, dims
