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
    KCL_PIPELINE_STALL_SECONDS            the hosting sensor's ticks fail once no lease-manager cycle succeeded
                                          for this long (300; 0: never)
    KCL_PIPELINE_GRACE_SECONDS            clock grace of window completeness  (10)
    KCL_PIPELINE_HOST_WORKERS             the sensor hosts lease workers (true) or only observes (false)
                                          (demo: true; otherwise it must be set to true explicitly)
    KCL_PIPELINE_WORKER_ID                this host's consumer id (default: made once, kept in the sensor cursor)
    KCL_PIPELINE_METRICS_NAMESPACE        CloudWatch namespace (unset: no CloudWatch metrics)
    KCL_PIPELINE_METRICS_NAMING           pipeline | kcl (Java KCL's metric names and dimensions)
    KCL_PIPELINE_RETRIEVAL                polling | fanout: GetRecords, or enhanced fan-out through a stream
                                          consumer named after the application (polling; docs/fanout.md)
    KCL_PIPELINE_DECODER                  payload decoder of the transform    (json)
    KCL_PIPELINE_LANDING_READER           auto | native | datasource: how Spark reads the zone (auto)
    KCL_PIPELINE_SPARK_MASTER             Spark master                        (local[*]; `demo` and `local up`
                                          set their Spark Connect server's sc://127.0.0.1:<port>)
    KCL_PIPELINE_SPARK_FALLBACK_MASTER    with an sc:// master: the cold session a run starts when the server
                                          does not answer (unset: the run fails; `demo` and `local up` set
                                          local[*]; transform/connect.py)
    KCL_PIPELINE_SPARK_CONF               extra Spark settings, a JSON object (secret-looking ones shown as ***)
    KCL_PIPELINE_SPARK_AWS_CREDENTIALS    pass the run's AWS keys to Spark's options (unset: only when S3 is at
                                          an explicit endpoint, e.g. the emulators)
    AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL[_KINESIS|_DYNAMODB|_S3|_CLOUDWATCH]  where AWS is (read by the SDK)
    KCL_PIPELINE_S3_SSE_KMS_KEY_ID, KCL_PIPELINE_S3_EXPECTED_BUCKET_OWNER  what every S3 request carries (read
                                          by kcl/aws_settings.py in every process, like the endpoints: OTHER_VARIABLES)

The consumer's defaults (timings, lease counts, initial position) are ConsumerConfig's: they are declared
once, in kcl_pipeline.kcl.config, and read from there.

A KCL_PIPELINE_* variable that is not one of these (nor one read elsewhere: OTHER_VARIABLES) is refused,
naming the closest known one. Every check is made here, once, before anything is written (docs/configuration.md).

The variables are read by pydantic-settings (the [dagster] extra): the prefix, a blank variable meaning unset,
numbers, booleans (true/false, 1/0, yes/no, on/off), choices and JSON. A bad value is an error naming the
variable, its value and what was expected. The module itself imports without it (and without Dagster): its
checks and constants serve the CLI on a core install.
"""
from __future__ import annotations

import difflib
import functools
import math
import os
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Mapping

from ..kcl.aws_settings import (
    AWS_CALL_LOG_ENV,
    S3_EXPECTED_BUCKET_OWNER_ENV,
    S3_SSE_KMS_KEY_ID_ENV,
    AwsSettings,
    S3RequestSettings,
)
from ..kcl.config import RETRIEVALS, WORKER_START_METHOD_ENV, ConfigError, InitialPosition, consumer_default
from ..kcl.core.model import AT_TIMESTAMP, LATEST, TRIM_HORIZON
from ..transform.connect import is_connect
from ..transform.names import DECODERS, SPARK_MASTER
from .consumer import ConsumerSettings
from .redaction import looks_secret
from .streams import check_prefixes

PREFIX = "KCL_PIPELINE_"
PROFILES = ("default", "demo")
LANDING_READERS = ("auto", "native", "datasource")
# Dagster's UI and daemons slow down past this many partitions of one asset.
MAX_PARTITIONS = 100_000
# What the demo profile changes (the partitions' start too: the current window, unless set).
DEMO_DEFAULTS = {"window_minutes": 2, "create_zones": True, "host_workers": True}
# The settings, one per KCL_PIPELINE_<NAME> variable (PipelineVariables has one field for each: a test holds
# them equal). Listed here, outside pydantic, so that names are checked on a core install too.
SETTINGS = ("profile", "stream", "application", "table_name", "initial_position", "initial_timestamp",
            "window_minutes", "partitions_start", "landing_uri", "output_uri", "create_zones", "host_workers",
            "sensor_interval_seconds", "heartbeat_seconds", "lease_expiry_seconds", "max_leases", "stall_seconds",
            "grace_seconds",
            "worker_id", "metrics_namespace", "metrics_naming", "retrieval", "decoder", "landing_reader",
            "spark_master", "spark_fallback_master", "spark_conf", "spark_aws_credentials")
# KCL_PIPELINE_* variables that are not settings of the deployment but are read elsewhere; known, so that
# they are not refused as misspelt settings. A test holds every KCL_PIPELINE_ name in the repository to
# SETTINGS and these.
OTHER_VARIABLES = {
    WORKER_START_METHOD_ENV: "how lease workers start (kcl/config.py; docs/memory.md)",
    "KCL_PIPELINE_NODE_MODULES": "the local emulators' node_modules (local/prerequisites.py)",
    "KCL_PIPELINE_CACHE_DIR": "the local emulators' cache (local/prerequisites.py)",
    "KCL_PIPELINE_PARENT_PID": "the emulators exit when this process is gone (local/emulators.py)",
    S3_SSE_KMS_KEY_ID_ENV: "the SSE-KMS key of every S3 write (kcl/aws_settings.py; docs/deployment.md)",
    S3_EXPECTED_BUCKET_OWNER_ENV: "the account every S3 request expects to own the bucket (kcl/aws_settings.py)",
    AWS_CALL_LOG_ENV: "a file each process appends its AWS calls to (tests of the IAM policies; kcl/shells/aws.py)",
}
KNOWN_VARIABLES = (*(PREFIX + name.upper() for name in SETTINGS), *OTHER_VARIABLES)
ZONE_SCHEMES = ("s3://bucket/prefix", "file://path", "a directory", "memory://name (tests)")
# Partitions start within datetime's range with a window to spare (a window's end must be a datetime too),
# and not before the Unix epoch (no Kinesis record is older).
EARLIEST_START = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST_START = datetime(9999, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class PipelineSettings(ConsumerSettings):
    """The consumer (ConsumerSettings, the `consumer` resource's fields) and what is fixed when Definitions
    are built: the partitions' start, the sensor's interval, Spark. Defaults are the environment's."""

    stream: str = "kcl-pipeline-demo"
    application: str = "kcl-pipeline"
    partitions_start: datetime  # required: fixed configuration, see above
    landing_uri: str = "s3://kcl-pipeline/landing"
    output_uri: str = "s3://kcl-pipeline/output"
    # Hosting lease workers in the code server is opt-in outside the demo: a code location loaded by accident
    # with production credentials observes (reports windows, requests runs) but never joins the fleet.
    host_workers: bool = False
    sensor_interval_seconds: int = int(consumer_default("cycle_seconds"))
    spark_master: str = "local[*]"
    spark_fallback_master: str | None = None  # with an sc:// master only (transform/connect.py)
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    spark_aws_credentials: bool | None = None  # None: S3Options.pins_credentials decides

    def __post_init__(self) -> None:
        # Every check of the deployment's settings is here: PipelineSettings is built (from_env) before the
        # code location defines anything or the CLI writes anything. nan passes every comparison and inf
        # most: refuse both first.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{variable_name(f.name)} must be a finite number, got {value!r}")
        check_window_minutes(self.window_minutes)
        InitialPosition.parse(self.initial_position, self.initial_timestamp)  # raises ConfigError
        # The consumer's own checks (names, heartbeat vs expiry, leases), at load rather than at the first tick.
        self.consumer_config(AwsSettings(), "settings-check", float(self.sensor_interval_seconds))
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
        if not EARLIEST_START <= self.partitions_start < LATEST_START:
            raise ConfigError(f"{PREFIX}PARTITIONS_START {self.partitions_start.isoformat()} must be from "
                              f"{EARLIEST_START.date()} to before {LATEST_START.date()}")
        for name in ("landing_uri", "output_uri"):
            check_zone_uri(variable_name(name), getattr(self, name))
        if self.decoder not in DECODERS:
            raise ConfigError(f"{PREFIX}DECODER must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if not SPARK_MASTER.fullmatch(self.spark_master):
            raise ConfigError(f"{PREFIX}SPARK_MASTER must be local, local[N], local[*], local-cluster[N,C,M], yarn "
                              f"or spark://, k8s://, mesos://, sc://host, got {self.spark_master!r}")
        check_spark_fallback(self.spark_master, self.spark_fallback_master)

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
        values = read_variables(env)
        check_s3_requests(env)
        demo = values.pop("profile", "default") == "demo"
        if demo:
            values = {**DEMO_DEFAULTS, **values}
        window = values.get("window_minutes", cls.window_minutes)
        check_window_minutes(window)  # before the current window is computed from it
        start_text = values.pop("partitions_start", None)
        if start_text:
            start = _parse_start(start_text)
        elif demo or not for_partitions:
            start = window_start(now, window)
        else:
            raise ConfigError(
                f"{PREFIX}PARTITIONS_START is required: the first window partition, fixed for the deployment's "
                f"life (ISO 8601 UTC on a window boundary, e.g. 2026-01-31 or 2026-01-31T06:00:00Z). Choose the "
                f"window of the oldest record you want transformed; older records are left untransformed and reported")
        if "stream" in values:
            values["stream"], *more = _streams(values["stream"])
            values["more_streams"] = tuple(more)
        if "spark_conf" in values:
            values["spark_conf"] = {str(k): str(v) for k, v in values["spark_conf"].items()}
        settings = cls(partitions_start=start, **values)
        settings.check_partition_count(now)
        return settings


def variable_name(field_name: str) -> str:
    """The variable a field is set by (KCL_PIPELINE_<FIELD>), or the field's name if no variable sets it."""
    return PREFIX + field_name.upper() if field_name in SETTINGS else field_name


def check_s3_requests(env: Mapping[str, str]) -> None:
    """KCL_PIPELINE_S3_SSE_KMS_KEY_ID and _EXPECTED_BUCKET_OWNER as this environment gives them (read by every
    process's AwsSettings, so not settings of PipelineSettings; checked at load all the same)."""
    try:
        S3RequestSettings.from_environment(env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_zone_uri(variable: str, uri: str) -> None:
    """A zone is s3://bucket/prefix, a directory (a path or file://) or memory://name; anything else (ftp://,
    s3:// without a bucket) would fail only when the first batch is written."""
    if not uri:
        raise ConfigError(f"{variable} is empty; use {', '.join(ZONE_SCHEMES)}")
    if uri.startswith("memory://"):
        return
    from ..zone.layout import Zone

    try:
        Zone.parse(uri)
    except ValueError:
        raise ConfigError(f"{variable} must be {', '.join(ZONE_SCHEMES)}, got {uri!r}") from None


def check_variable_names(env: Mapping[str, str]) -> None:
    """A KCL_PIPELINE_* variable that is set but no known name is refused, naming the closest known one: a
    misspelt setting (KCL_PIPELINE_HOST_WORKER) silently ignored would leave the deployment on a default."""
    problems = []
    for name in sorted(env):
        upper = name.upper()  # pydantic-settings reads the names in any case
        if not upper.startswith(PREFIX) or upper in KNOWN_VARIABLES or not env[name].strip():
            continue
        # Compared without the prefix they all share, which would make every name look close.
        close = difflib.get_close_matches(upper[len(PREFIX):], [known[len(PREFIX):] for known in KNOWN_VARIABLES], n=1)
        problems.append(f"{name} is not a setting" + (f" (did you mean {PREFIX}{close[0]}?)" if close else ""))
    if problems:
        raise ConfigError("; ".join(problems) + " (settings: docs/configuration.md)")


def _streams(text: str) -> tuple[str, ...]:
    streams = tuple(part.strip() for part in text.split(","))
    if not all(streams):
        raise ConfigError(f"{PREFIX}STREAM {text!r} has an empty name: give a stream, or streams separated by ','")
    return streams


def read_variables(env: Mapping[str, str]) -> dict[str, Any]:
    """The KCL_PIPELINE_* variables that are set (blank ones are not), by field name, typed by pydantic-settings.

    Every bad value is reported at once: the variable, the value given, what was expected.
    """
    check_variable_names(env)
    if not any(name.startswith(PREFIX) and value.strip() for name, value in env.items()):
        return {}  # nothing to read: a core install (no pydantic-settings) runs audit and backfill on flags alone
    from pydantic import ValidationError

    model, source = _variables_model()
    found = source(model, env)()
    try:
        typed = model.model_validate(found)
    except ValidationError as exc:
        raise ConfigError("; ".join(_explain(error, found) for error in exc.errors())) from None
    return {name: getattr(typed, name) for name in typed.model_fields_set}


# What each kind of refusal expected, in the variable's words.
_EXPECTED = {
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "bool_parsing": "true or false (or 1/0, yes/no, on/off)",
    "dict_type": "a JSON object",
}


def _explain(error: Any, found: Mapping[str, Any]) -> str:
    name = str(error["loc"][0])
    variable, given = PREFIX + name.upper(), found.get(name, error["input"])
    kind = error["type"]
    if kind == "literal_error":
        expected = error["ctx"]["expected"]
    elif kind == "json_invalid":
        expected = f"a JSON object (not JSON: {error['ctx']['error']})"
    else:
        expected = _EXPECTED.get(kind, error["msg"])
    if name == "spark_conf" and looks_secret(str(given)):  # the code location's error is shown in Dagster's UI
        return f"{variable} must be {expected}, got a value not repeated here (it names a secret-looking setting)"
    return f"{variable} must be {expected}, got {given!r}"


@functools.cache
def _variables_model() -> tuple[Any, Any]:
    """The variables' types and the source reading them from a mapping (built on first use: pydantic-settings
    comes with the [dagster] extra, and the CLI imports this module on a core install too)."""
    try:
        from pydantic import BeforeValidator, Json
        from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
    except ImportError:
        raise ConfigError(f"reading the {PREFIX}* variables needs pydantic-settings: pip install "
                          f"'kcl_pipeline[dagster]' (or pydantic-settings alone)") from None
    lower, upper = BeforeValidator(str.lower), BeforeValidator(str.upper)
    return (_variables_class(BaseSettings, SettingsConfigDict, Json, lower, upper),
            _mapping_source_class(BaseSettings, EnvSettingsSource))


def _variables_class(BaseSettings: Any, SettingsConfigDict: Any, Json: Any, lower: Any, upper: Any) -> Any:
    """The variables' model, from pydantic-settings' classes (passed in: imported only where it is installed)."""

    class PipelineVariables(BaseSettings):
        """One field per variable (KCL_PIPELINE_<FIELD>); unset ones stay None and PipelineSettings' defaults apply."""

        model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore")

        # The choices are the tuples the checks use (Literal of a tuple: pydantic reads it, mypy does not).
        profile: Annotated[Literal[PROFILES], lower] | None = None  # type: ignore[valid-type]
        stream: str | None = None
        application: str | None = None
        table_name: str | None = None
        initial_position: Annotated[Literal[TRIM_HORIZON, LATEST, AT_TIMESTAMP], upper] | None = None  # type: ignore[valid-type]
        initial_timestamp: str | None = None
        window_minutes: int | None = None
        partitions_start: str | None = None  # ISO 8601 with a Z: read by _parse_start
        landing_uri: str | None = None
        output_uri: str | None = None
        create_zones: bool | None = None
        host_workers: bool | None = None
        sensor_interval_seconds: int | None = None
        heartbeat_seconds: float | None = None
        lease_expiry_seconds: float | None = None
        max_leases: int | None = None
        stall_seconds: float | None = None
        grace_seconds: float | None = None
        worker_id: str | None = None
        metrics_namespace: str | None = None
        metrics_naming: Annotated[Literal["pipeline", "kcl"], lower] | None = None
        retrieval: Annotated[Literal[RETRIEVALS], lower] | None = None  # type: ignore[valid-type]
        decoder: str | None = None
        landing_reader: Annotated[Literal[LANDING_READERS], lower] | None = None  # type: ignore[valid-type]
        spark_master: str | None = None
        spark_fallback_master: str | None = None
        spark_conf: Json[dict[str, Any]] | None = None
        spark_aws_credentials: bool | None = None

    return PipelineVariables


def _mapping_source_class(BaseSettings: Any, EnvSettingsSource: Any) -> Any:
    """pydantic-settings' environment source, reading a given mapping instead of os.environ."""

    class MappingSource(EnvSettingsSource):
        """pydantic-settings' environment source over a given mapping (os.environ, or a test's), values
        stripped: a variable of blanks is unset too."""

        def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
            self.environ = environ
            super().__init__(settings_cls)

        def _load_env_vars(self) -> Mapping[str, str | None]:
            stripped = ((name, value.strip()) for name, value in self.environ.items())
            return {name if self.case_sensitive else name.lower(): value for name, value in stripped
                    if value or not self.env_ignore_empty}

    return MappingSource


def check_spark_fallback(master: str, fallback: str | None) -> None:
    """A fallback master is a cold session for an sc:// master's runs: any master but another server."""
    if fallback is None:
        return
    name = f"{PREFIX}SPARK_FALLBACK_MASTER"
    if not is_connect(master):
        raise ConfigError(f"{name} is the session a run starts when its Spark Connect server does not answer; "
                          f"it needs an sc:// {PREFIX}SPARK_MASTER, got {master!r}")
    if not SPARK_MASTER.fullmatch(fallback) or is_connect(fallback):
        raise ConfigError(f"{name} must be local, local[N], local[*], local-cluster[N,C,M], yarn or spark://, "
                          f"k8s://, mesos:// (a session the run starts itself), got {fallback!r}")


def check_window_minutes(minutes: int) -> None:
    """Windows must tile the hour or the day, so that they line up with Dagster's cron-based partitions."""
    if minutes < 1 or (minutes < 60 and 60 % minutes) or (minutes >= 60 and (minutes % 60 or 24 % (minutes // 60))):
        raise ConfigError(
            f"{PREFIX}WINDOW_MINUTES must divide an hour (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) or be whole hours "
            f"dividing a day (60, 120, 180, 240, 360, 480, 720, 1440), got {minutes}")


def window_start(now: datetime, window_minutes: int) -> datetime:
    """The start of the window `now` falls in (UTC)."""
    seconds = int(now.timestamp())
    return datetime.fromtimestamp(seconds - seconds % (window_minutes * 60), tz=timezone.utc)


def _parse_start(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)
    except ValueError:
        raise ConfigError(f"{PREFIX}PARTITIONS_START {text!r} is not an ISO 8601 date or time "
                          f"(e.g. 2026-01-31 or 2026-01-31T06:00:00Z)") from None
    except OverflowError:  # its offset takes it past year 1 or 9999 in UTC
        raise ConfigError(f"{PREFIX}PARTITIONS_START {text!r} is out of range in UTC") from None
