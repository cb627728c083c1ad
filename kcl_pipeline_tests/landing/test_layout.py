"""The key scheme's date arithmetic: a key's dt/hh/mm read from its digits must match strptime everywhere
(month and year boundaries, leap days, the epoch itself), and names no date that does not exist."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.layout import (
    MINUTE_MS,
    BatchKey,
    hour_prefix,
    link_key,
    minute_prefix,
    parse_batch_key,
    parse_link_key,
    path_minute_ms,
)

FIRST, LAST = Checkpoint("100", 0), Checkpoint("205", 3)


def _strptime_ms(text: str) -> int:
    """The reference: what the layout used to compute, with strptime."""
    dt = datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _minute_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


EDGES = [
    "1970-01-01 00:00", "1969-12-31 23:59", "1999-12-31 23:59", "2000-01-01 00:00",
    "2000-02-29 12:30", "1900-02-28 23:59", "1900-03-01 00:00", "2023-02-28 23:59", "2023-03-01 00:00",
    "2024-02-29 00:00", "2024-02-29 23:59", "2024-03-01 00:00", "2024-12-31 23:59", "2025-01-01 00:00",
    "2025-04-30 23:59", "2025-05-01 00:00", "2025-07-31 23:59", "2025-08-01 00:00", "2038-01-19 03:14",
    "2100-02-28 23:59", "2100-03-01 00:00", "9999-12-31 23:59", "0001-01-01 00:00",
]


@pytest.mark.parametrize("text", EDGES)
def test_a_keys_minute_is_strptimes(text):
    day, clock = text.split()
    hh, mm = clock.split(":")
    assert path_minute_ms(day, hh, mm) == _strptime_ms(text)


def test_every_minute_around_boundaries_and_random_ones_match():
    starts = [datetime(2024, 2, 28, 23, 0, tzinfo=timezone.utc), datetime(2024, 12, 31, 23, 0, tzinfo=timezone.utc),
              datetime(2023, 2, 28, 23, 0, tzinfo=timezone.utc), datetime(1970, 1, 1, 0, 0, tzinfo=timezone.utc)]
    rng = random.Random(7)
    minutes = [int((s + timedelta(minutes=i)).timestamp()) * 1000 for s in starts for i in range(-90, 90)]
    minutes += [rng.randrange(-2 * 10**12, 4 * 10**12) // MINUTE_MS * MINUTE_MS for _ in range(2000)]
    for ms in minutes:
        text = _minute_text(ms)
        key = BatchKey("orders", "shardId-000000000001", ms, FIRST, LAST)
        parsed = parse_batch_key(key.key())
        assert parsed == key and parsed.minute_ms == _strptime_ms(text) == ms
        assert key.key().startswith(f"orders/dt={text[:10]}/hh={text[11:13]}/mm={text[14:16]}/")
        link = parse_link_key(link_key("orders", ms, "shardId-000000000001", FIRST))
        assert link is not None and link.minute_ms == ms


@pytest.mark.parametrize("day,hh,mm", [
    ("2023-02-29", "00", "00"), ("2024-02-30", "00", "00"), ("2100-02-29", "00", "00"), ("2025-04-31", "00", "00"),
    ("2025-13-01", "00", "00"), ("2025-00-10", "00", "00"), ("2025-01-00", "00", "00"), ("0000-01-01", "00", "00"),
    ("2025-01-01", "24", "00"), ("2025-01-01", "23", "60"), ("2025-01-01", "99", "99"),
])
def test_a_date_or_time_that_does_not_exist_is_refused_as_strptime_refuses_it(day, hh, mm):
    with pytest.raises(ValueError):
        _strptime_ms(f"{day} {hh}:{mm}")
    with pytest.raises(ValueError):
        path_minute_ms(day, hh, mm)
    with pytest.raises(ValueError):
        parse_batch_key(f"orders/dt={day}/hh={hh}/mm={mm}/shardId-1/1_0-2_0.parquet")


def _path(dt: datetime) -> str:
    return f"dt={dt:%Y-%m-%d}/hh={dt:%H}/mm={dt:%M}/"


@pytest.mark.parametrize("ms", [0, 59_999, 60_000, -1, -60_000, -60_001, 1_709_251_199_999, 1_709_251_200_000,
                                1_735_689_599_999, 1_735_689_600_000 + 3_599_999])
def test_prefixes_name_the_minute_and_hour_holding_any_millisecond(ms):
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    assert minute_prefix("orders", ms) == f"orders/dt={dt:%Y-%m-%d}/hh={dt:%H}/mm={dt:%M}/"
    assert hour_prefix("orders", ms) == f"orders/dt={dt:%Y-%m-%d}/hh={dt:%H}/"
    # A stream named by its ARN lands in its identity directory (another account's or region's `orders` beside it).
    assert minute_prefix("arn:aws:kinesis:eu-west-1:123456789012:stream/orders", ms) == \
        minute_prefix("orders@eu-west-1@123456789012", ms) == f"orders@eu-west-1@123456789012/{_path(dt)}"
