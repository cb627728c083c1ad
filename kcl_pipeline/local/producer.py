"""The demo producer: JSON user records into a Kinesis stream, plain or KPL-aggregated.

`produce()` is what `kcl-pipeline produce` runs. It creates the stream when asked, puts records with
PutRecords (at most 500 entries and 5 MiB a call), re-sends only the entries that failed (with
jittered exponential back-off when Kinesis throttles), paces itself to a rate when given one, and can
poison every k-th payload (invalid JSON) to exercise the transform's quarantine.

The decisions — how entries are batched, which to re-send, how long to back off, when a batch is due —
are pure functions below; `produce()` wraps them with the Kinesis calls, a clock and sleep.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Sequence

from botocore.exceptions import ClientError

from kcl_pipeline.kcl.records.kpl import MAX_RECORD_BYTES, Aggregator
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, StreamNotFound, where

log = logging.getLogger(__name__)

MAX_ENTRIES_PER_CALL = 500
MAX_BYTES_PER_CALL = 5 * 1024 * 1024  # data + partition keys of one PutRecords call
MAX_PUT_ATTEMPTS = 10
# With a rate, a batch holds about this many seconds of records, so the output is smooth, not bursts.
PACING_SECONDS = 0.2
THROTTLED = "ProvisionedThroughputExceededException"
WRITABLE = ("ACTIVE", "UPDATING")


class PutRecordsFailed(KinesisUnavailable):
    """Some entries were still refused after every attempt."""


@dataclass
class ProduceReport:
    stream: str
    user_records: int = 0  # user records put (aggregated or not)
    kinesis_records: int = 0  # Kinesis records put (an aggregate counts once)
    aggregates: int = 0
    poisoned: int = 0  # payloads that are not valid JSON on purpose
    bytes: int = 0  # data bytes put
    put_calls: int = 0
    retried_entries: int = 0  # entries re-sent after Kinesis refused them
    throttled_entries: int = 0
    created_stream: bool = False
    seconds: float = 0.0
    shards: dict[str, int] = field(default_factory=dict)  # shard id -> Kinesis records put there
    ids: list[int] = field(default_factory=list)  # user record ids, in production order
    poison_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    """One PutRecords entry: a plain user record or a KPL aggregate of several."""

    partition_key: str
    data: bytes
    ids: tuple[int, ...]
    aggregated: bool = False

    def size(self) -> int:
        return len(self.data) + len(self.partition_key.encode())


# -- payloads ------------------------------------------------------------------------------------------

def default_payload(n: int, now: float) -> bytes:
    """{"id": n, "ts": ISO-8601 UTC millis, "value": a number derived from n} (same n → same value)."""
    ts = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    value = round(random.Random(n).uniform(0, 1000), 3)
    return json.dumps({"id": n, "ts": ts, "value": value}, separators=(",", ":")).encode()


def poison_payload(n: int) -> bytes:
    """Not JSON (an unterminated object), yet recognisably this record's."""
    return f'{{"id": {n}, "poison": tru'.encode()


def is_poison(n: int, poison_every: int | None) -> bool:
    """Every k-th record, counting from 1 (k = 3: ids 2, 5, 8 when ids start at 0)."""
    return poison_every is not None and (n + 1) % poison_every == 0


# -- pure decisions ------------------------------------------------------------------------------------

def batches(entries: Iterable[Entry], max_users: int | None = None) -> Iterator[list[Entry]]:
    """Group entries into PutRecords calls: <= 500 entries, <= 5 MiB, <= max_users user records (pacing)."""
    batch: list[Entry] = []
    size = users = 0
    for entry in entries:
        full = (len(batch) >= MAX_ENTRIES_PER_CALL or size + entry.size() > MAX_BYTES_PER_CALL
                or (max_users is not None and users + len(entry.ids) > max_users))
        if batch and full:
            yield batch
            batch, size, users = [], 0, 0
        batch.append(entry)
        size += entry.size()
        users += len(entry.ids)
    if batch:
        yield batch


