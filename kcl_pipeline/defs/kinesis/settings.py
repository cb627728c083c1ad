"""The Dagster deployment's settings, read once from the environment when the code location loads.

Partitions and the sensor's interval are fixed when Definitions are built, so they cannot come from a
resource at run time: every setting is read here, and the resources are built from the same object (one
source of truth for the window length). Every variable but KCL_PIPELINE_PARTITIONS_START is optional;
`KCL_PIPELINE_PROFILE=demo` changes the defaults to a demo's (2-minute windows, partitions from the current
window, zones created on first use; `kcl-pipeline demo` sets the start to its stream's creation).

The first partition is fixed configuration, never computed from the clock at load: a start that moved with
every load ("7 days ago") made the windows before it unreportable, so their records never materialised and no
checkpoint moved past them.

    KCL_PIPELINE_PROFILE                  default | demo
    KCL_PIPELINE_STREAM                   Kinesis stream name or ARN, or a comma-separated list of them
                                          (a multi-stream application: one set of assets per stream)
                                                                              (kcl-pipeline-demo)
    KCL_PIPELINE_APPLICATION              application name                    (kcl-pipeline)
    KCL_PIPELINE_TABLE_NAME               lease table (Java's tableName)      (the application name)
    KCL_PIPELINE_INITIAL_POSITION         TRIM_HORIZON | LATEST | AT_TIMESTAMP (TRIM_HORIZON)
    KCL_PIPELINE_INITIAL_TIMESTAMP        ISO 8601, with AT_TIMESTAMP only
    KCL_PIPELINE_WINDOW_MINUTES           window length: a divisor of 60, or whole hours dividing 24 (60; demo 2)
    KCL_PIPELINE_PARTITIONS_START         first partition, ISO date/time UTC  (REQUIRED; demo: the current window)
    KCL_PIPELINE_LANDING_URI              s3://bucket/prefix or a directory   (s3://kcl-pipeline/landing)
    KCL_PIPELINE_OUTPUT_URI               s3://bucket/prefix or a directory   (s3://kcl-pipeline/output)
    KCL_PIPELINE_CREATE_ZONES             create missing buckets/directories (false; demo true)
    KCL_PIPELINE_SENSOR_INTERVAL_SECONDS  sensor interval = lease-manager cycle
    KCL_PIPELINE_HEARTBEAT_SECONDS / KCL_PIPELINE_LEASE_EXPIRY_SECONDS
    KCL_PIPELINE_MAX_LEASES               leases this host works at most
    KCL_PIPELINE_GRACE_SECONDS            clock grace of window completeness  (10)
    KCL_PIPELINE_HOST_WORKERS             the sensor hosts lease workers (true) or only observes (false)
                                          (demo: true; otherwise it must be set to true explicitly)
    KCL_PIPELINE_WORKER_ID                this host's consumer id (default: made once, kept in the sensor cursor)
    KCL_PIPELINE_METRICS_NAMESPACE        CloudWatch namespace (unset: no CloudWatch metrics)
    KCL_PIPELINE_METRICS_NAMING           pipeline | kcl (Java KCL's metric names and dimensions)
    KCL_PIPELINE_DECODER                  payload decoder of the transform    (json)
    KCL_PIPELINE_LANDING_READER           auto | native | datasource: how Spark reads the zone (auto)
    KCL_PIPELINE_SPARK_MASTER             Spark master                        (local[*])
    KCL_PIPELINE_SPARK_CONF               extra Spark settings, a JSON object
    AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL[_KINESIS|_DYNAMODB|_S3|_CLOUDWATCH]  where AWS is (read by the SDK)

The consumer's defaults (timings, lease counts, initial position) are ConsumerConfig's: they are declared
once, in kcl_pipeline.kcl.config, and read from there.
"""
from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timezone
from typing import Mapping

from ...kcl.config import ConfigError, ConsumerConfig, InitialPosition, consumer_default
from .streams import check_prefixes

