"""The landing sink: a record processor that lands a lease's records exactly once as Parquet batches.

Exactly once, however often workers crash, restart or hand a lease over:

* Deterministic keys (layout.py): a batch is named by its shard, arrival minute and first/last position.
  The sink flushes at every arrival-minute change, so a batch never spans two minutes.
* Before every flush it lists the shard's keys of the batch's minute and drops the buffered records an
  existing batch already holds (the sequence-range exclusion, exclusion.py); what is left is
  written with a conditional put (`If-None-Match: *` / hard link), so an object is never replaced and a
  partly written one is never visible.
* On initialize it finds the last LANDED record (not only the lease checkpoint, which the pipeline
  commits only after the transform: docs/windows.md) and `resume_position()` tells the worker to read after it.
* It never checkpoints (the `kinesis_checkpoints` asset does, for materialised windows), except in
  standalone mode (`checkpoint_after_flush=True`, `kcl-pipeline consume --landing` without Dagster),
  where it checkpoints after each flush (on the next heartbeat write) and ends the shard itself.

Finding the last landed record cheaply. The key scheme puts the minute above the shard
(`<stream>/dt/hh/mm/<shard>/…`), so one shard's batches cannot be listed in one call; the sink lists
`<minute>/<shard>/` one minute at a time, forward, from the minute of the last landed record its
lease says (the previous owner's progress, which rides on its heartbeats: at most a heartbeat behind),
or, with no such hint, from `resume_lookback_minutes` ago. It stops at the current minute, or after
`RESUME_EMPTY_MINUTES` empty minutes once it found batches. Stopping early can only UNDER-estimate
the resume point, which is safe: the re-read records are dropped by the exclusion at flush time.
(Over-estimating would lose records, and cannot happen: every record before a landed batch is
landed, because batches are written in shard order from a point at or before the last landed record.)
A typical hand-over costs 1-5 small LIST calls.

Progress (progress.py) is published through `heartbeat_attributes()`, which the worker calls from its
heartbeat thread: the sink only ever swaps an immutable ShardProgress there, each one true as a whole.
With it goes the arrival of the first record it holds but has not landed, when that record follows the last
landed one (`_publish_next`): a window closes as soon as a record after it has been read, not when that
record's batch lands (at the next minute's end, or when the buffer is old enough). The caught-up fact
(polled_at, millis_behind_latest) is published only for polls all of whose records are landed; the
worker should call `process_records` for empty polls too (or `tick()`), so idle shards report polls
and old buffers flush on age.
"""
from __future__ import annotations

import logging
import time
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from itertools import accumulate
from operator import add
from typing import Any, Callable, Mapping, Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.model import AT_TIMESTAMP, Checkpoint, UserRecord
from ..kcl.core.streams import STREAM_ARN_RE, stream_name
from ..kcl.processor import Checkpointer, InitializationInput, ProcessRecordsInput, RecordProcessor
from ..kcl.records.record_batch import UserRecordBatch
from .batch import BATCH_FORMATS, COMPRESSIONS, PARQUET_FORMAT, BatchInfo, encode_batch, read_batch_info
from .errors import (
    ChainStartTaken,
    CorruptBatchError,
    ForeignStreamError,
    LandingConfigError,
    LandingError,
    StartEndedEmpty,
)
from .exclusion import exclude_landed
from .layout import (
    MINUTE_MS,
    START_DIR,
    BatchKey,
    ended_empty_body,
    ends_empty,
    foreign_stream,
    landing_directory,
    link_body,
    link_key,
    link_target,
    minute_of,
    minute_prefix,
    parse_batch_key,
    parse_link_key,
    split_landed_keys,
    stream_directory,
)
from .migration import marker_key
from .progress import ShardProgress, merge_progress
from .store import ZoneStore, open_store

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# 1 MB/s per shard (Kinesis' write limit): a batch every ~8 s at full speed, at least one per 30 s.
DEFAULT_MAX_BATCH_BYTES = 8 * MiB
DEFAULT_MAX_BATCH_AGE_SECONDS = 30.0
DEFAULT_MAX_BATCH_RECORDS = 100_000
DEFAULT_MEMORY_LIMIT_BYTES = 64 * MiB
# Buffered records, their Arrow copy and the encoded object coexist during a flush.
MEMORY_FACTOR = 3
RECORD_OVERHEAD_BYTES = 48  # per-record estimate beyond data, partition key and sequence number
RESUME_LOOKBACK_MINUTES = 15
RESUME_EMPTY_MINUTES = 3


@dataclass(frozen=True)
class LandingSettings:
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_batch_age_seconds: float = DEFAULT_MAX_BATCH_AGE_SECONDS
    max_batch_records: int = DEFAULT_MAX_BATCH_RECORDS
    compression: str = "zstd"
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES
    checkpoint_after_flush: bool = False
    create_zone: bool = False
    resume_lookback_minutes: int = RESUME_LOOKBACK_MINUTES
    batch_format: str = PARQUET_FORMAT  # the landing codec (batch.py): "rows" is the simulation's cheap one

    def __post_init__(self) -> None:
        if self.max_batch_bytes < 1024:
            raise LandingConfigError(f"max_batch_bytes must be >= 1024, got {self.max_batch_bytes}")
        if not 0 < self.max_batch_age_seconds < float("inf"):  # nan fails both comparisons
            raise LandingConfigError(f"max_batch_age_seconds must be a finite number > 0, got "
                                     f"{self.max_batch_age_seconds}")
        if self.max_batch_records < 1:
            raise LandingConfigError(f"max_batch_records must be >= 1, got {self.max_batch_records}")
        if self.compression not in COMPRESSIONS:
            raise LandingConfigError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        if MEMORY_FACTOR * self.max_batch_bytes > self.memory_limit_bytes:
            raise LandingConfigError(
                f"max_batch_bytes {self.max_batch_bytes} needs about {MEMORY_FACTOR}x its size while flushing "
                f"({MEMORY_FACTOR * self.max_batch_bytes} bytes), more than memory_limit_bytes "
                f"{self.memory_limit_bytes}: lower max_batch_bytes or raise the limit")
        if self.batch_format not in BATCH_FORMATS:
            raise LandingConfigError(f"batch_format must be one of {', '.join(BATCH_FORMATS)}, "
                                     f"got {self.batch_format!r}")
        if self.resume_lookback_minutes < 0:
            raise LandingConfigError(f"resume_lookback_minutes must be >= 0, got {self.resume_lookback_minutes}")


