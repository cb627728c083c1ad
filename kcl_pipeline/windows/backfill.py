"""Bounded re-reads: land a past time range again, isolated from the live consumer.

For every shard the stream lists, a reader starts AT_TIMESTAMP at the range's start (TRIM_HORIZON when
the start predates the stream's retention: there is nothing older to find) and reads until a record
arrives at or after the range's end, the shard ends, or it is caught up. The records of the range go
through the live landing writer (LandingProcessor) under the same deterministic keys, so records that
are landed already are dropped by the sequence-range exclusion and nothing is duplicated.

Never written: the lease table. No lease is taken, no checkpoint written, no progress published; the
live consumer carries on undisturbed.

Paced, in parallel. Shards are read at once (`BackfillPace.parallelism` at a time), each within its share
of the shard's limits (`reads_per_second` of the 5 GetRecords/s, `bytes_per_second` of the 2 MiB/s): the
rest stays the live consumer's, so a day's backfill neither takes hours shard after shard nor throttles the
live workers. A deadline cuts the reads (what was landed stays; running again goes on without duplicates),
and `on_progress` hears of every shard done.

Never ahead of the live consumer. A live worker resumes after the furthest batch it finds, trusting that
everything before it is landed; a backfill batch landed ahead of the live frontier would make it skip
records. So a shard is re-read only when the live side is done with the range (the same test as window
completeness, on a read-only snapshot of the lease table: ended, landed past the end, caught up after it,
or never to be read); the others are left to the live consumer and reported as `live`.

Never below the application's start. A shard whose live chain starts at LATEST (its start link
`_start/<shard>/after=LATEST`) owes nothing before that chain's first record: those records arrived before
the application started. A backfill of the minute a LATEST chain starts in lands from that chain's first
record on, through the live start link (a lost first batch is refilled exactly); the records before it are
counted (`skipped_before_start`), never landed — a chain of their own would end where the LATEST chain
begins and the audit would report a gap before it for ever. In an application started at LATEST
(`application_start`), a leased shard with no live start link at all (neither after LATEST nor, a child's,
after TRIM_HORIZON) has no chain yet: its start is not known, and may be a record inside the range that a
holder read and is landing now (its first flush on its way, the start link not yet claimed). The backfill
lands nothing of such a shard (its records counted `skipped_before_start`): whatever of the range the
application owes is landed by that holder's chain; the rest arrived before its start. A chain of the
backfill's own over the whole range would land those records a second time: the holder's first batch, claimed
after it, holds them too (a holder can freeze for many seconds inside its first flush). A shard whose LATEST
start link says it ended with nothing landed (`layout.ENDED_EMPTY`: its holder read LATEST after the shard had
closed, and claimed the start for that) has a chain that began and ended empty: it owes nothing, and nothing of
it is landed either (`skipped_before_start`) — every record of it arrived before its start.

Reading every listed shard is correct without knowing when each one existed: a shard closed before
the range ends at once (or serves only records before it); one born after the range serves its first
record at or after the end, which stops its read.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, UserRecord
from ..kcl.processor import InitializationInput, ProcessRecordsInput
from ..kcl.shells.aws import client
from ..kcl.shells.read.reader import MAX_CALLS_PER_SECOND, MAX_READ_BYTES_PER_SECOND, ShardReader
from ..kcl.shells.shards import describe_stream_summary, list_shards
from ..zone.layout import (
    MINUTE_MS,
    START_DIR,
    ends_empty,
    landing_directory,
    link_key,
    link_target,
    minute_of,
    minute_prefix,
    parse_batch_key,
    parse_link_key,
    split_batch_keys,
    split_landed_keys,
)
from ..zone.progress import progress_from_leases
from ..zone.sink import LandingProcessor
from ..zone.store import ZoneStore, open_store
from .completeness import window_complete
from .report import json_position

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


def start_position(start_ms: int, now_ms: int, retention_hours: int) -> Checkpoint:
    """AT_TIMESTAMP at the range start, or TRIM_HORIZON when the start is beyond the stream's retention."""
    if start_ms <= now_ms - retention_hours * HOUR_MS:
        return Checkpoint(TRIM_HORIZON)
    return Checkpoint(AT_TIMESTAMP, start_ms)


