"""The pipeline's assets: kinesis_stream (observed) → landed_records → transformed_records → kinesis_checkpoints.

Wiring only: each asset calls its domain function and attaches metadata from what it reports:
windows/backfill.py (bounded re-reads) and windows/report.py (what the windows hold), transform/job.py
(Spark), windows/checkpoints/run.py (plan and commit the checkpoints). Every asset shares the window partitions.
"""

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

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

from ...deployment.consumer import ConsumerSettings
from ...deployment.streams import PipelineStream
from ...kcl.core.table.lease_codec import LeaseTableMissing
from ...kcl.shells.aws import client, instrument
from ...kcl.shells.lease_table import LeaseTable
from ...windows.backfill import BackfillReport, backfill_range
from ...windows.checkpoints.record import MAX_LATE_KEYS
from ...windows.checkpoints.run import CheckpointReport, commit_checkpoints
from ...windows.keys import partition_key
from ...windows.report import RangeSummary, json_position, summarise_range
from ...zone.store import S3Options, ZoneStore, open_store
from .partitions import window_of
from .resources import SPARK_POOL, AwsResource, KinesisConsumerResource, SparkResource
from .stopping import stop_cancels_run

if TYPE_CHECKING:
    from ...transform.job import TransformReport  # pyspark: imported by the runs that transform

KINESIS_STREAM = AssetKey("kinesis_stream")
LANDED = AssetKey("landed_records")
TRANSFORMED = AssetKey("transformed_records")
CHECKPOINTS = AssetKey("kinesis_checkpoints")


def stream_spec(target: PipelineStream) -> AssetSpec:
    return AssetSpec(
        target.key(KINESIS_STREAM), group_name=target.group, kinds={"kinesis"},
        description=target.about("The Kinesis stream. Observed by the kinesis_consumer sensor: lag per shard (millis "
                                 "behind latest), leases per consumer, shard and lease counts."))


SINGLE = PipelineStream()
kinesis_stream = stream_spec(SINGLE)


def landing_store(consumer: ConsumerSettings | KinesisConsumerResource, aws: AwsResource,
                  s3: S3Resource | None) -> ZoneStore:
    """The landing zone, through dagster-aws's S3 client when the zone is on S3."""
    uri = consumer.landing_uri
    store = open_store(uri, aws.settings(), s3_client=_s3_client(s3, aws, uri))
    store.ensure_zone(create=consumer.create_zones)
    return store


def output_store(consumer: ConsumerSettings | KinesisConsumerResource, aws: AwsResource, s3: S3Resource | None,
                 target: PipelineStream = SINGLE) -> ZoneStore:
    """The stream's transform output location, read (manifests) with the landing zone's store code."""
    uri = target.output_uri(consumer.output_uri)
    return open_store(uri, aws.settings(), s3_client=_s3_client(s3, aws, uri))


def _s3_client(s3: S3Resource | None, aws: AwsResource, uri: str) -> Any:
    """dagster-aws's client for an s3:// zone, carrying what every S3 request of the package carries."""
    if s3 is None or not uri.startswith("s3://"):
        return None
    return instrument(s3.get_client(), aws.settings().s3_requests())


def live_leases(consumer: KinesisConsumerResource, aws: AwsResource) -> list:
    """A read-only snapshot of the live lease table ([] when it does not exist yet)."""
    try:
        return LeaseTable(consumer.settings().lease_table, client("dynamodb", aws.settings())).scan()
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


def transformed_freshness(window_ms: int) -> FreshnessPolicy:
    """A window is transformed about one window + grace after it ends: warn when the newest transform is two
    windows and ten minutes old (one window late), fail at three windows and ten minutes (two late)."""
    window = timedelta(milliseconds=window_ms)
    return FreshnessPolicy.time_window(fail_window=3 * window + timedelta(minutes=10),
                                       warn_window=2 * window + timedelta(minutes=10))


def build_assets(partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                 target: PipelineStream = SINGLE):
    """The stream's landed_records, transformed_records and kinesis_checkpoints over `partitions_def`."""
    return (build_landed_records(partitions_def, window_ms, target),
            build_transformed_records(partitions_def, window_ms, target),
            build_kinesis_checkpoints(partitions_def, window_ms, target))


# -- landed_records -----------------------------------------------------------------------------------------