def failed_entries(sent: Sequence[Entry], results: Sequence[dict]) -> tuple[list[Entry], list[str]]:
    """The entries PutRecords refused (to re-send, in order) and their error codes."""
    if len(results) != len(sent):
        raise ValueError(f"PutRecords answered {len(results)} results for {len(sent)} entries")
    failed = [(e, r["ErrorCode"]) for e, r in zip(sent, results, strict=True) if r.get("ErrorCode")]
    return [e for e, _ in failed], [code for _, code in failed]


def backoff_seconds(attempt: int, rnd: random.Random, base: float = 0.1, cap: float = 5.0) -> float:
    """Full-jitter exponential back-off before re-send number `attempt` (1-based)."""
    return rnd.uniform(0, min(cap, base * 2 ** (attempt - 1)))


def due_at(start: float, users_before: int, rate: float | None) -> float:
    """When a batch whose first user record is number `users_before` may be sent (rate: user records/s)."""
    return start if rate is None else start + users_before / rate


def users_per_batch(rate: float | None) -> int | None:
    return None if rate is None else max(1, math.ceil(rate * PACING_SECONDS))


# -- I/O -------------------------------------------------------------------------------------------------

def _error_code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def _stream_status(kinesis: Any, stream: str) -> str | None:
    try:
        return kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
    except ClientError as exc:
        if _error_code(exc) == "ResourceNotFoundException":
            return None
        raise


