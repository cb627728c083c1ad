"""Enhanced fan-out: the application's stream consumer, and a shard reader that SubscribeToShard pushes to.

Registration. An application has one stream consumer per stream, named after the application (Java KCL's
default consumerName is its applicationName too), shared by every worker of the fleet: a lease is read by
one worker at a time, and a subscription is per consumer and shard. A worker opening a lease describes the
consumer; registers it when it is missing; waits while it is CREATING (or DELETING: registered again once
gone) until it is ACTIVE. A peer registering it at the same moment (ResourceInUseException) is waited for.
Too many consumers on the stream (LimitExceededException, once botocore's retries are spent) is an error
naming the stream's consumers.

Reading. `FanOutReader.poll()` presents what `ShardReader.poll()` does: a ReadBatch of deaggregated user
records after the (sequence, sub-sequence) resume filter, MillisBehindLatest, and the shard's end with its
children. One subscription at a time; a thread reads its events off the connection into a queue of one, so
a worker holds at most the event it delivers, one queued and one being read. Each poll delivers one event,
or an empty batch after `event_wait` seconds without one (the worker checks its lease and stop signal
between polls, as with polling).

Resubscription: Kinesis ends a subscription after 5 minutes; the reader subscribes again AFTER_SEQUENCE_NUMBER
of the last event's ContinuationSequenceNumber (the reader's own checkpoint: it moves even when no record
arrives). Errors mid-subscription (an exception event such as InternalFailureException or
ResourceInUseException, a reset connection, a read timeout) resubscribe from the same continuation after an
exponential, jittered back-off; a subscription still open 30 s past its 5 minutes is closed by the reader
itself (`subscription_limit`). Before the first event, the start is the lease's: AT_SEQUENCE_NUMBER of its
checkpoint (the filter drops the user records of a partly processed aggregate), TRIM_HORIZON, AT_TIMESTAMP, or LATEST
(once: a LATEST subscription that never delivered an event restarts AT_TIMESTAMP of the service's time when
it was made, as the polling reader does). A SubscribeToShard refused with ResourceInUseException (another
subscription of the consumer to the shard: the lease's previous holder, or one made in the last 5 s) or
LimitExceededException (1 per second per consumer and shard) backs off and retries; ResourceNotFoundException
re-resolves the consumer (a deregistered consumer is registered again) and, when the consumer is there, means
the shard is gone: its end, as Java KCL has it. An event Java would refuse (`invalid_event`) is a failure too:
the reader subscribes again from the last continuation.

Landing and checkpoints are the polling reader's: the worker delivers the same batches, the processor
checkpoints user records, and a lease's checkpoint stays a record's (sequence, sub-sequence), so a lease moves
between polling and fan-out consumers (and Java KCL) unchanged.

The service's time of an event ("caught up as of", for window completeness) is the subscription response's
Date plus the time since it was received, less a second, in whole seconds; an event that may have waited in
the connection's buffers (the queue was full when it was read) keeps the previous event's time, never a later
one.
"""
from __future__ import annotations

import http.client
import logging
import queue
import random
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import urllib3.exceptions
from botocore.eventstream import ParserError
from botocore.exceptions import ClientError

from ...core.model import Checkpoint
from ..shards import (
    KinesisUnavailable,
    StreamNotFound,
    error_code,
    http_status,
    is_connection_error,
    stream_arn,
    unavailable,
    where,
)
from .reader import (
    THROTTLING_CODES,
    PositionedReader,
    ReadBatch,
    ReaderError,
    ReaderStats,
    already_ended,
    backoff_delay,
    take_records,
)
from .reader import service_time_ms as response_time_ms

if TYPE_CHECKING:
    from ...records.kpl import KplStats

log = logging.getLogger(__name__)