@dataclass(frozen=True)
class Cut:
    """What to do with one polled batch of a bounded read (pure)."""

    deliver: list[UserRecord]  # the records inside [start, end)
    skipped_before: int  # records before the start (TRIM_HORIZON reads)
    done: bool  # a record at or after the end was seen: stop reading
    last_before: Checkpoint | None  # the last skipped record before the start (the first delivered one's predecessor)


def cut_batch(records: Sequence[UserRecord], start_ms: int, end_ms: int) -> Cut:
    """Split a polled batch at the range. Arrival timestamps do not decrease along a shard, so the first
    record at or after `end_ms` ends the read."""
    deliver: list[UserRecord] = []
    skipped = 0
    last_before = None
    for r in records:
        arrival = r.approximate_arrival_timestamp_ms
        if arrival >= end_ms:
            return Cut(deliver, skipped, True, last_before)
        if arrival < start_ms:
            skipped += 1
            last_before = r.checkpoint
            continue
        deliver.append(r)
    return Cut(deliver, skipped, False, last_before)


@dataclass(frozen=True)
class BackfillPace:
    """How hard a backfill reads: shards at once, and its share of each shard's read limits.

    Defaults leave the live consumer 4 of the 5 GetRecords/s and half of the 2 MiB/s of every shard."""

    parallelism: int = 8
    reads_per_second: float = 1.0
    bytes_per_second: float = MAX_READ_BYTES_PER_SECOND / 2

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise ValueError(f"backfill parallelism must be >= 1, got {self.parallelism}")
        if not 0 < self.reads_per_second < MAX_CALLS_PER_SECOND:
            raise ValueError(f"backfill reads_per_second must be > 0 and below the shard's {MAX_CALLS_PER_SECOND} "
                             f"GetRecords/s (the live consumer needs the rest), got {self.reads_per_second}")
        if not 0 < self.bytes_per_second < MAX_READ_BYTES_PER_SECOND:
            raise ValueError(f"backfill bytes_per_second must be > 0 and below the shard's "
                             f"{MAX_READ_BYTES_PER_SECOND} B/s (the live consumer needs the rest), "
                             f"got {self.bytes_per_second}")

    @property
    def polling_interval(self) -> float:
        return 1.0 / self.reads_per_second


@dataclass(frozen=True)
class BackfillProgress:
    """Where a running backfill stands, after each shard it finishes."""

    shards_done: int
    shards_to_read: int
    records_in_range: int
    records_landed: int
    last_shard: str
    stopped_by: str

    def describe(self) -> str:
        return (f"backfill progress: {self.shards_done}/{self.shards_to_read} shards read ({self.last_shard}: "
                f"{self.stopped_by}); {self.records_in_range} records in range, {self.records_landed} landed now")


@dataclass
class ShardBackfill:
    shard_id: str
    start: str  # AT_TIMESTAMP <ms> | TRIM_HORIZON
    stopped_by: str = ""  # past_end | shard_end | caught_up | deadline | live (not read: see live_reason)
    live_reason: str = ""
    records_read: int = 0  # user records the reader returned
    records_in_range: int = 0  # from the shard's live start on (see skipped_before_start)
    skipped_before_start: int = 0  # records of the range before the shard's LATEST chain began: never landed
    records_landed: int = 0  # newly written
    records_already_landed: int = 0  # dropped by the exclusion: landed before (live, or an earlier backfill)
    batches_written: int = 0
    bytes_written: int = 0
    first: Checkpoint | None = None
    last: Checkpoint | None = None
    get_records_calls: int = 0

    def describe(self) -> str:
        return (f"{self.shard_id}: {self.stopped_by}; read from {self.start}: {self.records_in_range} records in "
                f"range, {self.records_landed} landed now, {self.records_already_landed} landed before"
                + (f", {self.skipped_before_start} before the application's start (LATEST) not landed"
                   if self.skipped_before_start else "")
                + (f" ({self.live_reason})" if self.live_reason else ""))