def build_landed_records(partitions_def: TimeWindowPartitionsDefinition, window_ms: int, target: PipelineStream):
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
        with stop_cancels_run(context):  # a stop cancels the run, not fails it
            span = window_range(context, partitions_def, window_ms)
            store = landing_store(consumer, aws, s3)
            consumer_settings = consumer.settings()
            # leases and directory only: backfill_range lists the shards itself
            view = target.read_slice(consumer, aws.settings(), live_leases(consumer, aws), shards=False)
            report = backfill_range(target.configured(consumer), span.start_ms, span.end_ms, store,
                                    directory=view.directory, leases=view.leases_by_shard_id(),
                                    grace_ms=consumer_settings.grace_ms, aws=aws.settings(),
                                    pace=consumer_settings.backfill_pace(),
                                    deadline_seconds=consumer.backfill_deadline_seconds,
                                    on_progress=lambda p: context.log.info(p.describe()),
                                    application_start=consumer_settings.initial_checkpoint())
            for _, shard in sorted(report.shards.items()):
                context.log.info(shard.describe())
            _fail_unless_whole(report, consumer.backfill_deadline_seconds)
            summary = summarise_range(store, view.directory, span.starts, window_ms)
            return MaterializeResult(metadata=_landed_metadata(report, summary))

    return landed_records


