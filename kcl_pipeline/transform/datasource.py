"""Spark 4 Python data sources: read one landing-zone window, write one output partition — S3 without s3a.

Reader `kcl_landing` (`spark.read.format("kcl_landing").options(...).load()`):
    zone               s3://bucket/prefix or a local directory
    stream             the stream whose batches to read
    window_start_ms    window [start, end) in epoch millis UTC, whole minutes (batches are grouped by
    window_end_ms      arrival minute: a batch belongs to the window iff its minute does)
    s3_endpoint_url, s3_region, s3_aws_access_key_id, ... (see landing.store.S3Options; explicit because
                       executors do not inherit the driver's environment on a cluster)
    max_partition_bytes  bound of one input partition (default 64 MiB)
  The planner lists the window's minute prefixes (layout.window_prefixes) and packs the batch keys, in key
  order, into input partitions of at most max_partition_bytes; executors fetch each object and yield Arrow
  record batches in LANDING_SCHEMA (the fast path: no per-row Python).

Writer `kcl_window_output` (`df.write.format("kcl_window_output").mode("overwrite").options(...).save()`):
    path               dataset root URI (s3://… or a directory), e.g. <output_uri>/transformed
    partition          one directory under it, e.g. window=20240501T120000Z
  Each run writes into its own run directory, <path>/<partition>/run=<job>/: every task streams its Parquet
  file straight to its final key (S3 multipart parts of 8 MiB, or a temporary file renamed into place), so
  no task holds its output in memory and nothing is copied. Commit writes <partition>/_manifest.json naming
  the run and exactly its files (the switch), then removes everything else under the partition (the previous
  run, failed task attempts). An empty input still publishes one empty Parquet file, so the partition exists
  with its schema. Abort removes the run directory unless the manifest already names it. A reader of the
  manifest's run directory sees exactly one run's files; see docs/transform-commits.md for readers of the whole
  directory.
"""
from __future__ import annotations

import io
import itertools
import json
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..kcl.records.record_batch import arrow_schema
from ..zone.batch import decode_batch
from ..zone.layout import MINUTE_MS, Zone, landing_directory, parse_batch_key, split_batch_keys, window_prefixes
from ..zone.store import S3Options, ZoneStore, open_store

LANDING_FORMAT = "kcl_landing"
OUTPUT_FORMAT = "kcl_window_output"
MANIFEST = "_manifest.json"
RUN_PREFIX = "run="
DEFAULT_MAX_PARTITION_BYTES = 64 * 1024 * 1024

# The landed batch schema (declared once: kcl/records/record_batch.py) as Spark sees it: nullable, and the arrival
# timestamp in microseconds (Spark's Arrow unit; batches are written in milliseconds and cast on read).
LANDING_ARROW_SCHEMA = pa.schema([
    pa.field(f.name, pa.timestamp("us", tz="UTC") if pa.types.is_timestamp(f.type) else f.type)
    for f in arrow_schema()])
_SPARK_TYPES = {pa.string(): "STRING", pa.int64(): "BIGINT", pa.binary(): "BINARY"}
LANDING_SCHEMA_DDL = ", ".join(
    f"{f.name} {'TIMESTAMP' if pa.types.is_timestamp(f.type) else _SPARK_TYPES[f.type]}" for f in LANDING_ARROW_SCHEMA)


# ---------------------------------------------------------------- pure planning

@dataclass(frozen=True)
class WindowBatch:
    key: str  # relative to the zone root
    size: int


def select_window_batches(listing: Iterable[tuple[str, int]], stream: str,
                          start_ms: int, end_ms: int) -> list[WindowBatch]:
    """The batches of `stream` whose arrival minute lies in [start_ms, end_ms), in key order.

    Read with the zone's one listing rule (`split_batch_keys`): objects that are not `.parquet` (links,
    temporaries, markers) are not landed data; a `.parquet` object that is not a batch key is an error."""
    sizes = dict(listing)
    stream = landing_directory(stream)
    found = split_batch_keys(sizes)
    if found.malformed:
        raise ValueError(f"landing zone: {len(found.malformed)} objects are not batch keys "
                         f"(<first>_<sub>-<last>_<sub>.parquet), e.g. {found.malformed[0]}; move them away")
    out = [WindowBatch(b.key(), sizes[b.key()]) for b in found.batches
           if b.stream == stream and start_ms <= b.minute_ms < end_ms]
    return sorted(set(out), key=lambda b: b.key)


