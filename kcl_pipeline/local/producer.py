"""The demo producer: JSON user records into a Kinesis stream, plain or KPL-aggregated.

`produce()` is what `kcl-pipeline produce` runs. It creates the stream when asked, puts records with
PutRecords (at most 500 entries and 5 MiB a call), re-sends only the entries that failed (with
jittered exponential back-off when Kinesis throttles), paces itself to a rate when given one, and can
poison every k-th payload (invalid JSON) to exercise the transform's quarantine.

Aggregation is per shard, as the KPL does it: every user record has a random partition key, and an
aggregate holds only user records whose keys hash (MD5, a 128-bit big-endian integer) into one open
shard's hash key range; it is put with an ExplicitHashKey in that range (its first record's hash key), so
it lands on that shard. Java KCL drops a whole aggregate holding a user record outside the receiving
shard's range. The shard map comes from ListShards (paged) and is listed again when a put lands on a
shard other than the one its aggregate was built for (a reshard closed that shard), and once the stream
leaves UPDATING when it was listed during a reshard; pending user records of shards no longer open are
re-packed under the new map. An aggregate already put across a split is not re-sent (the KPL would, as
duplicates): the report counts its user records outside the receiving shard's range
(`off_shard_user_records`). With a rate, a partial aggregate waits at most MAX_BUFFERED_SECONDS of the
schedule (the KPL's RecordMaxBufferedTime); every partial aggregate is put at the end.

The decisions — how records are routed and packed, how entries are batched, which to re-send, how long to
back off, when a batch is due — are pure functions and classes below; `produce()` wraps them with the
Kinesis calls, a clock and sleep.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Sequence

from botocore.exceptions import ClientError

from kcl_pipeline.kcl.core.model import Shard
from kcl_pipeline.kcl.records.kpl import MAX_HASH_KEY, MAX_RECORD_BYTES, Aggregator
from kcl_pipeline.kcl.shells.shards import KinesisUnavailable, StreamNotFound, list_shards, where

log = logging.getLogger(__name__)

MAX_ENTRIES_PER_CALL = 500
MAX_BYTES_PER_CALL = 5 * 1024 * 1024  # data + partition keys of one PutRecords call
MAX_PUT_ATTEMPTS = 10
# With a rate, a batch holds about this many seconds of records, so the output is smooth, not bursts.
PACING_SECONDS = 0.2
THROTTLED = "ProvisionedThroughputExceededException"
WRITABLE = ("ACTIVE", "UPDATING")
# With a rate, a partial per-shard aggregate is put once this many seconds of the schedule have passed since its
# first record (the KPL's RecordMaxBufferedTime), so a slow shard's records are not held back.
MAX_BUFFERED_SECONDS = 2.0
# While the shard map was listed during a reshard (UPDATING), the stream's status is checked at most this often.
STATUS_CHECK_SECONDS = 0.5
# ListShards answers whose open shards do not cover the hash key space once (mid-reshard) are listed again.
MAX_LISTINGS = 20


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
    shard_listings: int = 0  # ListShards listings of the shard map (aggregating only)
    misrouted_aggregates: int = 0  # aggregates that landed on another shard than they were built for (a reshard)
    off_shard_user_records: int = 0  # user records of those outside the receiving shard's range (Java KCL drops)
    ids: list[int] = field(default_factory=list)  # user record ids, in the order they were put
    poison_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    """One PutRecords entry: a plain user record or a KPL aggregate of several.

    An aggregate names the shard it was built for, is routed there by `explicit_hash_key`, and keeps the
    lowest and highest hash key of its user records (`hash_span`)."""

    partition_key: str
    data: bytes
    ids: tuple[int, ...]
    aggregated: bool = False
    explicit_hash_key: str | None = None
    shard_id: str | None = None
    hash_span: tuple[int, int] | None = None

    def size(self) -> int:
        return len(self.data) + len(self.partition_key.encode())

    def request(self) -> dict[str, Any]:
        out: dict[str, Any] = {"Data": self.data, "PartitionKey": self.partition_key}
        if self.explicit_hash_key is not None:
            out["ExplicitHashKey"] = self.explicit_hash_key
        return out


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

def hash_key(partition_key: str) -> int:
    """The hash key Kinesis routes a partition key by: MD5 of its UTF-8 bytes as a 128-bit big-endian integer."""
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


@dataclass(frozen=True)
class ShardMap:
    """The open shards' hash key ranges, in key order: which shard a hash key goes to."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    shard_ids: tuple[str, ...]

    @classmethod
    def of(cls, shards: Iterable[Shard]) -> "ShardMap":
        """From a listing (open and closed shards). ValueError unless the open shards cover 0..2^128-1 once."""
        ranges = sorted((int(s.hash_key_range.starting_hash_key), int(s.hash_key_range.ending_hash_key), s.shard_id)
                        for s in shards if s.ending_sequence_number is None and s.hash_key_range is not None)
        expected = 0
        for lo, hi, shard_id in ranges:
            if lo != expected or hi < lo:
                raise ValueError(f"open shards do not cover the hash key space once: {shard_id} starts at {lo}, "
                                 f"expected {expected}")
            expected = hi + 1
        if expected != MAX_HASH_KEY + 1:
            raise ValueError(f"open shards do not cover the hash key space: they end at {expected - 1}")
        return cls(tuple(r[0] for r in ranges), tuple(r[1] for r in ranges), tuple(r[2] for r in ranges))

    def shard_for(self, key: int) -> str:
        return self.shard_ids[bisect_right(self.starts, key) - 1]

    def range_of(self, shard_id: str) -> tuple[int, int] | None:
        """The open shard's (starting, ending) hash key; None for a shard not open in this map."""
        try:
            i = self.shard_ids.index(shard_id)
        except ValueError:
            return None
        return self.starts[i], self.ends[i]


