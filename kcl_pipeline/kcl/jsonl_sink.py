"""The `jsonl:DIR` sink: one JSON line per user record in DIR/<lease key>.jsonl, checkpointed after fsync.

The lease key is the shard id for a single-stream application and `account:stream:creationEpoch:shardId`
for a multi-stream one (whose lines also carry `stream`, the stream identifier).

At-least-once: a record is checkpointed only once its line is on disk, so a crash re-delivers (never
loses) the records after the last checkpoint. Lines are synced every batch and the checkpoint rides on
the lease's next heartbeat (flushed at shutdown, shard end and lease loss): a checkpoint write per
GetRecords call would cost up to 5 DynamoDB writes per second per shard.
"""
from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import TextIO

from .core.streams import multi_stream_key
from .processor import Checkpointer, InitializationInput, ProcessRecordsInput, RecordProcessor


class JsonlSink(RecordProcessor):
    def __init__(self, directory: str):
        self.directory = Path(directory)
        self._file: TextIO | None = None
        self.shard_id = ""
        self.stream: str | None = None

    def initialize(self, init: InitializationInput) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_id = init.shard_id
        self.stream = init.stream
        name = init.shard_id if init.stream is None else multi_stream_key(init.stream, init.shard_id)
        self._file = open(self.directory / f"{name}.jsonl", "a", encoding="utf-8")

    def process_records(self, batch: ProcessRecordsInput) -> None:
        if not batch.records:
            return
        delivered_at_ms = round(time.time() * 1000)  # for lineage and latency, by this host's clock
        stream = {} if self.stream is None else {"stream": self.stream}
        lines = [json.dumps({
            **stream,
            "shard_id": r.shard_id,
            "sequence_number": r.sequence_number,
            "sub_sequence_number": r.sub_sequence_number,
            "partition_key": r.partition_key,
            "approximate_arrival_timestamp": r.approximate_arrival_timestamp_ms,
            "data_base64": base64.b64encode(r.data).decode("ascii"),
            "delivered_at_ms": delivered_at_ms,
        }, separators=(",", ":")) + "\n" for r in batch.records]
        self._opened().write("".join(lines))
        self._sync()
        batch.checkpointer.checkpoint_at_next_heartbeat()

    def _opened(self) -> TextIO:
        if self._file is None:
            raise RuntimeError(f"the JSONL sink of {self.shard_id or 'no shard'} is not open "
                               "(not initialized, or closed)")
        return self._file

    def _sync(self) -> None:
        file = self._opened()
        file.flush()
        os.fsync(file.fileno())

    def lease_lost(self) -> None:
        self._close()

    def shard_ended(self, checkpointer: Checkpointer) -> None:
        self._sync()
        checkpointer.end_shard()
        self._close()

    def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        # Every delivered line was synced in process_records; the worker flushes the pending checkpoint.
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