BATCHES_OPTION = "batches"


def batches_option(batches: Sequence[WindowBatch]) -> str:
    """The reader option that fixes the batches to read (JSON [[key, size], ...])."""
    return json.dumps([[b.key, b.size] for b in batches])


def batches_from_option(value: str | None) -> tuple[WindowBatch, ...] | None:
    if value is None:
        return None
    try:
        return tuple(WindowBatch(str(k), int(n)) for k, n in json.loads(value))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{LANDING_FORMAT}: option {BATCHES_OPTION} is a JSON list of [key, size]: {exc}") from exc


def plan_partitions(batches: Sequence[WindowBatch], max_bytes: int) -> list[tuple[WindowBatch, ...]]:
    """Consecutive groups of at most `max_bytes` (a larger batch gets a group of its own)."""
    if max_bytes <= 0:
        raise ValueError(f"max_partition_bytes must be > 0, got {max_bytes}")
    groups: list[tuple[WindowBatch, ...]] = []
    current: list[WindowBatch] = []
    size = 0
    for batch in batches:
        if current and size + batch.size > max_bytes:
            groups.append(tuple(current))
            current, size = [], 0
        current.append(batch)
        size += batch.size
    if current:
        groups.append(tuple(current))
    return groups


def overlapping_shards(batches: Sequence[WindowBatch]) -> set[str]:
    """The shards of which two listed batches share a position. Only these can hold a record twice: a batch
    holds consecutive records, so batches whose [first, last] ranges are disjoint hold distinct records."""
    by_shard: dict[str, list] = {}
    for batch in batches:
        key = parse_batch_key(batch.key)
        if key is None:
            raise ValueError(f"{batch.key} is not a batch key")
        by_shard.setdefault(key.shard_id, []).append(key)
    overlapping = set()
    for shard, keys in by_shard.items():
        keys.sort(key=lambda k: k.first.key())
        if any(b.first.key() <= a.last.key() for a, b in itertools.pairwise(keys)):
            overlapping.add(shard)
    return overlapping


