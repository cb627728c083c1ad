"""The pipeline's assets: kinesis_stream (observed) → landed_records → transformed_records → kinesis_checkpoints.

Wiring only: the work is landing/backfill.py (bounded re-reads), transform/job.py (Spark), and
landing/checkpoint_plan.py (what to commit). Every asset shares the window partitions.
"""

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    BackfillPolicy,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    TimeWindowPartitionsDefinition,
    asset,
)
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet  # not re-exported
from dagster_aws.s3 import S3Resource

from ...kcl.core.lease_codec import LeaseTableMissing
from ...kcl.shells.aws import client
from ...kcl.shells.lease_table import LeaseTable
from ...landing.store import ZoneStore, open_store
from .partitions import partition_key, window_of
from .resources import SPARK_POOL, AwsResource, KinesisConsumerResource, SparkResource
from .streams import PipelineStream

KINESIS_STREAM = AssetKey("kinesis_stream")
LANDED = AssetKey("landed_records")
TRANSFORMED = AssetKey("transformed_records")
CHECKPOINTS = AssetKey("kinesis_checkpoints")
REOPENED = "reopened_windows"  # kinesis_checkpoints metadata the sensor reads
MAX_LATE_KEYS = 50


def stream_spec(target: PipelineStream) -> AssetSpec:
    return AssetSpec(
        target.key(KINESIS_STREAM), group_name=target.group, kinds={"kinesis"},
        description=target.about("The Kinesis stream. Observed by the kinesis_consumer sensor: lag per shard (millis "
                                 "behind latest), leases per consumer, shard and lease counts."))


SINGLE = PipelineStream()
kinesis_stream = stream_spec(SINGLE)


def landing_store(consumer: KinesisConsumerResource, aws: AwsResource, s3: S3Resource | None) -> ZoneStore:
    """The landing zone, through dagster-aws's S3 client when the zone is on S3."""
    uri = consumer.landing_uri
    s3_client = s3.get_client() if s3 is not None and uri.startswith("s3://") else None
    store = open_store(uri, aws.settings(), s3_client=s3_client)
    store.ensure_zone(create=consumer.create_zones)
    return store


def output_store(consumer: KinesisConsumerResource, aws: AwsResource, s3: S3Resource | None,
                 target: PipelineStream = SINGLE) -> ZoneStore:
    """The stream's transform output location, read (manifests) with the landing zone's store code."""
    uri = target.output_uri(consumer.output_uri)
    s3_client = s3.get_client() if s3 is not None and uri.startswith("s3://") else None
    return open_store(uri, aws.settings(), s3_client=s3_client)


def live_leases(consumer: KinesisConsumerResource, aws: AwsResource) -> list:
    """A read-only snapshot of the live lease table ([] when it does not exist yet)."""
    try:
        return LeaseTable(consumer.lease_table, client("dynamodb", aws.settings())).scan()
    except LeaseTableMissing:
        return []


@dataclass(frozen=True)
class WindowRange:
    start_ms: int
    end_ms: int
    window_ms: int

    @property
    def starts(self) -> list[int]:
        return list(range(self.start_ms, self.end_ms, self.window_ms))


def window_range(context, partitions_def: TimeWindowPartitionsDefinition, window_ms: int) -> WindowRange:
    """The run's windows: one partition, or a range (single-run backfills)."""
    keys = context.partition_keys
    start, _ = window_of(partitions_def, keys[0])
    _, end = window_of(partitions_def, keys[-1])
    return WindowRange(start, end, window_ms)


def _pos(cp) -> list[Any] | None:
    return None if cp is None else [cp.sequence_number, cp.sub_sequence_number]


def transformed_freshness(window_ms: int) -> FreshnessPolicy:
    """A window is transformed about one window + grace after it ends: warn when the newest transform is two
    windows and ten minutes old (one window late), fail at three windows and ten minutes (two late)."""
    window = timedelta(milliseconds=window_ms)
    return FreshnessPolicy.time_window(fail_window=3 * window + timedelta(minutes=10),
                                       warn_window=2 * window + timedelta(minutes=10))


