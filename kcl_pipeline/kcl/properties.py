"""Java KCL / kclpy `.properties` files, read into ConsumerConfig settings.

A team moving from kclpy's MultiLangDaemon keeps its properties file: each key it knows becomes the
ConsumerConfig field it means (times in milliseconds become seconds). Keys that only matter to the
MultiLangDaemon (the child process to run, its thread pool, its user agent) are accepted and reported as
ignored, so the file kclpy ships works unchanged. Any other key — a typo, or a KCL 3.x setting this
consumer does not have — is an error naming the key: a setting silently dropped is a surprise in production.

The file's syntax is Java's own: `parse_properties` reads what `java.util.Properties.load` reads, with its
escapes and continuations (through `javaproperties`), so a file the MultiLangDaemon accepts means the same here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import javaproperties

from .config import ConfigError, InitialPosition, consumer_default
from .core.model import AT_TIMESTAMP


@dataclass(frozen=True)
class PropertiesImport:
    """What a properties file sets: ConsumerConfig keyword arguments, plus the keys it ignored."""

    settings: dict[str, Any] = field(default_factory=dict)  # ConsumerConfig field -> value (`region` for the AWS one)
    ignored: tuple[str, ...] = ()


def _millis(key: str, text: str) -> float:
    return _positive_int(key, text) / 1000.0


def _positive_int(key: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"property {key} must be a whole number, got {text!r}") from None
    if value <= 0:
        raise ConfigError(f"property {key} must be > 0, got {value}")
    return value


def _text(key: str, text: str) -> str:
    if not text:
        raise ConfigError(f"property {key} is empty")
    return text


# property -> (ConsumerConfig field, parser). Java's meaning, in this consumer's units.
MAPPED: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "streamName": ("stream", _text),
    "streamArn": ("stream", _text),  # wins over streamName, as in kclpy
    "applicationName": ("application", _text),
    "tableName": ("table_name", _text),
    # KCL 3.x's multilang keys for its separate metadata tables (CoordinatorStateTableConfigBean,
    # WorkerMetricStatsTableConfigBean).
    "coordinatorStateTableName": ("coordinator_state_table_name", _text),
    "workerMetricsTableName": ("worker_metrics_table_name", _text),
    "workerId": ("worker_id", _text),
    "workerIdentifier": ("worker_id", _text),
    "regionName": ("region", _text),
    "failoverTimeMillis": ("lease_expiry_seconds", _millis),
    "maxLeasesForWorker": ("max_leases", _positive_int),
    "maxLeasesToStealAtOneTime": ("leases_to_acquire", _positive_int),
    "shardSyncIntervalMillis": ("cycle_seconds", _millis),
    "idleTimeBetweenReadsInMillis": ("polling_interval_seconds", _millis),
    "maxRecords": ("max_records_per_call", _positive_int),
    "metricsBufferTimeMillis": ("metrics_interval_seconds", _millis),
}
# Read separately: they combine with other keys.
_SPECIAL = ("initialPositionInStream", "initialPositionInStreamExtended", "metricsLevel",
            "AwsCredentialsProvider", "AwsCredentialsProviderDynamoDB", "AwsCredentialsProviderCloudWatch")
# The MultiLangDaemon's own knobs, or behaviour this consumer has fixed: accepted, reported, without effect.
IGNORED = frozenset({
    "executableName", "processingLanguage", "maxActiveThreads", "callProcessRecordsEvenForEmptyRecordList",
    "parentShardPollIntervalMillis", "cleanupLeasesUponShardCompletion", "taskBackoffTimeMillis",
    "metricsMaxQueueSize", "validateSequenceNumberBeforeCheckpointing",
})
KNOWN = frozenset(MAPPED) | frozenset(_SPECIAL) | IGNORED
# boto3's default chain (environment, profile, container and instance roles) is Java's default provider.
_DEFAULT_PROVIDERS = {"DefaultCredentialsProvider", "DefaultAWSCredentialsProviderChain"}
_LINE_END = re.compile(r"\r\n|\r|\n")


def parse_properties(text: str | bytes, source: str = "properties") -> dict[str, str]:
    """Keys and values as Java's `Properties.load` reads them (the `javaproperties` package implements it).

    `key = value`, `key: value` and `key value`; `#`/`!` comments; a line ending in an odd number of
    backslashes continues on the next (whose leading whitespace is dropped); escapes `\\uXXXX`, `\\t`,
    `\\n`, `\\r`, `\\f`, `\\\\`, and a backslash before any other character is that character (`a\\=b`
    is the key `a=b`); a key alone has the empty value; a value keeps its trailing whitespace. Bytes are read
    as ISO-8859-1, as `Properties.load(InputStream)` (the MultiLangDaemon's) reads a file.

    Where Java differs, it is on purpose: a key given twice is an error naming both lines (Java keeps the
    last silently; here it is most likely a mistake), and a malformed `\\u` escape names its line.
    """
    entries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    line = 1  # where the next element starts
    try:
        for element in javaproperties.parse(text):
            if isinstance(element, javaproperties.KeyValue):
                if element.key in entries:
                    raise ConfigError(f"{source}:{line}: {element.key} is set twice "
                                      f"(first on line {first_line[element.key]})")
                entries[element.key] = element.value
                first_line[element.key] = line
            line += _lines(element.source)
    except javaproperties.InvalidUEscapeError as exc:
        raise ConfigError(f"{source}:{line}: malformed \\uXXXX escape {exc.escape!r} "
                          f"(four hexadecimal digits expected)") from None
    return entries


def _lines(source: str) -> int:
    """How many physical lines an element spans (Java's line ends: \\n, \\r, \\r\\n)."""
    ends = len(_LINE_END.findall(source))
    return ends if source.endswith(("\n", "\r")) else ends + 1


def import_properties(entries: dict[str, str]) -> PropertiesImport:
    """The ConsumerConfig settings a kclpy/Java KCL properties file means. Unknown keys are an error.

    Values are read trimmed: whitespace a file cannot show (Java keeps a value's trailing blanks) would
    otherwise make a stream, application or region name that AWS refuses.
    """
    unknown = sorted(set(entries) - KNOWN)
    entries = {key: value.strip() for key, value in entries.items()}
    if unknown:
        raise ConfigError(
            f"unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; supported: "
            f"{', '.join(sorted(set(MAPPED) | set(_SPECIAL)))} (and, ignored: {', '.join(sorted(IGNORED))})")
    settings: dict[str, Any] = {}
    for key, value in entries.items():
        if key in MAPPED and key != "streamName":
            name, parse = MAPPED[key]
            settings[name] = parse(key, value)
    if "streamArn" not in entries and "streamName" in entries:
        settings["stream"] = _text("streamName", entries["streamName"])
    if "failoverTimeMillis" in entries:
        # Java renews every failoverTime/3: the same ratio keeps a lease alive through one lost renewal.
        settings["heartbeat_seconds"] = settings["lease_expiry_seconds"] / 3
    if "idleTimeBetweenReadsInMillis" in entries:
        settings["idle_interval_seconds"] = max(settings["polling_interval_seconds"],
                                                consumer_default("idle_interval_seconds"))
    position = _initial_position(entries)
    if position is not None:
        settings["initial_position"] = position
    for key in ("AwsCredentialsProvider", "AwsCredentialsProviderDynamoDB", "AwsCredentialsProviderCloudWatch"):
        provider = entries.get(key)
        if provider is not None and provider not in _DEFAULT_PROVIDERS:
            raise ConfigError(f"property {key} = {provider}: only the default provider chain is supported "
                              f"(configure credentials through AWS_PROFILE, the environment or an instance role)")
    level = entries.get("metricsLevel", "SUMMARY").upper()
    if level not in ("NONE", "SUMMARY", "DETAILED"):
        raise ConfigError(f"property metricsLevel must be NONE, SUMMARY or DETAILED, got {level!r}")
    # Java KCL publishes to CloudWatch under the application's name unless metrics are off.
    settings["metrics_namespace"] = None if level == "NONE" else settings.get("application")
    settings["metrics_naming"] = "kcl"  # a KCL user's dashboards expect KCL's names
    return PropertiesImport(settings, tuple(sorted(set(entries) & IGNORED)))


def _initial_position(entries: dict[str, str]) -> InitialPosition | None:
    extended = entries.get("initialPositionInStreamExtended")
    if extended is not None:
        # kclpy: epoch seconds, and it means AT_TIMESTAMP whatever initialPositionInStream says.
        try:
            seconds = float(extended)
            stamp = datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()
        except (ValueError, OverflowError, OSError):  # not a number; nan, inf or out of datetime's range
            raise ConfigError(f"property initialPositionInStreamExtended must be epoch seconds, "
                              f"got {extended!r}") from None
        return InitialPosition.parse(AT_TIMESTAMP, stamp)
    kind = entries.get("initialPositionInStream")
    if kind is None:
        return None
    if kind.upper() == AT_TIMESTAMP:
        raise ConfigError("property initialPositionInStream = AT_TIMESTAMP needs initialPositionInStreamExtended "
                          "(epoch seconds)")
    return InitialPosition.parse(kind)


def read_properties_file(path: str) -> PropertiesImport:
    try:
        with open(path, "rb") as fh:
            text = fh.read()  # bytes: ISO-8859-1, as Java's Properties.load(InputStream) reads them
    except OSError as exc:
        raise ConfigError(f"cannot read properties file {path}: {exc.strerror}") from None
    return import_properties(parse_properties(text, path))
