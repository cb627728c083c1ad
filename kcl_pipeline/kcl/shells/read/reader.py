"""The polling shard reader: GetShardIterator from a checkpoint, then paced GetRecords calls.

One `poll()` = at most one GetShardIterator (when the reader has no valid iterator) and exactly one
GetRecords attempt, after pacing. Recoverable failures (an expired iterator, throttling) return an empty
batch and schedule the next attempt, so the worker regains control between attempts (it checks its
lease and stop signal) and the iterator position is never lost: a fresh iterator always restarts
AFTER_SEQUENCE_NUMBER of the last Kinesis record fetched.

Pacing: >= `polling_interval` between calls, `idle_interval` after a response that
is empty and caught up, and never more than 5 GetRecords per second per shard (the Kinesis limit),
whatever the intervals.

Prefetch: with `max_bytes_per_call`, each GetRecords asks for (Limit) as many records as fit that many bytes at
the mean size of the Kinesis records of the last response that had any, and at most `max_records`; before any,
as many as fit at the largest size a Kinesis record can have (1 MiB). So what a worker holds of a backlog is
about `max_bytes_per_call`, not the 10 MiB a response may carry. A response runs over only when records grow
between calls (by their growth, never past 10 MiB).
"""
from __future__ import annotations

import collections
import logging
import random
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable, Sequence

from botocore.exceptions import ClientError

from ...core.model import Checkpoint, UserRecord
from ...core.read_position import ReadPosition
from ...records.kpl import deaggregate_batch
from ..shards import KinesisError, error_code, http_status, is_connection_error, unavailable, where

if TYPE_CHECKING:
    from ...records.kpl import KplStats

log = logging.getLogger(__name__)

MAX_CALLS_PER_SECOND = 5  # GetRecords per shard (Kinesis limit)
MAX_READ_BYTES_PER_SECOND = 2 * 1024 * 1024  # read throughput per shard (Kinesis limit)
MAX_RECORD_BYTES = 1024 * 1024  # the largest Kinesis record (data and partition key)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 10.0
# Error codes that mean "slow down"; botocore's standard retry mode already retried them inside the call.
THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "KMSThrottlingException",
    "LimitExceededException", "RequestLimitExceeded", "Throttling",
})


class ReaderError(KinesisError):
    """The reader cannot go on: a missing stream or shard, invalid arguments, or a misuse."""


@dataclass(frozen=True)
class ReadBatch:
    """The outcome of one poll.

    `records` are the user records after deaggregation and the (sequence, sub-sequence) filter;
    `kinesis_records` and `bytes` count what Kinesis returned (records and payload bytes, before the
    filter): what the shard served. `new_bytes` counts the payload bytes of the Kinesis records that gave a
    user record: the shard's traffic this poll added, which the lease's reported load (`throughputKBps`) is
    made of. A reader resuming inside an aggregate (a checkpoint's sub-sequence) reads that aggregate again
    for its later user records only; when there are none, its bytes are not traffic (counted, every take on a
    quiet stream would report load). `millis_behind_latest` is None when no GetRecords succeeded.
    """

    records: Sequence[UserRecord]
    millis_behind_latest: int | None
    shard_ended: bool = False
    child_shards: list[str] = field(default_factory=list)
    kinesis_records: int = 0
    bytes: int = 0
    # The service's clock when it answered (the response's HTTP Date header, whole seconds, epoch millis);
    # None when no GetRecords succeeded or the header is missing. "Caught up as of" is judged by this, never
    # by the host's wall clock, which may be skewed.
    service_time_ms: int | None = None
    new_bytes: int = 0

    @classmethod
    def empty(cls, shard_ended: bool = False) -> "ReadBatch":
        """A poll that got no response (paced, backed off, refused, no event yet), or the shard found ended."""
        return cls([], None, shard_ended, [], 0, 0)


@dataclass
class ReaderStats:
    """Counters of one reader, for operational metrics."""

    get_records_calls: int = 0
    kinesis_records: int = 0
    user_records: int = 0
    throttles: int = 0
    expired_iterators: int = 0
    iterator_requests: int = 0


