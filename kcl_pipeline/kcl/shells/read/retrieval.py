"""How a lease worker retrieves its shard's records: polling (GetRecords) or enhanced fan-out (SubscribeToShard).

Both readers answer `poll()` with the same ReadBatch (deaggregated user records after the resume filter,
MillisBehindLatest, the shard's end and its children), so the worker, the processor and the checkpoints do not
depend on the retrieval (ConsumerConfig.retrieval).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from ...config import FANOUT, ConsumerConfig
from ...core.model import Checkpoint
from .fanout import FanOutReader
from .reader import ReadBatch, ReaderStats, ShardReader

if TYPE_CHECKING:
    from ...records.kpl import KplStats


class RecordReader(Protocol):
    """What the worker asks of a shard reader."""

    @property
    def stats(self) -> ReaderStats: ...

    def poll(self) -> ReadBatch: ...


def open_reader(config: ConsumerConfig, kinesis: Any, stream: str, shard_id: str, start: Checkpoint, *,
                kpl_stats: "KplStats | None", sleep: Callable[[float], None]) -> RecordReader:
    """The configured reader of one shard, from `start` (a checkpoint, or a starting position)."""
    if config.retrieval == FANOUT:
        # The stream consumer is the application's (fanout.consumer_name); an idle poll waits for an event
        # as long as a caught-up polling reader waits between GetRecords.
        return FanOutReader(kinesis, stream, shard_id, start, consumer=config.application, kpl_stats=kpl_stats,
                            sleep=sleep, event_wait=config.idle_interval_seconds)
    return ShardReader(kinesis, stream, shard_id, start, polling_interval=config.polling_interval_seconds,
                       idle_interval=config.idle_interval_seconds, max_records=config.max_records_per_call,
                       kpl_stats=kpl_stats, sleep=sleep, max_bytes_per_call=config.prefetch_bytes)


def close_reader(reader: RecordReader | None) -> None:
    """Release what a reader holds (a fan-out subscription's connection and thread; a polling reader, nothing)."""
    close = getattr(reader, "close", None)
    if close is not None:
        close()
