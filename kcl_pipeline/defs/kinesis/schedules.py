"""A daily backfill of the previous day (stopped by default): re-land and transform every window of the day.

It re-reads each window from Kinesis (windows/backfill.py: AT_TIMESTAMP, TRIM_HORIZON beyond retention) and
lands only what is missing, then transforms the day in one run (single-run backfill policy). It never writes
to the live lease table: checkpoints stay with the live pipeline.
"""
from __future__ import annotations

from datetime import datetime, timezone

from dagster import (
    DefaultScheduleStatus,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    TimeWindowPartitionsDefinition,
    schedule,
)
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from ...deployment.streams import PipelineStream
from ...windows.keys import partition_key

DAY_MS = 86_400_000


def previous_day_keys(scheduled: datetime, window_ms: int, partitions_start_ms: int) -> tuple[str, str] | None:
    """The first and last partition keys of the UTC day before `scheduled` (None: the day precedes the partitions)."""
    day_end = int(scheduled.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
                  .timestamp() * 1000)
    day_start = max(day_end - DAY_MS, partitions_start_ms)
    if day_start >= day_end:
        return None
    return partition_key(day_start), partition_key(day_end - window_ms)


def build_backfill_schedule(job, partitions_def: TimeWindowPartitionsDefinition, window_ms: int,
                            target: PipelineStream = PipelineStream()):
    partitions_start_ms = int(partitions_def.start.timestamp() * 1000)

    @schedule(name=target.job("backfill_previous_day"), cron_schedule="30 1 * * *", execution_timezone="UTC", job=job,
              default_status=DefaultScheduleStatus.STOPPED,
              description=target.about("Re-land (bounded re-reads from Kinesis) and transform every window of the "
                                       "previous day."))
    def backfill_previous_day(context: ScheduleEvaluationContext):
        scheduled = context.scheduled_execution_time or datetime.now(timezone.utc)
        keys = previous_day_keys(scheduled, window_ms, partitions_start_ms)
        if keys is None:
            return SkipReason("the previous day precedes the first partition")
        first, last = keys
        return RunRequest(run_key=f"backfill-{first}", tags={
            # No Spark run tag: the day's re-reads (paced, shards in parallel) must not hold the single Spark run
            # slot for their whole length; the transform step alone waits for the `spark` pool.
            ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last})

    return backfill_previous_day
