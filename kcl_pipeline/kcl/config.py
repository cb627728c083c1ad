"""The consumer's configuration: one validated object, with errors that say which setting is wrong."""
from __future__ import annotations

import math
import os
import re
import uuid
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import datetime, timezone
from typing import Any

from .aws_settings import AwsSettings
from .core.fleet.retry import STALL_SECONDS
from .core.model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint
from .core.streams import STREAM_ARN_RE, identifier_parts, is_stream_identifier, stream_name

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,255}")
# Java KCL 2.x expires a lease after failoverTimeMillis = 10 s: peers sharing its table must heartbeat inside it.
JAVA_COMPATIBLE_TIMINGS = {"heartbeat_seconds": 3.0, "lease_expiry_seconds": 10.0}
# How lease worker processes start (shells/workers/worker_processes.py): forked from a preloaded server, or spawned.
# The default is the first; the environment variable sets another for every consumer of the process that
# does not choose one itself (the way back to spawn without a code change: docs/memory.md).
WORKER_START_METHODS = ("forkserver", "spawn")
WORKER_START_METHOD_ENV = "KCL_PIPELINE_WORKER_START_METHOD"
# How workers read their shards: GetRecords polling (every application on a stream shares each shard's 5 reads/s
# and 2 MB/s), or enhanced fan-out (SubscribeToShard through the application's own stream consumer: 2 MB/s per
# shard of its own, pushed; billed per consumer-shard hour and per GB; docs/fanout.md).
POLLING, FANOUT = "polling", "fanout"
RETRIEVALS = (POLLING, FANOUT)
MAX_CONSUMER_NAME = 128  # a fan-out consumer is named after the application (fanout.consumer_name)
MiB = 1024 * 1024
MAX_GET_RECORDS_BYTES = 10 * MiB  # the most one GetRecords response holds


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is allowed."""


def check_stream(stream: str) -> None:
    """A stream is named by its name, across accounts by its ARN, or by a Java stream identifier
    `<account>:<name>:<creationEpoch>` (its lease keys then carry that creation epoch and account, whatever
    DescribeStreamSummary says: as a Java multi-stream application configures them)."""
    if stream.startswith("arn:"):
        if not STREAM_ARN_RE.fullmatch(stream):
            raise ConfigError(f"stream ARN {stream!r} is not arn:<partition>:kinesis:<region>:<account>:stream/<name>")
    elif is_stream_identifier(stream):
        try:
            _account, name, _epoch = identifier_parts(stream)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        check_stream(name)
    elif not _NAME_RE.fullmatch(stream) or len(stream) > 128:
        raise ConfigError(f"stream {stream!r} must be 1-128 characters of letters, digits, '_', '.', '-' "
                          f"(or a stream ARN)")
    if stream_name(stream) in (".", ".."):
        # Kinesis allows them, but a stream's name is a directory of the landing zone and of the output:
        # '.' or '..' would land, commit and write datasets into the zone's root or its parent.
        raise ConfigError(f"stream {stream!r}: a stream named '.' or '..' cannot be consumed here (its name is a "
                          f"directory of the landing zone and the output)")


@dataclass(frozen=True)
class InitialPosition:
    """Where a lease created for a shard with no history starts (TRIM_HORIZON, LATEST or AT_TIMESTAMP)."""

    kind: str = TRIM_HORIZON
    timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in (TRIM_HORIZON, LATEST, AT_TIMESTAMP):
            raise ConfigError(f"initial position must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {self.kind!r}")
        if (self.kind == AT_TIMESTAMP) != (self.timestamp_ms is not None):
            raise ConfigError("initial position AT_TIMESTAMP needs a timestamp, and only it takes one")

    @classmethod
    def parse(cls, kind: str, timestamp: str | None = None) -> "InitialPosition":
        kind = kind.upper()
        if kind != AT_TIMESTAMP:
            if timestamp:
                raise ConfigError(f"--timestamp is only valid with AT_TIMESTAMP, not {kind}")
            return cls(kind)
        if not timestamp:
            raise ConfigError("AT_TIMESTAMP needs --timestamp (ISO 8601, e.g. 2026-11-22T03:00:00Z)")
        try:
            dt = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(f"--timestamp {timestamp!r} is not ISO 8601: {exc}") from None
        try:
            dt = dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
        except OverflowError:  # its offset takes it past year 1 or 9999 in UTC
            raise ConfigError(f"--timestamp {timestamp!r} is out of range in UTC") from None
        if dt.year < 1970:  # no Kinesis record is older; GetShardIterator refuses a negative timestamp
            raise ConfigError(f"--timestamp {timestamp!r} is before 1970-01-01 UTC")
        return cls(AT_TIMESTAMP, int(dt.timestamp() * 1000))

    def checkpoint(self) -> Checkpoint:
        """The checkpoint a new lease is created with, as Java KCL writes it (HierarchicalShardSyncer): the
        sentinel with sub-sequence 0. AT_TIMESTAMP's timestamp is never stored in the lease; a reader takes it
        from the application's configuration (`timestamp_ms`), as Java's IteratorBuilder does."""
        return Checkpoint(self.kind, 0)


@dataclass(frozen=True)
class ConsumerConfig:
    """Everything one consumer (a peer of the fleet) needs.

    Defaults favour cost: a heartbeat every 10 s and a 30 s expiry make ~6 DynamoDB writes per
    lease-minute (Java KCL 2.x makes ~18). A fleet that shares its table with Java KCL consumers must
    heartbeat inside Java's 10 s expiry: use `java_compatible()` (3 s heartbeat, 10 s expiry).
    """

    stream: str  # a name, or an ARN (a stream of another account)
    application: str
    # The DynamoDB lease table (Java's tableName); None: named after the application, as Java KCL does.
    table_name: str | None = None
    # KCL 3.x's separate metadata tables, when the application names its own (Java's
    # CoordinatorStateTableConfig / WorkerMetricsTableConfig tableName); None: <application>-CoordinatorState
    # and <application>-WorkerMetricStats, as Java names them.
    coordinator_state_table_name: str | None = None
    worker_metrics_table_name: str | None = None
    worker_id: str = field(default_factory=lambda: f"kclpy-{uuid.uuid4()}")
    initial_position: InitialPosition = field(default_factory=InitialPosition)
    leases_to_acquire: int = 1
    max_leases: int = 64
    heartbeat_seconds: float = 10.0
    lease_expiry_seconds: float = 30.0
    # A worker delivers only while now < (send time of its last successful lease write) + expiry − margin:
    # the margin absorbs clock-rate drift between hosts and scheduling delays. None: a tenth of the expiry.
    validity_margin_seconds: float | None = None
    # A lease attribute that, when true, proves every record of the shard was delivered durably: such a
    # parent counts as finished for reading order (its children may be read) before SHARD_END is written.
    # None keeps Java's rule (SHARD_END or gone). The landing pipeline sets its "last record landed" flag.
    parent_drained_attribute: str | None = None
    cycle_seconds: float = 20.0
    # Probability that a cycle lists shards (bounds ListShards calls across a large fleet); the first
    # cycle, cycles after a local shard end, and cycles with no leases always list.
    list_shards_probability: float = 1.0
    retrieval: str = POLLING  # or FANOUT (see RETRIEVALS)
    polling_interval_seconds: float = 0.2  # >= 0.2: Kinesis allows 5 GetRecords/s per shard
    idle_interval_seconds: float = 2.0
    max_records_per_call: int = 10000
    # A worker's prefetch: the reader sizes each GetRecords (its Limit) so a response holds about this many
    # bytes, whatever the shard's backlog (docs/memory.md has the formula of a worker's memory).
    prefetch_bytes: int = 2 * MiB
    # "forkserver": workers fork from one server that preloaded boto3, pyarrow and the worker (shared memory);
    # "spawn": each worker is a fresh interpreter (shells/workers/worker_processes.py).
    worker_start_method: str = field(default_factory=lambda: default_worker_start_method())
    metrics_namespace: str | None = None  # CloudWatch namespace; None = metrics kept locally only
    # "pipeline": this project's names; "kcl": Java KCL's names and dimensions (its dashboards carry over).
    metrics_naming: str = "pipeline"
    metrics_interval_seconds: float = 10.0
    # How often this consumer writes its item in KCL 3.x's worker metrics table (<application>-WorkerMetricStats:
    # its throughput, for load-aware balance and a 3.x fleet's leader); 0 never writes it.
    worker_metrics_period_seconds: float = 30.0
    aws: AwsSettings = field(default_factory=AwsSettings)
    # A multi-stream application's other streams (one lease table, KCL's multi-stream lease keys); empty: a
    # single-stream application, whose lease keys are the shard ids (KCL 2.x's format).
    more_streams: tuple[str, ...] = ()
    # A consumer none of whose lease-manager cycles succeeded for this long gives up: `consume` exits non-zero
    # with one line saying why, the Dagster sensor's tick fails with it (kcl/core/fleet/retry.py); 0: never.
    stall_seconds: float = STALL_SECONDS
    # A file whose modification time is set after every successful cycle, for an orchestrator's liveness probe
    # (docs/deployment.md); None: none.
    health_file: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):  # nan passes every comparison below and inf none: refuse both first
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
        check_stream(self.stream or "")
        if isinstance(self.more_streams, (str, bytes)) or not isinstance(self.more_streams, tuple):
            raise ConfigError(f"more_streams must be a tuple of stream names, got {self.more_streams!r}")
        names = [stream_name(s) for s in self.streams]
        for stream in self.more_streams:
            check_stream(stream or "")
        if len(set(names)) != len(names):
            raise ConfigError(f"a stream is named twice: {', '.join(self.streams)}")
        tables = ("table_name", "coordinator_state_table_name", "worker_metrics_table_name")
        for name in ("application", *tables):
            value = getattr(self, name)
            if value is None and name in tables:
                continue
            if not value or not _NAME_RE.fullmatch(value):
                raise ConfigError(f"{name} {value!r} must be 1-255 characters of letters, digits, '_', '.', '-'")
            if name in tables and len(value) < 3:
                raise ConfigError(f"{name} {value!r} is shorter than DynamoDB's 3 characters")
        if not self.worker_id or len(self.worker_id) > 255:
            raise ConfigError("worker_id must be 1-255 characters")
        if self.leases_to_acquire < 1:
            raise ConfigError(f"leases_to_acquire must be >= 1, got {self.leases_to_acquire}")
        if self.max_leases < 1:
            raise ConfigError(f"max_leases must be >= 1, got {self.max_leases}")
        try:
            self.aws.s3_requests()  # the S3 request variables, checked before anything is written
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.heartbeat_seconds <= 0:
            raise ConfigError(f"heartbeat_seconds must be > 0, got {self.heartbeat_seconds}")
        if self.lease_expiry_seconds < 2 * self.heartbeat_seconds:
            raise ConfigError(
                f"lease_expiry_seconds ({self.lease_expiry_seconds}) must be at least twice heartbeat_seconds "
                f"({self.heartbeat_seconds}), or a live lease will look expired to its peers"
            )
        if not 0 <= self.validity_margin < self.lease_expiry_seconds - self.heartbeat_seconds:
            raise ConfigError(
                f"validity_margin_seconds ({self.validity_margin}) must be >= 0 and leave more than one "
                f"heartbeat ({self.heartbeat_seconds}s) of the lease expiry ({self.lease_expiry_seconds}s)")
        if self.cycle_seconds <= 0:
            raise ConfigError(f"cycle_seconds must be > 0, got {self.cycle_seconds}")
        if not 0 < self.list_shards_probability <= 1:
            raise ConfigError(f"list_shards_probability must be in (0, 1], got {self.list_shards_probability}")
        if self.polling_interval_seconds < 0.2:
            raise ConfigError(
                f"polling_interval_seconds must be >= 0.2 (Kinesis allows 5 GetRecords/s per shard), "
                f"got {self.polling_interval_seconds}"
            )
        if self.idle_interval_seconds < self.polling_interval_seconds:
            raise ConfigError("idle_interval_seconds must be >= polling_interval_seconds")
        if self.metrics_naming not in ("pipeline", "kcl"):
            raise ConfigError(f"metrics_naming must be pipeline or kcl, got {self.metrics_naming!r}")
        if self.stall_seconds < 0:
            raise ConfigError(f"stall_seconds must be >= 0 (0: never give up), got {self.stall_seconds}")
        if self.health_file is not None and (not self.health_file.strip() or self.health_file.endswith(("/", os.sep))):
            raise ConfigError(f"health_file must name a file, got {self.health_file!r}")
        if self.worker_metrics_period_seconds < 0:
            raise ConfigError(f"worker_metrics_period_seconds must be >= 0 (0: never), got "
                              f"{self.worker_metrics_period_seconds}")
        if not 1 <= self.max_records_per_call <= 10000:
            raise ConfigError(f"max_records_per_call must be in 1..10000, got {self.max_records_per_call}")
        if not 64 * 1024 <= self.prefetch_bytes <= MAX_GET_RECORDS_BYTES:
            raise ConfigError(f"prefetch_bytes must be in 65536..{MAX_GET_RECORDS_BYTES} (GetRecords returns at "
                              f"most 10 MiB), got {self.prefetch_bytes}")
        if self.retrieval not in RETRIEVALS:
            raise ConfigError(f"retrieval must be one of {', '.join(RETRIEVALS)}, got {self.retrieval!r}")
        if self.retrieval == FANOUT and len(self.application) > MAX_CONSUMER_NAME:
            raise ConfigError(f"retrieval fanout registers a stream consumer named after the application, at most "
                              f"{MAX_CONSUMER_NAME} characters: application {self.application!r} has "
                              f"{len(self.application)}")
        if self.worker_start_method not in WORKER_START_METHODS:
            raise ConfigError(f"worker_start_method must be one of {', '.join(WORKER_START_METHODS)}, got "
                              f"{self.worker_start_method!r} (the default comes from {WORKER_START_METHOD_ENV} "
                              f"when set)")

    @property
    def validity_margin(self) -> float:
        """The validity margin in effect (a tenth of the lease expiry unless set)."""
        if self.validity_margin_seconds is None:
            return self.lease_expiry_seconds / 10
        return self.validity_margin_seconds

    @property
    def lease_table(self) -> str:
        """The lease table: `table_name`, else (as Java KCL does) the application's name."""
        return self.table_name or self.application

    @property
    def stream_name(self) -> str:
        return stream_name(self.stream)

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream, *self.more_streams)

    @property
    def multi_stream(self) -> bool:
        """Several streams: KCL's multi-stream lease keys (account:name:creationEpoch:shardId)."""
        return bool(self.more_streams)

    def java_compatible(self) -> "ConsumerConfig":
        """Timings that are safe beside Java KCL 2.x consumers (they expire leases after 10 s)."""
        return self.with_(**JAVA_COMPATIBLE_TIMINGS)

    def with_(self, **changes) -> "ConsumerConfig":
        return replace(self, **changes)

    @property
    def default_timings(self) -> bool:
        """The heartbeat and expiry are ConsumerConfig's defaults (nobody chose them)."""
        return (self.heartbeat_seconds == consumer_default("heartbeat_seconds")
                and self.lease_expiry_seconds == consumer_default("lease_expiry_seconds")
                and self.validity_margin_seconds is None)

    @property
    def java_safe(self) -> bool:
        """Java KCL judges a lease expired after its failoverTimeMillis (10 s by default) without a counter change:
        a heartbeat inside a third of that, and a validity no longer than it, keep two holders from delivering."""
        return (self.heartbeat_seconds <= JAVA_COMPATIBLE_TIMINGS["heartbeat_seconds"]
                and self.lease_expiry_seconds <= JAVA_COMPATIBLE_TIMINGS["lease_expiry_seconds"])


def timings_beside_java(config: ConsumerConfig, java_seen: bool) -> ConsumerConfig | None:
    """The configuration to run with once Java KCL consumers are seen sharing the table: Java-safe timings when
    the configured ones are the defaults (chosen by nobody: this consumer's defaults favour cost and let Java
    steal its leases, and deliver beside Java, for ten seconds of every thirty); None to keep what was chosen."""
    if not java_seen or config.java_safe or not config.default_timings:
        return None
    return config.java_compatible()


def default_worker_start_method() -> str:
    """ConsumerConfig.worker_start_method's default: $KCL_PIPELINE_WORKER_START_METHOD, else forkserver."""
    return os.environ.get(WORKER_START_METHOD_ENV, "").strip().lower() or WORKER_START_METHODS[0]


def consumer_default(name: str) -> Any:
    """The default of one ConsumerConfig field: settings, resources and the CLI read their defaults here."""
    for f in fields(ConsumerConfig):
        if f.name == name:
            if f.default is MISSING:
                raise KeyError(f"ConsumerConfig.{name} has no plain default")
            return f.default
    raise KeyError(f"ConsumerConfig has no field {name!r}")
