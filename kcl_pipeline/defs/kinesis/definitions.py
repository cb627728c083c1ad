"""The Kinesis domain's Definitions, built from PipelineSettings (the environment by default)."""
from __future__ import annotations

from dataclasses import dataclass

from dagster import AssetSelection, Definitions, define_asset_job, in_process_executor

from .assets import CHECKPOINTS, LANDED, TRANSFORMED, build_assets, stream_spec
from .checks import build_checks
from .partitions import window_partitions
from .resources import SPARK_RUN_TAG, build_resources
from .schedules import build_backfill_schedule
from .sensors import CHECKPOINTS_JOB, WINDOW_JOB, build_consumer_sensor, build_member_sensor
from .settings import PipelineSettings
from .streams import PipelineStream, pipeline_streams

BACKFILL_JOB = "kinesis_backfill_job"


def build_definitions(settings: PipelineSettings | None = None) -> Definitions:
    settings = settings or PipelineSettings.from_env()
    partitions_def = window_partitions(settings)
    targets = pipeline_streams(settings.streams)
    assets, checks, jobs, schedules = [], [], [], []
    sensor_jobs = []
    for target in targets:
        stream_defs = _stream_definitions(settings, partitions_def, target)
        assets += stream_defs.assets
        checks += stream_defs.checks
        jobs += stream_defs.jobs
        sensor_jobs += stream_defs.jobs[:2]
        schedules.append(stream_defs.schedule)
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=[build_consumer_sensor(partitions_def, sensor_jobs, settings.sensor_interval_seconds, targets)],
        schedules=schedules,
        resources=build_resources(settings),
        # Steps run one after another in the run's process: one SparkSession per run, no per-step start-up.
        executor=in_process_executor,
    )


@dataclass(frozen=True)
class _StreamDefinitions:
    assets: list
    checks: list
    jobs: list  # the window job, the checkpoints job, the backfill job
    schedule: object


def _stream_definitions(settings: PipelineSettings, partitions_def, target: PipelineStream) -> _StreamDefinitions:
    """One stream's assets, checks, jobs and backfill schedule (plain names for a single stream)."""
    landed, transformed, checkpoints = build_assets(partitions_def, settings.window_ms, target)
    chain, counts, within, stalled = build_checks(partitions_def, settings.window_ms, target)
    window_job = define_asset_job(
        # windows_not_stalled is the sensor's verdict (evaluated by the sensor), not a window run's step.
        target.job(WINDOW_JOB),
        selection=(AssetSelection.assets(target.key(TRANSFORMED), target.key(CHECKPOINTS))
                   | AssetSelection.checks(chain)) - AssetSelection.checks(stalled),
        partitions_def=partitions_def, tags={SPARK_RUN_TAG: "true"},
        description=target.about("Transform a window the kinesis_consumer sensor reported complete, then commit its "
                                 "checkpoints."))
    checkpoints_job = define_asset_job(
        target.job(CHECKPOINTS_JOB), selection=AssetSelection.assets(target.key(CHECKPOINTS)),
        partitions_def=partitions_def,
        description=target.about("Apply the checkpoint plan alone (the sensor runs it when a shard's last record has "
                                 "landed, so the shard is ended and its children's leases are created)."))
    backfill_job = define_asset_job(
        target.job(BACKFILL_JOB),
        selection=AssetSelection.assets(target.key(LANDED), target.key(TRANSFORMED)) - AssetSelection.checks(stalled),
        partitions_def=partitions_def,
        # No Spark run tag: the re-reads run beside the live window runs; only the transform step waits for
        # the `spark` pool's slot.
        description=target.about("Re-land windows from Kinesis (bounded re-reads) and transform them; checkpoints "
                                 "untouched."))
    return _StreamDefinitions(
        assets=[stream_spec(target), landed, transformed, checkpoints],
        checks=[chain, counts, within, stalled],
        jobs=[window_job, checkpoints_job, backfill_job],
        schedule=build_backfill_schedule(backfill_job, partitions_def, settings.window_ms, target))


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
