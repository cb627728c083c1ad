"""The sensors: `kinesis_consumer`, this deployment's member of the consumer fleet, and `kinesis_fleet_member`, a
second host's.

One tick of `kinesis_consumer` = one lease-manager cycle (scan, list shards, delete/create leases, acquire, spawn
one worker process per lease), then: read the fleet's landing progress from the lease table, report every window
that became complete since the cursor as a `landed_records` materialisation, and request `transformed_records` +
`kinesis_checkpoints` for it (tick.py, calling the decisions of windows/tick/decisions.py). The lease manager and
workers it hosts are deployment/fleet_hosting.py's; what it remembers between ticks is its cursor
(windows/tick/cursor.py).
"""
from typing import Sequence

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, TimeWindowPartitionsDefinition, sensor
from dagster_aws.s3 import S3Resource

from ...deployment.fleet_hosting import CONSUMER_SENSOR, MEMBER_SENSOR
from ...deployment.streams import PipelineStream
from ...windows.tick.cursor import Cursor, CursorError
from .assets import SINGLE
from .jobs import CHECKPOINTS_JOB, WINDOW_JOB
from .resources import AwsResource, KinesisConsumerResource
from .tick import consumer_tick, member_tick

# The sensors, and what their callers name with them: the sensor's cursor and the jobs it targets.
__all__ = ["CHECKPOINTS_JOB", "CONSUMER_SENSOR", "MEMBER_SENSOR", "WINDOW_JOB", "Cursor", "CursorError",
           "build_consumer_sensor", "build_member_sensor"]


def build_consumer_sensor(partitions_def: TimeWindowPartitionsDefinition, jobs, interval_seconds: int,
                          targets: Sequence[PipelineStream] = (SINGLE,)):
    """`jobs`: each stream's window job (transform + checkpoints) and checkpoints-only job (jobs.py)."""
    names = sorted(job.name for job in jobs)
    expected = sorted(target.job(base) for target in targets for base in (WINDOW_JOB, CHECKPOINTS_JOB))
    if names != expected:
        raise ValueError(f"the kinesis_consumer sensor targets the jobs {', '.join(expected)}, got {names}")

    @sensor(name=CONSUMER_SENSOR, jobs=jobs, minimum_interval_seconds=interval_seconds,
            default_status=DefaultSensorStatus.RUNNING,
            description="This deployment's Kinesis consumer: one lease-manager cycle per tick (one worker process "
                        "per held lease), then reports every window that became complete as landed_records and "
                        "requests its transform and checkpoints.")
    def kinesis_consumer(context: SensorEvaluationContext, consumer: KinesisConsumerResource, aws: AwsResource,
                         s3: S3Resource) -> SensorResult:
        return consumer_tick(context, consumer, aws, s3, partitions_def, interval_seconds, targets=targets)

    return kinesis_consumer


def build_member_sensor(interval_seconds: int):
    """The fleet-member location's one sensor: hosts lease workers, targets no job, reports no window."""

    @sensor(name=MEMBER_SENSOR, minimum_interval_seconds=interval_seconds, default_status=DefaultSensorStatus.RUNNING,
            description=f"A second host's member of the Kinesis consumer fleet: one lease-manager cycle per tick "
                        f"(one worker process per held lease). It reports nothing: the pipeline location's "
                        f"{CONSUMER_SENSOR} sensor reports windows and requests their runs.")
    def kinesis_fleet_member(context: SensorEvaluationContext, consumer: KinesisConsumerResource,
                             aws: AwsResource) -> SensorResult:
        return member_tick(context, consumer, aws, interval_seconds)

    return kinesis_fleet_member