def ensure_stream(kinesis: Any, stream: str, create_shards: int | None, *, timeout: float = 60.0,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> bool:
    """Make sure `stream` is writable; create it with `create_shards` shards if missing. True if created."""
    status = _stream_status(kinesis, stream)
    created = False
    if status is None:
        if create_shards is None:
            raise StreamNotFound(
                f"stream {stream!r} does not exist in {where(kinesis)}: create it, or pass create_shards "
                f"(--create-shards N) to have the producer create it"
            )
        try:
            kinesis.create_stream(StreamName=stream, ShardCount=create_shards)
            created = True
            log.info("creating stream %s with %d shards", stream, create_shards)
        except ClientError as exc:
            if _error_code(exc) != "ResourceInUseException":  # someone else is creating it: wait for it
                raise
        status = "CREATING"
    deadline = clock() + timeout
    while status not in WRITABLE:
        if status == "DELETING":
            raise StreamNotFound(f"stream {stream!r} is being deleted in {where(kinesis)}")
        if clock() > deadline:
            raise KinesisUnavailable(f"stream {stream!r} still {status} after {timeout:.0f} s in {where(kinesis)}")
        sleep(0.25)
        status = _stream_status(kinesis, stream) or "CREATING"  # not yet visible right after CreateStream
    return created


def _put(kinesis: Any, stream: str, batch: list[Entry], report: ProduceReport, rnd: random.Random,
         sleep: Callable[[float], None]) -> None:
    """One batch, re-sending refused entries until all are in or the attempts run out."""
    pending = batch
    for attempt in range(1, MAX_PUT_ATTEMPTS + 1):
        try:
            report.put_calls += 1
            resp = kinesis.put_records(StreamName=stream, Records=[
                {"Data": e.data, "PartitionKey": e.partition_key} for e in pending])
        except ClientError as exc:
            # botocore's own retries (standard mode) are spent; throttling is worth waiting out longer.
            if _error_code(exc) not in (THROTTLED, "LimitExceededException") or attempt == MAX_PUT_ATTEMPTS:
                raise
            report.throttled_entries += len(pending)
            report.retried_entries += len(pending)
            sleep(backoff_seconds(attempt, rnd))
            continue
        refused, codes = failed_entries(pending, resp["Records"])
        for entry, result in zip(pending, resp["Records"], strict=True):
            if not result.get("ErrorCode"):
                report.shards[result["ShardId"]] = report.shards.get(result["ShardId"], 0) + 1
                report.kinesis_records += 1
                report.user_records += len(entry.ids)
                report.aggregates += int(entry.aggregated)
                report.bytes += len(entry.data)
        if not refused:
            return
        report.retried_entries += len(refused)
        report.throttled_entries += codes.count(THROTTLED)
        log.info("PutRecords refused %d of %d entries (%s); re-sending them", len(refused), len(pending),
                 ", ".join(sorted(set(codes))))
        pending = refused
        if attempt < MAX_PUT_ATTEMPTS:
            sleep(backoff_seconds(attempt, rnd))
    raise PutRecordsFailed(
        f"PutRecords to {stream!r} in {where(kinesis)} still refused {len(pending)} entries after "
        f"{MAX_PUT_ATTEMPTS} attempts ({', '.join(sorted(set(codes)))}); {report.user_records} user records were put"
    )


def _entries(ids: Iterable[int], payload: Callable[[int], bytes], aggregate: int,
             rnd: random.Random, report: ProduceReport) -> Iterator[Entry]:
    def user(n: int) -> tuple[str, bytes]:
        data = payload(n)
        if not isinstance(data, (bytes, bytearray)):
            raise ValueError(f"payload({n}) returned {type(data).__name__}, not bytes")
        return f"{rnd.getrandbits(64):016x}", bytes(data)

    if aggregate == 1:
        for n in ids:
            pk, data = user(n)
            if len(data) + len(pk) > MAX_RECORD_BYTES:
                raise ValueError(f"payload({n}) is {len(data)} bytes: over the Kinesis record limit")
            yield Entry(pk, data, (n,))
        return
    agg = Aggregator(max_records=aggregate)
    pending: list[int] = []
    for n in ids:
        pk, data = user(n)
        done = agg.add(pk, None, data)
        if done is not None:
            yield Entry(done.partition_key, done.data, tuple(pending[:done.user_records]), aggregated=True)
            pending = pending[done.user_records:]
        pending.append(n)
    last = agg.flush()
    if last is not None:
        yield Entry(last.partition_key, last.data, tuple(pending), aggregated=True)


def produce(kinesis_client: Any, stream: str, count: int, rate: float | None = None, aggregate: int = 1,
            payload: Callable[[int], bytes] | None = None, poison_every: int | None = None,
            create_shards: int | None = None, *, first_id: int = 0, seed: int | None = None,
            clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
            on_progress: Callable[[int], None] | None = None) -> ProduceReport:
    """Put `count` user records (ids first_id .. first_id+count-1) into `stream`.

    rate: user records per second (None: as fast as Kinesis takes them). aggregate: user records per
    KPL aggregate (1: plain records); every user record gets a random partition key, and an aggregate
    is routed by its first record's. payload(n) -> bytes (default: a small JSON document).
    poison_every: every k-th payload is invalid JSON. create_shards: create the stream with that many
    shards if it does not exist (otherwise a missing stream is StreamNotFound). on_progress(n): called after
    each PutRecords with the user records put so far.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if aggregate < 1:
        raise ValueError(f"aggregate must be >= 1 user records per Kinesis record, got {aggregate}")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 user records per second, got {rate}")
    if poison_every is not None and poison_every < 1:
        raise ValueError(f"poison_every must be >= 1, got {poison_every}")
    if create_shards is not None and create_shards < 1:
        raise ValueError(f"create_shards must be >= 1, got {create_shards}")

    report = ProduceReport(stream=stream)
    report.created_stream = ensure_stream(kinesis_client, stream, create_shards, sleep=sleep)
    rnd = random.Random(seed)
    make = payload or (lambda n: default_payload(n, clock()))

    def user_payload(n: int) -> bytes:
        if is_poison(n, poison_every):
            report.poisoned += 1
            report.poison_ids.append(n)
            return poison_payload(n)
        return make(n)

    start = clock()
    users_before = 0
    ids = range(first_id, first_id + count)
    for batch in batches(_entries(ids, user_payload, aggregate, rnd, report), users_per_batch(rate)):
        wait = due_at(start, users_before, rate) - clock()
        if wait > 0:
            sleep(wait)
        _put(kinesis_client, stream, batch, report, rnd, sleep)
        for entry in batch:
            report.ids.extend(entry.ids)
            users_before += len(entry.ids)
        if on_progress is not None:
            on_progress(users_before)
    report.seconds = round(clock() - start, 3)
    log.info("produced %d user records in %d Kinesis records to %s in %.1f s", report.user_records,
             report.kinesis_records, stream, report.seconds)
    return report
