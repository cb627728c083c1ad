"""Asset checks = the lineage audit (landing/audit.py), per window partition.

* landed_records / chain_unbroken              every shard's batches chain without gap or overlap
* transformed_records / rows_reconcile         landed = transformed + duplicates + quarantined
* kinesis_checkpoints / checkpoint_within_materialised   no checkpoint beyond materialised records
"""

from typing import Any, Mapping

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetRecordsFilter,
    MetadataValue,
    TimeWindowPartitionsDefinition,
    asset_check,
)
from dagster_aws.s3 import S3Resource

from ...landing.audit import CheckOutcome, audit_window
from .assets import CHECKPOINTS, LANDED, TRANSFORMED, landing_store, live_leases, output_store, window_range
from .resources import AwsResource, KinesisConsumerResource


def check_result(outcomes: list[CheckOutcome]) -> AssetCheckResult:
    """One result for the run's windows: passed when every window passed; numbers summed for plotting."""
    failed = [o for o in outcomes if not o.ok]
    numbers: dict[str, Any] = {}
    for o in outcomes:
        for name, value in o.metadata.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                numbers[name] = numbers.get(name, 0) + value
    summary = "; ".join(o.summary for o in (failed or outcomes))[:2000] or "no window"
    return AssetCheckResult(
        passed=not failed, severity=AssetCheckSeverity.ERROR, description=summary,
        metadata={**numbers, "windows": len(outcomes), "failed_windows": len(failed),
                  "details": MetadataValue.md("\n".join(
                      f"- **{o.check} {'OK' if o.ok else 'FAILED'}** {o.summary}\n"
                      + "".join(f"  - `{line}`\n" for line in o.details[:50]) for o in outcomes)[:20000])})


def _transform_report(context: AssetCheckExecutionContext) -> Mapping[str, int] | None:
    """The transform's own counts for this partition (when the run transformed exactly one window)."""
    if context.has_partition_key_range and len(context.partition_keys) != 1:
        return None
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=TRANSFORMED, asset_partitions=[context.partition_key]), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    meta = records[0].asset_materialization.metadata
    if "windows" not in meta or meta["windows"].value != 1:
        return None
    return {name: int(meta[name].value) for name in ("rows_in", "rows_out", "duplicates_dropped", "quarantined")
            if name in meta}


def build_checks(partitions_def: TimeWindowPartitionsDefinition, window_ms: int):
    def run(context, consumer, aws, s3, check: str, **kwargs) -> AssetCheckResult:
        span = window_range(context, partitions_def, window_ms)
        store = landing_store(consumer, aws, s3)
        output = output_store(consumer, aws, s3)
        outcomes: list[CheckOutcome] = []
        for start in span.starts:
            outcomes += audit_window(store, output, consumer.stream, start, start + window_ms, checks=[check],
                                     **kwargs)
        for o in outcomes:
            context.log.info(f"{o.check} {'OK' if o.ok else 'FAILED'}: {o.summary}")
        return check_result(outcomes)

    # The checks on the assets a checkpoint depends on are blocking: a red check stops the run before the
    # downstream assets (and so the checkpoint commit) materialise.
    @asset_check(asset=LANDED, name="chain_unbroken", partitions_def=partitions_def, blocking=True,
                 description="Every shard's landed batches form an unbroken chain (each batch follows the previous "
                             "one's last record; no gap, no overlap, no unreadable object), across windows too.")
    def chain_unbroken(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                       s3: S3Resource) -> AssetCheckResult:
        return run(context, consumer, aws, s3, "chain")

    @asset_check(asset=TRANSFORMED, name="rows_reconcile", partitions_def=partitions_def, blocking=True,
                 description="Landed rows = transformed rows + duplicates dropped + quarantined rows (from the "
                             "landing zone and the output manifests; the transform's own report must agree).")
    def rows_reconcile(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                       s3: S3Resource) -> AssetCheckResult:
        return run(context, consumer, aws, s3, "counts", transform=_transform_report(context))

    @asset_check(asset=CHECKPOINTS, name="checkpoint_within_materialised", partitions_def=partitions_def,
                 description="No committed checkpoint reaches into a window that has not materialised (SHARD_END only "
                             "once the shard's last record is in), and none is past the last landed record.")
    def checkpoint_within_materialised(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource,
                                       aws: AwsResource, s3: S3Resource) -> AssetCheckResult:
        return run(context, consumer, aws, s3, "checkpoints", leases=live_leases(consumer, aws))

    return chain_unbroken, rows_reconcile, checkpoint_within_materialised