class PositionedReader:
    """What the polling and the fan-out readers share: what they read (a stream's shard, from a checkpoint), the
    clocks and randomness they are given, and where they stand in the shard (a ReadPosition)."""

    def __init__(self, kinesis: Any, stream: str, shard_id: str, start: Checkpoint, *, kpl_stats: "KplStats | None",
                 sleep: Callable[[float], None], monotonic: Callable[[], float], clock: Callable[[], float],
                 rng: random.Random | None):
        check_target(stream, shard_id, start)
        self.kinesis = kinesis
        self.stream = stream
        self.shard_id = shard_id
        self.start = start
        self.kpl_stats = kpl_stats
        self._sleep = sleep
        self._monotonic = monotonic
        self._clock = clock
        self._rng = rng or random.Random()
        self._read = ReadPosition.at(start)

    def _sleep_until(self, due: float) -> bool:
        """Sleep until `due` (monotonic); False if the (interruptible) sleep returned early: the worker is stopping,
        and the reader must not call early."""
        wait = due - self._monotonic()
        if wait > 0:
            self._sleep(wait)
            return self._monotonic() >= due
        return True

    @property
    def position(self) -> Checkpoint:
        """The last delivered user record's (sequence, sub-sequence), or the start checkpoint."""
        return self._read.delivered

    @property
    def ended(self) -> bool:
        return self._read.ended

    @property
    def child_shards(self) -> list[str]:
        return list(self._read.child_shards)


