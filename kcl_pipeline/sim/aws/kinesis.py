"""A simulated Kinesis stream and the client the real `ShardReader` and `list_shards` call.

Shards receive records (some KPL aggregates of several user records under one sequence number, encoded
by the real aggregator), split and merge (the parent closes; new records go to the children), and a
closed shard disappears from ListShards once it is older than the retention. Sequence numbers are
decimal strings that grow in length as the stream ages, so numeric and lexicographic order differ. Reads
behave as Kinesis does: iterators (TRIM_HORIZON, LATEST, AT_/AFTER_SEQUENCE_NUMBER, AT_TIMESTAMP) that
expire after 300 s, a closed shard's last response without NextShardIterator and with ChildShards,
MillisBehindLatest, paginated ListShards, and a trimmed shard answering ResourceNotFoundException.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any, Callable

from botocore.exceptions import ClientError

from ...kcl.records.kpl import aggregate

HASH_SPACE = 1 << 128
ITERATOR_LIFETIME = 300.0
LIST_PAGE = 4  # small pages, so the paginated ListShards path is exercised
PAYLOAD_BYTES = 200  # a user record's size: holders' throughput reports (KB/s) sit well above the idle floor


def _error(code: str, message: str, operation: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0}}, operation)


@dataclass
class StreamRecord:
    sequence: str
    key: tuple[int, str]          # (length, sequence): numeric order of the decimal string
    arrival: float                # the service's clock when it was put (seconds)
    data: bytes
    partition_key: str
    positions: tuple[tuple[int, str, int], ...]  # the user records it holds: (len, sequence, sub)


@dataclass
class SimShard:
    shard_id: str
    parents: tuple[str, ...]
    lo: int
    hi: int
    created_at: float
    records: list[StreamRecord] = field(default_factory=list)
    keys: list[tuple[int, str]] = field(default_factory=list)  # records' keys, for bisect
    positions: list[tuple[int, str, int]] = field(default_factory=list)  # every user record, in order
    closed_at: float | None = None
    trimmed: bool = False

    def as_api(self) -> dict:
        item: dict[str, Any] = {
            "ShardId": self.shard_id,
            "HashKeyRange": {"StartingHashKey": str(self.lo), "EndingHashKey": str(self.hi)},
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
        }
        if self.parents:
            item["ParentShardId"] = self.parents[0]
        if len(self.parents) > 1:
            item["AdjacentParentShardId"] = self.parents[1]
        if self.closed_at is not None:
            # Real Kinesis gives the last sequence; kinesis-local 2^63-1. Neither is compared to records.
            item["SequenceNumberRange"]["EndingSequenceNumber"] = self.records[-1].sequence if self.records else "0"
        return item


class SimStream:
    """One stream, in the service's time (the world's true clock, `now()`)."""

    def __init__(self, name: str, rng: random.Random, initial_shards: int, now: Callable[[], float],
                 retention: float = 300.0, first_sequence: int = 9_900):
        self.name = name
        self.rng = rng
        self.now = now
        self.retention = retention
        self.shards: dict[str, SimShard] = {}
        self._next_id = 0
        self._sequence = first_sequence
        step = HASH_SPACE // initial_shards
        for i in range(initial_shards):
            hi = HASH_SPACE - 1 if i == initial_shards - 1 else (i + 1) * step - 1
            self._add((), i * step, hi)
        self.user_records = 0

    def _add(self, parents: tuple[str, ...], lo: int, hi: int) -> SimShard:
        shard = SimShard(f"shardId-{self._next_id:012d}", parents, lo, hi, self.now())
        self._next_id += 1
        self.shards[shard.shard_id] = shard
        return shard

    def open_shards(self) -> list[SimShard]:
        return [s for s in self.shards.values() if s.closed_at is None]

    def listed(self) -> list[SimShard]:
        return [s for s in self.shards.values() if not s.trimmed]

    # -- the producer ------------------------------------------------------------------------------------
    def put(self, shard: SimShard, users: int) -> None:
        """One Kinesis record on `shard`: a plain record, or a KPL aggregate of `users` user records."""
        self._sequence += self.rng.randint(1, 60)
        seq = str(self._sequence)
        key = (len(seq), seq)
        if users == 1:
            data, positions = f"r{seq}".encode().ljust(PAYLOAD_BYTES, b"."), ((len(seq), seq, 0),)
        else:
            data = aggregate([(f"pk{i}", None, f"r{seq}.{i}".encode().ljust(PAYLOAD_BYTES, b"."))
                              for i in range(users)])
            positions = tuple((len(seq), seq, i) for i in range(users))
        shard.records.append(StreamRecord(seq, key, self.now(), data, f"pk{seq}", positions))
        shard.keys.append(key)
        shard.positions.extend(positions)
        self.user_records += users

    def produce(self, rate: float, hot: int = 1) -> None:
        """One second of traffic: each open shard gets a record with probability `rate`; the shard holding
        the lowest hash keys (a hot partition key) gets `hot` such chances."""
        shards = sorted(self.open_shards(), key=lambda s: s.lo)
        for shard in shards:
            for _ in range(hot if shard is shards[0] else 1):
                if self.rng.random() < rate:
                    self.put(shard, 1 if self.rng.random() < 0.7 else self.rng.randint(2, 4))

    # -- resharding and retention --------------------------------------------------------------------------
    def reshard(self) -> str:
        now = self.now()
        open_shards = sorted(self.open_shards(), key=lambda s: s.lo)
        pairs = [(a, b) for a, b in pairwise(open_shards) if a.hi + 1 == b.lo]
        if pairs and (len(open_shards) > 3 or self.rng.random() < 0.4):
            a, b = self.rng.choice(pairs)
            a.closed_at = b.closed_at = now
            self._add((a.shard_id, b.shard_id), a.lo, b.hi)
            return "merge"
        parent = self.rng.choice(open_shards)
        parent.closed_at = now
        mid = (parent.lo + parent.hi) // 2
        self._add((parent.shard_id,), parent.lo, mid)
        self._add((parent.shard_id,), mid + 1, parent.hi)
        return "split"

    def trim(self) -> list[str]:
        """Closed shards older than the retention leave the stream (with their records)."""
        now, gone = self.now(), []
        for shard in self.shards.values():
            if not shard.trimmed and shard.closed_at is not None and now - shard.closed_at > self.retention:
                shard.trimmed = True
                gone.append(shard.shard_id)
        return gone


class SimKinesisClient:
    """What `list_shards` and `ShardReader` call: list_shards, get_shard_iterator, get_records (and the stream's
    summary, which a backfill reads for its retention)."""

    class _Meta:
        region_name = "us-east-1"
        endpoint_url = "http://kinesis.sim"

    meta = _Meta()

    def __init__(self, stream: SimStream, rng: random.Random, throttle: float = 0.0, short_reads: float = 0.0,
                 short_rng: random.Random | None = None):
        self.stream = stream
        self.rng = rng
        self.throttle = throttle
        # Short reads draw from a stream of their own: a world without them draws what it drew before.
        self.short_reads = short_reads
        self.short_rng = short_rng or random.Random(0)
        self.short_next = 0  # how many of the next GetRecords come back short (aimed: sim/actors/consumer.py)
        self.elapsed = 0.0

    def _shard(self, shard_id: str, operation: str) -> SimShard:
        shard = self.stream.shards.get(shard_id)
        if shard is None or shard.trimmed:
            raise _error("ResourceNotFoundException", f"Shard {shard_id} in stream {self.stream.name} not found",
                         operation)
        return shard

    def _latency(self) -> None:
        self.elapsed += 0.005 + 0.02 * self.rng.random()

    def describe_stream_summary(self, **request) -> dict:
        self._latency()
        return {"StreamDescriptionSummary": {"StreamName": self.stream.name, "StreamStatus": "ACTIVE",
                                             "RetentionPeriodHours": 24}}

    def list_shards(self, **request) -> dict:
        self._latency()
        if "NextToken" in request:
            start = int(request["NextToken"])
        else:
            if request.get("StreamName") != self.stream.name:
                raise _error("ResourceNotFoundException", f"Stream {request.get('StreamName')} not found", "ListShards")
            start = 0
        listed = self.stream.listed()
        page = listed[start:start + LIST_PAGE]
        response: dict[str, Any] = {"Shards": [s.as_api() for s in page]}
        if start + LIST_PAGE < len(listed):
            response["NextToken"] = str(start + LIST_PAGE)
        return response

    def get_shard_iterator(self, **request) -> dict:
        self._latency()
        shard = self._shard(request["ShardId"], "GetShardIterator")
        kind = request["ShardIteratorType"]
        if kind == "TRIM_HORIZON":
            index = 0
        elif kind == "LATEST":
            index = len(shard.records)
        elif kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            seq = request["StartingSequenceNumber"]
            key = (len(seq), seq)
            index = (bisect.bisect_left if kind == "AT_SEQUENCE_NUMBER" else bisect.bisect_right)(shard.keys, key)
        elif kind == "AT_TIMESTAMP":
            ts = request["Timestamp"]
            seconds = ts.timestamp() if isinstance(ts, datetime) else float(ts)
            index = next((i for i, r in enumerate(shard.records) if r.arrival >= seconds), len(shard.records))
        else:
            raise _error("InvalidArgumentException", f"bad ShardIteratorType {kind}", "GetShardIterator")
        if shard.closed_at is not None and index >= len(shard.records) and kind != "LATEST":
            pass  # Kinesis still gives an iterator; the first GetRecords ends the shard
        return {"ShardIterator": f"{shard.shard_id}|{index}|{self.stream.now()!r}"}

    def get_records(self, **request) -> dict:
        self._latency()
        shard_id, index_text, issued_text = request["ShardIterator"].split("|")
        shard = self._shard(shard_id, "GetRecords")
        now = self.stream.now()
        if now - float(issued_text) > ITERATOR_LIFETIME:
            raise _error("ExpiredIteratorException", "Iterator expired", "GetRecords")
        if self.throttle and self.rng.random() < self.throttle:
            raise _error("ProvisionedThroughputExceededException", "Rate exceeded for shard", "GetRecords")
        index = int(index_text)
        limit = request.get("Limit", 10000)
        if self.short_next or (self.short_reads and self.short_rng.random() < self.short_reads):
            self.short_next = max(0, self.short_next - 1)
            limit = self.short_rng.randint(0, limit)  # Kinesis may return fewer records than it holds, or none
        chunk = shard.records[index:index + limit]
        nxt = index + len(chunk)
        response: dict[str, Any] = {
            "Records": [{"SequenceNumber": r.sequence, "ApproximateArrivalTimestamp": r.arrival, "Data": r.data,
                         "PartitionKey": r.partition_key} for r in chunk],
            "MillisBehindLatest": _millis_behind(shard, nxt, bool(chunk), now),
            "ResponseMetadata": {"HTTPStatusCode": 200, "RetryAttempts": 0},
        }
        if shard.closed_at is not None and nxt >= len(shard.records):
            response["ChildShards"] = [
                {"ShardId": s.shard_id, "ParentShards": list(s.parents)}
                for s in self.stream.shards.values() if shard_id in s.parents]
        else:
            response["NextShardIterator"] = f"{shard_id}|{nxt}|{now!r}"
        return response


def _millis_behind(shard: SimShard, nxt: int, returned: bool, now: float) -> int:
    """How far the response is from the shard's tip: 0 once nothing is left past it. A short read that returned
    nothing with records left is behind by the next record's age, and never 0 (a reader takes 0 for caught up:
    the pipeline then closes windows on it)."""
    if nxt >= len(shard.records):
        return 0
    if returned:
        return int(max(0.0, now - shard.records[nxt - 1].arrival) * 1000)
    return max(1, int((now - shard.records[nxt].arrival) * 1000))


__all__ = ["SimKinesisClient", "SimShard", "SimStream", "StreamRecord"]