@dataclass
class BackfillReport:
    stream: str
    start_ms: int
    end_ms: int
    zone: str
    shards: dict[str, ShardBackfill] = field(default_factory=dict)

    @property
    def records_in_range(self) -> int:
        return sum(s.records_in_range for s in self.shards.values())

    @property
    def records_landed(self) -> int:
        return sum(s.records_landed for s in self.shards.values())

    @property
    def records_already_landed(self) -> int:
        return sum(s.records_already_landed for s in self.shards.values())

    @property
    def complete(self) -> bool:
        """Every shard was read to the end of the range (none left to the live side or cut by the deadline)."""
        return all(s.stopped_by not in ("deadline", "live") for s in self.shards.values())

    @property
    def cut_by_deadline(self) -> list[str]:
        return sorted(k for k, s in self.shards.items() if s.stopped_by == "deadline")

    @property
    def left_to_live(self) -> dict[str, str]:
        return {k: s.live_reason for k, s in sorted(self.shards.items()) if s.stopped_by == "live"}

    def per_shard(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: per shard where its read started and stopped, its first and last record in the range,
        records in range and landed now."""
        return {k: {"start": s.start, "stopped_by": s.stopped_by, "first": json_position(s.first),
                    "last": json_position(s.last), "in_range": s.records_in_range, "landed": s.records_landed}
                for k, s in sorted(self.shards.items())}


class _NoCheckpoints:
    """A backfill never writes to the lease table; the pipeline-mode sink never calls these."""

    def checkpoint(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> bool:
        raise RuntimeError("a backfill never checkpoints (the live lease table is not touched)")

    def checkpoint_at_next_heartbeat(self, sequence_number: str | None = None, sub_sequence_number: int = 0) -> None:
        raise RuntimeError("a backfill never checkpoints (the live lease table is not touched)")

    def end_shard(self) -> None:
        raise RuntimeError("a backfill never ends a shard (the live lease table is not touched)")


class _BackfillLanding(LandingProcessor):
    """The live landing writer, without the resume-after-the-last-landed-record shortcuts.

    A live worker skips everything up to the shard's last landed record (found from a hint, or by following
    its chain from its start link); a backfill must offer every record of its range to the exclusion, so that
    records missing from the zone are landed whatever came after them.
    """

    def _find_last_landed(self, hint):  # noqa: D401 - see the class docstring
        return None

    def _follow_chain(self, start):  # noqa: D401 - see the class docstring
        return None

    def follows(self, position: Checkpoint, key: str | None) -> None:
        """The batch ending at `position` (the first delivered record's predecessor) is `key`: the first batch
        names it, as the live writer's did."""
        if key is not None:
            self._tail = (position, key)


# How far back the batch ending at a refill's predecessor is looked for (one LIST a minute, stopping at the
# first minute below it): a live chain's consecutive batches are at most a few idle minutes apart.
PREDECESSOR_LOOKBACK_MINUTES = 60


def live_predecessor(store: ZoneStore, directory: str, shard_id: str,
                     first: UserRecord) -> tuple[Checkpoint, str | None] | None:
    """The position the live chain says precedes `first` (a backfill's first record, read from AT_TIMESTAMP,
    which tells no predecessor), and the key of the batch ending there when the zone holds it; None when no
    live link claims the batch starting at `first` (nothing was landed there, or its links are gone too).

    Every landed batch was claimed by the link `after=<its predecessor>` in its own minute (layout.link_key),
    and links outlive a lost batch. `first` is the first record of its minute (a range starts on a minute), so
    the predecessor is the greatest link position of that minute below it: its successor is `first` (a record
    between them would be in that minute, before `first`). The first batch of a chain is claimed by a start
    link instead (`_start/<shard>/after=TRIM_HORIZON_0` …): one GET per start link of the shard tells whether
    it names a batch starting at `first`. With the predecessor known, a refill goes through the live link:
    it lands exactly the lost batch, under its own key, and the live successor's footer names it again."""
    minute = minute_of(first.approximate_arrival_timestamp_ms)
    prefix = f"{minute_prefix(directory, minute)}{shard_id}/"
    names = list(store.list_keys(prefix))
    below = [link.prev for link in split_landed_keys(names).links
             if link.shard_id == shard_id and link.minute_ms == minute and link.prev.key() < first.position()]
    if below:
        position = max(below, key=Checkpoint.key)
        return position, _batch_ending_at(store, directory, shard_id, position, minute, names)
    for name in store.list_keys(f"{directory}/{START_DIR}/{shard_id}/"):
        link = parse_link_key(name)
        body = store.get_optional(name) if link is not None else None
        owner = parse_batch_key(link_target(body)) if body is not None else None
        if link is not None and owner is not None and owner.first == first.checkpoint:
            return link.prev, None  # a starting position: the first batch of its chain names no batch
    return None


def live_start(store: ZoneStore, directory: str, shard_id: str) -> Checkpoint | None:
    """The first record of the shard's chain when the application started it at LATEST: the first of the
    batch its start link (`_start/<shard>/after=LATEST`) names, whether or not that batch is still there (links
    outlive a lost batch). SHARD_END when the link says the shard ended with nothing landed after LATEST
    (`layout.ENDED_EMPTY`): the chain began at the shard's end, every record of the shard is before it. None when
    no LATEST link is there (the shard starts at TRIM_HORIZON or AT_TIMESTAMP, or nothing was landed for it): no
    floor. One GET."""
    body = store.get_optional(link_key(directory, 0, shard_id, Checkpoint(LATEST)))
    target = link_target(body) if body is not None else None
    if ends_empty(target):
        return Checkpoint(SHARD_END)
    owner = parse_batch_key(target) if target is not None else None
    return None if owner is None or owner.shard_id != shard_id else owner.first


def _batch_ending_at(store: ZoneStore, directory: str, shard_id: str, position: Checkpoint, minute: int,
                     names: list[str] | None = None) -> str | None:
    """The key of the shard's landed batch whose last record is `position`, looked for from `minute` back
    (`names`: that minute's listing, when the caller has it)."""
    for m in range(minute, minute - PREDECESSOR_LOOKBACK_MINUTES * MINUTE_MS, -MINUTE_MS):
        listed = names if m == minute and names is not None else list(
            store.list_keys(f"{minute_prefix(directory, m)}{shard_id}/"))
        batches = [b for b in split_batch_keys(listed).batches if b.shard_id == shard_id]
        for b in batches:
            if b.last == position:
                return b.key()
        if batches and max(b.last.key() for b in batches) < position.key():
            return None  # this minute is wholly before the position: the batch ending there is gone
    return None


def backfill_range(stream: str, start_ms: int, end_ms: int, zone: str | ZoneStore, *,
                   leases: Sequence[Lease] | None = None, grace_ms: int = 10_000,
                   aws: AwsSettings | None = None, kinesis: Any = None, now_ms: int | None = None,
                   deadline_seconds: float | None = None, pace: BackfillPace = BackfillPace(),
                   on_progress: Callable[[BackfillProgress], None] | None = None,
                   compression: str = "zstd", create_zone: bool = False, directory: str | None = None,
                   monotonic: Callable[[], float] = time.monotonic,
                   application_start: Checkpoint | None = None) -> BackfillReport:
    """Land the records of `stream` that arrived in [start_ms, end_ms) (whole minutes) into `zone`.

    `leases`: a snapshot of the live lease table (read by the caller; None or empty: no live consumer), named
    by shard id. `directory`: where the stream lands in the zone (default: its name; a multi-stream
    application's stream lands in its incarnation's directory, layout.landing_directory).
    `on_progress` is called in the caller's thread after each shard read. `application_start`: where the
    application's new leases start (its initial position; None: not known). At LATEST, a leased shard whose
    live chain has not begun lands nothing (see the module docstring).
    """
    if end_ms <= start_ms or start_ms % MINUTE_MS or end_ms % MINUTE_MS:
        raise ValueError(f"backfill range [{start_ms}, {end_ms}) must be non-empty and on whole minutes")
    kinesis = kinesis or client("kinesis", aws)
    store = zone if isinstance(zone, ZoneStore) else open_store(zone, aws)
    store.ensure_zone(create=create_zone)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    summary = describe_stream_summary(kinesis, stream)
    retention = int(summary.get("RetentionPeriodHours") or 24)
    # The stream's own directory records its ARN in every batch, as the live writer does (a multi-stream
    # incarnation's directory is its identity, and its live batches record none).
    own = directory is None or directory == landing_directory(stream)
    stream_arn = summary.get("StreamARN") if own else None
    start = start_position(start_ms, now_ms, retention)
    deadline = None if deadline_seconds is None else monotonic() + deadline_seconds
    report = BackfillReport(stream, start_ms, end_ms, store.uri)
    worker_id = f"backfill-{uuid.uuid4().hex[:12]}"
    shards = list_shards(kinesis, stream)
    live = live_shards(start_ms, end_ms, shards, leases or [], grace_ms)
    to_read = [shard.shard_id for shard in shards if shard.shard_id not in live]
    # A LATEST application's leased shards: each one's live chain starts at its start link (checked per shard).
    latest = application_start is not None and application_start.sequence_number == LATEST
    leased = {lease.lease_key for lease in leases or []} if latest else set()
    for shard_id, reason in live.items():
        report.shards[shard_id] = ShardBackfill(shard_id, str(start), "live", live_reason=reason)
    stop = threading.Event()  # the caller's thread was interrupted: the readers stop at their next poll
    with ThreadPoolExecutor(max_workers=max(1, min(pace.parallelism, len(to_read))),
                            thread_name_prefix="backfill") as pool:
        futures = {pool.submit(_backfill_shard, kinesis, store, stream, directory or landing_directory(stream),
                               shard_id, start, start_ms, end_ms,
                               worker_id, deadline, pace, compression, monotonic, stop,
                               shard_id in leased, stream_arn): shard_id
                   for shard_id in to_read}
        try:
            for future in as_completed(futures):
                done = report.shards[futures[future]] = future.result()
                if on_progress is not None:
                    read = [s for s in report.shards.values() if s.stopped_by != "live"]
                    on_progress(BackfillProgress(len(read), len(to_read), report.records_in_range,
                                                 report.records_landed, done.shard_id, done.stopped_by))
        except BaseException:
            stop.set()
            raise
    report.shards = dict(sorted(report.shards.items()))
    log.info("backfill of %s [%s, %s) from %s: %d records in range, %d landed now, %d landed before",
             stream, start_ms, end_ms, start, report.records_in_range, report.records_landed,
             report.records_already_landed)
    return report


def live_shards(start_ms: int, end_ms: int, shards, leases: Sequence[Lease], grace_ms: int) -> dict[str, str]:
    """Shards the live consumer may still land records of [start_ms, end_ms) for (shard -> why). Pure.

    With no lease at all there is no live consumer of this application: nothing is left to it."""
    if not leases:
        return {}
    status = window_complete(start_ms, end_ms, shards, progress_from_leases(leases), leases, grace_ms)
    return {shard_id: status.reasons.get(shard_id, "") for shard_id in status.waiting_on}


def _start_sink(store: ZoneStore, directory: str, shard_id: str, worker_id: str, first: UserRecord,
                start: Checkpoint, compression: str, monotonic: Callable[[], float],
                stream_arn: str | None = None) -> _BackfillLanding:
    """The sink of a shard's range, started after the first record's predecessor: the last record skipped
    before the range (a TRIM_HORIZON read), or else the one the live chain's links name (an AT_TIMESTAMP read
    tells none). Starting there, the first batch goes through the live link — a lost batch is refilled exactly,
    under its own key — instead of starting a chain of its own that no live link fences. Only where no live
    link claims the first record (nothing landed there yet) does it start after AT_TIMESTAMP."""
    prev_key = None
    if start.sequence_number == AT_TIMESTAMP:
        found = live_predecessor(store, directory, shard_id, first)
        if found is not None:
            start, prev_key = found
    elif not start.is_sentinel:
        prev_key = _batch_ending_at(store, directory, shard_id, start, minute_of(
            first.approximate_arrival_timestamp_ms))
    sink = _BackfillLanding(store, directory, compression=compression, monotonic=monotonic, stream_arn=stream_arn)
    sink.initialize(InitializationInput(shard_id, worker_id, start))
    if not start.is_sentinel:
        sink.follows(start, prev_key)
    return sink


def _backfill_shard(kinesis, store: ZoneStore, stream: str, directory: str, shard_id: str, start: Checkpoint,
                    start_ms: int,
                    end_ms: int, worker_id: str, deadline: float | None, pace: BackfillPace,
                    compression: str, monotonic: Callable[[], float], stop: threading.Event,
                    latest_lease: bool = False, stream_arn: str | None = None) -> ShardBackfill:
    result = ShardBackfill(shard_id, str(start.sequence_number if start.sequence_number == TRIM_HORIZON
                                         else f"AT_TIMESTAMP {start_ms}"))
    checkpointer = _NoCheckpoints()
    reader = ShardReader(kinesis, stream, shard_id, start, polling_interval=pace.polling_interval,
                         idle_interval=pace.polling_interval, max_bytes_per_second=pace.bytes_per_second,
                         monotonic=monotonic)
    sink: _BackfillLanding | None = None
    last_before: Checkpoint | None = None
    # The live chain's start: nothing before it is landed (read once, before the first poll: the start link is
    # written before the live chain's first batch, and never moves).
    floor = live_start(store, directory, shard_id)
    # A LATEST chain that began and ended empty (its holder read LATEST after the shard closed): nothing of the
    # shard is owed, and nothing of it is landed — a chain of the backfill's own would be records before the start.
    ended_empty = floor is not None and floor.is_shard_end
    # A LATEST lease whose chain has not begun (no start link after LATEST, nor after TRIM_HORIZON for a child):
    # its start is not known yet, and may lie inside the range, claimed by a holder's first flush still on its
    # way. Nothing of the range is landed: a chain of the backfill's own there, and that holder's first batch
    # claimed after it, would hold the same records twice (no link is common to both).
    unstarted = latest_lease and floor is None and not store.exists(
        link_key(directory, 0, shard_id, Checkpoint(TRIM_HORIZON)))
    while True:
        if stop.is_set() or (deadline is not None and monotonic() > deadline):
            result.stopped_by = "deadline"
            break
        batch = reader.poll()
        result.records_read += len(batch.records)
        cut = cut_batch(batch.records, start_ms, end_ms)
        last_before = cut.last_before or last_before
        deliver = cut.deliver
        if unstarted or ended_empty:
            result.skipped_before_start += len(deliver)
            deliver = []
        elif floor is not None and deliver and deliver[0].position() < floor.key():
            kept = [r for r in deliver if r.position() >= floor.key()]
            result.skipped_before_start += len(deliver) - len(kept)
            deliver = kept
        if deliver:
            if sink is None:
                # The LATEST chain's first record follows its start link: through that link, the first batch is
                # the live one (refilled exactly when it was lost), never a chain of its own.
                chain_start = (Checkpoint(LATEST) if floor is not None and deliver[0].checkpoint == floor
                               else last_before or start)
                sink = _start_sink(store, directory, shard_id, worker_id, deliver[0], chain_start,
                                   compression, monotonic, stream_arn)
            result.records_in_range += len(deliver)
            result.first = result.first or deliver[0].checkpoint
            result.last = deliver[-1].checkpoint
            sink.process_records(ProcessRecordsInput(deliver, None, checkpointer))
        if cut.done:
            result.stopped_by = "past_end"
            break
        if batch.shard_ended:
            result.stopped_by = "shard_end"
            break
        if not batch.records and batch.millis_behind_latest == 0:
            result.stopped_by = "caught_up"
            break
    if sink is not None:
        sink.shutdown_requested(checkpointer)  # flushes what is buffered
        result.records_landed = sink.stats.rows_written
        result.records_already_landed = result.records_in_range - sink.stats.rows_written
        result.batches_written = sink.stats.batches_written
        result.bytes_written = sink.stats.bytes_written
    result.get_records_calls = reader.stats.get_records_calls
    return result