SUBSCRIPTION_SECONDS = 300.0  # Kinesis ends a subscription after 5 minutes
SUBSCRIPTION_GRACE_SECONDS = 30.0  # past that, the reader closes a subscription the service did not end
SUBSCRIBE_INTERVAL_SECONDS = 1.0  # Kinesis: one SubscribeToShard per second per consumer and shard
CONSUMER_ACTIVE_TIMEOUT_SECONDS = 120.0
CONSUMER_POLL_SECONDS = 1.0
MAX_CONSECUTIVE_FAILURES = 10  # subscriptions failing with no event in between: the service is unavailable
SERVICE_CLOCK_MARGIN_MS = 1000
CONSUMER_NAME_RE = re.compile(r"[a-zA-Z0-9_.-]{1,128}")


class FanOutError(ReaderError):
    """Enhanced fan-out cannot go on: the consumer cannot be registered or made ACTIVE."""


class _Interrupted(Exception):
    """The reader's (interruptible) sleep returned early while waiting for the consumer: the worker is stopping."""


# -- the stream consumer ------------------------------------------------------------------------------------

def consumer_name(application: str) -> str:
    """The application's stream consumer: named after the application (Java KCL's default consumerName)."""
    if not CONSUMER_NAME_RE.fullmatch(application):
        raise FanOutError(f"application {application!r} cannot name a stream consumer (1-128 characters of letters, "
                          f"digits, '_', '.', '-'): enhanced fan-out needs a shorter application name")
    return application


@dataclass(frozen=True)
class StreamConsumer:
    name: str
    arn: str
    status: str
    stream_arn: str


def describe_consumer(kinesis: Any, stream_arn: str, name: str) -> StreamConsumer | None:
    """The consumer, or None when the stream has no consumer of that name."""
    try:
        resp = kinesis.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=name)
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return None
        raise _registration_error("DescribeStreamConsumer", kinesis, stream_arn, name, exc) from exc
    except Exception as exc:
        if is_connection_error(exc):
            raise unavailable(kinesis, "DescribeStreamConsumer", exc) from exc
        raise
    d = resp["ConsumerDescription"]
    return StreamConsumer(d["ConsumerName"], d["ConsumerARN"], d["ConsumerStatus"], d.get("StreamARN", stream_arn))


def ensure_consumer(kinesis: Any, stream: str, name: str, *, timeout: float = CONSUMER_ACTIVE_TIMEOUT_SECONDS,
                    poll_interval: float = CONSUMER_POLL_SECONDS, sleep: Callable[[float], None] = time.sleep,
                    monotonic: Callable[[], float] = time.monotonic) -> StreamConsumer:
    """The stream's consumer `name`, ACTIVE: reused when it exists, registered when it does not.

    Raises StreamNotFound for a missing stream, FanOutError when the stream has all the consumers it may have
    or the consumer is not ACTIVE within `timeout`, and _Interrupted when `sleep` returns early.
    """
    arn = stream if stream.startswith("arn:") else stream_arn(kinesis, stream)
    deadline = monotonic() + timeout
    said: set[str] = set()
    while True:
        consumer = describe_consumer(kinesis, arn, name)
        if consumer is None:
            consumer = _register(kinesis, arn, name)
        if consumer is not None and consumer.status == "ACTIVE":
            return consumer
        status = consumer.status if consumer is not None else "being registered by a peer"
        if status not in said:
            said.add(status)
            log.info("stream consumer %s of %s is %s; waiting for it to be ACTIVE%s", name, arn, status,
                     " (it is registered again once it is gone)" if status == "DELETING" else "")
        if monotonic() >= deadline:
            raise FanOutError(f"stream consumer {name} of {arn} is still {status} after {timeout:g} s in "
                              f"{where(kinesis)}")
        due = monotonic() + poll_interval
        sleep(poll_interval)
        if monotonic() < due:
            raise _Interrupted()