@dataclass
class LandingStats:
    batches_written: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    records_already_landed: int = 0  # dropped by the exclusion (re-delivered after a restart/hand-over)
    batches_already_landed: int = 0  # conditional put found the object there
    links_lost: int = 0  # another writer had claimed the batch after the same position
    links_joined: int = 0  # links claimed for batches another chain wrote (LandingProcessor._join)
    flushes: dict[str, int] = field(default_factory=dict)  # by reason


class LandingProcessor(RecordProcessor):
    """A RecordProcessor landing one shard's records under the zone. Build it with plain, picklable arguments
    (it opens the store in `initialize`), so a ProcessorSpec can create it in a worker process."""

    def __init__(self, zone: str | ZoneStore, stream: str, *,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 max_batch_age_seconds: float = DEFAULT_MAX_BATCH_AGE_SECONDS,
                 max_batch_records: int = DEFAULT_MAX_BATCH_RECORDS,
                 compression: str = "zstd",
                 memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
                 checkpoint_after_flush: bool = False,
                 create_zone: bool = False,
                 resume_lookback_minutes: int = RESUME_LOOKBACK_MINUTES,
                 batch_format: str = PARQUET_FORMAT,
                 aws: AwsSettings | None = None,
                 progress_hint: ShardProgress | None = None,
                 stream_arn: str | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        if stream and STREAM_ARN_RE.fullmatch(stream):  # named by its ARN: lands in its identity directory
            stream_arn = stream_arn or stream
        stream = landing_directory(stream) if stream else stream
        if not stream or "/" in stream:
            raise LandingConfigError(f"stream {stream!r} must be a non-empty name without '/'")
        if stream_arn is not None and not STREAM_ARN_RE.fullmatch(stream_arn):
            raise LandingConfigError(f"stream_arn {stream_arn!r} is not a Kinesis stream ARN "
                                     f"(arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
        self.settings = LandingSettings(max_batch_bytes, max_batch_age_seconds, max_batch_records, compression,
                                        memory_limit_bytes, checkpoint_after_flush, create_zone,
                                        resume_lookback_minutes, batch_format)
        self._zone = zone
        self.stream = stream
        self.stream_arn = stream_arn  # recorded in every batch's footer; another stream's batches are refused
        self._aws = aws
        self._hint = progress_hint
        self._clock = clock
        self._monotonic = monotonic
        self.store: ZoneStore | None = zone if isinstance(zone, ZoneStore) else None
        self.shard_id = ""
        self.stats = LandingStats()
        self._progress: ShardProgress | None = None
        self._resume: Checkpoint | None = None
        self._skip_key: tuple | None = None  # records at or below it were landed before: dropped
        self._start_prev: Checkpoint | None = None
        self._tail: tuple[Checkpoint, str] | None = None  # the last landed batch we know: (its last, its key)
        self._adopt: BatchKey | None = None  # the start link's batch, claimed by a holder that never wrote it
        self._holder = ""  # named in the start links this holder claims (who claimed a chain's start)
        self._last_delivered: UserRecord | None = None
        # The buffer: columnar slices of the delivered batches (never one Python object per record).
        self._segments: list[UserRecordBatch] = []
        self._buffer_count = 0
        self._buffer_bytes = 0
        self._buffer_minute = 0
        self._buffer_prev: Checkpoint | None = None
        self._buffer_started = 0.0
        self._last_poll: tuple[int, int | None] | None = None
        self._checkpointer: Checkpointer | None = None
        self._validated: set[str] = set()
        self._closed = False

    # -- RecordProcessor ------------------------------------------------------------------------------

    def initialize(self, init: InitializationInput) -> None:
        self.shard_id = init.shard_id
        self._holder = init.worker_id
        if init.stream is not None:  # a multi-stream application: one directory per stream incarnation
            self.stream = stream_directory(init.stream)
            self.stream_arn = None  # one spec serves every stream: the incarnation's directory is its identity
        if self.store is None:  # built with a URI: this (worker) process opens its own store
            zone = self._zone
            self.store = zone if isinstance(zone, ZoneStore) else open_store(zone, self._aws)
        self.store.ensure_zone(create=self.settings.create_zone)
        start = init.checkpoint
        self._start_prev = None if start.is_shard_end else start
        self._progress = ShardProgress(self.shard_id)
        if start.is_shard_end:
            return  # the worker only waits for children; nothing will be delivered
        hint = self._hint or ShardProgress.from_attributes(
            self.shard_id, getattr(init, "lease_attributes", None) or {})
        if start.is_starting_sentinel:
            # Follow this start's own chain, never "any batch of the last minutes" (a backfill's batches there
            # would make the consumer skip everything older). A hint whose batch the zone no longer holds (lost)
            # is no hint: the chain is followed from its start link, whose batch, if it is the lost one, this
            # holder lands again (taken for a hint, it sends every holder back for ever: the lookback finds
            # nothing, LATEST on a closed shard reads nothing, and the start link naming the lost batch at the
            # shard's end makes it give the lease back).
            hinted = self._find_hinted(hint)
            found = (hinted, self._validate(hinted)) if hinted is not None else self._follow_chain(start)
        else:
            found = self._find_last_landed(hint)
        if found is not None:
            key, info = found
            landed = ShardProgress(self.shard_id, key.last, info.last_arrival_ms, last_batch_key=key.key())
            self._tail = (key.last, key.key())
            if hint is not None and hint.landed is not None and hint.landed.key() <= key.last.key():
                landed = merge_progress(landed, hint)  # the previous owner's poll facts still hold
            self._progress = landed
            if start.is_starting_sentinel or key.last.key() > start.key():
                self._resume = key.last
                self._start_prev = key.last
        if self._adopt is not None:
            # Read from the claimed batch's minute (AT_TIMESTAMP: the reader delivers from there); the records
            # before its first are dropped, and its first follows the starting position, like the claimer's.
            self._resume = Checkpoint(AT_TIMESTAMP, self._adopt.minute_ms)
            log.info("%s: the start link after %s names %s, never written (its claimer died): landing it",
                     self.shard_id, start, self._adopt.key())
        if self._resume is None and not start.is_starting_sentinel:
            self._resume = start
        self._skip_key = self._resume.key() if self._resume is not None and not self._resume.is_sentinel else None
        log.info("%s: landing into %s; lease checkpoint %s, last landed %s -> resume after %s",
                 self.shard_id, self.store.uri, start, found[0].last if found else None, self._resume)

    def resume_position(self) -> Checkpoint | None:
        """Where the reader should start (after): the later of the lease checkpoint and the last landed record
        (or AT_TIMESTAMP, from where a batch claimed after the start and never written can be read again)."""
        return self._resume

    def process_records(self, batch: ProcessRecordsInput) -> None:
        if self._closed:
            return
        self._checkpointer = batch.checkpointer
        records = batch.records
        if records:
            self._check_records(records)
            self._buffer_records(records)
        # "Caught up at t" completes windows ending before t - grace: t is the service's clock (the
        # GetRecords response's Date, whole seconds: never late), so a host clock running fast completes
        # nothing early. The host clock stands in only when the response had no Date.
        polled_at = batch.service_time_ms if batch.service_time_ms is not None else int(self._clock() * 1000)
        self._last_poll = (polled_at, batch.millis_behind_latest)
        self._flush_if_due()
        if not self._buffer_count:
            self._settle_poll()
        self._publish_next()

    def tick(self) -> None:
        """Flush a buffer that is old enough (for workers that do not deliver empty polls)."""
        if not self._closed:
            self._flush_if_due()
            if not self._buffer_count:
                self._settle_poll()
            self._publish_next()

    def flush(self) -> None:
        if self._buffer_count and not self._closed:
            self._flush("requested")
            self._settle_poll()

    def shard_ended(self, checkpointer: Checkpointer) -> None:
        self._checkpointer = checkpointer
        if self._buffer_count:
            self._flush("shard_end")
        self._settle_poll()
        self._fence_empty_start()
        self._progress = replace(self._initialised_progress(), shard_end_landed=True)
        log.info("%s: shard end landed (last record %s)", self.shard_id, self._progress.landed)
        if self.settings.checkpoint_after_flush:
            checkpointer.end_shard()  # standalone: nothing downstream decides when a shard is done

    def _fence_empty_start(self) -> None:
        """At the shard's end, having landed nothing from a starting position: claim the start link for "the shard
        ended with nothing landed after this start" (`layout.ENDED_EMPTY`), so that no holder begins the chain
        after the shard's end is reported landed.

        This holder found no start link naming a batch when it started, and read nothing it could land (LATEST on
        a shard that closed meanwhile). A holder before it may still be on its way to the start link — a paused
        first flush going on after the lease moved — with records this holder never read. A look at the link here
        can come before such a claim; the put-if-absent is the fence: after it, that holder's claim
        fails, finds the marker and lands nothing (`_land_after`). If another holder claimed the start first,
        naming a batch, the shard's end is not landed: the lease is given back, and its next start follows that
        chain, or lands the claimed batch (`_follow_chain`). A marker already there (another holder
        ended the shard so before, or this one's retry) is the same end. One PUT, at such a shard end only."""
        start = self._start_prev
        if start is None or not start.is_starting_sentinel or self._initialised_progress().landed is not None:
            return
        store = self._zone_store()
        link = link_key(self.stream, 0, self.shard_id, start)
        if store.put_if_absent(link, ended_empty_body(self._holder)):
            log.info("%s: the shard ended with nothing landed after %s: start link %s claimed for that",
                     self.shard_id, start, link)
            return
        text = self._link_text(link)
        if ends_empty(text):
            return  # ended so before: another holder, or a retry of this one
        if text is None:
            raise ChainStartTaken(f"landing zone {store.uri}: the start link {link} was there and is gone (moved "
                                  f"away?); the shard's end is claimed again on the lease's next start")
        raise ChainStartTaken(
            f"landing zone {store.uri}: the shard ended with nothing landed after {start}, but the start link "
            f"{link} names {self._batch_named(link, text).key()} (another holder's start, claimed meanwhile); "
            f"re-reading from that chain on the lease's next start")

    def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        self._checkpointer = checkpointer
        if self._buffer_count:
            self._flush("shutdown")
        self._settle_poll()
        self._closed = True

    def lease_lost(self) -> None:
        # Nothing was checkpointed past what landed: the next owner re-reads the buffered records.
        dropped = self._buffer_count
        self._set_buffer(None)
        self._publish_next()
        self._closed = True
        log.info("%s: lease lost; %d buffered records dropped (the next owner re-reads them)", self.shard_id, dropped)

    def heartbeat_attributes(self) -> Mapping[str, Any]:
        progress = self._progress  # one read of an immutable snapshot: safe from the heartbeat thread
        return progress.to_attributes() if progress is not None else {}

    @property
    def progress(self) -> ShardProgress | None:
        return self._progress

    def _initialised_progress(self) -> ShardProgress:
        """The shard's progress, which `initialize` starts: records, flushes and ends come after it."""
        if self._progress is None:
            raise LandingError(f"landing processor of {self.shard_id or 'no shard'}: not initialised")
        return self._progress

    def _zone_store(self) -> ZoneStore:
        """The landing zone's store: given, or opened by `initialize`."""
        if self.store is None:
            raise LandingError(f"landing processor of {self.shard_id or 'no shard'}: not initialised (no store)")
        return self.store

    # -- buffering --------------------------------------------------------------------------------------

    def _check_records(self, records) -> None:
        first = records[0]
        if first.shard_id != self.shard_id:
            raise ValueError(f"landing processor of {self.shard_id} got a record of {first.shard_id}")

    def _buffer_records(self, records) -> None:
        if not isinstance(records, UserRecordBatch):  # a list of UserRecords (tests, other readers)
            records = UserRecordBatch.from_records(self.shard_id, records)
        rest: UserRecordBatch | None = records
        while rest is not None:
            rest = self._buffer_poll(rest)

    def _buffer_poll(self, records: UserRecordBatch) -> UserRecordBatch | None:
        """Buffer (and flush) a delivered poll; returns the records still to buffer when a flush learned that
        another writer landed beyond some of them (they are then taken like a new poll)."""
        if self._adopt is not None:
            records = self._adopt_start(records, self._adopt)
        if self._skip_key is not None or (
                self._last_delivered is not None and records[0].position() <= self._last_delivered.position()):
            records = self._drop_landed(records)
        if not len(records):
            return None
        s = self.settings
        cum, per = _cumulative_sizes(records)
        # Cut where the arrival minute changes (only at a Kinesis record's boundary), where the byte budget
        # runs out and at the record limit; each piece is a columnar slice.
        pieces: list[list] = []  # [start, stop, minute]
        start = 0
        for ms, length in zip(records.run_arrival_ms, records.run_lengths, strict=True):
            minute = ms - ms % MINUTE_MS
            if pieces and pieces[-1][2] == minute:
                pieces[-1][1] += length
            else:
                pieces.append([start, start + length, minute])
            start += length
        for begin, stop, minute in pieces:
            pos = begin
            while pos < stop:
                if self._overtaken(records, pos):
                    # A flush just learned that another writer landed beyond records still to come in this
                    # poll: take the rest as a new poll, so they are dropped like any landed record and the
                    # buffer never holds records with a hole after them (see `_drop_landed`).
                    return records[pos:]
                if self._buffer_count and minute != self._buffer_minute:
                    self._flush("minute")
                if not self._buffer_count:
                    self._buffer_minute = minute
                    self._buffer_prev = self._last_delivered.checkpoint if self._last_delivered else self._start_prev
                    self._buffer_started = self._monotonic()
                # The longest run from pos that fits the byte budget (sizes grow with j: a binary search).
                budget = s.max_batch_bytes - self._buffer_bytes + cum[pos] + per * pos
                end = bisect_right(range(pos, stop + 1), budget, key=lambda j: cum[j] + per * j) - 1 + pos
                if end == pos:
                    if self._buffer_count:
                        self._flush("bytes")
                        if not self._buffer_count:
                            continue  # plan again from an empty buffer
                    # A record larger than the budget gets a batch of its own; and a buffer that a flush kept
                    # (its batch is claimed by a writer not done yet) still takes the next record.
                    end = pos + 1
                # At least one record per step: a kept buffer can exceed the limit until its claim resolves.
                end = max(pos + 1, min(end, pos + s.max_batch_records - self._buffer_count))
                self._segments.append(records[pos:end])
                self._buffer_count += end - pos
                self._buffer_bytes += cum[end] - cum[pos] + per * (end - pos)
                self._last_delivered = records[end - 1]
                pos = end
                if self._buffer_count >= s.max_batch_records:
                    self._flush("records")
                elif pos < stop:
                    self._flush("bytes")
        return None

    def _adopt_start(self, records: UserRecordBatch, claimed: BatchKey) -> UserRecordBatch:
        """Records from the first of the claimed start batch on (a prefix before it is dropped: the reader
        started at its minute). Its first record must be among them: a stream that no longer serves it
        (trimmed by retention since the claim) leaves a batch nobody can land, which stops landing with a
        message naming the link (docs/landing.md, known limits)."""
        first = claimed.first.key()
        lo = bisect_right(range(len(records)), False, key=lambda i: records[i].position() >= first)
        if lo == len(records):
            return records[lo:]  # the minute's earlier records: the claimed first comes in a later poll
        if records[lo].position() != first:
            store = self._zone_store()
            raise CorruptBatchError(
                f"landing zone {store.uri}: the start link after {self._start_prev} of {self.shard_id} names "
                f"{claimed.key()}, never written, and the stream no longer serves its first record (it serves "
                f"{records[lo].checkpoint} first): no holder can land that batch; move the link away to resume")
        self._adopt = None  # from here the claimed batch is landed like any batch after the start
        return records[lo:]

    def _overtaken(self, records: UserRecordBatch, pos: int) -> bool:
        """Whether records[pos] is at or below what another writer is known to have landed (a flush of this
        poll found it)."""
        return self._skip_key is not None and records[pos].position() <= self._skip_key

    def _drop_landed(self, records: UserRecordBatch) -> UserRecordBatch:
        """After a resume: drop the records at or below the resume point (or already delivered). Records come
        in shard order, so those are a prefix, found by binary search.

        The buffer must stay consecutive, from the record after `_buffer_prev` to the last delivered: a batch's
        predecessor (its link, its footer) is read off it. Records dropped because another writer landed them
        lie after everything buffered, so what is buffered is landed too: it goes as well, and the next
        buffer starts after the last record dropped. (Before, the buffer stayed and the records after the
        hole took a buffered record as their predecessor: a link after the wrong position, which let a
        second writer land the same records again.)"""
        floor = self._skip_key
        delivered = self._last_delivered.position() if self._last_delivered is not None else None
        if delivered is not None:
            floor = delivered if floor is None or delivered > floor else floor
        if floor is None:  # nothing resumed from and nothing delivered yet: nothing to drop
            return records
        if self._buffer_count and delivered is not None and floor > delivered:
            self.stats.records_already_landed += self._buffer_count
            log.info("%s: %d buffered records were landed by another writer meanwhile", self.shard_id,
                     self._buffer_count)
            self._set_buffer(None)
        lo, hi = 0, len(records)
        while lo < hi:
            mid = (lo + hi) // 2
            if records[mid].position() <= floor:
                lo = mid + 1
            else:
                hi = mid
        if lo:
            self.stats.records_already_landed += lo
            # The predecessor of the next buffered record is the last one dropped.
            self._last_delivered = records[lo - 1]
        if lo < len(records):
            self._skip_key = None  # records arrive in shard order: nothing later is at or below it
        return records[lo:]

    def _buffered(self) -> UserRecordBatch:
        return UserRecordBatch.concat(self._segments, self.shard_id)

    def _set_buffer(self, records: UserRecordBatch | None) -> None:
        if records is None or not len(records):
            self._segments, self._buffer_count, self._buffer_bytes = [], 0, 0
            return
        cum, per = _cumulative_sizes(records)
        self._segments = [records]
        self._buffer_count = len(records)
        self._buffer_bytes = cum[-1] + per * len(records)

    def _flush_if_due(self) -> None:
        if not self._buffer_count:
            return
        if self._monotonic() - self._buffer_started >= self.settings.max_batch_age_seconds:
            self._flush("age")
            return
        poll = self._last_poll
        # Caught up and the buffer's minute is over: no more records of that minute are coming.
        if poll is not None and poll[1] == 0 and self._buffer_minute + MINUTE_MS <= poll[0]:
            self._flush("minute_over")

    def _publish_next(self) -> None:
        """Publish the arrival of the first held record when it is the record right after the last landed one
        (progress.py, `next_arrival_ms`): every record of the chain before it is landed then, so a window
        ending at or before its arrival has passed (windows/completeness.py). Nothing is published while the
        held records follow anything else: the chain's start before anything landed (another holder may claim
        that start from other first records), or a lease checkpoint beyond the last landed batch found."""
        progress = self._progress
        if progress is None:
            return
        prev = self._buffer_prev
        follows = (self._buffer_count > 0 and progress.landed is not None and prev is not None
                   and not prev.is_sentinel and prev == progress.landed)
        arrival = self._segments[0][0].approximate_arrival_timestamp_ms if follows else None
        if arrival != progress.next_arrival_ms:
            self._progress = replace(progress, next_arrival_ms=arrival)

    def _settle_poll(self) -> None:
        """Every record of every poll so far is landed: publish the newest poll."""
        poll = self._last_poll
        if poll is not None and poll[1] is not None and self._progress is not None:
            self._progress = replace(self._progress, polled_at_ms=poll[0], millis_behind_latest=poll[1])

    # -- flushing ----------------------------------------------------------------------------------------

    def _flush(self, reason: str) -> None:
        records, prev, minute = self._buffered(), self._buffer_prev, self._buffer_minute
        existing, linked = self._list_minute(minute)
        exclusion = exclude_landed(records, prev, existing)
        # The batch ending where the buffer starts is known from before this flush (the last one landed, or the
        # one a refill follows) even when batches another writer landed further on become the tail below: a run
        # landed after it names its key.
        ends = dict([self._tail]) if self._tail is not None else {}
        for cover in exclusion.covering:
            self._validate(cover)  # never drop records on the word of an unreadable object
            if self._tail is None or cover.last.key() > self._tail[0].key():
                self._tail = (cover.last, cover.key())
        self._join(exclusion.joins, linked)
        ends.update((c.last, c.key()) for c in exclusion.covering)
        covered = len(records) - sum(len(run.records) for run in exclusion.runs)
        if covered:
            self.stats.records_already_landed += covered
            log.info("%s: %d of %d records were landed already (%s)", self.shard_id, covered, len(records),
                     ", ".join(b.key() for b in exclusion.covering))
        final_key: BatchKey | None = exclusion.last_covered_by
        landed_end = exclusion.last_covered_by.last if exclusion.last_covered_by else None
        kept_start: int | None = None  # records from here on stay buffered
        kept_prev: Checkpoint | None = None
        for run in exclusion.runs:
            pending, run_prev = run.records, run.prev
            while pending:
                prev_key = ends.get(run_prev) if run_prev is not None else None
                outcome = self._land_after(run_prev, pending, prev_key)
                if outcome is None:  # the batch after run_prev is claimed but not written yet, and ends later
                    kept_start, kept_prev = run.start + len(run.records) - len(pending), run_prev
                    break
                key, consumed = outcome
                final_key, landed_end = key, key.last
                ends[key.last] = key.key()
                self._tail = (key.last, key.key())
                pending, run_prev = pending[consumed:], key.last
            if kept_start is not None:
                break
        # Everything from an unfinished link on stays buffered; a later flush (with more records of the
        # minute) completes the claimed batch. The exclusion drops whatever else lands meanwhile.
        kept = records[kept_start:] if kept_start is not None else None
        landed_records = records[:kept_start] if kept_start is not None else records
        if landed_records:
            last = landed_records[-1]
            arrival = last.approximate_arrival_timestamp_ms
            progress = self._initialised_progress()
            prior = progress.landed_arrival_ms
            end = landed_end if landed_end is not None and landed_end.key() > last.position() else last.checkpoint
            self._progress = replace(
                progress, landed=end,
                landed_arrival_ms=arrival if prior is None or arrival > prior else prior,
                last_batch_key=final_key.key() if final_key else progress.last_batch_key,
                next_arrival_ms=None)  # published again for what stays held (`_publish_next`, below)
            if end.key() > last.position():
                # Another writer landed further than we have read: drop those records when they come.
                self._skip_key = end.key() if self._skip_key is None or end.key() > self._skip_key else self._skip_key
        self._set_buffer(kept)
        if kept:
            self._buffer_prev = kept_prev
            self._buffer_started = self._monotonic()
        self._publish_next()
        self.stats.flushes[reason] = self.stats.flushes.get(reason, 0) + 1
        if self.settings.checkpoint_after_flush and self._checkpointer is not None and landed_records:
            # On the next heartbeat write when the worker offers it (no extra DynamoDB write): a checkpoint
            # that lags only makes a successor re-read records the exclusion then drops.
            last = landed_records[-1]
            commit = getattr(self._checkpointer, "checkpoint_at_next_heartbeat", None) or self._checkpointer.checkpoint
            commit(last.sequence_number, last.sub_sequence_number)

    def _land_after(self, prev: Checkpoint | None, records: Sequence[UserRecord],
                    prev_key: str | None) -> tuple[BatchKey, int] | None:
        """Land the batch following `prev`, fenced by its link; (the batch that follows prev, how many of
        `records` it holds), or None when another writer claimed a longer batch that is not written yet."""
        store = self._zone_store()
        encoded = encode_batch(self.stream, self.shard_id, records, prev, self.settings.compression, prev_key,
                               self.settings.batch_format, self.stream_arn)
        link = link_key(self.stream, encoded.key.minute_ms, self.shard_id, prev)
        starts = prev is not None and prev.is_starting_sentinel
        # A start link names its claimer too: who began the chain, when a person looks at a stuck shard.
        if store.put_if_absent(link, link_body(encoded.key.key(), self._holder if starts else None)):
            return self._put_batch(encoded), len(records)
        owner_text = link_target(store.get(link))
        if starts and ends_empty(owner_text):
            # A holder ended the shard meanwhile with nothing landed after this start (it read LATEST after this
            # holder, on a shard that had closed) and claimed the start for that: the chain is complete and empty.
            # This holder lost the lease since (it was paused on its way here): it lands nothing and stops.
            dropped = self._buffer_count
            self._set_buffer(None)
            self._closed = True
            raise StartEndedEmpty(
                f"landing zone {store.uri}: the start link {link} says the shard ended with nothing landed after "
                f"{prev} (another holder's end, claimed meanwhile): {dropped} buffered records dropped, nothing "
                f"landed; this holder stops")
        owner = parse_batch_key(owner_text)
        if starts and owner is not None and owner.shard_id == self.shard_id and owner.first != records[0].checkpoint:
            # Another holder claimed the chain's start meanwhile, from other first records (LATEST read at
            # another moment, a trim horizon that moved): records after that start cannot follow ours. Give
            # the lease back; its next start follows that chain, or lands the claimed batch (`_follow_chain`).
            raise ChainStartTaken(
                f"landing zone {store.uri}: the start link {link} names {owner.key()} (another holder's start, "
                f"claimed meanwhile), which does not start at {records[0].checkpoint}; re-reading from that "
                f"chain on the lease's next start")
        if owner is None or owner.shard_id != self.shard_id or owner.first != records[0].checkpoint:
            raise CorruptBatchError(
                f"landing zone {store.uri}: link {link} names {owner_text!r}, not a batch of {self.shard_id} "
                f"starting at {records[0].checkpoint}; move it away to resume landing")
        if owner == encoded.key:
            return self._put_batch(encoded), len(records)  # our own claim (a retry), or the same range
        held = sum(1 for r in records if r.position() <= owner.last.key())
        self.stats.links_lost += 1
        if store.exists(owner.key()):
            self._validate(owner)  # never drop records on the word of an unreadable object
            self.stats.records_already_landed += held
            log.info("%s: the batch after %s is %s (another writer's): %d records dropped",
                     self.shard_id, prev, owner.key(), held)
            return owner, held
        if held == len(records) and records[-1].checkpoint != owner.last:
            return None  # the claimed batch ends beyond what we hold: wait for more records
        # The claimer died between link and batch: land exactly its range (same records, same key).
        mine = encode_batch(self.stream, self.shard_id, records[:held], prev, self.settings.compression, prev_key,
                            self.settings.batch_format, self.stream_arn)
        if mine.key != owner:
            raise CorruptBatchError(f"landing zone {store.uri}: link {link} names {owner.key()}, "
                                    f"but the records after {prev} make {mine.key.key()}")
        return self._put_batch(mine), held

    def _put_batch(self, encoded) -> BatchKey:
        store = self._zone_store()
        if store.put_if_absent(encoded.key.key(), encoded.body):
            self.stats.batches_written += 1
            self.stats.rows_written += encoded.rows
            self.stats.bytes_written += len(encoded.body)
        else:
            # Same key = same range: someone landed exactly these records. Check it really holds them.
            info = self._validate(encoded.key)
            if info.rows != encoded.rows:
                raise CorruptBatchError(
                    f"landing zone {store.uri}: object {encoded.key.key()} holds {info.rows} rows, "
                    f"but {encoded.rows} records have that range")
            self.stats.batches_already_landed += 1
        return encoded.key

    def _validate(self, key: BatchKey) -> BatchInfo:
        """The footer of a batch this holder is about to trust (resume after, follow, drop records on the word
        of): never another stream's (two streams of one name, in other accounts or regions, landing in one
        directory), whose positions mean nothing in this stream."""
        info = read_batch_info(self._zone_store(), key)
        _refuse_foreign(self._zone_store(), self.stream, info, self.stream_arn)
        self._validated.add(key.key())
        return info

    def _join(self, joins: Sequence[tuple[Checkpoint | None, BatchKey]], linked: set[Checkpoint]) -> None:
        """Claim the link after the record delivered just before a covering batch when the minute has none: the
        batch was written by another chain (a backfill's first batch, which follows AT_TIMESTAMP, or one landed
        before this shard's start link existed), and this writer saw that it follows that record. The link is
        the proof the checkpoint plan needs to pass the batch; without it the plan stops there for good. A
        link already there (the usual case, listed for free) is left alone; a start link costs one PUT."""
        store = self._zone_store()
        for prev, cover in joins:
            if prev is None or (not prev.is_starting_sentinel and prev in linked):
                continue
            if store.put_if_absent(link_key(self.stream, cover.minute_ms, self.shard_id, prev),
                                   link_body(cover.key())):
                self.stats.links_joined += 1
                log.info("%s: %s follows %s (another chain's batch): link claimed", self.shard_id, cover.key(), prev)

    def _list_minute(self, minute_ms: int) -> tuple[list[BatchKey], set[Checkpoint]]:
        """The shard's batches in the minute, and the positions its links follow."""
        store = self._zone_store()
        prefix = f"{minute_prefix(self.stream, minute_ms)}{self.shard_id}/"
        listing = split_landed_keys(store.list_keys(prefix))
        foreign = listing.malformed + [k.key() for k in listing.batches
                                       if k.shard_id != self.shard_id or k.minute_ms != minute_ms]
        if foreign:
            raise CorruptBatchError(
                f"landing zone {store.uri}: object {foreign[0]} under the shard's prefix is not a batch key "
                f"(<first>_<sub>-<last>_<sub>.parquet with first <= last); move it away to resume landing")
        return listing.batches, {link.prev for link in listing.links if link.shard_id == self.shard_id}

    # -- resuming ------------------------------------------------------------------------------------------

    def _find_last_landed(self, hint: ShardProgress | None) -> tuple[BatchKey, BatchInfo] | None:
        found = self._find_hinted(hint)
        if found is None:
            now_minute = minute_of(int(self._clock() * 1000))
            found = self._walk(now_minute - self.settings.resume_lookback_minutes * MINUTE_MS, now_minute)
        if found is None:
            return None
        return found, self._validate(found)

    def _find_hinted(self, hint: ShardProgress | None) -> BatchKey | None:
        """The furthest batch from the minute of the last landed record the lease's hint names, if the zone holds
        a batch reaching that record (None without a hint, or when the zone no longer holds it)."""
        if hint is None or hint.landed is None or hint.landed_arrival_ms is None:
            return None
        now_minute = minute_of(int(self._clock() * 1000))
        found = self._walk(min(minute_of(hint.landed_arrival_ms), now_minute), now_minute)
        if found is None or found.last.key() < hint.landed.key():
            log.warning("%s: the lease says %s was landed (batch %s) but the zone %s does not hold it (lost?); "
                        "resuming without that hint", self.shard_id, hint.landed, hint.last_batch_key,
                        self._zone_store().uri)
            return None
        return found

    def _follow_chain(self, start: Checkpoint) -> tuple[BatchKey, BatchInfo] | None:
        """The last batch of the chain that begins at the starting position `start`, followed link by link
        (one GET per link and one LIST per minute the chain spans, once per lease start without a hint).

        A start link naming a batch that was never written (its claimer died between link and batch) is
        adopted: this holder reads from that batch's minute and lands exactly that batch (`_adopt_start`).
        Reading from its own start instead (LATEST now, or the trim horizon that moved) would give it other
        first records, which can never be landed after that link: every later holder stopped there."""
        link = link_key(self.stream, 0, self.shard_id, start)
        text = self._link_text(link)
        if text is None:
            return None
        if ends_empty(text):
            # A holder ended the shard with nothing landed after this start: its chain is complete and empty.
            # Nothing to resume from or adopt; a read from the start of the closed shard brings nothing, and
            # records it brought all the same would meet the marker at their start link and land nothing.
            log.info("%s: the start link after %s says the shard ended with nothing landed", self.shard_id, start)
            return None
        claim = self._batch_named(link, text)
        if not self._zone_store().exists(claim.key()):
            self._adopt = claim
            return None
        cur = claim
        now_minute = minute_of(int(self._clock() * 1000))
        minute, empty = cur.minute_ms, 0
        # Stopping early only UNDER-estimates the resume point (safe: re-read records meet the links and the
        # exclusion); following one chain never lands beyond it (a backfill's batches are another chain).
        while minute <= now_minute + MINUTE_MS and empty < RESUME_EMPTY_MINUTES:
            link = link_key(self.stream, minute, self.shard_id, cur.last)
            names = set(self._zone_store().list_keys(f"{minute_prefix(self.stream, minute)}{self.shard_id}/"))
            nxt = self._linked(link) if link in names else None
            if nxt is None:
                minute += MINUTE_MS
                empty += 1
                continue
            cur, minute, empty = nxt, nxt.minute_ms, 0
        return cur, self._validate(cur)

    def _linked(self, link: str) -> BatchKey | None:
        """The batch a link names, if that batch is landed (a claimed but unwritten one ends the chain)."""
        key = self._claimed(link)
        return key if key is not None and self._zone_store().exists(key.key()) else None

    def _claimed(self, link: str) -> BatchKey | None:
        """The batch a link names, landed or not (None: no such link)."""
        text = self._link_text(link)
        return None if text is None else self._batch_named(link, text)

    def _link_text(self, link: str) -> str | None:
        """A link's first line (`link_target`), None when there is no such link."""
        store = self._zone_store()
        try:
            return link_target(store.get(link))
        except LandingError:
            if store.exists(link):
                raise
            return None

    def _batch_named(self, link: str, text: str) -> BatchKey:
        """The batch of this shard a link's first line names; anything else is a corrupt link."""
        store = self._zone_store()
        key = parse_batch_key(text)
        if key is None or key.shard_id != self.shard_id:
            raise CorruptBatchError(f"landing zone {store.uri}: link {link} names {text!r}, not a batch of "
                                    f"{self.shard_id}; move it away to resume landing")
        return key

    def _walk(self, start_minute: int, now_minute: int) -> BatchKey | None:
        """The furthest batch of the shard from `start_minute` on (see the module docstring)."""
        best: BatchKey | None = None
        empty = 0
        minute = start_minute
        # One minute past the local clock: arrival timestamps are the service's clock, not ours.
        while minute <= now_minute + MINUTE_MS:
            keys, _ = self._list_minute(minute)
            if keys:
                empty = 0
                top = max(keys, key=lambda k: k.last.key())
                if best is None or top.last.key() > best.last.key():
                    best = top
            elif best is not None:
                empty += 1
                if empty >= RESUME_EMPTY_MINUTES:
                    break
            minute += MINUTE_MS
        return best


def _refuse_foreign(store: ZoneStore, directory: str, info: BatchInfo, stream_arn: str | None) -> None:
    """ForeignStreamError, naming both streams and the remedy, when the batch is of another stream."""
    why = foreign_stream(directory, info.stream_arn, stream_arn)
    if why is not None:
        raise ForeignStreamError(
            f"landing zone {store.uri}: batch {info.key.key()} is not of this consumer's stream "
            f"{stream_arn or directory}: {why}; two streams named {stream_name(directory)} land in one directory: "
            f"name each by its ARN (--stream / KCL_PIPELINE_STREAM), so each lands in <name>@<region>@<account>")


def check_stream_chains(store: ZoneStore, stream: str, stream_arn: str | None) -> None:
    """Before a consumer starts: ForeignStreamError when a chain of the stream's directory begins with another
    stream's batch (its start links, one LIST and a GET and a footer read per shard that has one), so that a
    second stream of the name is refused in one line rather than by every worker, lease after lease. A migration
    into the directory left unfinished (`landing migrate`'s marker) is refused too: its chains are half moved."""
    directory = landing_directory(stream)
    if store.exists(marker_key(directory)):
        raise LandingError(f"landing zone {store.uri}: a migration into {directory}/ is unfinished "
                           f"({marker_key(directory)}): run `kcl-pipeline landing migrate` again to finish it")
    for link in store.list_keys(f"{directory}/{START_DIR}/"):
        if parse_link_key(link) is None:
            continue
        body = store.get_optional(link)
        key = None if body is None else parse_batch_key(link_target(body))
        if key is None or not store.exists(key.key()):
            continue  # the ended-empty marker, or a claim never written: no stream to tell
        _refuse_foreign(store, directory, read_batch_info(store, key), stream_arn)


def landing_spec(zone: str, stream: str, *, aws: AwsSettings | None = None, standalone: bool = False,
                 stream_arn: str | None = None, **settings: Any):
    """A picklable ProcessorSpec building a LandingProcessor in a worker process (for the CLI / Dagster).

    `stream` as configured (a name, or an ARN: it lands in its identity directory, layout.landing_directory);
    `stream_arn` the stream's ARN when configured by name (`resolve_stream_arn`), recorded in every batch.
    Settings are checked here, in the parent, so a bad value fails before any worker starts.
    """
    from ..kcl.shells.workers.worker import ProcessorSpec  # lazily: the worker module pulls in the whole consumer

    LandingSettings(checkpoint_after_flush=standalone, **settings)
    kwargs: dict[str, Any] = {"zone": zone, "stream": stream, "checkpoint_after_flush": standalone, **settings}
    if stream_arn is not None:
        kwargs["stream_arn"] = stream_arn
    LandingProcessor(zone, stream, stream_arn=stream_arn)  # the stream and its ARN (opens nothing)
    if aws is not None:
        kwargs["aws"] = aws
    return ProcessorSpec("kcl_pipeline.zone.sink:LandingProcessor", kwargs)


def _cumulative_sizes(records: UserRecordBatch) -> tuple[list[int], int]:
    """(cum, per): records[a:b] count cum[b] - cum[a] + per * (b - a) bytes towards the batch limit — data
    and partition key, plus a sequence number and the row overhead (a shard's sequence numbers share one
    length). Built with C-level map/accumulate: no Python loop per record."""
    seqs = records.run_sequence_numbers
    per = (len(seqs[0]) if seqs else 0) + RECORD_OVERHEAD_BYTES
    cum = list(accumulate(map(add, map(len, records.data), map(len, records.partition_keys)), initial=0))
    return cum, per
