"""Time-window partitions of the pipeline's assets: one partition = one window [t0, t1) of arrival time (UTC).

Windows are aligned to multiples of their length since the epoch, which is what the cron schedules below
produce (the length divides an hour or a day), so a partition key and a landing-zone window always agree.

The key format is the windows' (windows/keys.py), shared with the sensor's decisions and the CLI's backfill.
"""
from __future__ import annotations

from datetime import timezone

from dagster import TimeWindowPartitionsDefinition

from ...deployment.settings import PipelineSettings, check_window_minutes
from ...windows.keys import PARTITION_FMT


def window_cron(window_minutes: int) -> str:
    check_window_minutes(window_minutes)
    if window_minutes < 60:
        return f"*/{window_minutes} * * * *" if window_minutes > 1 else "* * * * *"
    hours = window_minutes // 60
    return "0 * * * *" if hours == 1 else f"0 */{hours} * * *" if hours < 24 else "0 0 * * *"


def window_partitions(settings: PipelineSettings) -> TimeWindowPartitionsDefinition:
    return TimeWindowPartitionsDefinition(
        start=settings.partitions_start.astimezone(timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule=window_cron(settings.window_minutes), timezone="UTC")


def window_of(partitions_def: TimeWindowPartitionsDefinition, key: str) -> tuple[int, int]:
    """The window [t0, t1) in epoch millis of a partition key."""
    tw = partitions_def.time_window_for_partition_key(key)
    return round(tw.start.timestamp() * 1000), round(tw.end.timestamp() * 1000)
