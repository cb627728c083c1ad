"""The landing zone in the simulation: a put-if-absent object store and a record processor that lands into it.

These are the simulation's stand-ins, named apart from what they stand in for: `SimZoneStore` for the zone
(landing/store.py's `ZoneStore`), `SimLandingProcessor` for the landing sink (landing/sink.py's
`LandingProcessor`), `SimPipeline` for the pipeline's checkpoint commit (the `kinesis_checkpoints` asset).

The processor does what the landing sink does, on the same rules and with the same pure exclusion
(`kcl_pipeline.landing.exclusion.exclude_landed`): buffer delivered records, and at a flush list the
shard's landed batches, drop what they already hold, and write each remaining run under its deterministic
key (shard, first, last) with put-if-absent. It resumes after the last landed record, checkpoints what it
landed on the next heartbeat, ends the shard itself once its last record is landed (the standalone mode),
and drops its buffer when the lease is lost. No Parquet: a batch is the list of positions it holds.

The store counts, per user record, how many stored batches hold it: the ground truth for "landed exactly
once".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..kcl.core.model import Checkpoint
from ..landing import exclusion
from ..landing.layout import BatchKey


@dataclass(frozen=True)
class StoredBatch:
    key: BatchKey
    prev: Checkpoint | None
    positions: tuple[tuple[int, str, int], ...]


class SimZoneStore:
    """The zone: batches by key, listed per shard; a put succeeds only if the key is new."""

    def __init__(self, stream: str):
        self.stream = stream
        self.objects: dict[str, StoredBatch] = {}
        self.by_shard: dict[str, list[BatchKey]] = {}
        self.landed: dict[tuple[str, tuple[int, str, int]], int] = {}  # (shard, position) -> copies
        self.puts = 0
        self.put_conflicts = 0
        self.on_land = None  # world hook: (shard, positions) after a successful put

    def list(self, shard_id: str) -> list[BatchKey]:
        return list(self.by_shard.get(shard_id, ()))

    def put_if_absent(self, batch: StoredBatch) -> bool:
        name = batch.key.key()
        self.puts += 1
        if name in self.objects:
            self.put_conflicts += 1
            return False
        self.objects[name] = batch
        self.by_shard.setdefault(batch.key.shard_id, []).append(batch.key)
        shard = batch.key.shard_id
        for position in batch.positions:
            self.landed[(shard, position)] = self.landed.get((shard, position), 0) + 1
        if self.on_land is not None:
            self.on_land(shard, batch.positions)
        return True

    def last_landed(self, shard_id: str) -> Checkpoint | None:
        keys = self.by_shard.get(shard_id)
        if not keys:
            return None
        return max(keys, key=lambda k: k.last.key()).last


class SimLandingProcessor:
    """A RecordProcessor landing one shard into a SimZoneStore (see the module docstring)."""

    def __init__(self, store: SimZoneStore, flush_records: int = 6, pipeline_commits: bool = False):
        self.store = store
        self.flush_records = flush_records
        # The Dagster pipeline's mode: checkpoints and SHARD_END are committed by the pipeline (ownerless,
        # after the window materialised), never by the worker, which idles at the shard's end until then.
        self.pipeline_commits = pipeline_commits
        self.shard_id = ""
        self.buffer: list = []
        self.prev: Checkpoint | None = None      # the record delivered just before the buffer's first
        self.resume: Checkpoint | None = None
        self.landed: Checkpoint | None = None
        self.closed = False
        self.checkpointer = None

    # -- RecordProcessor ---------------------------------------------------------------------------------
    def initialize(self, init) -> None:
        self.shard_id = init.shard_id
        start = init.checkpoint
        if start.is_shard_end:
            return
        last = self.store.last_landed(self.shard_id)
        if last is not None and (start.is_starting_sentinel or last.key() > start.key()):
            self.resume = last
        elif not start.is_starting_sentinel:
            self.resume = start
        self.prev = self.resume
        self.landed = last

    def resume_position(self) -> Checkpoint | None:
        return self.resume

    def process_records(self, batch) -> None:
        if self.closed:
            return
        self.checkpointer = batch.checkpointer
        self.buffer.extend(batch.records)
        # Full, or caught up (an empty poll): the sink flushes on size, and on age once the minute is over.
        if len(self.buffer) >= self.flush_records or not batch.records:
            self.flush()

    def shard_ended(self, checkpointer) -> None:
        self.checkpointer = checkpointer
        self.flush()
        if not self.pipeline_commits:
            checkpointer.end_shard()

    def shutdown_requested(self, checkpointer) -> None:
        self.checkpointer = checkpointer
        self.flush()
        self.closed = True

    def lease_lost(self) -> None:
        self.buffer = []  # the next owner re-reads them: nothing past the landed records was checkpointed
        self.closed = True

    def heartbeat_attributes(self) -> Mapping[str, Any]:
        # Progress rides on heartbeats, as the landing sink's does.
        return {"simLanded": str(self.landed)} if self.landed is not None else {}

    # -- landing -----------------------------------------------------------------------------------------
    def flush(self) -> None:
        records, self.buffer = self.buffer, []
        if not records:
            return
        cut = exclusion.exclude_landed(records, self.prev, self.store.list(self.shard_id))
        for run in cut.runs:
            first, last = run.records[0], run.records[-1]
            key = BatchKey(self.store.stream, self.shard_id, 0, first.checkpoint, last.checkpoint)
            self.store.put_if_absent(StoredBatch(key, run.prev, tuple(r.position() for r in run.records)))
        self.prev = records[-1].checkpoint
        self.landed = records[-1].checkpoint
        if self.checkpointer is not None and not self.pipeline_commits:
            self.checkpointer.checkpoint_at_next_heartbeat(records[-1].sequence_number,
                                                           records[-1].sub_sequence_number)


class SimPipeline:
    """The pipeline's checkpoint commit (the `kinesis_checkpoints` asset): every `period` seconds, an
    ownerless forward-only checkpoint at each shard's last landed record, and SHARD_END once a closed
    shard's every record has landed. It owns no lease and never touches a counter."""

    def __init__(self, store: SimZoneStore, table, stream) -> None:
        self.store = store
        self.table = table    # a LeaseTable
        self.stream = stream  # the simulated stream (which shards are closed, and their records)

    def commit(self) -> None:
        for shard_id, shard in self.stream.shards.items():
            if shard.trimmed:
                continue
            lease = self.table.get(shard_id)
            if lease is None or lease.is_ended:
                continue
            last = self.store.last_landed(shard_id)
            if shard.closed_at is not None and all((shard_id, p) in self.store.landed for p in shard.positions):
                self.table.end(shard_id)
            elif last is not None and (lease.checkpoint.is_starting_sentinel or last.key() > lease.checkpoint.key()):
                self.table.checkpoint(shard_id, last)


__all__ = ["SimLandingProcessor", "SimPipeline", "SimZoneStore", "StoredBatch"]
