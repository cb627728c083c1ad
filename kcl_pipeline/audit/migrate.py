"""`kcl-pipeline landing migrate`: move a stream's bare-name directory into its identity directory, the I/O around
zone/migration.py's decisions (what is rewritten, the marker, when to refuse).

    check_no_live_consumer(leases, watch_seconds)       two scans of the lease table: a counter that moved
                                                        is a live consumer (refused)
    migrate_zone(store, output, migration, dry_run=…)   check everything, then copy (rewritten), rewrite the
                                                        output's commits and checkpoint record, then delete

Everything that can refuse is looked at before the first write: the marker, the identity directory, every
batch's footer (another stream's is refused), every commit and the checkpoint record (unreadable: refused).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..kcl.core.model import Lease
from ..windows.checkpoints.record import RECORD_KEY
from ..windows.manifest import COMMITS
from ..zone.batch import read_batch_info, rewrite_batch
from ..zone.errors import ZoneNotFoundError
from ..zone.layout import split_batch_keys
from ..zone.migration import (
    COPY,
    DELETE,
    Migration,
    MigrationRefused,
    is_link,
    live_leases,
    marker_key,
    read_marker,
    resumable,
)
from ..zone.store import ZoneStore
from .index import index_key

DELETE_CHUNK = 1000  # objects per delete request (S3's DeleteObjects limit)


def check_no_live_consumer(scan: Callable[[], Sequence[Lease]], watch_seconds: float,
                           sleep: Callable[[float], None] = time.sleep) -> int:
    """MigrationRefused when a lease's counter moves within `watch_seconds` (a consumer of the application is
    running: it would land into the old directory meanwhile). Returns the leases watched."""
    before = list(scan())
    sleep(watch_seconds)
    live = live_leases(before, scan())
    if live:
        raise MigrationRefused(f"a consumer of the application holds {len(live)} live leases ({live[0]}"
                               f"{' …' if len(live) > 1 else ''}): stop every consumer (and the Dagster sensor "
                               f"hosting one) first; nothing was moved")
    return len(before)


@dataclass
class MigrationReport:
    migration: Migration
    dry_run: bool
    phase: str  # the phase the run began in (COPY: from the start, or a copy stopped; DELETE: a delete stopped)
    batches: int = 0
    links: int = 0
    others: int = 0
    outputs: list[str] = field(default_factory=list)  # output objects rewritten (commits, the checkpoint record)
    deleted: int = 0
    leases_watched: int | None = None

    def lines(self) -> list[str]:
        m = self.migration
        would = "would " if self.dry_run else ""
        out = [f"{'dry run: ' if self.dry_run else ''}migrate {m.source}/ into {m.target}/ for {m.stream_arn}"
               + (" (resuming its delete phase)" if self.phase == DELETE else "")]
        if self.leases_watched is not None:
            out.append(f"  lease table: {self.leases_watched} leases watched, none live")
        if self.phase == COPY:
            out.append(f"  {would}copy {self.batches} batches (rewritten: key, footer, rows' stream), "
                       f"{self.links} links (key and body) and {self.others} other objects")
            out.append(f"  {would}rewrite {len(self.outputs)} output objects naming its batches"
                       + "".join(f"\n    {k}" for k in self.outputs))
        out.append(f"  {would}delete {self.deleted} objects of {m.source}/")
        out.append(f"{'DRY RUN' if self.dry_run else 'OK'}: {m.source}/ -> {m.target}/")
        return out


def migrate_zone(store: ZoneStore, output: ZoneStore | None, migration: Migration, *,
                 dry_run: bool = False, on_step: Callable[[str], None] | None = None) -> MigrationReport:
    """Move `migration.source` into `migration.target` in `store`, rewriting the batch keys `output`'s commits and
    checkpoint record name (None: no transform output). Resumable: run again after a stop, it finishes what the
    marker says was under way. `on_step(phase)`: called as each phase begins, its marker written (tests stop a run
    there)."""
    store.ensure_zone(create=False)
    where = f"{store.uri}/{marker_key(migration.target)}"
    raw = store.get_optional(marker_key(migration.target))
    marker = None if raw is None else read_marker(raw, where)
    phase = resumable(migration, marker, list(store.list_keys(f"{migration.target}/")))
    report = MigrationReport(migration, dry_run, phase)
    source = list(store.list_keys(f"{migration.source}/"))
    if phase == COPY:
        if not source:
            raise MigrationRefused(f"landing zone {store.uri}: {migration.source}/ holds nothing to migrate")
        rewrites = _output_rewrites(output, migration)
        batches = _checked_batches(store, migration, source)
        report.batches = len(batches)
        report.links = sum(1 for k in source if is_link(k))
        report.others = len(source) - report.batches - report.links
        report.outputs = sorted(rewrites)
        report.deleted = len(source)
        if dry_run:
            return report
        store.put(marker_key(migration.target), migration.to_marker(COPY))
        if on_step is not None:
            on_step(COPY)
        _copy(store, migration, source, batches)
        for key, body in sorted(rewrites.items()):
            assert output is not None  # rewrites come from an output only
            output.put(key, body)
        store.put(marker_key(migration.target), migration.to_marker(DELETE))
    else:
        report.deleted = len(source)
        if dry_run:
            return report
    if on_step is not None:
        on_step(DELETE)
    for i in range(0, len(source), DELETE_CHUNK):
        store.delete(source[i:i + DELETE_CHUNK])
    if output is not None:
        try:
            output.delete([index_key(migration.source)])  # a cache of the old directory's footers
        except ZoneNotFoundError:
            pass  # nothing transformed yet: no index either
    store.delete([marker_key(migration.target)])
    return report


def _checked_batches(store: ZoneStore, migration: Migration, keys: list[str]) -> dict:
    """Each batch of the source with its footer (key -> info): MigrationRefused on an object that is not a batch
    key, or a batch of another stream; an unreadable batch is a CorruptBatchError naming it."""
    listing = split_batch_keys(keys)
    if listing.malformed:
        raise MigrationRefused(f"landing zone {store.uri}: {listing.malformed[0]} is not a batch key "
                               f"({len(listing.malformed)} such objects): move them away first; nothing was moved")
    infos = {}
    refusals = []
    for key in listing.batches:
        info = read_batch_info(store, key)
        why = migration.stream_refusal(key.key(), info.stream_arn)
        if why is not None:
            refusals.append(why)
        infos[key.key()] = info
    if refusals:
        raise MigrationRefused(f"landing zone {store.uri}: {refusals[0]}"
                               f"{f' (and {len(refusals) - 1} more)' if len(refusals) > 1 else ''}: "
                               f"{migration.source}/ holds another stream's batches; nothing was moved")
    return infos


def _copy(store: ZoneStore, migration: Migration, keys: list[str], batches: dict) -> None:
    """Write every object of the source under the identity directory, rewritten (idempotent: a copy stopped
    half-way is written again whole)."""
    for key in keys:
        info = batches.get(key)
        if info is not None:
            moved = rewrite_batch(store.get(key), info, migration.target,
                                  migration.named_key(info.prev_key) if info.prev_key else None,
                                  info.stream_arn or migration.stream_arn)
            if moved.key.key() != migration.key(key):  # the encoder names the key: it must be the moved one
                raise MigrationRefused(f"batch {key} rewritten as {moved.key.key()}, not {migration.key(key)}")
            store.put(moved.key.key(), moved.body)
        elif is_link(key):
            store.put(migration.key(key), migration.link_body(store.get(key)))
        else:
            store.put(migration.key(key), store.get(key))


def _output_rewrites(output: ZoneStore | None, migration: Migration) -> dict[str, bytes]:
    """The output objects naming batches of the source, rewritten (key -> body): every window commit (published
    or pending) and the checkpoint record. MigrationRefused on one that is not JSON."""
    if output is None:
        return {}
    try:
        keys = [k for k in output.list_keys(f"{COMMITS}/") if k.endswith(".json")]
        keys += [RECORD_KEY] if output.exists(RECORD_KEY) else []
    except ZoneNotFoundError:
        return {}  # nothing transformed yet
    out = {}
    for key in keys:
        try:
            data = json.loads(output.get(key))
            moved = migration.output_object(data) if isinstance(data, dict) else None
        except ValueError as exc:
            raise MigrationRefused(f"transform output {output.uri}: {key} is not JSON ({exc}); nothing was "
                                   f"moved") from None
        if moved is not None:
            out[key] = json.dumps(moved, indent=1, sort_keys=True).encode()
    return out
