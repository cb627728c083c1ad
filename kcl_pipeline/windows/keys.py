"""A window's partition key: the name Dagster's window partitions, the sensor's run keys and its messages give
the window [t0, t1) starting at t0 (epoch millis, UTC). Defined once here, so that the Dagster wiring, the
sensor's decisions and the CLI's backfill (local/dagster_client.py, over HTTP, without Dagster) agree."""
from __future__ import annotations

from datetime import datetime, timezone

PARTITION_FMT = "%Y-%m-%d-%H:%M"  # Dagster's own format for sub-daily windows


def partition_key(window_start_ms: int) -> str:
    """The partition key of the window starting at `window_start_ms` (epoch millis, UTC)."""
    return datetime.fromtimestamp(window_start_ms / 1000, tz=timezone.utc).strftime(PARTITION_FMT)


def window_start_ms(key: str) -> int:
    """The start (epoch millis, UTC) of the window named by partition key `key`."""
    return round(datetime.strptime(key, PARTITION_FMT).replace(tzinfo=timezone.utc).timestamp() * 1000)