PREFIX = "KCL_PIPELINE_"
PROFILES = ("default", "demo")
# Dagster's UI and daemons slow down past this many partitions of one asset.
MAX_PARTITIONS = 100_000
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class PipelineSettings:
    stream: str = "kcl-pipeline-demo"
    application: str = "kcl-pipeline"
    initial_position: str = InitialPosition().kind
    initial_timestamp: str | None = None
    table_name: str | None = consumer_default("table_name")
    window_minutes: int = 60
    partitions_start: datetime = field(kw_only=True)  # required: fixed configuration, see above
    landing_uri: str = "s3://kcl-pipeline/landing"
    output_uri: str = "s3://kcl-pipeline/output"
    create_zones: bool = False
    # Hosting lease workers in the code server is opt-in outside the demo: a code location loaded by accident
    # with production credentials observes (reports windows, requests runs) but never joins the fleet.
    host_workers: bool = False
    sensor_interval_seconds: int = int(consumer_default("cycle_seconds"))
    heartbeat_seconds: float = consumer_default("heartbeat_seconds")
    lease_expiry_seconds: float = consumer_default("lease_expiry_seconds")
    max_leases: int = consumer_default("max_leases")
    grace_seconds: float = 10.0
    worker_id: str | None = None
    metrics_namespace: str | None = None
    metrics_naming: str = consumer_default("metrics_naming")
    decoder: str = "json"
    # auto: Spark's own Parquet reader for a directory zone, the Python data source for s3:// (no s3a in
    # PyPI's pyspark); native for s3:// needs hadoop-aws on the cluster.
    landing_reader: str = "auto"
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # A multi-stream application's other streams (ConsumerConfig.more_streams): one lease table, KCL's
    # multi-stream lease keys, and one set of assets, jobs and checks per stream.
    more_streams: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_window_minutes(self.window_minutes)
        InitialPosition.parse(self.initial_position, self.initial_timestamp)  # raises ConfigError
        # The consumer's own checks (names, heartbeat vs expiry, max leases), at load rather than at the first tick.
        ConsumerConfig(self.stream, self.application, table_name=self.table_name,
                       heartbeat_seconds=self.heartbeat_seconds, lease_expiry_seconds=self.lease_expiry_seconds,
                       max_leases=self.max_leases, cycle_seconds=float(self.sensor_interval_seconds),
                       metrics_naming=self.metrics_naming, more_streams=tuple(self.more_streams))
        check_prefixes(self.streams)
        if self.partitions_start.tzinfo is None:
            raise ConfigError("partitions_start must be timezone-aware (UTC)")
        if int(self.partitions_start.timestamp()) % (self.window_minutes * 60):
            raise ConfigError(f"{PREFIX}PARTITIONS_START {self.partitions_start.isoformat()} is not on a "
                              f"{self.window_minutes}-minute window boundary")
        if self.sensor_interval_seconds < 5:
            raise ConfigError(f"{PREFIX}SENSOR_INTERVAL_SECONDS must be >= 5, got {self.sensor_interval_seconds}")
        if self.grace_seconds < 0:
            raise ConfigError(f"{PREFIX}GRACE_SECONDS must be >= 0, got {self.grace_seconds}")
        for name in ("landing_uri", "output_uri"):
            if not getattr(self, name):
                raise ConfigError(f"{PREFIX}{name.upper()} is empty; use s3://bucket/prefix or a directory")

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream, *self.more_streams)

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    @property
    def keepalive_seconds(self) -> float:
        """Workers stop by themselves (releasing their leases) after this long without a sensor tick."""
        return 3.0 * self.sensor_interval_seconds

    def partition_count(self, now: datetime) -> int:
        return max(0, int((now - self.partitions_start).total_seconds() // (self.window_minutes * 60)))

    def check_partition_count(self, now: datetime) -> None:
        count = self.partition_count(now)
        if count > MAX_PARTITIONS:
            raise ConfigError(
                f"{count} partitions of {self.window_minutes} minutes since {self.partitions_start.isoformat()} "
                f"exceed Dagster's {MAX_PARTITIONS} per asset: set {PREFIX}PARTITIONS_START later or "
                f"{PREFIX}WINDOW_MINUTES longer")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, now: datetime | None = None,
                 for_partitions: bool = True) -> "PipelineSettings":
        """The settings from KCL_PIPELINE_* variables. `for_partitions=False` (the CLI's defaults for audit,
        verify and backfill, which name their windows themselves) does not require the partitions' start."""
        env = os.environ if env is None else env
        now = now or datetime.now(timezone.utc)
        profile = env.get(f"{PREFIX}PROFILE", "default").strip().lower() or "default"
        if profile not in PROFILES:
            raise ConfigError(f"{PREFIX}PROFILE must be one of {', '.join(PROFILES)}, got {profile!r}")
        demo = profile == "demo"

        def get(name: str, default: str | None = None) -> str | None:
            value = env.get(PREFIX + name)
            return value.strip() if value is not None and value.strip() != "" else default

        window = _int(get("WINDOW_MINUTES"), "WINDOW_MINUTES", 2 if demo else 60)
        start_text = get("PARTITIONS_START")
        d = _defaults(cls)
        if start_text:
            start = _parse_start(start_text)
        elif demo or not for_partitions:
            start = _window_start(now, window)
        else:
            raise ConfigError(
                f"{PREFIX}PARTITIONS_START is required: the first window partition, fixed for the deployment's "
                f"life (ISO 8601 UTC on a window boundary, e.g. 2026-01-31 or 2026-01-31T06:00:00Z). Choose the "
                f"window of the oldest record you want transformed; older records are left untransformed and reported")
        streams = _streams(get("STREAM", d["stream"]))
        settings = cls(
            stream=streams[0],
            more_streams=streams[1:],
            application=get("APPLICATION", d["application"]),
            initial_position=get("INITIAL_POSITION", d["initial_position"]).upper(),
            initial_timestamp=get("INITIAL_TIMESTAMP"),
            table_name=get("TABLE_NAME", d["table_name"]),
            window_minutes=window,
            partitions_start=start,
            landing_uri=get("LANDING_URI", d["landing_uri"]),
            output_uri=get("OUTPUT_URI", d["output_uri"]),
            create_zones=_bool(get("CREATE_ZONES"), "CREATE_ZONES", demo),
            host_workers=_bool(get("HOST_WORKERS"), "HOST_WORKERS", demo),
            sensor_interval_seconds=_int(get("SENSOR_INTERVAL_SECONDS"), "SENSOR_INTERVAL_SECONDS",
                                         d["sensor_interval_seconds"]),
            heartbeat_seconds=_float(get("HEARTBEAT_SECONDS"), "HEARTBEAT_SECONDS", d["heartbeat_seconds"]),
            lease_expiry_seconds=_float(get("LEASE_EXPIRY_SECONDS"), "LEASE_EXPIRY_SECONDS",
                                        d["lease_expiry_seconds"]),
            max_leases=_int(get("MAX_LEASES"), "MAX_LEASES", d["max_leases"]),
            grace_seconds=_float(get("GRACE_SECONDS"), "GRACE_SECONDS", d["grace_seconds"]),
            worker_id=get("WORKER_ID"),
            metrics_namespace=get("METRICS_NAMESPACE"),
            metrics_naming=get("METRICS_NAMING", d["metrics_naming"]).lower(),
            decoder=get("DECODER", d["decoder"]),
            landing_reader=_choice(get("LANDING_READER", d["landing_reader"]), "LANDING_READER",
                                   ("auto", "native", "datasource")),
            spark_master=get("SPARK_MASTER", d["spark_master"]),
            spark_conf=_json_object(get("SPARK_CONF"), "SPARK_CONF"),
        )
        settings.check_partition_count(now)
        return settings


def _streams(text: str) -> tuple[str, ...]:
    streams = tuple(part.strip() for part in text.split(","))
    if not all(streams):
        raise ConfigError(f"{PREFIX}STREAM {text!r} has an empty name: give a stream, or streams separated by ','")
    return streams


def _choice(value: str, name: str, allowed: tuple[str, ...]) -> str:
    if value.lower() not in allowed:
        raise ConfigError(f"{PREFIX}{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value.lower()


def _defaults(cls) -> dict[str, object]:
    """The dataclass's own plain defaults: from_env falls back to exactly these (no second copy)."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def check_window_minutes(minutes: int) -> None:
    """Windows must tile the hour or the day, so that they line up with Dagster's cron-based partitions."""
    if minutes < 1 or (minutes < 60 and 60 % minutes) or (minutes >= 60 and (minutes % 60 or 24 % (minutes // 60))):
        raise ConfigError(
            f"{PREFIX}WINDOW_MINUTES must divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) or be whole hours "
            f"dividing a day (60, 120, 180, 240, 360, 480, 720, 1440), got {minutes}")


def _window_start(now: datetime, window_minutes: int) -> datetime:
    seconds = int(now.timestamp())
    return datetime.fromtimestamp(seconds - seconds % (window_minutes * 60), tz=timezone.utc)


def _parse_start(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{PREFIX}PARTITIONS_START {text!r} is not an ISO 8601 date or time "
                          f"(e.g. 2026-01-31 or 2026-01-31T06:00:00Z)") from None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _int(text: str | None, name: str, default: int) -> int:
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{PREFIX}{name} must be an integer, got {text!r}") from None


def _float(text: str | None, name: str, default: float) -> float:
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{PREFIX}{name} must be a number, got {text!r}") from None


def _bool(text: str | None, name: str, default: bool) -> bool:
    if text is None:
        return default
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{PREFIX}{name} must be true or false, got {text!r}")


def _json_object(text: str | None, name: str) -> dict[str, str]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{PREFIX}{name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{PREFIX}{name} must be a JSON object of Spark settings, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}