def _register(kinesis: Any, stream_arn: str, name: str) -> StreamConsumer | None:
    """Register the consumer; None when a peer registers it at the same moment (it is described again)."""
    try:
        resp = kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name)
    except ClientError as exc:
        if error_code(exc) == "ResourceInUseException":
            log.info("stream consumer %s of %s is being registered (or deleted) by someone else; waiting for it",
                     name, stream_arn)
            return None
        raise _registration_error("RegisterStreamConsumer", kinesis, stream_arn, name, exc) from exc
    except Exception as exc:
        if is_connection_error(exc):
            raise unavailable(kinesis, "RegisterStreamConsumer", exc) from exc
        raise
    c = resp["Consumer"]
    log.info("registered stream consumer %s of %s (%s)", name, stream_arn, c["ConsumerARN"])
    return StreamConsumer(c["ConsumerName"], c["ConsumerARN"], c["ConsumerStatus"], stream_arn)


def _registration_error(operation: str, kinesis: Any, stream_arn: str, name: str, exc: ClientError) -> Exception:
    code = error_code(exc)
    if code == "ResourceNotFoundException":
        return StreamNotFound(f"Kinesis stream {stream_arn} does not exist in {where(kinesis)} ({operation})")
    if code == "LimitExceededException":
        others = _consumer_names(kinesis, stream_arn)
        return FanOutError(
            f"{operation} of stream consumer {name} on {stream_arn} refused with LimitExceededException after "
            f"botocore's retries: a stream has at most 20 consumers (this one has {len(others)}: "
            f"{', '.join(others) or 'none listed'}), and registrations are limited to 5 per second per account. "
            f"Deregister consumers nothing uses (aws kinesis deregister-stream-consumer), or read by polling "
            f"(--retrieval polling)")
    if http_status(exc) >= 500:
        return unavailable(kinesis, operation, exc)
    return FanOutError(f"{operation} of stream consumer {name} on {stream_arn} failed: {exc}")


def _consumer_names(kinesis: Any, stream_arn: str) -> list[str]:
    try:
        pages = kinesis.get_paginator("list_stream_consumers").paginate(StreamARN=stream_arn)
        return [c["ConsumerName"] for page in pages for c in page.get("Consumers", [])]
    except Exception as exc:  # only to explain the refusal
        log.debug("could not list the consumers of %s: %s", stream_arn, exc)
        return []


def deregister_consumer(kinesis: Any, stream: str, name: str) -> bool:
    """Deregister the stream's consumer `name`; False when there was none."""
    arn = stream if stream.startswith("arn:") else stream_arn(kinesis, stream)
    try:
        kinesis.deregister_stream_consumer(StreamARN=arn, ConsumerName=name)
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise
    return True


# -- the subscription -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Event:
    event: dict
    received: float  # monotonic
    fresh: bool  # read while the queue had room: not held in the connection's buffers meanwhile


class _End:
    """The service ended the subscription (after its 5 minutes)."""


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_Item = _Event | _End | _Failed


class _Subscription:
    """One SubscribeToShard's event stream, read by its own thread into a queue of one."""

    def __init__(self, events: Any, date_ms: int | None, received: float, shard_id: str,
                 monotonic: Callable[[], float]):
        self.events = events
        self.date_ms = date_ms
        self.received = received
        self._monotonic = monotonic
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=1)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"fanout-{shard_id}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        fresh = True
        try:
            for event in self.events:
                if self._closed.is_set():
                    return
                full = self._queue.full()
                if not self._put(_Event(event, self._monotonic(), fresh)):
                    return
                fresh = not full
            self._put(_End())
        except Exception as exc:
            if not self._closed.is_set():
                self._put(_Failed(exc))

    def _put(self, item: _Item) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def next(self, timeout: float) -> _Item | None:
        try:
            return self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed.set()
        # Shut the socket down first: closing it alone leaves the pump blocked in its read (and the service's
        # side of the subscription open) until the next event arrives.
        raw = getattr(self.events, "_raw_stream", None)
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.events.close()  # the connection is discarded, never reused
        except Exception as exc:
            log.debug("closing a subscription: %s", exc)


@dataclass
class FanOutStats(ReaderStats):
    """The reader's counters (ReaderStats': throttles feed the worker's metrics) and its subscriptions'."""

    subscriptions: int = 0
    resubscriptions: int = 0  # subscriptions the service ended (5 minutes) that were made again
    subscription_errors: int = 0  # refused, or failed mid-stream