def shuffle_partitions(nbytes: int, max_partition_bytes: int) -> int:
    """Partitions for `nbytes` of landed input: one per max_partition_bytes, at least one."""
    return max(1, -(-nbytes // max_partition_bytes))


def check_window(start_ms: int, end_ms: int) -> None:
    if end_ms <= start_ms:
        raise ValueError(f"window end {end_ms} must be after its start {start_ms}")
    if start_ms % MINUTE_MS or end_ms % MINUTE_MS:
        raise ValueError(
            f"window [{start_ms}, {end_ms}) is not whole minutes: landing batches are grouped by arrival minute")


# ---------------------------------------------------------------- reader

@dataclass(frozen=True)
class WindowRead:
    zone: str
    stream: str
    start_ms: int
    end_ms: int
    s3: S3Options
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    # The driver's listing, when it fixed one (the window's commit names exactly these batches).
    batches: tuple[WindowBatch, ...] | None = None

    @classmethod
    def from_options(cls, options) -> "WindowRead":
        opts = {str(k).lower(): v for k, v in options.items()}
        missing = [k for k in ("zone", "stream", "window_start_ms", "window_end_ms") if not opts.get(k)]
        if missing:
            raise ValueError(f"{LANDING_FORMAT}: missing option(s) {', '.join(missing)}")
        try:
            start, end = int(opts["window_start_ms"]), int(opts["window_end_ms"])
            max_bytes = int(opts.get("max_partition_bytes") or DEFAULT_MAX_PARTITION_BYTES)
        except ValueError as exc:
            raise ValueError(f"{LANDING_FORMAT}: window_start_ms, window_end_ms and max_partition_bytes "
                             f"are integers: {exc}") from exc
        check_window(start, end)
        return cls(opts["zone"], opts["stream"], start, end, S3Options.from_options(opts), max_bytes,
                   batches_from_option(opts.get(BATCHES_OPTION)))

    def list_batches(self) -> list[WindowBatch]:
        if self.batches is not None:
            return list(self.batches)
        store = open_store(self.zone, s3=self.s3)
        store.check_exists()
        listing = (item for prefix in window_prefixes(self.stream, self.start_ms, self.end_ms)
                   for item in store.list_objects(prefix))
        return select_window_batches(listing, self.stream, self.start_ms, self.end_ms)


class LandingPartition(InputPartition):
    def __init__(self, batches: tuple[WindowBatch, ...]) -> None:
        super().__init__([b.key for b in batches])
        self.batches = batches


class LandingDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return LANDING_FORMAT

    def schema(self) -> str:
        return LANDING_SCHEMA_DDL

    def reader(self, schema: StructType) -> "LandingReader":
        return LandingReader(WindowRead.from_options(self.options))


class LandingReader(DataSourceReader):
    def __init__(self, window: WindowRead) -> None:
        self.window = window

    def partitions(self) -> list[InputPartition]:
        groups = plan_partitions(self.window.list_batches(), self.window.max_partition_bytes)
        # An empty list makes Spark plan one partition with value None; say so explicitly.
        return [LandingPartition(g) for g in groups] or [LandingPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batches = getattr(partition, "batches", None) or ()
        if not batches:
            return
        store = open_store(self.window.zone, s3=self.window.s3)
        for batch in batches:
            where = f"{batch.key} in {self.window.zone}"
            table = decode_batch(store.local_path(batch.key) or store.get(batch.key), where, self.window.stream)
            yield from table.cast(LANDING_ARROW_SCHEMA).to_batches()  # Spark's Arrow timestamps are micros


# ---------------------------------------------------------------- writer

class WrittenFile(WriterCommitMessage):
    def __init__(self, task: int, key: str | None, rows: int) -> None:
        self.task = task
        self.key = key  # relative to the dataset root; None: the task had no rows
        self.rows = rows


@dataclass(frozen=True)
class PartitionTarget:
    path: str
    partition: str
    s3: S3Options

    @classmethod
    def from_options(cls, options) -> "PartitionTarget":
        opts = {str(k).lower(): v for k, v in options.items()}
        path, partition = opts.get("path"), opts.get("partition")
        if not path or not partition:
            raise ValueError(f"{OUTPUT_FORMAT}: options path (the dataset root) and partition "
                             f"(e.g. window=20240501T120000Z) are required")
        if "/" in partition or partition.startswith(("_", ".")):
            raise ValueError(f"{OUTPUT_FORMAT}: partition {partition!r} must be one visible directory name")
        return cls(path, partition, S3Options.from_options(opts))


class WindowOutputDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return OUTPUT_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> "PartitionWriter":
        if not overwrite:
            raise ValueError(f"{OUTPUT_FORMAT} replaces one partition; use mode('overwrite')")
        return PartitionWriter(PartitionTarget.from_options(self.options), schema)


class PartitionWriter(DataSourceArrowWriter):
    def __init__(self, target: PartitionTarget, schema: StructType) -> None:
        self.target = target
        self.schema = schema
        self.job_id = uuid.uuid4().hex[:16]  # made on the driver; travels to tasks and commit by pickling
        store = self._store()
        store.ensure_zone(create=store.local_path("x") is not None)  # a dataset directory is made; a bucket must exist

    @property
    def run(self) -> str:
        return f"{RUN_PREFIX}{self.job_id}"

    @property
    def run_prefix(self) -> str:
        return f"{self.target.partition}/{self.run}/"

    def _store(self) -> ZoneStore:
        return open_store(self.target.path, s3=self.target.s3, what="transform output")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenFile:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        key = f"{self.run_prefix}part-{task:05d}-{attempt}.parquet"
        upload = None
        writer = None
        rows = 0
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    upload = self._store().upload(key)
                    writer = pq.ParquetWriter(upload, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
                upload.close()
        except BaseException:
            if upload is not None:
                upload.abort()  # first: a writer closed later (or collected) cannot publish a partial file
            raise
        return WrittenFile(task, key if writer is not None else None, rows)

    def commit(self, messages: list[WrittenFile | None]) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        store = self._store()
        part = f"{self.target.partition}/"
        files, rows = [], 0
        for msg in sorted((m for m in messages if m is not None), key=lambda m: m.task):
            rows += msg.rows
            if msg.key:
                files.append(msg.key[len(part):])
        if not files:
            name = f"{self.run}/part-empty.parquet"
            buf = io.BytesIO()
            pq.write_table(to_arrow_schema(self.schema, timezone="UTC").empty_table(), buf)
            store.put(part + name, buf.getvalue())
            files.append(name)
        manifest = {
            "job_id": self.job_id,
            "partition": self.target.partition,
            "run": self.run,
            "files": files,
            "rows": rows,
            "schema": [[f.name, f.dataType.simpleString()] for f in self.schema.fields],
        }
        store.put(part + MANIFEST, json.dumps(manifest, indent=1).encode())  # the switch
        # One run per window (the Spark run pool serialises a window's runs): whatever else is under the
        # partition is a replaced run, a failed task attempt or a crashed run's leftovers.
        keep = {part + name for name in files} | {part + MANIFEST}
        store.delete([key for key in store.list_keys(part) if key not in keep])

    def abort(self, messages: list[WrittenFile | None]) -> None:
        store = self._store()
        raw = store.get_optional(f"{self.target.partition}/{MANIFEST}")
        if raw is None or json.loads(raw).get("job_id") != self.job_id:  # our run was not committed
            store.delete_prefix(self.run_prefix)


# ---------------------------------------------------------------- native read

LANDING_READERS = ("auto", "native", "datasource")


def use_native_reader(zone: str, reader: str) -> bool:
    """Whether Spark reads the zone's Parquet itself (`spark.read.parquet`) instead of through the Python data
    source: "auto" does for a directory zone (executors of a local session, or of a cluster on a shared path,
    see it as the driver does); an s3:// zone needs reader="native" and hadoop-aws (s3a) on the cluster."""
    if reader not in LANDING_READERS:
        raise ValueError(f"landing reader {reader!r}: expected one of {', '.join(LANDING_READERS)}")
    if reader == "auto":
        return Zone.parse(zone).scheme == "file"
    return reader == "native"


def native_paths(zone: str, batches: Sequence[WindowBatch]) -> list[str]:
    """The batches as paths Spark's own Parquet reader opens (file:// or s3a://)."""
    parsed = Zone.parse(zone)
    if parsed.scheme == "file":
        return [f"file://{parsed.root}/{b.key}" for b in batches]
    return [f"s3a://{parsed.bucket}/{parsed.full_key(b.key)}" for b in batches]


def read_native(spark, zone: str, stream: str, batches: Sequence[WindowBatch]):
    """The listed batches through `spark.read.parquet`, in the landing schema (a missing `stream` column is the
    stream read; a missing `explicit_hash_key` is null), like the data source's rows."""
    from pyspark.sql import functions as F

    if not batches:
        return spark.createDataFrame([], LANDING_SCHEMA_DDL)
    df = spark.read.schema(LANDING_SCHEMA_DDL).parquet(*native_paths(zone, batches))
    return df.withColumn("stream", F.coalesce(F.col("stream"), F.lit(stream)))


def register(spark) -> None:
    """Register both data sources with `spark`, at every window's run: a registration lives in the JVM session's
    state, which a session object can outlive (a test run met a session whose object was marked registered while
    Spark no longer knew `kcl_window_output`); registering again replaces it, in a few hundred milliseconds."""
    spark.dataSource.register(LandingDataSource)
    spark.dataSource.register(WindowOutputDataSource)


def activate(spark) -> None:
    """Make `spark` the JVM's active session for the calling thread, before a read or write names one of the data
    sources: Spark finds a Python data source by name in the thread's active session, not the writer's own
    session, and a py4j thread can have another or none (a thread pinned anew after its connection was reset:
    both cluster tests failed so with DATA_SOURCE_NOT_FOUND). A Spark Connect session keeps its own state on the
    server: nothing to do."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None and getattr(spark, "_jsparkSession", None) is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
