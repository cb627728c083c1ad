"""The Kinesis domain's Definitions, built from PipelineSettings (the environment by default)."""
from __future__ import annotations

from dataclasses import dataclass

from dagster import Definitions

from ...deployment.settings import PipelineSettings
from ...deployment.streams import PipelineStream, pipeline_streams
from .assets import build_assets, stream_spec
from .checks import build_checks
from .jobs import backfill_job, checkpoints_job, window_job
from .partitions import window_partitions
from .resources import build_resources
from .schedules import build_backfill_schedule
from .sensors import build_consumer_sensor, build_member_sensor
from .stopping import stop_cancels_run_executor


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
        # Steps run one after another in the run's process: one SparkSession per run, no per-step start-up. A stop
        # (Ctrl-C) during a run cancels it rather than failing it (stopping.py).
        executor=stop_cancels_run_executor,
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
    backfill = backfill_job(partitions_def, target, stalled)
    return _StreamDefinitions(
        assets=[stream_spec(target), landed, transformed, checkpoints],
        checks=[chain, counts, within, stalled],
        jobs=[window_job(partitions_def, target, chain, stalled), checkpoints_job(partitions_def, target), backfill],
        schedule=build_backfill_schedule(backfill, partitions_def, settings.window_ms, target))


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
