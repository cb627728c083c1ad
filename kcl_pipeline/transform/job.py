"""The Spark transform of one window: read the landed batches, drop duplicates, decode, quarantine, write.

Output layout under `output_uri` (s3://bucket/prefix or a directory), one partition per window start:

    transformed/window=<YYYYMMDDTHHMMSSZ>/part-*.parquet + _manifest.json
        shard_id, sequence_number, sub_sequence_number, partition_key, approximate_arrival_timestamp,
        window_start, payload, [the decoder's further fields]
    quarantine/window=<…>/…
        shard_id, sequence_number, sub_sequence_number, partition_key, approximate_arrival_timestamp,
        window_start, reason, data (the raw bytes)

The window name is ISO 8601 basic format (no ':' — Hadoop paths reject it). Re-running a window replaces
both partitions (datasource.PartitionWriter), so outputs never duplicate. Sequence numbers stay strings.

Counting is exact by construction: the window is made distinct on (shard_id, sequence_number,
sub_sequence_number), counting copies, and every distinct record then lands in exactly one of the outputs:
rows_in = rows_out + duplicates_dropped + quarantined. Duplicates are the same Kinesis record landed twice
(overlapping batches written before batch fencing, or a zone copied in by hand), so which copy is kept does
not matter. Only shards whose batch keys overlap can hold a copy (a batch holds consecutive records), so
only their rows are grouped (shuffled, in partitions sized from their bytes); every other row passes through
without a shuffle: with today's fenced landing that is every row.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from ..kcl.core.model import Checkpoint
from ..windows.commit import begin_window
from ..windows.manifest import QUARANTINE, TRANSFORMED, window_partition
from ..zone.batch import read_parquet
from ..zone.errors import ZoneNotFoundError
from ..zone.layout import parse_batch_key
from ..zone.store import S3Options, ZoneStore, open_store
from .connect import is_connect, resolve_master
from .datasource import (
    BATCHES_OPTION,
    DEFAULT_MAX_PARTITION_BYTES,
    LANDING_FORMAT,
    MANIFEST,
    OUTPUT_FORMAT,
    WindowBatch,
    WindowRead,
    activate,
    batches_option,
    check_window,
    overlapping_shards,
    read_native,
    register,
    shuffle_partitions,
    use_native_reader,
)
from .decoders import DecoderFn, get_decoder
from .names import LOCAL_MASTER

log = logging.getLogger(__name__)

RECORD_KEY = ("shard_id", "sequence_number", "sub_sequence_number")
_CARRIED = ("partition_key", "approximate_arrival_timestamp", "data")
OUTPUT_BASE = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key",
               "approximate_arrival_timestamp", "window_start")


class OutputNotFoundError(FileNotFoundError):
    """A window partition with no committed output."""


class ShardRange(NamedTuple):
    """A shard's records in the window (after dropping duplicates; output + quarantine)."""

    first: Checkpoint
    last: Checkpoint
    rows: int


