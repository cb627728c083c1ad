"""Sequence-range exclusion (pure): drop what listed batches hold, keep runs that chain."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.exclusion import exclude_landed
from kcl_pipeline.zone.layout import BatchKey

from .helpers import SHARD, STREAM, T0, make_records

RECORDS = make_records(12, aggregate_every=3)  # positions: 4 Kinesis records x 3 sub-records
PREV = Checkpoint("TRIM_HORIZON")


def span(i: int, j: int) -> BatchKey:
    """A landed batch holding RECORDS[i..j] (inclusive)."""
    return BatchKey(STREAM, SHARD, T0, RECORDS[i].checkpoint, RECORDS[j].checkpoint)


@pytest.mark.parametrize("landed,runs,covering,last_cover", [
    # nothing landed: one run, chained to the buffer's predecessor
    ([], [(None, 0, 11)], [], None),
    # everything landed (same boundaries, or one wider batch)
    ([span(0, 11)], [], [0], 0),
    ([span(0, 5), span(6, 11)], [], [0, 1], 1),
    # a landed prefix (the usual restart): the rest chains to the prefix's last record
    ([span(0, 4)], [(4, 5, 11)], [0], None),
    # a different earlier boundary: prefix covered by two batches
    ([span(0, 2), span(3, 7)], [(7, 8, 11)], [0, 1], None),
    # a landed middle: two runs, each chained to the record before it
    ([span(3, 7)], [(None, 0, 2), (7, 8, 11)], [0], None),
    # a landed suffix
    ([span(9, 11)], [(None, 0, 8)], [0], 0),
    # batches of other ranges entirely outside the buffer change nothing
    ([BatchKey(STREAM, SHARD, T0, Checkpoint("1"), Checkpoint("2"))], [(None, 0, 11)], [], None),
    # overlapping landed batches (a damaged zone) still count as covering
    ([span(0, 6), span(2, 4)], [(6, 7, 11)], [0], None),
])
def test_exclusion(landed, runs, covering, last_cover):
    ex = exclude_landed(RECORDS, PREV, landed)
    got = [(r.prev, r.records[0], r.records[-1]) for r in ex.runs]
    want = [(PREV if p is None else RECORDS[p].checkpoint, RECORDS[i], RECORDS[j]) for p, i, j in runs]
    assert got == want
    for r in ex.runs:  # runs are consecutive slices
        i = RECORDS.index(r.records[0])
        assert list(r.records) == RECORDS[i:i + len(r.records)]
    assert ex.covering == [landed[i] for i in covering]
    assert ex.last_covered_by == (None if last_cover is None else landed[last_cover])


def test_every_record_once_either_written_or_covered():
    landed = [span(1, 2), span(5, 5), span(8, 10)]
    ex = exclude_landed(RECORDS, PREV, landed)
    written = [r for run in ex.runs for r in run.records]
    covered = [r for r in RECORDS if any(b.first.key() <= r.position() <= b.last.key() for b in landed)]
    assert sorted(written + covered, key=lambda r: r.position()) == RECORDS
    assert not set(map(id, written)) & set(map(id, covered))


def test_empty_buffer():
    assert exclude_landed([], PREV, []).runs == []
    assert exclude_landed([], PREV, [span(0, 1)]).runs == []
