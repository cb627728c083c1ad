"""Time-window partitions of the pipeline's assets: one partition = one window [t0, t1) of arrival time (UTC).

Windows are aligned to multiples of their length since the epoch, which is what the cron schedules below
produce (the length divides an hour or a day), so a partition key and a landing-zone window always agree.

The key format is defined here once; the module imports Dagster only where it builds Dagster's objects, so
the CLI's backfill (local/dagster_client.py, which talks to a webserver over HTTP) names the same keys without
Dagster installed.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from .settings import PipelineSettings, check_window_minutes

if TYPE_CHECKING:
    from dagster import TimeWindowPartitionsDefinition

PARTITION_FMT = "%Y-%m-%d-%H:%M"  # Dagster's own format for sub-daily windows


def window_cron(window_minutes: int) -> str:
    check_window_minutes(window_minutes)
    if window_minutes < 60:
        return f"*/{window_minutes} * * * *" if window_minutes > 1 else "* * * * *"
    hours = window_minutes // 60
    return "0 * * * *" if hours == 1 else f"0 */{hours} * * *" if hours < 24 else "0 0 * * *"


def window_partitions(settings: PipelineSettings) -> TimeWindowPartitionsDefinition:
    from dagster import TimeWindowPartitionsDefinition

    return TimeWindowPartitionsDefinition(
        start=settings.partitions_start.astimezone(timezone.utc).replace(tzinfo=None),
        fmt=PARTITION_FMT, cron_schedule=window_cron(settings.window_minutes), timezone="UTC")


def partition_key(window_start_ms: int) -> str:
    """The partition key of the window starting at `window_start_ms` (epoch millis, UTC)."""
    return datetime.fromtimestamp(window_start_ms / 1000, tz=timezone.utc).strftime(PARTITION_FMT)


def window_of(partitions_def: TimeWindowPartitionsDefinition, key: str) -> tuple[int, int]:
    """The window [t0, t1) in epoch millis of a partition key."""
    tw = partitions_def.time_window_for_partition_key(key)
    return round(tw.start.timestamp() * 1000), round(tw.end.timestamp() * 1000)