@dataclass(frozen=True)
class TransformReport:
    window_start_ms: int
    window_end_ms: int
    rows_in: int
    rows_out: int
    duplicates_dropped: int
    quarantined: int
    schema: list[tuple[str, str]]
    per_shard: dict[str, ShardRange] = field(default_factory=dict)
    output_path: str = ""
    quarantine_path: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (for asset metadata)."""
        return {
            "window_start_ms": self.window_start_ms, "window_end_ms": self.window_end_ms,
            "rows_in": self.rows_in, "rows_out": self.rows_out,
            "duplicates_dropped": self.duplicates_dropped, "quarantined": self.quarantined,
            "schema": [list(item) for item in self.schema],
            "per_shard": {
                shard: {"first": [r.first.sequence_number, r.first.sub_sequence_number],
                        "last": [r.last.sequence_number, r.last.sub_sequence_number], "rows": r.rows}
                for shard, r in sorted(self.per_shard.items())
            },
            "output_path": self.output_path, "quarantine_path": self.quarantine_path,
        }


def spark_session_conf(python_executable: str | None = None, *, shuffle_partitions: int = 4) -> dict[str, str]:
    """The SparkSession settings the transform needs (for dagster-pyspark's PySparkResource or a builder).

    The Python interpreter is set only when asked (`python_executable`): on a local session the driver's
    interpreter is the workers'; on a cluster the executors' own Python (PYSPARK_PYTHON in their
    environment) is used, and forcing a driver path there would name a file the executors do not have."""
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # local[*]: a few shuffle partitions (AQE coalesces further); raise it on a cluster.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    if python_executable:
        conf["spark.pyspark.python"] = python_executable
        conf["spark.pyspark.driver.python"] = python_executable
    return conf


LOOPBACK = "127.0.0.1"


def is_local_master(master: str) -> bool:
    return LOCAL_MASTER.fullmatch(master.strip()) is not None


def loopback_conf(master: str) -> dict[str, str]:
    """For a local master: the driver's RPC and block manager bound to loopback, and no web UI.

    Spark's driver serves them unauthenticated (spark.authenticate is off by default) and, by default, on the
    host's external address: anyone who reaches the host could submit work to it. A local session has no
    executor elsewhere to reach it, so nothing needs more than loopback. The UI is off rather than bound:
    Spark binds it to every interface whatever the driver's address (only SPARK_LOCAL_IP in the environment
    moves it). Settings the user gives (KCL_PIPELINE_SPARK_CONF, a builder's extra settings) are applied after
    these and win. A cluster master gets nothing here: its executors must reach the driver."""
    if not is_local_master(master):
        return {}
    return {"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK, "spark.ui.enabled": "false"}


def build_local_session(master: str = "local[2]", app_name: str = "kcl-pipeline-transform",
                        *, fallback_master: str | None = None, **extra_conf: str) -> SparkSession:
    """A SparkSession for tests, benchmarks and the CLI (Dagster builds its own through PySparkResource):
    `local[N]`, `spark://host:port` (standalone) or `sc://host:port` (Spark Connect).

    An sc:// server that does not answer is refused at once (connect.SparkUnreachable), or, with
    `fallback_master`, replaced by a cold session of that master with one WARNING line (connect.py).
    Sets PYSPARK_PYTHON to this interpreter in the environment first: classic PySpark takes the Python
    workers' interpreter from it, not from spark.pyspark.python."""
    choice = resolve_master(master, fallback_master)
    if choice.warning:
        log.warning(choice.warning)
    master = choice.master
    if is_connect(master):  # Spark Connect: the server owns the context; only session settings travel
        builder = SparkSession.builder.remote(master)
        for key, value in {**spark_session_conf(None), **extra_conf}.items():
            if key.startswith("spark.sql."):
                builder = builder.config(key, value)
        return builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    local = is_local_master(master)
    for key, value in {**spark_session_conf(os.environ["PYSPARK_PYTHON"] if local else None),
                       "spark.ui.enabled": "false", "spark.log.level": "WARN", **loopback_conf(master),
                       **extra_conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    return spark


def use_configured_python(spark: SparkSession) -> None:
    """Make the Python workers of a classic session use spark.pyspark.python when it is set.

    Classic PySpark takes the worker interpreter from PYSPARK_PYTHON (default "python3") when the context
    starts; a session built only with the conf would run Python data sources under another interpreter.
    A Spark Connect session (no context here) and a session without the setting are left alone."""
    configured = spark.conf.get("spark.pyspark.python", None)
    context = getattr(spark, "_sc", None)  # classic sessions only
    if configured and context is not None and context.pythonExec != configured:
        context.pythonExec = configured


def _dataset_uri(output_uri: str, name: str) -> str:
    return f"{output_uri.rstrip('/')}/{name}"


def _output(uri: str, s3: S3Options) -> ZoneStore:
    return open_store(uri, s3=s3, what="transform output")


def distinct_records(raw: DataFrame, batches: list[WindowBatch], max_partition_bytes: int) -> DataFrame:
    """`raw` once per record key with a `_copies` count. Only the rows of shards whose listed batches
    overlap are grouped (one shuffle, a partition per max_partition_bytes of their batches); the rest pass
    through unshuffled with `_copies` = 1."""
    overlapping = overlapping_shards(batches)
    passed = raw.select(*RECORD_KEY, F.lit(1).cast("long").alias("_copies"), *_CARRIED)
    if not overlapping:
        return passed
    suspect = F.col("shard_id").isin(sorted(overlapping))
    nbytes = sum(b.size for b in batches if parse_batch_key(b.key).shard_id in overlapping)
    grouped = (raw.where(suspect).repartition(shuffle_partitions(nbytes, max_partition_bytes), *RECORD_KEY)
               .groupBy(*RECORD_KEY)
               .agg(F.count(F.lit(1)).alias("_copies"), *[F.any_value(c).alias(c) for c in _CARRIED]))
    return passed.where(~suspect).unionByName(grouped)


def _decode(distinct: DataFrame, decoder: DecoderFn) -> tuple[DataFrame, list[str]]:
    """`distinct` with `payload`, `reason` and the decoder's further fields as columns."""
    decoded = distinct.withColumn("_decoded", decoder(F.col("data")))
    dtype = decoded.schema["_decoded"].dataType
    names = [f.name for f in dtype.fields] if isinstance(dtype, StructType) else []
    if not isinstance(dtype, StructType) or not {"payload", "reason"} <= set(names):
        raise TypeError(f"a decoder returns STRUCT<payload STRING, reason STRING, ...>, got {dtype.simpleString()}")
    for name in ("payload", "reason"):
        if not isinstance(dtype[name].dataType, StringType):
            raise TypeError(f"decoder field {name} must be STRING, got {dtype[name].dataType.simpleString()}")
    extra = [n for n in names if n not in ("payload", "reason")]
    clash = set(extra) & (set(OUTPUT_BASE) | {"data", "_copies"})
    if clash or len(set(names)) != len(names):
        raise ValueError(f"decoder fields {sorted(clash) or names} clash with the output's own columns")
    return decoded.select("*", *[F.col(f"_decoded.{n}").alias(n) for n in names]).drop("_decoded"), extra


def _per_shard(rows) -> dict[str, ShardRange]:
    return {
        r["shard_id"]: ShardRange(
            Checkpoint(r["first"]["sequence_number"], r["first"]["sub_sequence_number"]),
            Checkpoint(r["last"]["sequence_number"], r["last"]["sub_sequence_number"]),
            r["distinct"],
        )
        for r in rows
    }


def transform_window(
    spark: SparkSession,
    *,
    zone: str,
    stream: str,
    window_start_ms: int,
    window_end_ms: int,
    output_uri: str,
    decoder: Union[str, DecoderFn] = "json",
    s3_options: S3Options | None = None,
    max_partition_bytes: int | None = None,
    landing_reader: str = "auto",
    publish: bool = True,
) -> TransformReport:
    """Transform the window [window_start_ms, window_end_ms) of `stream` landed in `zone` into `output_uri`.

    Raises ZoneNotFoundError when the zone (bucket or directory) or the output bucket does not exist,
    ValueError for a window that is not whole minutes or an unknown decoder. `landing_reader`: "native" reads
    the batches with Spark's own Parquet reader (a directory zone under "auto"; s3:// needs s3a on the
    cluster), "datasource" through the Python data source (boto3 on the executors: any cluster, any S3).
    `publish=False`: the commit is left pending for the window's rows_reconcile check to publish (the pipeline;
    manifest.py), so a window that does not reconcile never counts as materialised."""
    check_window(window_start_ms, window_end_ms)
    native = use_native_reader(zone, landing_reader)
    decode_fn = get_decoder(decoder)
    s3 = s3_options or S3Options()
    open_store(zone, s3=s3).check_exists()
    out_store = _output(output_uri, s3)
    out_store.ensure_zone(create=out_store.local_path("x") is not None)  # a directory is made; a bucket must exist

    use_configured_python(spark)
    register(spark)
    options = {"zone": zone, "stream": stream, "window_start_ms": str(window_start_ms),
               "window_end_ms": str(window_end_ms), **s3.to_options()}
    if max_partition_bytes:
        options["max_partition_bytes"] = str(max_partition_bytes)
    # The window is un-materialised from here until this run's commit is written (`finish`, below); the
    # listing fixed now is exactly what the reader reads and what the commit names.
    write = begin_window(out_store, window_start_ms, window_end_ms, publish=publish)
    batches = WindowRead.from_options(options).list_batches()
    options[BATCHES_OPTION] = batches_option(batches)

    activate(spark)
    raw = (read_native(spark, zone, stream, batches) if native
           else spark.read.format(LANDING_FORMAT).options(**options).load())
    distinct = distinct_records(raw, batches, max_partition_bytes or DEFAULT_MAX_PARTITION_BYTES)
    decoded, extra = _decode(distinct, decode_fn)
    decoded = (decoded.withColumn("window_start", F.timestamp_millis(F.lit(window_start_ms)))
               # only quarantined rows need their raw bytes: a good row's payload is the same text
               .withColumn("data", F.when(F.col("reason").isNotNull(), F.col("data"))))
    # Three actions below: read, shuffle and parse once. On disk, serialised: the cache is as large as the
    # window, and a heap-first cache of a window larger than the heap ends in OutOfMemoryError (measured:
    # a 5 GB window with a 2 GB driver, MEMORY_AND_DISK; benchmarks/bench_transform.py --gb 5).
    decoded.persist(StorageLevel.DISK_ONLY)
    try:
        position = F.struct(F.length("sequence_number").alias("len"), "sequence_number", "sub_sequence_number")
        shard_rows = decoded.groupBy("shard_id").agg(
            F.sum("_copies").alias("rows_in"),
            F.count(F.lit(1)).alias("distinct"),
            F.count_if(F.col("reason").isNull()).alias("rows_out"),
            F.min(position).alias("first"),
            F.max(position).alias("last"),
        ).collect()
        transformed = decoded.where(F.col("reason").isNull()).select(*OUTPUT_BASE, "payload", *extra)
        quarantine = decoded.where(F.col("reason").isNotNull()).select(*OUTPUT_BASE, "reason", "data")
        partition = window_partition(window_start_ms)
        for frame, name in ((transformed, TRANSFORMED), (quarantine, QUARANTINE)):
            activate(spark)
            (frame.write.format(OUTPUT_FORMAT).mode("overwrite")
             .options(path=_dataset_uri(output_uri, name), partition=partition, **s3.to_options()).save())
    finally:
        decoded.unpersist()
    # last: the window is now materialised (or, pending, once its rows_reconcile check publishes it)
    write.finish(b.key for b in batches)

    rows_in = sum(r["rows_in"] for r in shard_rows)
    distinct_rows = sum(r["distinct"] for r in shard_rows)
    rows_out = sum(r["rows_out"] for r in shard_rows)
    return TransformReport(
        window_start_ms=window_start_ms,
        window_end_ms=window_end_ms,
        rows_in=rows_in,
        rows_out=rows_out,
        duplicates_dropped=rows_in - distinct_rows,
        quarantined=distinct_rows - rows_out,
        schema=[(f.name, f.dataType.simpleString()) for f in transformed.schema.fields],
        per_shard=_per_shard(shard_rows),
        output_path=f"{_dataset_uri(output_uri, TRANSFORMED)}/{partition}/",
        quarantine_path=f"{_dataset_uri(output_uri, QUARANTINE)}/{partition}/",
    )


# ---------------------------------------------------------------- reading the output back

@dataclass(frozen=True)
class WindowOutput:
    transformed: Any  # pyarrow.Table, or a Spark DataFrame when read through a SparkSession
    quarantine: Any
    manifests: dict[str, dict]


def read_partition(output_uri: str, dataset: str, window_start_ms: int,
                   s3: S3Options | None = None) -> tuple[pa.Table, dict]:
    """The committed files of one partition (as its manifest names them) as one Arrow table."""
    store = _output(_dataset_uri(output_uri, dataset), s3 or S3Options())
    partition = window_partition(window_start_ms)
    raw = store.get_optional(f"{partition}/{MANIFEST}")
    if raw is None:
        raise OutputNotFoundError(f"{_dataset_uri(output_uri, dataset)}/{partition}: no committed output")
    manifest = json.loads(raw)
    tables = []
    for name in manifest["files"]:
        key = f"{partition}/{name}"
        path = store.local_path(key)
        tables.append(read_parquet(path if path else store.get(key)))
    return pa.concat_tables(tables), manifest


def read_output(engine: Any, output_uri: str, window_start_ms: int,
                s3: S3Options | None = None) -> WindowOutput:
    """Both outputs of a window: Arrow tables, or Spark DataFrames when `engine` is a SparkSession
    (pass the pyarrow module or None for tables). For tests and the lineage audit."""
    results = {name: read_partition(output_uri, name, window_start_ms, s3) for name in (TRANSFORMED, QUARANTINE)}
    tables = {name: table for name, (table, _) in results.items()}
    if isinstance(engine, SparkSession):
        tables = {name: engine.createDataFrame(table) for name, table in tables.items()}
    return WindowOutput(tables[TRANSFORMED], tables[QUARANTINE],
                        {name: manifest for name, (_, manifest) in results.items()})


__all__ = [
    "OutputNotFoundError", "ShardRange", "build_local_session", "TransformReport", "WindowOutput", "ZoneNotFoundError",
    "is_local_master", "loopback_conf", "read_output", "read_partition", "spark_session_conf", "transform_window",
    "use_configured_python", "window_partition",
]
