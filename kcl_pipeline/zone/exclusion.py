"""Sequence-range exclusion: which buffered records are already landed, and what is left to write.

Pure. A landed batch holds every record of its shard between its first and last position (records are
consecutive within a batch), so a listing of keys alone says which records are landed. The records left
form runs of consecutive records; each run becomes its own batch, whose predecessor is the record
delivered just before it (landed or not), so the chain of batches stays verifiable.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Sequence

from ..kcl.core.model import Checkpoint, UserRecord
from .layout import BatchKey


@dataclass(frozen=True)
class Run:
    prev: Checkpoint | None
    records: Sequence[UserRecord]
    start: int = 0  # index of its first record in the records excluded from


@dataclass(frozen=True)
class Exclusion:
    runs: list[Run]  # what is left to write, in shard order
    covering: list[BatchKey]  # the landed batches that held some of the records, in shard order
    last_covered_by: BatchKey | None  # the batch holding the last record, when that record was landed
    # (the position delivered just before a covering batch's first record, that batch): the batch follows that
    # position, a fact the writer saw, whichever chain wrote the batch (see LandingProcessor's joins)
    joins: list[tuple[Checkpoint | None, BatchKey]] = field(default_factory=list)


def exclude_landed(records: Sequence[UserRecord], prev: Checkpoint | None,
                   landed: Sequence[BatchKey]) -> Exclusion:
    """Split `records` (consecutive, in shard order; `prev` delivered just before the first) around `landed`."""
    if not records:
        return Exclusion([], [], None)
    if not landed:
        return Exclusion([Run(prev, records)], [], None)
    spans = sorted(landed, key=lambda b: b.first.key())
    if max(b.last.key() for b in spans) < records[0].position() or spans[0].first.key() > records[-1].position():
        # The usual flush: the minute's batches so far all precede the buffer (or all follow it). Records
        # are in shard order, so none is covered; no record is looked at.
        return Exclusion([Run(prev, records)], [], None)
    firsts = [b.first.key() for b in spans]
    # Running maximum of the lasts, so a (corrupt-zone) overlapping listing still counts as covering.
    widest: list[BatchKey] = []
    for b in spans:
        widest.append(b if not widest or b.last.key() > widest[-1].last.key() else widest[-1])

    runs: list[Run] = []
    covering: list[BatchKey] = []
    joins: list[tuple[Checkpoint | None, BatchKey]] = []
    start = None
    last_cover = None
    for i, record in enumerate(records):
        pos = record.position()
        j = bisect_right(firsts, pos) - 1
        cover = widest[j] if j >= 0 and widest[j].last.key() >= pos else None
        if cover is None:
            if start is None:
                start, run_prev = i, (records[i - 1].checkpoint if i else prev)
        else:
            if start is not None:
                runs.append(Run(run_prev, records[start:i], start))
                start = None
            if not covering or covering[-1] != cover:
                covering.append(cover)
                if pos == cover.first.key():
                    joins.append((records[i - 1].checkpoint if i else prev, cover))
        last_cover = cover
    if start is not None:
        runs.append(Run(run_prev, records[start:], start))
    return Exclusion(runs, covering, last_cover, joins)