@dataclass
class _Pending:
    aggregator: Aggregator
    records: list[tuple[int, str, int, bytes]]  # (id, partition key, hash key, data) in the open aggregate
    since: int  # the record number its first record had


class ShardAggregation:
    """User records packed into KPL aggregates per shard, as the KPL does: an aggregate holds only user records
    whose partition keys hash into one shard of `shard_map`.

    `add` and `flush` return the entries finished (an aggregate is finished when `max_records` are in it, the
    next record would not fit in a Kinesis record, or, with `max_wait`, that many user records have been added
    since its first); `reroute` takes a new map after a reshard. kpl.Aggregator does the encoding."""

    def __init__(self, shard_map: ShardMap, max_records: int, max_wait: int | None = None) -> None:
        self.map = shard_map
        self.max_records = max_records
        self.max_wait = max_wait
        self._open: dict[str, _Pending] = {}  # oldest first
        self._added = 0

    def add(self, n: int, partition_key: str, data: bytes) -> list[Entry]:
        key = hash_key(partition_key)
        out = self._add(self.map.shard_for(key), n, partition_key, key, data)
        self._added += 1
        if self.max_wait is not None:
            while self._open:
                shard_id, oldest = next(iter(self._open.items()))
                if self._added - oldest.since < self.max_wait:
                    break
                out.append(self._close(shard_id))
        return out

    def flush(self) -> list[Entry]:
        return [self._close(shard_id) for shard_id in list(self._open)]

    def reroute(self, shard_map: ShardMap) -> list[Entry]:
        """Use `shard_map` from now on: the pending user records of shards it no longer has are packed again
        under it (a shard keeps its range while it is open, so the others' aggregates stay as they are)."""
        self.map = shard_map
        out: list[Entry] = []
        for shard_id in [s for s in self._open if shard_map.range_of(s) is None]:
            for n, pk, key, data in self._open.pop(shard_id).records:
                out += self._add(shard_map.shard_for(key), n, pk, key, data)
        return out

    def _add(self, shard_id: str, n: int, partition_key: str, key: int, data: bytes) -> list[Entry]:
        pending = self._open.get(shard_id)
        if pending is None:
            pending = _Pending(Aggregator(max_records=self.max_records), [], self._added)
        done = pending.aggregator.add(partition_key, None, data)  # a record too large raises: nothing changed
        self._open.setdefault(shard_id, pending)
        out = []
        if done is not None:
            out.append(self._entry(shard_id, done.partition_key, done.data, pending.records[:done.user_records]))
            pending.records = pending.records[done.user_records:]
            del self._open[shard_id]  # its new aggregate starts now: the youngest
            pending.since = self._added
            self._open[shard_id] = pending
        pending.records.append((n, partition_key, key, data))
        return out

    def _close(self, shard_id: str) -> Entry:
        pending = self._open.pop(shard_id)
        done = pending.aggregator.flush()
        assert done is not None and done.user_records == len(pending.records)
        return self._entry(shard_id, done.partition_key, done.data, pending.records)

    @staticmethod
    def _entry(shard_id: str, partition_key: str, data: bytes, records: list[tuple[int, str, int, bytes]]) -> Entry:
        keys = [key for _, _, key, _ in records]
        assert records[0][1] == partition_key
        return Entry(partition_key, data, tuple(n for n, _, _, _ in records), aggregated=True,
                     explicit_hash_key=str(keys[0]), shard_id=shard_id, hash_span=(min(keys), max(keys)))


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
    return _ensure_writable(kinesis, stream, create_shards, timeout=timeout, sleep=sleep, clock=clock)[0]


