"""Where a reader of one shard stands, whether it polls (shells/read/reader.py) or is pushed to
(shells/read/fanout.py): the user records it delivered, the Kinesis record it resumes after, and the shard's end
with its children.

A reader's request starts (`starting_point`) after the last Kinesis record it was given once there is one (the
polling reader's last fetched sequence number, the fan-out reader's last continuation), else at the lease's
start. A LATEST start is taken once: a request made at LATEST that never gave a record starts again AT_TIMESTAMP of
the service's time when it was made, never at LATEST again, which would skip what arrived meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from .model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, UserRecord

AFTER_SEQUENCE_NUMBER = "AFTER_SEQUENCE_NUMBER"
AT_SEQUENCE_NUMBER = "AT_SEQUENCE_NUMBER"


@dataclass(frozen=True)
class StartingPoint:
    """Where a GetShardIterator or a SubscribeToShard starts: its ShardIteratorType (StartingPosition Type), with
    the sequence number (AFTER_ / AT_SEQUENCE_NUMBER) or the epoch millis (AT_TIMESTAMP) it names."""

    kind: str
    sequence_number: str | None = None
    timestamp_ms: int | None = None

    @property
    def timestamp(self) -> datetime | None:
        return None if self.timestamp_ms is None else utc(self.timestamp_ms)

    def arguments(self, kind_name: str, sequence_name: str) -> dict[str, Any]:
        """The point in a request's words: GetShardIterator's (ShardIteratorType, StartingSequenceNumber) or
        SubscribeToShard's StartingPosition (Type, SequenceNumber); a Timestamp in both."""
        arguments: dict[str, Any] = {kind_name: self.kind}
        if self.sequence_number is not None:
            arguments[sequence_name] = self.sequence_number
        if self.timestamp is not None:
            arguments["Timestamp"] = self.timestamp
        return arguments


@dataclass
class ReadPosition:
    """A reader's state in its shard, and its transitions (the readers' I/O feeds them)."""

    start: Checkpoint  # the lease's start (a starting sentinel, AT_TIMESTAMP's millis as its sub-sequence)
    delivered: Checkpoint  # the last delivered user record's (sequence, sub-sequence), or the start
    # Records at or below this are dropped (resume mid-aggregate; never deliver again); None from a sentinel.
    after: Checkpoint | None
    resume_after: str | None = None  # the last Kinesis record given (fetched, or an event's continuation)
    latest_anchor_ms: int | None = None  # the service's time when a LATEST request was made
    ended: bool = False
    child_shards: list[str] = field(default_factory=list)

    @classmethod
    def at(cls, start: Checkpoint) -> "ReadPosition":
        return cls(start, start, None if start.is_sentinel else start, ended=start.is_shard_end)

    def deliver(self, users: Sequence[UserRecord]) -> None:
        """These user records (deaggregated past `after`) were delivered."""
        if users:
            self.delivered = users[-1].checkpoint
            self.after = self.delivered

    def given(self, sequence_number: str) -> None:
        """The service gave up to this Kinesis record: a request made from now on starts after it."""
        self.resume_after = sequence_number

    def end(self, children: Sequence[str] = ()) -> None:
        """The shard ended (children: as its last response or event named them; none when it was found gone)."""
        self.ended = True
        self.child_shards = list(children)

    def starting_point(self) -> StartingPoint:
        if self.resume_after is not None:
            return StartingPoint(AFTER_SEQUENCE_NUMBER, sequence_number=self.resume_after)
        kind = self.start.sequence_number
        if kind == TRIM_HORIZON:
            return StartingPoint(TRIM_HORIZON)
        if kind == LATEST:
            if self.latest_anchor_ms is not None:
                return StartingPoint(AT_TIMESTAMP, timestamp_ms=self.latest_anchor_ms)
            return StartingPoint(LATEST)
        if kind == AT_TIMESTAMP:
            return StartingPoint(AT_TIMESTAMP, timestamp_ms=self.start.sub_sequence_number)
        return StartingPoint(AT_SEQUENCE_NUMBER, sequence_number=kind)

    def started(self, point: StartingPoint, served_ms: int | None, requested_ms: int) -> None:
        """A request from `point` was answered, the service's clock saying `served_ms` (whole seconds; None when the
        answer had no Date) and the host's `requested_ms` when it was sent. A LATEST one anchors the restart: at the
        service's time less a second for its whole-second precision, so a skewed host clock never skips records;
        at the host's only when the service's is unknown."""
        if point.kind == LATEST:
            self.latest_anchor_ms = served_ms - 1000 if served_ms is not None else requested_ms


def utc(epoch_millis: int) -> datetime:
    # Integer arithmetic: a float division can land a microsecond below the millisecond.
    return datetime.fromtimestamp(epoch_millis // 1000, tz=timezone.utc) + timedelta(milliseconds=epoch_millis % 1000)
