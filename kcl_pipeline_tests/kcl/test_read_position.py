"""A shard reader's position (core/read_position.py), which the polling and the fan-out readers share: where a
request starts, what a delivery moves, and the shard's end."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, UserRecord
from kcl_pipeline.kcl.core.read_position import ReadPosition, StartingPoint

pytestmark = pytest.mark.core

SEQ = "49590338271490256608559692538361571095921575989136588898"
LATER = "49590338271490256608559692538361571095921575989136588899"


def user(sequence: str, sub: int) -> UserRecord:
    return UserRecord("shardId-000000000000", sequence, sub, "pk", None, 0, b"x", aggregated=True)


@pytest.mark.parametrize("start, point", [
    (Checkpoint(TRIM_HORIZON), StartingPoint(TRIM_HORIZON)),
    (Checkpoint(LATEST), StartingPoint(LATEST)),
    (Checkpoint(AT_TIMESTAMP, 1_700_000_000_123), StartingPoint(AT_TIMESTAMP, timestamp_ms=1_700_000_000_123)),
    (Checkpoint(SEQ, 3), StartingPoint("AT_SEQUENCE_NUMBER", sequence_number=SEQ)),
])
def test_a_first_request_starts_at_the_lease_start(start, point):
    assert ReadPosition.at(start).starting_point() == point


def test_a_request_after_a_record_was_given_starts_after_it_whatever_the_start():
    read = ReadPosition.at(Checkpoint(LATEST))
    read.started(StartingPoint(LATEST), served_ms=1_700_000_005_000, requested_ms=1_700_000_009_999)
    read.given(LATER)
    assert read.starting_point() == StartingPoint("AFTER_SEQUENCE_NUMBER", sequence_number=LATER)


def test_a_latest_start_that_gave_nothing_restarts_at_the_service_time_less_a_second_never_at_latest():
    read = ReadPosition.at(Checkpoint(LATEST))
    read.started(StartingPoint(LATEST), served_ms=1_700_000_005_000, requested_ms=1_700_000_009_999)
    point = read.starting_point()
    assert point == StartingPoint(AT_TIMESTAMP, timestamp_ms=1_700_000_004_000)
    assert point.timestamp == datetime(2023, 11, 14, 22, 13, 24, tzinfo=timezone.utc)
    read.started(point, served_ms=1_700_000_060_000, requested_ms=1_700_000_060_000)  # not LATEST: kept
    assert read.starting_point() == point


def test_a_latest_start_answered_without_a_date_anchors_at_the_host_time():
    read = ReadPosition.at(Checkpoint(LATEST))
    read.started(StartingPoint(LATEST), served_ms=None, requested_ms=1_700_000_009_999)
    assert read.starting_point().timestamp_ms == 1_700_000_009_999


def test_a_delivery_moves_the_position_and_the_resume_filter_to_its_last_user_record():
    read = ReadPosition.at(Checkpoint(SEQ, 2))
    assert read.after == Checkpoint(SEQ, 2)
    read.deliver([])
    assert read.delivered == Checkpoint(SEQ, 2)
    read.deliver([user(SEQ, 3), user(LATER, 0)])
    assert read.delivered == read.after == Checkpoint(LATER, 0)


def test_a_sentinel_start_filters_nothing_and_a_shard_end_start_is_ended():
    assert ReadPosition.at(Checkpoint(TRIM_HORIZON)).after is None
    assert ReadPosition.at(Checkpoint(SHARD_END)).ended


def test_the_end_keeps_the_children_it_was_told_of():
    read = ReadPosition.at(Checkpoint(TRIM_HORIZON))
    read.end(("shardId-000000000001", "shardId-000000000002"))
    assert read.ended and read.child_shards == ["shardId-000000000001", "shardId-000000000002"]
    read.end()
    assert read.child_shards == []
