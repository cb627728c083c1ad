"""A Kinesis client in memory for the backfill's fuzz tests: the calls `backfill_range` makes (DescribeStreamSummary,
ListShards, GetShardIterator, GetRecords) over fixed records, with responses cut into random pages."""
from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from datetime import datetime, timezone
from typing import Any

from kcl_pipeline.kcl.core.model import UserRecord


class FakeKinesis:
    """Plain (not aggregated) records per shard. Each GetRecords answers a random number of records (at most
    the Limit) and a random MillisBehindLatest (0 as often as not, as kinesis-local answers when caught up)."""

    def __init__(self, stream: str, records: dict[str, list[UserRecord]], rng: random.Random):
        self.stream = stream
        self.records = records
        self.rng = rng
        self.keys = {s: [r.position() for r in rs] for s, rs in records.items()}

    def describe_stream_summary(self, **request) -> dict[str, Any]:
        return {"StreamDescriptionSummary": {
            "StreamName": self.stream, "StreamStatus": "ACTIVE", "RetentionPeriodHours": 24,
            "StreamARN": f"arn:aws:kinesis:us-east-1:123456789012:stream/{self.stream}",
            "StreamCreationTimestamp": datetime(2026, 1, 1, tzinfo=timezone.utc)}}

    def list_shards(self, **request) -> dict[str, Any]:
        return {"Shards": [{"ShardId": s, "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
                            "SequenceNumberRange": {"StartingSequenceNumber": "0"}} for s in sorted(self.records)]}

    def get_shard_iterator(self, **request) -> dict[str, Any]:
        shard, kind = request["ShardId"], request["ShardIteratorType"]
        records = self.records[shard]
        if kind == "TRIM_HORIZON":
            index = 0
        elif kind == "AT_TIMESTAMP":
            ts = request["Timestamp"]
            ms = round(ts.timestamp() * 1000) if isinstance(ts, datetime) else round(float(ts) * 1000)
            index = next((i for i, r in enumerate(records) if r.approximate_arrival_timestamp_ms >= ms), len(records))
        elif kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            seq = request["StartingSequenceNumber"]
            position = (len(seq), seq, 0)
            index = (bisect_left if kind == "AT_SEQUENCE_NUMBER" else bisect_right)(
                [(len(r.sequence_number), r.sequence_number, 0) for r in records], position)
        else:
            raise ValueError(f"fake Kinesis: no {kind} iterators")
        return {"ShardIterator": f"{shard}|{index}"}

    def get_records(self, **request) -> dict[str, Any]:
        shard, index_text = request["ShardIterator"].rsplit("|", 1)
        index = int(index_text)
        records = self.records[shard]
        count = min(request.get("Limit", 10_000), self.rng.randint(1, 4))
        page = records[index:index + count]
        nxt = index + len(page)
        return {
            "Records": [{"SequenceNumber": r.sequence_number, "Data": r.data, "PartitionKey": r.partition_key,
                         "ApproximateArrivalTimestamp": datetime.fromtimestamp(
                             r.approximate_arrival_timestamp_ms / 1000, tz=timezone.utc)} for r in page],
            "NextShardIterator": f"{shard}|{nxt}",
            "MillisBehindLatest": 0 if nxt >= len(records) or self.rng.random() < 0.5 else 1000,
            "ResponseMetadata": {"HTTPStatusCode": 200, "RetryAttempts": 0},
        }


class Ticking:
    """A monotonic clock that moves ten seconds at every look: paced readers never sleep."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now