class ShardReader(PositionedReader):
    def __init__(self, kinesis: Any, stream: str, shard_id: str, start: Checkpoint, *,
                 polling_interval: float = 0.2, idle_interval: float = 2.0, max_records: int = 10000,
                 kpl_stats: "KplStats | None" = None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, max_bytes_per_second: float | None = None,
                 max_bytes_per_call: int | None = None):
        super().__init__(kinesis, stream, shard_id, start, kpl_stats=kpl_stats, sleep=sleep, monotonic=monotonic,
                         clock=clock, rng=rng)
        if polling_interval < 0:
            raise ReaderError(f"polling_interval must be >= 0, got {polling_interval}")
        if idle_interval < polling_interval:
            raise ReaderError(f"idle_interval ({idle_interval}) must be >= polling_interval ({polling_interval})")
        if max_bytes_per_second is not None and max_bytes_per_second <= 0:
            raise ReaderError(f"max_bytes_per_second must be > 0, got {max_bytes_per_second}")
        if not 1 <= max_records <= 10000:
            raise ReaderError(f"max_records must be in 1..10000 (the GetRecords limit), got {max_records}")
        if max_bytes_per_call is not None and max_bytes_per_call < 1:
            raise ReaderError(f"max_bytes_per_call must be >= 1, got {max_bytes_per_call}")
        self.polling_interval = polling_interval
        self.idle_interval = idle_interval
        self.max_records = max_records
        self.max_bytes_per_second = max_bytes_per_second
        self.max_bytes_per_call = max_bytes_per_call
        self._record_bytes: float | None = None  # mean Kinesis record size of the last response with records
        self.stats = ReaderStats()
        # A fresh iterator starts AFTER_SEQUENCE_NUMBER of the last Kinesis record fetched (the position's).
        self._iterator: str | None = None
        self._iterator_fresh = False  # obtained by GetShardIterator and not yet used successfully
        self._next_call_at: float | None = None
        self._recent_calls: collections.deque[float] = collections.deque(maxlen=MAX_CALLS_PER_SECOND)
        self._consecutive_throttles = 0

    # -- reading ----------------------------------------------------------------------------------
    def poll(self) -> ReadBatch:
        if self._read.ended:
            raise already_ended(self.stream, self.shard_id, self._read)
        if not self._pace():
            return ReadBatch.empty()  # the sleep was cut short (the worker is stopping): never call early
        if self._iterator is None and not self._get_iterator():
            return ReadBatch.empty(self._read.ended)
        self._mark_call()
        called_at = self._monotonic()
        try:
            resp = self.kinesis.get_records(ShardIterator=self._iterator, Limit=self.limit())
        except ClientError as exc:
            return self._on_get_records_error(exc)
        except Exception as exc:
            if is_connection_error(exc):
                raise unavailable(self.kinesis, "GetRecords", exc) from exc
            raise
        self.stats.get_records_calls += 1
        self._count_retries(resp, called_at)
        self._consecutive_throttles = 0
        return self._on_records(resp)

    def _on_records(self, resp: dict) -> ReadBatch:
        records = resp.get("Records") or []
        millis = resp.get("MillisBehindLatest")
        self._iterator = resp.get("NextShardIterator")
        self._iterator_fresh = False
        children = [c["ShardId"] for c in resp.get("ChildShards") or []]
        if records:
            self._read.given(records[-1]["SequenceNumber"])
        users, size, new_size = take_records(self._read, records, self.shard_id, self.kpl_stats, self.stats)
        if records:
            self._record_bytes = size / len(records)
        if not self._iterator or children:
            # A closed shard's last response has no NextShardIterator and (on current Kinesis) ChildShards.
            self._read.end(children)
            self._iterator = None
            log.info("shard %s of %s ended; children %s", self.shard_id, self.stream, children or "not reported")
        caught_up = not records and (millis is None or millis == 0)
        self._schedule(paced_delay(self.idle_interval if caught_up else self.polling_interval, size,
                                   self.max_bytes_per_second))
        return ReadBatch(users, millis, self._read.ended, list(self._read.child_shards), len(records), size,
                         service_time_ms(resp), new_size)

    def limit(self) -> int:
        """The Limit of the next GetRecords (see Prefetch in the module's docstring)."""
        if self.max_bytes_per_call is None:
            return self.max_records
        per_record = self._record_bytes if self._record_bytes is not None else MAX_RECORD_BYTES
        return max(1, min(self.max_records, int(self.max_bytes_per_call // max(1.0, per_record))))

    def _on_get_records_error(self, exc: ClientError) -> ReadBatch:
        code = error_code(exc)
        if code == "ExpiredIteratorException":
            self._expire("expired")
            return ReadBatch.empty()
        if http_status(exc) >= 500:
            # kinesis-local answers an invalid iterator with a bare HTTP 500 (AWS: a real 400
            # ExpiredIteratorException). Re-get the iterator once; a fresh one failing the same way is fatal.
            if self._iterator_fresh:
                raise ReaderError(
                    f"GetRecords on shard {self.shard_id} of stream {self.stream} in {where(self.kinesis)} "
                    f"failed with HTTP {http_status(exc)} ({code}) even with a fresh iterator: {exc}"
                ) from exc
            self._expire(f"HTTP {http_status(exc)} ({code})")
            return ReadBatch.empty()
        self._raise_or_back_off("GetRecords", exc)
        return ReadBatch.empty()

    def _expire(self, why: str) -> None:
        self.stats.expired_iterators += 1
        log.info("shard %s: iterator %s; restarting %s", self.shard_id, why, self._restart_description())
        self._iterator = None
        self._schedule(self.polling_interval)

    # -- iterators --------------------------------------------------------------------------------
    def _iterator_request(self) -> dict[str, Any]:
        """GetShardIterator arguments: after the last record fetched, else from the start checkpoint."""
        target = {"StreamARN": self.stream} if self.stream.startswith("arn:") else {"StreamName": self.stream}
        target["ShardId"] = self.shard_id
        return {**target, **self._read.starting_point().arguments("ShardIteratorType", "StartingSequenceNumber")}

    def _restart_description(self) -> str:
        req = self._iterator_request()
        return f"{req['ShardIteratorType']} {req.get('StartingSequenceNumber') or req.get('Timestamp') or ''}".strip()

    def _get_iterator(self) -> bool:
        point = self._read.starting_point()
        request = self._iterator_request()
        taken_at_ms = round(self._clock() * 1000)
        try:
            resp = self.kinesis.get_shard_iterator(**request)
        except ClientError as exc:
            self._raise_or_back_off("GetShardIterator", exc)
            return False
        except Exception as exc:
            if is_connection_error(exc):
                raise unavailable(self.kinesis, "GetShardIterator", exc) from exc
            raise
        self.stats.iterator_requests += 1
        self._read.started(point, service_time_ms(resp), taken_at_ms)
        self._iterator = resp.get("ShardIterator")
        self._iterator_fresh = True
        if not self._iterator:
            # Kinesis gives no iterator for a closed shard read past its end.
            self._read.end()
            log.info("shard %s of %s: no iterator from %s: shard already ended", self.shard_id, self.stream,
                     request["ShardIteratorType"])
            return False
        return True

    # -- errors and pacing ------------------------------------------------------------------------
    def _raise_or_back_off(self, operation: str, exc: ClientError) -> None:
        code = error_code(exc)
        if code in THROTTLING_CODES:
            self.stats.throttles += 1
            self._consecutive_throttles += 1
            delay = self._backoff(self._consecutive_throttles)
            log.warning("shard %s: %s throttled (%s, %d in a row); next attempt in %.2f s", self.shard_id,
                        operation, code, self._consecutive_throttles, delay)
            self._next_call_at = self._monotonic() + delay
            return
        if code == "ResourceNotFoundException":
            raise ReaderError(
                f"{operation}: stream {self.stream} or shard {self.shard_id} does not exist in "
                f"{where(self.kinesis)}: {exc.response.get('Error', {}).get('Message', '')}"
            ) from exc
        if code in ("InvalidArgumentException", "ValidationException"):
            raise ReaderError(
                f"{operation} rejected for shard {self.shard_id} of stream {self.stream} "
                f"(start {self.start}): {exc}"
            ) from exc
        if http_status(exc) >= 500:
            raise unavailable(self.kinesis, operation, exc) from exc
        raise ReaderError(f"{operation} failed for shard {self.shard_id} of stream {self.stream}: {exc}") from exc

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self._rng)

    def _schedule(self, delay: float) -> None:
        self._next_call_at = self._recent_calls[-1] + delay if self._recent_calls else self._monotonic() + delay

    def _due(self) -> float:
        due = self._next_call_at if self._next_call_at is not None else float("-inf")
        if len(self._recent_calls) == MAX_CALLS_PER_SECOND:
            due = max(due, self._recent_calls[0] + 1.0)
        return due

    def _pace(self) -> bool:
        """Sleep until the next call is allowed; False if the (interruptible) sleep returned early."""
        return self._sleep_until(self._due())

    def _mark_call(self) -> None:
        self._recent_calls.append(self._monotonic())

    def _count_retries(self, resp: dict, called_at: float) -> None:
        """botocore retried inside the call: each retry was a GetRecords against the shard's 5/s budget. The
        retries (throttles, 5xx) and their back-off happen inside botocore, where the reader's own throttle log
        never sees them: said here, with how long the shard waited on the call."""
        retries = int((resp.get("ResponseMetadata") or {}).get("RetryAttempts") or 0)
        now = self._monotonic()
        if retries:
            log.warning("shard %s: GetRecords answered after %d retries inside the call (throttled or failing), "
                        "%.1f s after it was sent", self.shard_id, retries, now - called_at)
        for _ in range(min(retries, MAX_CALLS_PER_SECOND)):
            self._recent_calls.append(now)


def check_target(stream: str, shard_id: str, start: Checkpoint) -> None:
    """What every shard reader is opened with: a stream, a shard, and a Checkpoint to start from."""
    if not stream:
        raise ReaderError("stream name or ARN is empty")
    if not shard_id:
        raise ReaderError("shard id is empty")
    if not isinstance(start, Checkpoint):
        raise ReaderError(f"start must be a Checkpoint, got {type(start).__name__}")


def already_ended(stream: str, shard_id: str, read: ReadPosition) -> ReaderError:
    """A shard reader polled after it reported its shard's end."""
    return ReaderError(
        f"shard {shard_id} of stream {stream} has already ended"
        + (f" (children {', '.join(read.child_shards)})" if read.child_shards else "")
        + "; poll() must not be called after shard_ended")


def take_records(read: ReadPosition, records: list[dict], shard_id: str, kpl_stats: "KplStats | None",
                 stats: ReaderStats) -> tuple[Sequence[UserRecord], int, int]:
    """A response's (or an event's) Kinesis records, delivered: their user records past the position (deaggregated,
    the resume filter applied), their payload bytes, and the payload bytes of those that gave a user record
    (ReadBatch.new_bytes); the position and the reader's counters follow."""
    size = new_size = 0
    users: Sequence[UserRecord] = []
    if records:
        size = sum(len(r["Data"]) for r in records)
        batch = deaggregate_batch(records, shard_id, read.after, kpl_stats)
        runs = batch.run_sequence_numbers  # one per Kinesis record that gave a user record (a suffix of its own)
        if len(runs) == len(records):
            new_size = size
        else:
            given = set(runs)
            new_size = sum(len(r["Data"]) for r in records if r["SequenceNumber"] in given)
        users = batch
        read.deliver(users)
    stats.kinesis_records += len(records)
    stats.user_records += len(users)
    return users, size, new_size


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Exponential back-off with 'equal jitter': half fixed, half random."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def paced_delay(interval: float, bytes_read: int, max_bytes_per_second: float | None) -> float:
    """The wait before the next GetRecords: the interval, or longer when the last response's bytes exceed
    the reader's byte budget (a bounded reader leaves the rest of the shard's 2 MiB/s to others). Pure."""
    if not max_bytes_per_second:
        return interval
    return max(interval, bytes_read / max_bytes_per_second)


def service_time_ms(resp: dict) -> int | None:
    """The HTTP Date header of a boto3 response as epoch millis (whole seconds); None when absent or bad."""
    headers = (resp.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    value = headers.get("date")
    if not value:
        return None
    try:
        return int(parsedate_to_datetime(value).timestamp()) * 1000
    except (TypeError, ValueError, IndexError):
        return None