def _fail_unless_whole(report: BackfillReport, deadline_seconds: float) -> None:
    """A backfill that did not read every shard to the range's end materialises nothing (what it landed stays)."""
    if report.cut_by_deadline:
        raise Failure(
            description=(f"the backfill reached its deadline ({deadline_seconds:.0f} s) before "
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


def _landed_metadata(report: BackfillReport, summary: RangeSummary) -> dict[str, Any]:
    return {
        "rows": summary.rows,
        "bytes": summary.bytes,
        "batches": len(summary.keys),
        "records_relanded": report.records_landed,
        "records_already_landed": report.records_already_landed,
        "per_shard": MetadataValue.json(summary.per_shard),
        "backfill": MetadataValue.json(report.per_shard()),
        "keys": MetadataValue.json(summary.keys[:200]),
        "source": "backfill",
    }


# -- transformed_records ------------------------------------------------------------------------------------

def build_transformed_records(partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                              target: PipelineStream):
    @asset(key=target.key(TRANSFORMED), partitions_def=partitions_def, deps=[target.key(LANDED)],
           group_name=target.group,
           backfill_policy=BackfillPolicy.single_run(), kinds={"pyspark", "parquet"}, pool=SPARK_POOL,
           freshness_policy=transformed_freshness(window_ms),
           description=target.about("The window's records, deduplicated on (shard, sequence, sub-sequence) and "
                                    "decoded, written idempotently (the partition is replaced); undecodable records "
                                    "go to quarantine with the reason."))
    def transformed_records(context: AssetExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                            pyspark: SparkResource) -> MaterializeResult:
        with stop_cancels_run(context):  # a stop cancels the run, not fails it
            from ...transform.job import transform_window  # pyspark: imported by the runs that transform

            span = window_range(context, partitions_def, window_ms)
            settings = aws.settings()
            output_uri = target.output_uri(consumer.output_uri)
            directory = target.directory(consumer, settings)
            if consumer.create_zones:
                open_store(output_uri, settings).ensure_zone(create=True)
            s3_options = S3Options.from_aws_settings(
                settings, env_credentials=S3Options.pins_credentials(settings, pyspark.aws_credentials))
            reports = []
            for start in span.starts:
                report = pyspark.run(context.log, lambda spark, start=start: transform_window(
                    spark, zone=consumer.landing_uri, stream=directory, window_start_ms=start,
                    window_end_ms=start + window_ms, output_uri=output_uri, decoder=consumer.decoder,
                    s3_options=s3_options, landing_reader=consumer.landing_reader,
                    publish=False))  # the window's rows_reconcile check publishes the commit
                context.log.info(f"window {start}: {report.rows_in} rows in, {report.rows_out} out, "
                                 f"{report.duplicates_dropped} duplicates, {report.quarantined} quarantined")
                reports.append((start, report))
            return MaterializeResult(metadata=_transformed_metadata(reports))

    return transformed_records


def _transformed_metadata(reports: list[tuple[int, "TransformReport"]]) -> dict[str, Any]:
    """The run's windows (start, transform report) as one materialisation: counts summed, per shard and per
    window, the schema and where the output is."""
    totals = {"rows_in": 0, "rows_out": 0, "duplicates_dropped": 0, "quarantined": 0}
    per_shard: dict[str, Any] = {}
    per_window: dict[str, Any] = {}
    for start, report in reports:
        for name in totals:
            totals[name] += getattr(report, name)
        for shard_id, r in report.per_shard.items():
            merged = per_shard.setdefault(shard_id, {"first": json_position(r.first), "rows": 0})
            merged.update(last=json_position(r.last), rows=merged["rows"] + r.rows)
        per_window[str(start)] = {k: getattr(report, k) for k in totals}
    paths = [report.output_path for _, report in reports]
    column_schema = TableSchema([TableColumn(name, dtype) for name, dtype in reports[-1][1].schema])
    return {
        **TableMetadataSet(column_schema=column_schema, partition_row_count=totals["rows_out"],
                           storage_kind="parquet"),
        **UriMetadataSet(uri=paths[-1]),
        **totals,
        "windows": len(reports),
        "schema": column_schema,
        "per_shard": MetadataValue.json(per_shard),
        "per_window": MetadataValue.json(per_window),
        "output_path": MetadataValue.path(paths[-1]) if len(paths) == 1 else MetadataValue.json(paths),
    }


# -- kinesis_checkpoints ------------------------------------------------------------------------------------

def build_kinesis_checkpoints(partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                              target: PipelineStream):
    first_window_ms = int(partitions_def.start.timestamp() * 1000)

    @asset(key=target.key(CHECKPOINTS), partitions_def=partitions_def, deps=[target.key(TRANSFORMED)],
           group_name=target.group,
           backfill_policy=BackfillPolicy.single_run(), kinds={"dynamodb"},
           description=target.about("Lease checkpoints committed for materialised windows: per shard, the last landed"
                                    " record of the longest run of materialised windows from its checkpoint, and "
                                    "SHARD_END once its last record is in. The only place the pipeline advances "
                                    "checkpoints. A partition is the commit made after that window's run (or for "
                                    "shard ends seen then); each commit covers every window materialised so far."))
    def kinesis_checkpoints(context: AssetExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                            s3: S3Resource) -> MaterializeResult:
        with stop_cancels_run(context):  # a stop cancels the run, not fails it
            settings, consumer_settings = aws.settings(), consumer.settings()
            table = LeaseTable(consumer_settings.lease_table, client("dynamodb", settings))
            span = window_range(context, partitions_def, window_ms)  # the window(s) whose run asked for this commit
            report = commit_checkpoints(
                table, target.read_slice(consumer, settings, table.scan()), landing_store(consumer, aws, s3),
                output_store(consumer, aws, s3, target), window_ms=window_ms, first_window_ms=first_window_ms,
                initial=consumer_settings.initial_checkpoint(), grace_ms=consumer_settings.grace_ms,
                requested_for=(span.start_ms, span.end_ms))
            _log_checkpoint_report(context, report, partitions_def)
            return MaterializeResult(metadata=_checkpoints_metadata(report))

    return kinesis_checkpoints


def _log_checkpoint_report(context: AssetExecutionContext, report: CheckpointReport,
                           partitions_def: TimeWindowPartitionsDefinition) -> None:
    if report.late:
        context.log.warning(f"batches landed in materialised windows after their runs listed the zone; the "
                            f"kinesis_consumer sensor requests these windows again: "
                            f"{ {partition_key(w): len(keys) for w, keys in report.late.items()} }")
    if report.uncommitted:
        context.log.warning(f"shards are stopped on windows without a commit (their runs failed or were never "
                            f"checked); the kinesis_consumer sensor requests them again: "
                            f"{[partition_key(w) for w in report.uncommitted]}")
    if report.broken:
        context.log.error(f"shards stopped on a break in their chain (a lost batch, or overlapping batches): no "
                          f"window run mends it; backfill the range (docs/landing.md): {report.broken}")
    if report.before_start:
        context.log.warning(f"batches landed before the first partition ({partitions_def.start.isoformat()}) "
                            f"are in no window and stay untransformed in the landing zone: {report.before_start}")
    for shard_id, p in sorted(report.plan.shards.items()):
        context.log.info(f"{shard_id}: commit {p.commit}, end {p.end}: {p.reason}")


def _checkpoints_metadata(report: CheckpointReport) -> dict[str, Any]:
    """For the UI only: the next run and the sensor read the checkpoint record the run stored in the output
    location (windows/checkpoints/record.py), never this."""
    return {
        "report": report.record.report if report.record is not None and report.record.report is not None else -1,
        "committed": MetadataValue.json(report.committed_rows()),
        "shard_ends": MetadataValue.json(report.shard_ends),
        "commits": report.commits,
        "ends": len(report.shard_ends),
        "materialised_windows": report.materialised_windows,
        "batches_before_first_partition": MetadataValue.json(report.before_start),
        "listed_from_ms": report.listed_from_ms if report.listed_from_ms is not None else -1,
        # window -> batches its manifest does not name (the sensor re-runs these windows)
        "reopened_windows": MetadataValue.json({partition_key(w): keys[:MAX_LATE_KEYS]
                                                for w, keys in report.late.items()}),
        "uncommitted_windows": MetadataValue.json([partition_key(w) for w in report.uncommitted]),
        "broken_chains": MetadataValue.json(report.broken),
        "frontier": MetadataValue.json(report.frontier),
        "plan": MetadataValue.json(report.plan_rows()),
    }
