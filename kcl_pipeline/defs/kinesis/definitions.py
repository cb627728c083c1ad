"""The Kinesis domain's Definitions, built from PipelineSettings (the environment by default)."""
from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from .assets import CHECKPOINTS, LANDED, TRANSFORMED, build_assets, kinesis_stream
from .checks import build_checks
from .partitions import window_partitions
from .resources import SPARK_RUN_TAG, build_resources
from .schedules import build_backfill_schedule
from .sensors import CHECKPOINTS_JOB, WINDOW_JOB, build_consumer_sensor, build_member_sensor
from .settings import PipelineSettings

BACKFILL_JOB = "kinesis_backfill_job"


def build_definitions(settings: PipelineSettings | None = None) -> Definitions:
    settings = settings or PipelineSettings.from_env()
    partitions_def = window_partitions(settings)
    landed, transformed, checkpoints = build_assets(partitions_def, settings.window_ms)
    chain, counts, within, stalled = build_checks(partitions_def, settings.window_ms)
    window_job = define_asset_job(
        # windows_not_stalled is the sensor's verdict (evaluated by the sensor), not a window run's step.
        WINDOW_JOB, selection=(AssetSelection.assets(TRANSFORMED, CHECKPOINTS) | AssetSelection.checks(chain))
        - AssetSelection.checks(stalled),
        partitions_def=partitions_def, tags={SPARK_RUN_TAG: "true"},
        description="Transform a window the kinesis_consumer sensor reported complete, then commit its checkpoints.")
    checkpoints_job = define_asset_job(
        CHECKPOINTS_JOB, selection=AssetSelection.assets(CHECKPOINTS), partitions_def=partitions_def,
        description="Apply the checkpoint plan alone (the sensor runs it when a shard's last record has landed, so "
                    "the shard is ended and its children's leases are created).")
    backfill_job = define_asset_job(
        BACKFILL_JOB, selection=AssetSelection.assets(LANDED, TRANSFORMED) - AssetSelection.checks(stalled),
        partitions_def=partitions_def,
        # No Spark run tag: the re-reads run beside the live window runs; only the transform step waits for
        # the `spark` pool's slot.
        description="Re-land windows from Kinesis (bounded re-reads) and transform them; checkpoints untouched.")
    return Definitions(
        assets=[kinesis_stream, landed, transformed, checkpoints],
        asset_checks=[chain, counts, within, stalled],
        jobs=[window_job, checkpoints_job, backfill_job],
        sensors=[build_consumer_sensor(partitions_def, [window_job, checkpoints_job], settings.sensor_interval_seconds)],
        schedules=[build_backfill_schedule(backfill_job, partitions_def, settings.window_ms)],
        resources=build_resources(settings),
        # Steps run one after another in the run's process: one SparkSession per run, no per-step start-up.
        executor=in_process_executor,
    )


def build_member_definitions(settings: PipelineSettings | None = None) -> Definitions:
    """A fleet-member code location: the `kinesis_fleet_member` sensor and its resources, no asset.

    A second code server (another host) in the same deployment loads this beside the pipeline location: its
    workers share the fleet through the lease table, and since it defines no asset and requests no run, every
    window is reported once, by the pipeline location's sensor. (Two copies of the pipeline location would
    define every asset twice, which Dagster treats as an invalid deployment.)"""
    settings = settings or PipelineSettings.from_env(for_partitions=False)
    resources = build_resources(settings)
    return Definitions(sensors=[build_member_sensor(settings.sensor_interval_seconds)],
                       resources={key: resources[key] for key in ("consumer", "aws")})