class InvalidEvent(Exception):
    """A SubscribeToShardEvent neither Kinesis nor Java KCL considers valid (`invalid_event`)."""


def invalid_event(continuation: str | None, child_shards: Sequence[Any]) -> str | None:
    """What is wrong with an event, as Java's DataRetrievalUtil.isValidResult judges it, or None: a shard's end
    is no continuation with children (each naming its parents); any other event has a continuation and no
    children."""
    if continuation is None and not child_shards:
        return "an event with neither a continuation nor child shards"
    if continuation is not None and child_shards:
        return "an event with both a continuation and child shards"
    if any(not child.get("ParentShards") for child in child_shards):
        return "a child shard without its parents"
    return None


class FanOutReader(PositionedReader):
    """A shard reader over SubscribeToShard: `poll()` returns ReadBatches as ShardReader's does."""

    def __init__(self, kinesis: Any, stream: str, shard_id: str, start: Checkpoint, *, consumer: str,
                 kpl_stats: "KplStats | None" = None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, event_wait: float = 2.0,
                 subscription_limit: float = SUBSCRIPTION_SECONDS + SUBSCRIPTION_GRACE_SECONDS,
                 consumer_timeout: float = CONSUMER_ACTIVE_TIMEOUT_SECONDS):
        super().__init__(kinesis, stream, shard_id, start, kpl_stats=kpl_stats, sleep=sleep, monotonic=monotonic,
                         clock=clock, rng=rng)
        if event_wait <= 0:
            raise ReaderError(f"event_wait must be > 0, got {event_wait}")
        self.consumer_name = consumer_name(consumer)
        self.event_wait = event_wait
        self.subscription_limit = subscription_limit  # a subscription open longer is closed by the reader
        self.consumer_timeout = consumer_timeout
        self.stats = FanOutStats()

        self._consumer: StreamConsumer | None = None
        self._consumer_missing = 0  # ResourceNotFound answers in a row while the consumer was resolved
        self._subscription: _Subscription | None = None
        self._next_subscribe_at: float | None = None
        self._failures = 0  # failed subscriptions with no event in between
        self._service_ms: int | None = None
        # A subscription starts AFTER_SEQUENCE_NUMBER of the last event's continuation (the position's).

    # -- state ------------------------------------------------------------------------------------
    @property
    def continuation(self) -> str | None:
        """The last event's ContinuationSequenceNumber: the next subscription starts after it."""
        return self._read.resume_after

    def close(self) -> None:
        """End the subscription (its connection and thread); a later poll subscribes again."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    # -- reading ----------------------------------------------------------------------------------
    def poll(self) -> ReadBatch:
        ended_before = self._read.ended
        batch = self._poll()
        if self._read.ended and not ended_before and not batch.shard_ended:
            return ReadBatch.empty(shard_ended=True)  # the shard found gone: its end (see _consumer_not_found)
        return batch

    def _poll(self) -> ReadBatch:
        if self._read.ended:
            raise already_ended(self.stream, self.shard_id, self._read)
        if self._subscription is None:
            if not self._pace():
                return ReadBatch.empty()
            try:
                self._subscribe()
            except _Interrupted:
                return ReadBatch.empty()
        subscription = self._subscription
        if subscription is None or self._closed_overdue(subscription):
            return ReadBatch.empty()
        item = subscription.next(self.event_wait)
        if item is None:
            return ReadBatch.empty()
        if isinstance(item, _End):
            self.stats.resubscriptions += 1
            log.debug("shard %s: the subscription ended after %.0f s; resubscribing after %s", self.shard_id,
                      self._monotonic() - subscription.received, self.continuation)
            self.close()
            return ReadBatch.empty()
        if isinstance(item, _Failed):
            self.close()
            self._on_failure(item.error)
            return ReadBatch.empty()
        return self._on_event(item, subscription)

    def _on_event(self, item: _Event, subscription: _Subscription) -> ReadBatch:
        body = item.event.get("SubscribeToShardEvent")
        if body is None:
            log.debug("shard %s: event of no known type ignored: %s", self.shard_id, list(item.event))
            return ReadBatch.empty()
        records = body.get("Records") or []
        continuation = body.get("ContinuationSequenceNumber")
        children = [c["ShardId"] for c in body.get("ChildShards") or []]
        invalid = invalid_event(continuation, body.get("ChildShards") or [])
        if invalid:
            # Java's FanOutRecordsPublisher refuses such an event (DataRetrievalUtil.isValidResult) and subscribes
            # again: its records are read again from the last continuation, and the shard is not ended on it.
            self.close()
            self._on_failure(InvalidEvent(f"shard {self.shard_id}: {invalid}"))
            return ReadBatch.empty()
        self._failures = 0
        self._consumer_missing = 0
        users, size, new_size = take_records(self._read, records, self.shard_id, self.kpl_stats, self.stats)
        if continuation:
            self._read.given(continuation)
        if continuation is None:
            # A closed shard's last event: ChildShards and no continuation (Kinesis sends both).
            self._read.end(children)
            self.close()
            log.info("shard %s of %s ended; children %s", self.shard_id, self.stream, children or "not reported")
        return ReadBatch(users, body.get("MillisBehindLatest"), self._read.ended, list(self._read.child_shards),
                         len(records), size, self._service_time(item, subscription), new_size)

    def _service_time(self, item: _Event, subscription: _Subscription) -> int | None:
        """The service's time when the event was sent, never later (see the module's docstring)."""
        if subscription.date_ms is None:
            return None
        if item.fresh:
            elapsed_ms = int((item.received - subscription.received) * 1000)
            estimate = subscription.date_ms + elapsed_ms - SERVICE_CLOCK_MARGIN_MS
            estimate -= estimate % 1000
            self._service_ms = max(self._service_ms or estimate, estimate)
        return self._service_ms if self._service_ms is not None else subscription.date_ms - SERVICE_CLOCK_MARGIN_MS

    # -- subscribing ------------------------------------------------------------------------------
    def _starting_position(self) -> dict[str, Any]:
        """SubscribeToShard's StartingPosition: after the last continuation, else from the start checkpoint."""
        return self._read.starting_point().arguments("Type", "SequenceNumber")

    def _subscribe(self) -> None:
        if self._consumer is None:
            self._consumer = ensure_consumer(self.kinesis, self.stream, self.consumer_name,
                                             timeout=self.consumer_timeout, sleep=self._sleep,
                                             monotonic=self._monotonic)
        point = self._read.starting_point()
        position = self._starting_position()
        self._next_subscribe_at = self._monotonic() + SUBSCRIBE_INTERVAL_SECONDS
        taken_at_ms = round(self._clock() * 1000)
        try:
            resp = self.kinesis.subscribe_to_shard(ConsumerARN=self._consumer.arn, ShardId=self.shard_id,
                                                   StartingPosition=position)
        except ClientError as exc:
            self._on_failure(exc)
            return
        except Exception as exc:
            if is_connection_error(exc):  # no answer at all, after botocore's retries: as polling does
                raise unavailable(self.kinesis, "SubscribeToShard", exc) from exc
            if _broken_stream(exc):  # the answer's stream broke while its initial response was read
                self._on_failure(exc)
                return
            if type(exc).__name__ == "ResponseParserError":
                raise ReaderError(f"SubscribeToShard on {where(self.kinesis)} did not answer with an event stream "
                                  f"botocore accepts ({exc}): is this endpoint serving enhanced fan-out?") from exc
            raise
        received = self._monotonic()
        date_ms = response_time_ms(resp)
        self.stats.subscriptions += 1
        self._read.started(point, date_ms, taken_at_ms)
        self._subscription = _Subscription(resp["EventStream"], date_ms, received, self.shard_id, self._monotonic)
        log.debug("shard %s: subscribed with consumer %s from %s", self.shard_id, self._consumer.name, position)

    def _closed_overdue(self, subscription: _Subscription) -> bool:
        """Close a subscription the service kept open past `subscription_limit` (the next poll subscribes again)."""
        age = self._monotonic() - subscription.received
        if age <= self.subscription_limit:
            return False
        log.info("shard %s: the subscription is still open after %.0f s; resubscribing after %s", self.shard_id, age,
                 self.continuation)
        self.stats.resubscriptions += 1
        self.close()
        return True

    # -- failures ---------------------------------------------------------------------------------
    def _on_failure(self, exc: BaseException) -> None:
        """A refused SubscribeToShard or a subscription that failed mid-stream: back off and subscribe again,
        or raise what cannot be retried."""
        self.stats.subscription_errors += 1
        self._failures += 1
        code = error_code(exc) if isinstance(exc, ClientError) else ""
        if code == "ResourceNotFoundException":
            self._consumer_not_found(exc)
            return
        if code in ("InvalidArgumentException", "ValidationException", "AccessDeniedException") or (
                code.startswith("KMS") and code not in THROTTLING_CODES):
            raise ReaderError(f"SubscribeToShard of shard {self.shard_id} of stream {self.stream} (consumer "
                              f"{self.consumer_name}, from {self._starting_position()}) failed: {exc}") from exc
        if isinstance(exc, ClientError) and http_status(exc) >= 500 and not _in_stream(exc):
            raise unavailable(self.kinesis, "SubscribeToShard", exc) from exc
        if self._failures > MAX_CONSECUTIVE_FAILURES:
            raise KinesisUnavailable(
                f"SubscribeToShard of shard {self.shard_id} of stream {self.stream} in {where(self.kinesis)} failed "
                f"{self._failures} times in a row without an event; last: {type(exc).__name__}: {exc}") from exc
        if code in THROTTLING_CODES:
            self.stats.throttles += 1
        delay = self._backoff(self._failures)
        self._next_subscribe_at = self._monotonic() + delay
        log.warning("shard %s: %s; subscribing again after %s in %.2f s (%d in a row)", self.shard_id,
                    _explain(code, exc, self.consumer_name), self.continuation or self._starting_position()["Type"],
                    delay, self._failures)

    def _consumer_not_found(self, exc: BaseException) -> None:
        self._consumer_missing += 1
        if self._consumer_missing > 1:
            # The consumer is ACTIVE and the stream there: the shard itself is gone (past its retention). Java's
            # FanOutRecordsPublisher marks such a shard for completion (its end, no children reported); the
            # worker then ends the lease and creates the children it finds by listing the stream.
            log.warning("shard %s of stream %s not found by SubscribeToShard with consumer %s ACTIVE (%s): the "
                        "shard is gone; treated as its end, as Java KCL does", self.shard_id, self.stream,
                        self.consumer_name, exc)
            self._read.end()
            return
        log.warning("shard %s: stream consumer %s not found (%s): deregistered? It is described, and registered "
                    "again if it is gone, before subscribing again", self.shard_id, self.consumer_name, exc)
        self._consumer = None
        self._next_subscribe_at = self._monotonic()

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self._rng)

    def _pace(self) -> bool:
        """Sleep until the next subscription is allowed; False if the (interruptible) sleep returned early."""
        due = self._next_subscribe_at
        return due is None or self._sleep_until(due)


def _broken_stream(exc: BaseException) -> bool:
    """A connection that broke inside a response (reset, cut short, corrupt), not one that never answered."""
    return isinstance(exc, (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ParserError))


def _in_stream(exc: ClientError) -> bool:
    """An exception event inside an open subscription (botocore's EventStreamError), not a refused call."""
    return type(exc).__name__ == "EventStreamError"


def _explain(code: str, exc: BaseException, consumer: str) -> str:
    if code == "ResourceInUseException":
        return (f"another subscription of consumer {consumer} to this shard is active (ResourceInUseException: "
                f"the lease's previous or next holder, or one made less than 5 s ago)")
    if code in THROTTLING_CODES:
        return f"SubscribeToShard throttled ({code})"
    if code:
        return f"the subscription failed ({code}: {exc})"
    return f"the subscription's connection failed ({type(exc).__name__}: {exc})"
