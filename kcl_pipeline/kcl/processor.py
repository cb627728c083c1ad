"""The record-processor API users implement, in the spirit of the Java KCL's ShardRecordProcessor.

One processor instance lives in one worker process and sees one lease (shard). The worker calls
`initialize` once, `process_records` after every GetRecords call — with the deaggregated user records in
shard order after the (sequence, sub-sequence) filter, and also when there were none, so a processor
learns that its shard is idle or caught up (millis_behind_latest) — then exactly one of `lease_lost`, `shard_ended` or
`shutdown_requested`. Checkpointing is the processor's choice: it calls the checkpointer it is given.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .core.model import Checkpoint, UserRecord


class Checkpointer(Protocol):
    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> bool:
        """Advance the lease checkpoint; no argument = the last record delivered. False if it did not advance."""

    def checkpoint_at_next_heartbeat(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> None:
        """Checkpoint on the lease's next heartbeat write (no extra DynamoDB write). Flushed at shutdown,
        shard end and lease loss; use it for routine progress, `checkpoint` when it must be durable now."""

    def end_shard(self) -> None:
        """Write SHARD_END (only valid from `shard_ended`, once every record is processed)."""


@dataclass(frozen=True)
class InitializationInput:
    shard_id: str
    worker_id: str
    checkpoint: Checkpoint
    child_shard_ids: tuple[str, ...] = ()
    # The lease item's other attributes (e.g. the previous owner's landing progress), read at acquire.
    lease_attributes: Mapping[str, Any] = field(default_factory=dict)
    # A multi-stream application's stream identifier (`account:name:creationEpoch`); None: single-stream.
    stream: str | None = None


@dataclass(frozen=True)
class ProcessRecordsInput:
    records: Sequence[UserRecord]
    millis_behind_latest: int | None
    checkpointer: Checkpointer
    # The service's clock when it answered this poll (HTTP Date, epoch millis); None when unknown.
    service_time_ms: int | None = None


@runtime_checkable
class RecordProcessor(Protocol):
    """Every hook the worker calls. The first five a processor implements; `resume_position` and
    `heartbeat_attributes` are optional: a processor that subclasses RecordProcessor inherits their defaults
    (nothing landed elsewhere, no progress attributes), one that does not must define them too (the worker
    checks this when it builds a processor: `ProcessorSpec.build`)."""

    def initialize(self, init: InitializationInput) -> None: ...

    def process_records(self, batch: ProcessRecordsInput) -> None: ...

    def lease_lost(self) -> None:
        """The lease is gone (heartbeat failed or taken): stop at once; checkpointing is still allowed."""

    def shard_ended(self, checkpointer: Checkpointer) -> None:
        """Every record of the shard was delivered: finish, then call checkpointer.end_shard()."""

    def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        """Graceful stop (SIGTERM/SIGINT): flush and checkpoint what was processed."""

    def resume_position(self) -> Checkpoint | None:
        """The last record the processor already has (say, landed), when reading should start after it rather
        than after the lease checkpoint; called once, after `initialize`. None: after the checkpoint."""
        return None

    def heartbeat_attributes(self) -> Mapping[str, Any] | None:
        """Progress attributes written on every heartbeat's UpdateItem (progress rides on the heartbeat: no
        extra writes); called before each. Names must not collide with the Java KCL lease attributes. None
        or empty: a plain heartbeat."""
        return None
