"""Landing batches for transform tests, written with pyarrow under layout.BatchKey keys (the landing schema)."""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.layout import BatchKey, minute_of

T0 = 1_714_564_800_000  # 2024-05-01T12:00:00Z
MINUTE = 60_000
SHARD0 = "shardId-000000000000"
SHARD1 = "shardId-000000000001"


def seq(i: int) -> str:
    """A 56-digit sequence number (AWS-like; far beyond decimal(38))."""
    return f"4959{i:052d}"


@dataclass(frozen=True)
class Rec:
    shard_id: str
    sequence_number: str
    data: bytes
    arrival_ms: int
    sub_sequence_number: int = 0
    partition_key: str = "pk"


def batch_table(stream: str, records: list[Rec]) -> pa.Table:
    return pa.table({
        "stream": pa.array([stream] * len(records), pa.string()),
        "shard_id": [r.shard_id for r in records],
        "sequence_number": [r.sequence_number for r in records],
        "sub_sequence_number": pa.array([r.sub_sequence_number for r in records], pa.int64()),
        "partition_key": [r.partition_key for r in records],
        "explicit_hash_key": pa.array([None] * len(records), pa.string()),
        "approximate_arrival_timestamp": pa.array([r.arrival_ms for r in records], pa.timestamp("ms", tz="UTC")),
        "data": pa.array([r.data for r in records], pa.binary()),
    })


def batch_key(stream: str, records: list[Rec]) -> str:
    first, last = records[0], records[-1]
    return BatchKey(stream, first.shard_id, minute_of(first.arrival_ms),
                    Checkpoint(first.sequence_number, first.sub_sequence_number),
                    Checkpoint(last.sequence_number, last.sub_sequence_number)).key()


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def write_local(root: Path, stream: str, records: list[Rec]) -> str:
    key = batch_key(stream, records)
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(parquet_bytes(batch_table(stream, records)))
    return key


def write_s3(s3_client, bucket: str, prefix: str, stream: str, records: list[Rec]) -> str:
    key = batch_key(stream, records)
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{key}" if prefix else key,
                         Body=parquet_bytes(batch_table(stream, records)))
    return key
