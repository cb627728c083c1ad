"""Asset checks = the lineage audit (audit/lineage.py), per window partition.

* landed_records / chain_unbroken              every shard's batches chain without gap or overlap
* transformed_records / rows_reconcile         landed = transformed + duplicates + quarantined; publishes the
                                               window's commit when it holds (audit/reconcile.py)
* kinesis_checkpoints / checkpoint_within_materialised   no checkpoint beyond materialised records
* transformed_records / windows_not_stalled    no reported window left unmaterialised past its end + overdue;
                                               evaluated by the kinesis_consumer sensor on every change (a run
                                               of it re-reads the sensor's latest stall metric)
"""

from dataclasses import dataclass
from typing import Any, Mapping

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    MetadataValue,
    TimeWindowPartitionsDefinition,
    asset_check,
)
from dagster_aws.s3 import S3Resource

from ...audit.lineage import CheckOutcome, audit_window
from ...audit.reconcile import reconcile_window
from ...deployment.streams import PipelineStream
from ...windows.followup import stall_description
from .assets import CHECKPOINTS, LANDED, SINGLE, TRANSFORMED, landing_store, live_leases, output_store, window_range
from .resources import AwsResource, KinesisConsumerResource

STALL_CHECK = "windows_not_stalled"  # evaluated by the kinesis_consumer sensor (tick.py)


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


def _transform_report(context: AssetCheckExecutionContext, transformed: AssetKey) -> Mapping[str, int] | None:
    """The transform's own counts for this partition (when the run transformed exactly one window)."""
    if context.has_partition_key_range and len(context.partition_keys) != 1:
        return None
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=transformed, asset_partitions=[context.partition_key]), limit=1).records
    if not records or records[0].asset_materialization is None:
        return None
    meta = records[0].asset_materialization.metadata
    if "windows" not in meta or meta["windows"].value != 1:
        return None
    return {name: int(meta[name].value) for name in ("rows_in", "rows_out", "duplicates_dropped", "quarantined")
            if name in meta}


def build_checks(partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                 target: PipelineStream = SINGLE):
    """The stream's chain_unbroken, rows_reconcile, checkpoint_within_materialised and windows_not_stalled."""
    audit = _Audit(partitions_def, window_ms, target)
    return (_chain_unbroken(audit), _rows_reconcile(audit), _checkpoint_within_materialised(audit),
            _windows_not_stalled(target))


@dataclass(frozen=True)
class _Audit:
    """The lineage audit of a run's windows (one partition, or a range) for one stream."""

    partitions_def: TimeWindowPartitionsDefinition
    window_ms: int
    target: PipelineStream

    def __call__(self, context, consumer: KinesisConsumerResource, aws: AwsResource, s3: S3Resource, check: str,
                 **kwargs: Any) -> AssetCheckResult:
        span = window_range(context, self.partitions_def, self.window_ms)
        store = landing_store(consumer, aws, s3)
        output = output_store(consumer, aws, s3, self.target)
        if check == "checkpoints":  # the audit matches leases to landed batches by shard id
            view = self.target.read_slice(consumer, aws.settings(), live_leases(consumer, aws), shards=False)
            kwargs["leases"] = view.leases_by_shard_id()
            directory = view.directory
        else:
            directory = self.target.directory(consumer, aws.settings())
        outcomes: list[CheckOutcome] = []
        for start in span.starts:
            if check == "counts":  # and publishes the commit its run left pending, once the window reconciles
                outcomes += reconcile_window(store, output, directory, start, start + self.window_ms, **kwargs)
            else:
                outcomes += audit_window(store, output, directory, start, start + self.window_ms, checks=[check],
                                         **kwargs)
        for o in outcomes:
            context.log.info(f"{o.check} {'OK' if o.ok else 'FAILED'}: {o.summary}")
        return check_result(outcomes)


# The two checks that guard checkpoints block: when either fails in a window run, the run stops before
# kinesis_checkpoints. rows_reconcile also publishes the window's commit (audit/reconcile.py): a window
# that does not reconcile has none, so no later run's checkpoints pass it either.

def _chain_unbroken(audit: _Audit):
    @asset_check(asset=audit.target.key(LANDED), name="chain_unbroken", partitions_def=audit.partitions_def,
                 blocking=True,
                 description="Every shard's landed batches form an unbroken chain (each batch follows the previous "
                             "one's last record; no gap, no overlap, no unreadable object), across windows too.")
    def chain_unbroken(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                       s3: S3Resource) -> AssetCheckResult:
        return audit(context, consumer, aws, s3, "chain")

    return chain_unbroken


def _rows_reconcile(audit: _Audit):
    transformed = audit.target.key(TRANSFORMED)

    @asset_check(asset=transformed, name="rows_reconcile", partitions_def=audit.partitions_def, blocking=True,
                 description="Landed rows = transformed rows + duplicates dropped + quarantined rows (from the "
                             "landing zone and the output manifests; the transform's own report must agree).")
    def rows_reconcile(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource, aws: AwsResource,
                       s3: S3Resource) -> AssetCheckResult:
        return audit(context, consumer, aws, s3, "counts", transform=_transform_report(context, transformed))

    return rows_reconcile


def _checkpoint_within_materialised(audit: _Audit):
    @asset_check(asset=audit.target.key(CHECKPOINTS), name="checkpoint_within_materialised",
                 partitions_def=audit.partitions_def,
                 description="No committed checkpoint reaches into a window that has not materialised (SHARD_END only "
                             "once the shard's last record is in), and none is past the last landed record.")
    def checkpoint_within_materialised(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource,
                                       aws: AwsResource, s3: S3Resource) -> AssetCheckResult:
        return audit(context, consumer, aws, s3, "checkpoints")

    return checkpoint_within_materialised


def _windows_not_stalled(target: PipelineStream):
    @asset_check(asset=target.key(TRANSFORMED), name=STALL_CHECK,
                 description="No window the sensor reported is still unmaterialised past its end + the overdue "
                             "time (its runs failed for good, or never ran); fails naming each stalled window.")
    def windows_not_stalled(context: AssetCheckExecutionContext, consumer: KinesisConsumerResource) -> AssetCheckResult:
        records = context.instance.fetch_observations(AssetRecordsFilter(asset_key=target.key(TRANSFORMED)),
                                                     limit=1).records
        observation = records[0].asset_observation if records else None
        value = observation.metadata.get("stalled") if observation is not None else None
        stalled = [str(k) for k in (getattr(value, "data", None) or [])]
        return AssetCheckResult(passed=not stalled, severity=AssetCheckSeverity.ERROR,
                                description=stall_description(stalled, consumer.overdue_seconds),
                                metadata={"stalled": MetadataValue.json(stalled)})

    return windows_not_stalled
