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
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable, Sequence

from botocore.exceptions import ClientError

from ..core.model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, UserRecord
from ..records.kpl import deaggregate_batch
from .shards import KinesisError, error_code, http_status, is_connection_error, unavailable, where

if TYPE_CHECKING:
    from ..records.kpl import KplStats

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
    filter): what the shard served. `millis_behind_latest` is None when no GetRecords succeeded.
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


@dataclass
class ReaderStats:
    """Counters of one reader, for operational metrics."""

    get_records_calls: int = 0
    kinesis_records: int = 0
    user_records: int = 0
    throttles: int = 0
    expired_iterators: int = 0
    iterator_requests: int = 0


class ShardReader:
    def __init__(self, kinesis: Any, stream: str, shard_id: str, start: Checkpoint, *,
                 polling_interval: float = 0.2, idle_interval: float = 2.0, max_records: int = 10000,
                 kpl_stats: "KplStats | None" = None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, max_bytes_per_second: float | None = None,
                 max_bytes_per_call: int | None = None):
        if not stream:
            raise ReaderError("stream name or ARN is empty")
        if not shard_id:
            raise ReaderError("shard id is empty")
        if not isinstance(start, Checkpoint):
            raise ReaderError(f"start must be a Checkpoint, got {type(start).__name__}")
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
        self.kinesis = kinesis
        self.stream = stream
        self.shard_id = shard_id
        self.start = start
        self.polling_interval = polling_interval
        self.idle_interval = idle_interval
        self.max_records = max_records
        self.max_bytes_per_second = max_bytes_per_second
        self.max_bytes_per_call = max_bytes_per_call
        self._record_bytes: float | None = None  # mean Kinesis record size of the last response with records
        self.kpl_stats = kpl_stats
        self.stats = ReaderStats()
        self._sleep = sleep
        self._monotonic = monotonic
        self._clock = clock
        self._rng = rng or random.Random()

        self._iterator: str | None = None
        self._iterator_fresh = False  # obtained by GetShardIterator and not yet used successfully
        self._last_fetched: str | None = None  # sequence number of the last Kinesis record fetched
        self._latest_anchor_ms: int | None = None  # when a LATEST iterator was taken (see _iterator_request)
        # Records at or below this position are dropped (resume mid-aggregate; never re-deliver).
        self._after: Checkpoint | None = None if start.is_sentinel else start
        self._position = start
        self._next_call_at: float | None = None
        self._recent_calls: collections.deque[float] = collections.deque(maxlen=MAX_CALLS_PER_SECOND)
        self._consecutive_throttles = 0
        self._ended = start.is_shard_end
        self._child_shards: list[str] = []

    # -- state ------------------------------------------------------------------------------------
    @property
    def position(self) -> Checkpoint:
        """The last delivered user record's (sequence, sub-sequence), or the start checkpoint."""
        return self._position

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def child_shards(self) -> list[str]:
        return list(self._child_shards)

    # -- reading ----------------------------------------------------------------------------------
    def poll(self) -> ReadBatch:
        if self._ended:
            raise ReaderError(
                f"shard {self.shard_id} of stream {self.stream} has already ended"
                + (f" (children {', '.join(self._child_shards)})" if self._child_shards else "")
                + "; poll() must not be called after shard_ended"
            )
        if not self._pace():
            return self._empty()  # the sleep was cut short (the worker is stopping): never call early
        if self._iterator is None and not self._get_iterator():
            return ReadBatch([], None, self._ended, [], 0, 0)
        self._mark_call()
        try:
            resp = self.kinesis.get_records(ShardIterator=self._iterator, Limit=self.limit())
        except ClientError as exc:
            return self._on_get_records_error(exc)
        except Exception as exc:
            if is_connection_error(exc):
                raise unavailable(self.kinesis, "GetRecords", exc) from exc
            raise
        self.stats.get_records_calls += 1
        self._count_retries(resp)
        self._consecutive_throttles = 0
        return self._on_records(resp)

    def _on_records(self, resp: dict) -> ReadBatch:
        records = resp.get("Records") or []
        millis = resp.get("MillisBehindLatest")
        self._iterator = resp.get("NextShardIterator")
        self._iterator_fresh = False
        children = [c["ShardId"] for c in resp.get("ChildShards") or []]
        size = 0
        users: Sequence[UserRecord] = []
        if records:
            self._last_fetched = records[-1]["SequenceNumber"]
            size = sum(len(r["Data"]) for r in records)
            self._record_bytes = size / len(records)
            users = deaggregate_batch(records, self.shard_id, self._after, self.kpl_stats)
            if users:
                self._position = users[-1].checkpoint
                self._after = self._position
        self.stats.kinesis_records += len(records)
        self.stats.user_records += len(users)
        if not self._iterator or children:
            # A closed shard's last response has no NextShardIterator and (on current Kinesis) ChildShards.
            self._ended = True
            self._iterator = None
            self._child_shards = children
            log.info("shard %s of %s ended; children %s", self.shard_id, self.stream, children or "not reported")
        caught_up = not records and (millis is None or millis == 0)
        self._schedule(paced_delay(self.idle_interval if caught_up else self.polling_interval, size,
                                   self.max_bytes_per_second))
        return ReadBatch(users, millis, self._ended, list(self._child_shards), len(records), size,
                         service_time_ms(resp))

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
            return self._empty()
        if http_status(exc) >= 500:
            # kinesis-local answers an invalid iterator with a bare HTTP 500 (AWS: a real 400
            # ExpiredIteratorException). Re-get the iterator once; a fresh one failing the same way is fatal.
            if self._iterator_fresh:
                raise ReaderError(
                    f"GetRecords on shard {self.shard_id} of stream {self.stream} in {where(self.kinesis)} "
                    f"failed with HTTP {http_status(exc)} ({code}) even with a fresh iterator: {exc}"
                ) from exc
            self._expire(f"HTTP {http_status(exc)} ({code})")
            return self._empty()
        self._raise_or_back_off("GetRecords", exc)
        return self._empty()

    def _expire(self, why: str) -> None:
        self.stats.expired_iterators += 1
        log.info("shard %s: iterator %s; restarting %s", self.shard_id, why, self._restart_description())
        self._iterator = None
        self._schedule(self.polling_interval)

    def _empty(self) -> ReadBatch:
        return ReadBatch([], None, False, [], 0, 0)

    # -- iterators --------------------------------------------------------------------------------
    def _iterator_request(self) -> dict[str, Any]:
        """GetShardIterator arguments: after the last record fetched, else from the start checkpoint."""
        target = {"StreamARN": self.stream} if self.stream.startswith("arn:") else {"StreamName": self.stream}
        target["ShardId"] = self.shard_id
        if self._last_fetched is not None:
            return {**target, "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "StartingSequenceNumber": self._last_fetched}
        kind = self.start.sequence_number
        if kind == TRIM_HORIZON:
            return {**target, "ShardIteratorType": TRIM_HORIZON}
        if kind == LATEST:
            if self._latest_anchor_ms is not None:
                # A LATEST iterator that expired before fetching anything: restarting at LATEST would skip
                # what arrived meanwhile; restart at the time the first LATEST iterator was taken.
                return {**target, "ShardIteratorType": AT_TIMESTAMP, "Timestamp": _utc(self._latest_anchor_ms)}
            return {**target, "ShardIteratorType": LATEST}
        if kind == AT_TIMESTAMP:
            return {**target, "ShardIteratorType": AT_TIMESTAMP, "Timestamp": _utc(self.start.sub_sequence_number)}
        return {**target, "ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": kind}

    def _restart_description(self) -> str:
        req = self._iterator_request()
        return f"{req['ShardIteratorType']} {req.get('StartingSequenceNumber') or req.get('Timestamp') or ''}".strip()

    def _get_iterator(self) -> bool:
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
        if request["ShardIteratorType"] == LATEST:
            # Anchor by the service's clock (the response's Date, minus one second for its whole-second
            # precision) so a skewed host clock never skips records; the host clock only when it is absent.
            served = service_time_ms(resp)
            self._latest_anchor_ms = served - 1000 if served is not None else taken_at_ms
        self._iterator = resp.get("ShardIterator")
        self._iterator_fresh = True
        if not self._iterator:
            # Kinesis gives no iterator for a closed shard read past its end.
            self._ended = True
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
        """Exponential back-off with 'equal jitter': half fixed, half random."""
        ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def _schedule(self, delay: float) -> None:
        self._next_call_at = self._recent_calls[-1] + delay if self._recent_calls else self._monotonic() + delay

    def _due(self) -> float:
        due = self._next_call_at if self._next_call_at is not None else float("-inf")
        if len(self._recent_calls) == MAX_CALLS_PER_SECOND:
            due = max(due, self._recent_calls[0] + 1.0)
        return due

    def _pace(self) -> bool:
        """Sleep until the next call is allowed; False if the (interruptible) sleep returned early."""
        due = self._due()
        wait = due - self._monotonic()
        if wait > 0:
            self._sleep(wait)
            return self._monotonic() >= due
        return True

    def _mark_call(self) -> None:
        self._recent_calls.append(self._monotonic())

    def _count_retries(self, resp: dict) -> None:
        """botocore retried inside the call: each retry was a GetRecords against the shard's 5/s budget."""
        retries = int((resp.get("ResponseMetadata") or {}).get("RetryAttempts") or 0)
        now = self._monotonic()
        for _ in range(min(retries, MAX_CALLS_PER_SECOND)):
            self._recent_calls.append(now)


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


def _utc(epoch_millis: int) -> datetime:
    # Integer arithmetic: a float division can land a microsecond below the millisecond.
    return datetime.fromtimestamp(epoch_millis // 1000, tz=timezone.utc) + timedelta(milliseconds=epoch_millis % 1000)