def build_assets(partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                 target: PipelineStream = SINGLE):
    """The stream's landed_records, transformed_records and kinesis_checkpoints over `partitions_def`."""

    @asset(key=target.key(LANDED), partitions_def=partitions_def, deps=[target.key(KINESIS_STREAM)],
           group_name=target.group,
           backfill_policy=BackfillPolicy.single_run(), kinds={"kinesis", "parquet"},
           description=target.about("Kinesis records landed exactly once as Parquet, one partition per arrival "
                                    "window. Reported live by the kinesis_consumer sensor when a window is complete; "
                                    "materialising it in a run (a backfill) re-reads the window from Kinesis "
                                    "(AT_TIMESTAMP, or TRIM_HORIZON beyond retention) and lands what is missing under"
                                    " the same keys."))
    def landed_records(context: AssetExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                       s3: S3Resource) -> MaterializeResult:
        from ...landing.backfill import BackfillProgress, backfill_range
        from ...landing.window_report import summarise_window

        span = window_range(context, partitions_def, window_ms)
        store = landing_store(consumer, aws, s3)
        # leases and directory only: backfill_range lists the shards itself
        view = target.read_slice(consumer, aws.settings(), live_leases(consumer, aws), shards=False)

        def progress(p: BackfillProgress) -> None:
            context.log.info(f"backfill progress: {p.shards_done}/{p.shards_to_read} shards read "
                             f"({p.last_shard}: {p.stopped_by}); {p.records_in_range} records in range, "
                             f"{p.records_landed} landed now")

        report = backfill_range(target.configured(consumer), span.start_ms, span.end_ms, store,
                                directory=view.directory, leases=view.leases_by_shard_id(),
                                grace_ms=int(consumer.grace_seconds * 1000), aws=aws.settings(),
                                pace=consumer.backfill_pace(),
                                deadline_seconds=consumer.backfill_deadline_seconds, on_progress=progress)
        for shard_id, s in sorted(report.shards.items()):
            context.log.info(f"{shard_id}: {s.stopped_by}; read from {s.start}: {s.records_in_range} records in "
                             f"range, {s.records_landed} landed now, {s.records_already_landed} landed before"
                             + (f" ({s.live_reason})" if s.live_reason else ""))
        if report.cut_by_deadline:
            raise Failure(
                description=(f"the backfill reached its deadline ({consumer.backfill_deadline_seconds:.0f} s) before "
                             f"reading {', '.join(report.cut_by_deadline)} to the end of the range; what it landed "
                             f"stays, and running it again goes on without duplicates (raise "
                             f"backfill_deadline_seconds or backfill_parallelism for ranges this long)."),
                metadata={"cut_by_deadline": MetadataValue.json(report.cut_by_deadline),
                          "records_landed": report.records_landed})
        if report.left_to_live:
            raise Failure(
                description=(f"the live consumer has not finished landing this range for "
                             f"{', '.join(report.left_to_live)}; those shards were left to it (a backfill never "
                             f"lands ahead of the live consumer). Retry once the windows are complete."),
                metadata={"left_to_live": MetadataValue.json(report.left_to_live)})
        rows = size = 0
        shards: dict[str, Any] = {}
        keys: list[str] = []
        for start in span.starts:
            summary = summarise_window(store, view.directory, start, start + window_ms)
            rows += summary.rows
            size += summary.bytes
            keys += summary.keys
            for shard_id, info in summary.per_shard().items():
                merged = shards.setdefault(shard_id, {"first": info["first"], "rows": 0, "batches": 0})
                merged.update(last=info["last"], rows=merged["rows"] + info["rows"],
                              batches=merged["batches"] + info["batches"])
        return MaterializeResult(metadata={
            "rows": rows,
            "bytes": size,
            "batches": len(keys),
            "records_relanded": report.records_landed,
            "records_already_landed": report.records_already_landed,
            "per_shard": MetadataValue.json(shards),
            "backfill": MetadataValue.json({k: {"start": s.start, "stopped_by": s.stopped_by,
                                                "first": _pos(s.first), "last": _pos(s.last),
                                                "in_range": s.records_in_range, "landed": s.records_landed}
                                            for k, s in sorted(report.shards.items())}),
            "keys": MetadataValue.json(keys[:200]),
            "source": "backfill",
        })

    @asset(key=target.key(TRANSFORMED), partitions_def=partitions_def, deps=[target.key(LANDED)],
           group_name=target.group,
           backfill_policy=BackfillPolicy.single_run(), kinds={"pyspark", "parquet"}, pool=SPARK_POOL,
           freshness_policy=transformed_freshness(window_ms),
           description=target.about("The window's records, deduplicated on (shard, sequence, sub-sequence) and "
                                    "decoded, written idempotently (the partition is replaced); undecodable records "
                                    "go to quarantine with the reason."))
    def transformed_records(context: AssetExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                            pyspark: SparkResource) -> MaterializeResult:
        from ...landing.store import S3Options
        from ...transform.job import transform_window

        span = window_range(context, partitions_def, window_ms)
        settings = aws.settings()
        output_uri = target.output_uri(consumer.output_uri)
        directory = target.directory(consumer, settings)
        if consumer.create_zones:
            open_store(output_uri, settings).ensure_zone(create=True)
        s3_options = S3Options.from_aws_settings(settings, env_credentials=True)
        spark = pyspark.spark_session
        totals = {"rows_in": 0, "rows_out": 0, "duplicates_dropped": 0, "quarantined": 0}
        per_shard: dict[str, Any] = {}
        per_window: dict[str, Any] = {}
        schema: list[tuple[str, str]] = []
        paths: list[str] = []
        for start in span.starts:
            report = transform_window(spark, zone=consumer.landing_uri, stream=directory,
                                      window_start_ms=start, window_end_ms=start + window_ms,
                                      output_uri=output_uri, decoder=consumer.decoder,
                                      s3_options=s3_options, landing_reader=consumer.landing_reader)
            context.log.info(f"window {start}: {report.rows_in} rows in, {report.rows_out} out, "
                             f"{report.duplicates_dropped} duplicates, {report.quarantined} quarantined")
            for name in totals:
                totals[name] += getattr(report, name)
            for shard_id, r in report.per_shard.items():
                merged = per_shard.setdefault(shard_id, {"first": _pos(r.first), "rows": 0})
                merged.update(last=_pos(r.last), rows=merged["rows"] + r.rows)
            per_window[str(start)] = {k: getattr(report, k) for k in totals}
            schema = report.schema
            paths.append(report.output_path)
        column_schema = TableSchema([TableColumn(name, dtype) for name, dtype in schema])
        return MaterializeResult(metadata={
            **TableMetadataSet(column_schema=column_schema, partition_row_count=totals["rows_out"],
                               storage_kind="parquet"),
            **UriMetadataSet(uri=paths[-1]),
            **totals,
            "windows": len(span.starts),
            "schema": column_schema,
            "per_shard": MetadataValue.json(per_shard),
            "per_window": MetadataValue.json(per_window),
            "output_path": MetadataValue.path(paths[-1]) if len(paths) == 1 else MetadataValue.json(paths),
        })

    @asset(key=target.key(CHECKPOINTS), partitions_def=partitions_def, deps=[target.key(TRANSFORMED)],
           group_name=target.group,
           backfill_policy=BackfillPolicy.single_run(), kinds={"dynamodb"},
           description=target.about("Lease checkpoints committed for materialised windows: per shard, the last landed"
                                    " record of the longest run of materialised windows from its checkpoint, and "
                                    "SHARD_END once its last record is in. The only place the pipeline advances "
                                    "checkpoints."))
    def kinesis_checkpoints(context: AssetExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                            s3: S3Resource) -> MaterializeResult:
        from ...kcl.config import InitialPosition
        from ...landing.checkpoint_plan import apply_plan, plan_checkpoints
        from ...landing.progress import progress_from_leases
        from ...landing.verify import list_batches
        from ...landing.window_report import earliest_landed_minute
        from ...landing.window_scan import next_frontier, plan_listing_end, plan_listing_start, window_floor
        from ...transform.manifest import late_batches, read_materialised

        settings = aws.settings()
        table = LeaseTable(consumer.lease_table, client("dynamodb", settings))
        view = target.read_slice(consumer, settings, table.scan())
        leases, shards = view.leases, view.shards  # named by lease key (a multi-stream key: stream + shard)
        store = landing_store(consumer, aws, s3)
        # a window counts once its commit is in
        committed = read_materialised(output_store(consumer, aws, s3, target))
        materialised = committed.windows
        previous = _previous_frontier(context, target)
        earliest = earliest_landed_minute(store, view.directory)
        zone_start = None if earliest is None else window_floor(earliest, window_ms)
        start = plan_listing_start(zone_start, previous, leases)
        progress = progress_from_leases(leases)
        end = plan_listing_end(materialised, progress, window_ms)
        batches: dict[str, list] = {}
        if start is not None and end is not None and end > start:
            for b in list_batches(store, view.directory, start, end):
                batches.setdefault(view.lease_key(b.shard_id), []).append(b)
        first_window_ms = int(partitions_def.start.timestamp() * 1000)
        plan = plan_checkpoints(committed, window_ms, batches, progress, leases, first_window_ms=first_window_ms)
        late = late_batches(committed, [(window_floor(b.minute_ms, window_ms), b.key())
                                        for listed in batches.values() for b in listed])
        if late:
            context.log.warning(f"batches landed in materialised windows after their runs listed the zone; the "
                                f"kinesis_consumer sensor requests these windows again: "
                                f"{ {partition_key(w): len(keys) for w, keys in late.items()} }")
        before_start = {k: p.before_start for k, p in plan.shards.items() if p.before_start}
        if before_start:
            context.log.warning(f"batches landed before the first partition ({partitions_def.start.isoformat()}) "
                                f"are in no window and stay untransformed in the landing zone: {before_start}")
        initial = InitialPosition.parse(consumer.initial_position, consumer.initial_timestamp).checkpoint()
        committed = apply_plan(plan, table, shards=shards, initial=initial)
        frontier = next_frontier(previous, leases, batches,
                                 {c.shard_id: c.checkpoint for c in committed if c.checkpoint is not None},
                                 progress, int(consumer.grace_seconds * 1000), window_ms, [s.shard_id for s in shards])
        for shard_id, p in sorted(plan.shards.items()):
            context.log.info(f"{shard_id}: commit {p.commit}, end {p.end}: {p.reason}")
        rows = [{"shard_id": c.shard_id, "sequence_number": c.checkpoint.sequence_number if c.checkpoint else None,
                 "sub_sequence_number": c.checkpoint.sub_sequence_number if c.checkpoint else None,
                 "checkpointed": c.checkpointed, "shard_end": c.ended, "children_created": list(c.children_created)}
                for c in committed]
        return MaterializeResult(metadata={
            "committed": MetadataValue.json(rows),
            "shard_ends": MetadataValue.json([c.shard_id for c in committed if c.ended]),
            "commits": sum(1 for c in committed if c.checkpointed),
            "ends": sum(1 for c in committed if c.ended),
            "materialised_windows": len(materialised),
            "batches_before_first_partition": MetadataValue.json(before_start),
            "listed_from_ms": start if start is not None else -1,
            # window -> batches its manifest does not name (the sensor re-runs these windows)
            REOPENED: MetadataValue.json({partition_key(w): keys[:MAX_LATE_KEYS] for w, keys in late.items()}),
            "frontier": MetadataValue.json(frontier),
            "plan": MetadataValue.json({k: {"commit": _pos(p.commit), "end": p.end, "reason": p.reason}
                                        for k, p in sorted(plan.shards.items())}),
        })

    return landed_records, transformed_records, kinesis_checkpoints


def _previous_frontier(context: AssetExecutionContext, target: PipelineStream = SINGLE) -> dict[str, int]:
    """The frontier the stream's last kinesis_checkpoints materialisation recorded (any partition)."""
    event = context.instance.get_latest_materialization_event(target.key(CHECKPOINTS))
    if event is None or event.asset_materialization is None:
        return {}
    value = event.asset_materialization.metadata.get("frontier")
    data = getattr(value, "data", None) if value is not None else None
    if isinstance(data, str):
        data = json.loads(data)
    return {str(k): int(v) for k, v in (data or {}).items()}