def _ensure_writable(kinesis: Any, stream: str, create_shards: int | None, *, timeout: float = 60.0,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> tuple[bool, str]:
    """ensure_stream, and the writable status seen last (ACTIVE or UPDATING)."""
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
    return created, status


class _ShardRouting:
    """The stream's shard map while aggregating: listed (paged) when first needed, listed again when a put lands on
    another shard than its aggregate was built for, and once the stream leaves UPDATING when it was listed then."""

    def __init__(self, kinesis: Any, stream: str, status: str, report: ProduceReport,
                 sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
        self.kinesis, self.stream, self.report, self.sleep, self.clock = kinesis, stream, report, sleep, clock
        self.map: ShardMap | None = None
        self._status = status  # as seen just before the first listing
        self._updating = False  # listed while the stream was UPDATING (a reshard under way)
        self._checked = 0.0
        self._refreshed_at_call = -1

    def current(self) -> ShardMap:
        if self.map is None:
            self.refresh()
        assert self.map is not None
        return self.map

    def refresh(self) -> None:
        for _ in range(MAX_LISTINGS):
            shards = list_shards(self.kinesis, self.stream)
            self.report.shard_listings += 1
            status = self._status or _stream_status(self.kinesis, self.stream) or "ACTIVE"
            self._status = ""
            try:
                self.map = ShardMap.of(shards)
            except ValueError as exc:  # a listing taken mid-reshard: list again
                log.info("shard map of %s: %s; listing again", self.stream, exc)
                self.sleep(0.25)
                continue
            self._updating, self._checked = status == "UPDATING", self.clock()
            return
        raise KinesisUnavailable(f"the open shards of {self.stream!r} in {where(self.kinesis)} did not cover the hash "
                                 f"key space after {MAX_LISTINGS} listings")

    def check_reshard(self) -> None:
        """Listed during a reshard: list again once the stream is ACTIVE (at most every STATUS_CHECK_SECONDS)."""
        if not self._updating or self.clock() - self._checked < STATUS_CHECK_SECONDS:
            return
        self._checked = self.clock()
        if _stream_status(self.kinesis, self.stream) != "UPDATING":
            log.info("stream %s is no longer UPDATING: listing its shards again", self.stream)
            self.refresh()

    def landed(self, entry: Entry, shard_id: str) -> None:
        """An entry was put to `shard_id`: if that is not the shard it was built for, the map is stale."""
        if entry.shard_id is None or entry.shard_id == shard_id:
            return
        stale = self.map is None or self.map.range_of(shard_id) is None or self.map.range_of(entry.shard_id) is not None
        if stale and self._refreshed_at_call != self.report.put_calls:  # once a call at most
            self._refreshed_at_call = self.report.put_calls
            log.info("an aggregate built for %s landed on %s: the stream was resharded; listing its shards again",
                     entry.shard_id, shard_id)
            self.refresh()
        assert self.map is not None and entry.hash_span is not None
        self.report.misrouted_aggregates += 1
        landed_on = self.map.range_of(shard_id)
        if landed_on is None or not landed_on[0] <= entry.hash_span[0] <= entry.hash_span[1] <= landed_on[1]:
            self.report.off_shard_user_records += len(entry.ids)
            log.warning("an aggregate of %d user records built for %s landed on %s, outside whose hash key range some "
                        "of them are (a reshard raced the put): Java KCL drops that aggregate", len(entry.ids),
                        entry.shard_id, shard_id)


def _put(kinesis: Any, stream: str, batch: list[Entry], report: ProduceReport, rnd: random.Random,
         sleep: Callable[[float], None], routing: _ShardRouting | None = None) -> None:
    """One batch, re-sending refused entries until all are in or the attempts run out."""
    pending = batch
    for attempt in range(1, MAX_PUT_ATTEMPTS + 1):
        try:
            report.put_calls += 1
            resp = kinesis.put_records(StreamName=stream, Records=[e.request() for e in pending])
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
                if routing is not None:
                    routing.landed(entry, result["ShardId"])
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
             rnd: random.Random, routing: _ShardRouting | None, max_wait: int | None) -> Iterator[Entry]:
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
    assert routing is not None
    packing = ShardAggregation(routing.current(), aggregate, max_wait)
    for n in ids:
        if routing.current() is not packing.map:  # listed again after a reshard
            yield from packing.reroute(routing.current())
        pk, data = user(n)
        yield from packing.add(n, pk, data)
    yield from packing.flush()


def produce(kinesis_client: Any, stream: str, count: int, rate: float | None = None, aggregate: int = 1,
            payload: Callable[[int], bytes] | None = None, poison_every: int | None = None,
            create_shards: int | None = None, *, first_id: int = 0, seed: int | None = None,
            clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
            on_progress: Callable[[int], None] | None = None) -> ProduceReport:
    """Put `count` user records (ids first_id .. first_id+count-1) into `stream`.

    rate: user records per second (None: as fast as Kinesis takes them). aggregate: user records per
    KPL aggregate (1: plain records); every user record gets a random partition key, and an aggregate holds
    only records of one shard and is put there (see the module's docstring). payload(n) -> bytes (default: a
    small JSON document).
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
    report.created_stream, status = _ensure_writable(kinesis_client, stream, create_shards, sleep=sleep)
    routing = _ShardRouting(kinesis_client, stream, status, report, sleep, clock) if aggregate > 1 else None
    max_wait = None if rate is None else max(1, math.ceil(rate * MAX_BUFFERED_SECONDS))
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
    entries = _entries(ids, user_payload, aggregate, rnd, routing, max_wait)
    for batch in batches(entries, users_per_batch(rate)):
        wait = due_at(start, users_before, rate) - clock()
        if wait > 0:
            sleep(wait)
        _put(kinesis_client, stream, batch, report, rnd, sleep, routing)
        if routing is not None:
            routing.check_reshard()
        for entry in batch:
            report.ids.extend(entry.ids)
            users_before += len(entry.ids)
        if on_progress is not None:
            on_progress(users_before)
    report.seconds = round(clock() - start, 3)
    log.info("produced %d user records in %d Kinesis records to %s in %.1f s", report.user_records,
             report.kinesis_records, stream, report.seconds)
    return report
