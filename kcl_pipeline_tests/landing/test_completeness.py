"""Window completeness (pure), table-driven: idle, ended, born mid-window, aged-out and late-reported shards."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.windows.completeness import window_complete
from kcl_pipeline.zone.progress import ShardProgress, merge_all

from .helpers import seq

T0 = 1_795_316_400_000
T1 = T0 + 3_600_000
GRACE = 5_000
MIN = 60_000

# A split at some time: A -> B, C; D is a root that never split; E + F merged into G.
A, B, C, D, E, F, G = ("shardId-A", "shardId-B", "shardId-C", "shardId-D", "shardId-E", "shardId-F", "shardId-G")
GRAPH = [Shard(A), Shard(B, A), Shard(C, A), Shard(D), Shard(E), Shard(F), Shard(G, E, F)]


def lease(key: str, cp: str = seq(1), sub: int = 0) -> Lease:
    return Lease(key, Checkpoint(cp, sub))


def landed(key: str, arrival: int, *, end: bool = False) -> ShardProgress:
    return ShardProgress(key, Checkpoint(seq(arrival % 1000 + 1)), arrival, shard_end_landed=end)


def holding(key: str, landed_arrival: int, next_arrival: int | None) -> ShardProgress:
    """Landed up to a record arriving at `landed_arrival`; holds (read, not landed) the one after, arriving at
    `next_arrival`."""
    return ShardProgress(key, Checkpoint(seq(3)), landed_arrival, next_arrival_ms=next_arrival)


def polled(key: str, at: int, behind: int = 0, arrival: int | None = None) -> ShardProgress:
    return ShardProgress(key, Checkpoint(seq(2)) if arrival else None, arrival, at, behind)


def past(*keys):
    return {k: landed(k, T1 + 10) for k in keys}


ENDED = Checkpoint("SHARD_END")

CASES = [
    # (id, shards, leases, progress, waiting_on)
    ("every shard landed past t1",
     [Shard(D)], [lease(D)], past(D), []),
    ("landed exactly at t1 counts",
     [Shard(D)], [lease(D)], {D: landed(D, T1)}, []),
    ("landed just before t1: waiting",
     [Shard(D)], [lease(D)], {D: landed(D, T1 - 1)}, [D]),
    ("the record after the last landed one is held and arrived past t1",
     [Shard(D)], [lease(D)], {D: holding(D, T1 - 5, T1 + 10)}, []),
    ("the held record arrived exactly at t1 counts",
     [Shard(D)], [lease(D)], {D: holding(D, T1 - 5, T1)}, []),
    ("the held record arrived just before t1: waiting",
     [Shard(D)], [lease(D)], {D: holding(D, T1 - 5, T1 - 1)}, [D]),
    ("nothing held after the last landed record: waiting",
     [Shard(D)], [lease(D)], {D: holding(D, T1 - 5, None)}, [D]),
    ("a held arrival without a landed record (the chain's start not settled) is no proof: waiting",
     [Shard(D)], [lease(D)], {D: ShardProgress(D, next_arrival_ms=T1 + 10)}, [D]),
    ("split mid-window: one child holds a record past t1, the other landed one",
     GRAPH[:3], [Lease(A, ENDED), lease(B), lease(C)], {B: holding(B, T0, T1 + 1), C: landed(C, T1 + 1)}, []),
    ("idle shard caught up after t1 + grace",
     [Shard(D)], [lease(D)], {D: polled(D, T1 + GRACE)}, []),
    ("idle shard caught up inside the grace: waiting",
     [Shard(D)], [lease(D)], {D: polled(D, T1 + GRACE - 1)}, [D]),
    ("polled late but behind: waiting",
     [Shard(D)], [lease(D)], {D: polled(D, T1 + 10 * GRACE, behind=1)}, [D]),
    ("behind unknown (no successful poll): waiting",
     [Shard(D)], [lease(D)], {D: ShardProgress(D, polled_at_ms=T1 + 10 * GRACE)}, [D]),
    ("leased but no progress yet: waiting",
     [Shard(D)], [lease(D)], {}, [D]),
    ("ended by lease (SHARD_END)",
     [Shard(D)], [Lease(D, ENDED)], {}, []),
    ("ended by progress (last record landed, plan has not ended it yet)",
     [Shard(D)], [lease(D)], {D: landed(D, T0 + MIN, end=True)}, []),
    ("split mid-window: children not leased yet (wait for the parent's SHARD_END)",
     GRAPH[:3], [lease(A)], {A: landed(A, T0 + 10 * MIN, end=True)}, [B, C]),
    ("split mid-window: children leased, one landed past t1, one idle and caught up",
     GRAPH[:3], [lease(A), lease(B, "TRIM_HORIZON"), lease(C, "TRIM_HORIZON")],
     {A: landed(A, T0 + 10 * MIN, end=True), B: landed(B, T1 + 1), C: polled(C, T1 + GRACE)}, []),
    ("split mid-window: one child still behind",
     GRAPH[:3], [Lease(A, ENDED), lease(B), lease(C)],
     {B: landed(B, T1 + 1), C: polled(C, T1 + GRACE, behind=30_000, arrival=T0 + 50 * MIN)}, [C]),
    ("split after the window: the parent landed past t1, the children cannot hold window records",
     GRAPH[:3], [lease(A)], {A: landed(A, T1 + 2 * MIN)}, []),
    ("grandchildren of a parent open past t1 are born after the window too",
     GRAPH[:3] + [Shard("shardId-B1", B)], [lease(A)], {A: landed(A, T1 + 2 * MIN)}, []),
    ("parent's lease gone (finished and deleted), children leased and past t1",
     GRAPH[:3], [lease(B), lease(C)], past(B, C), []),
    ("parent's lease gone, but a child is behind: only the child is waited on",
     GRAPH[:3], [lease(B), lease(C)], {**past(B), C: landed(C, T1 - 1)}, [C]),
    ("LATEST on an empty table: closed ancestors never leased, open shards caught up",
     GRAPH[:3], [lease(B, "LATEST"), lease(C, "LATEST")],
     {B: polled(B, T1 + GRACE), C: polled(C, T1 + GRACE)}, []),
    ("merge mid-window: the child waits for both parents",
     GRAPH[4:], [Lease(E, ENDED), lease(F)], {F: landed(F, T0 + 5 * MIN)}, [F, G]),
    ("merge after the window: one parent open past t1 is enough",
     GRAPH[4:], [lease(E), lease(F)], {E: landed(E, T1 + 5), F: landed(F, T1 + 9)}, []),
    ("a shard starting AT_TIMESTAMP after the window cannot hold its records",
     [Shard(D)], [lease(D, "AT_TIMESTAMP", T1)], {}, []),
    ("a shard starting AT_TIMESTAMP inside the window is waited on",
     [Shard(D)], [lease(D, "AT_TIMESTAMP", T1 - 1)], {}, [D]),
    ("shards no longer listed (aged out) are ignored, whatever their lease says",
     [Shard(D)], [lease(D), lease("shardId-gone")], {**past(D), "shardId-gone": landed("shardId-gone", T0)}, []),
    ("a listed shard with no lease and no leased descendant is waited on",
     [Shard(D)], [], {}, [D]),
]


@pytest.mark.parametrize("shards,leases,progress,waiting", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_window_complete(shards, leases, progress, waiting):
    status = window_complete(T0, T1, shards, progress, leases, GRACE)
    assert status.waiting_on == sorted(waiting)
    assert status.complete == (not waiting)
    assert set(status.reasons) == {s.shard_id for s in shards}  # every listed shard is explained
    # the same answer with leases given as a mapping
    again = window_complete(T0, T1, shards, progress, {lease.lease_key: lease for lease in leases}, GRACE)
    assert again.waiting_on == status.waiting_on


def test_reasons_say_why():
    status = window_complete(T0, T1, GRAPH[:3], {A: landed(A, T0 + 10 * MIN, end=True)}, [lease(A)], GRACE)
    assert "waits for parent shardId-A" in status.reasons[B]
    assert status.reasons[A].startswith("ended")
    status = window_complete(T0, T1, [Shard(D)], {D: landed(D, T1 - 1)}, [lease(D)], GRACE)
    assert "landed up to" in status.reasons[D]


def test_late_progress_from_another_consumer():
    """A stale snapshot (the lease scan) and a fresh report (a local worker), in either order."""
    stale = {D: polled(D, T1 - MIN, behind=0, arrival=T0 + 5 * MIN)}
    fresh = {D: polled(D, T1 + GRACE + 1, behind=0, arrival=T0 + 5 * MIN)}
    for sources in [(stale, fresh), (fresh, stale)]:
        merged = merge_all(*sources)
        assert window_complete(T0, T1, [Shard(D)], merged, [lease(D)], GRACE).complete
    assert not window_complete(T0, T1, [Shard(D)], stale, [lease(D)], GRACE).complete


def test_a_held_record_says_why():
    status = window_complete(T0, T1, [Shard(D)], {D: holding(D, T1 - 5, T1 + 10)}, [lease(D)], GRACE)
    assert status.reasons[D].startswith(f"holds the record after {seq(3)}")


def test_the_next_record_stays_proof_when_its_batch_lands_or_a_late_report_comes():
    """Progress from two holders, in either order: the held record's report, and one after its batch landed
    (`landed` moved past it: its arrival at least the held record's). Neither order un-completes the window."""
    held = {D: holding(D, T1 - 5, T1 + 10)}
    flushed = {D: ShardProgress(D, Checkpoint(seq(9)), T1 + 20)}
    for sources in [(held, flushed), (flushed, held)]:
        assert window_complete(T0, T1, [Shard(D)], merge_all(*sources), [lease(D)], GRACE).complete
    # a report that has landed less, from a holder that re-read from an older checkpoint and holds nothing
    # yet, does not take the held record's proof away
    behind = {D: ShardProgress(D, Checkpoint(seq(2)), T1 - 30)}
    for sources in [(held, behind), (behind, held)]:
        assert window_complete(T0, T1, [Shard(D)], merge_all(*sources), [lease(D)], GRACE).complete


def test_an_earlier_window_is_complete_whenever_a_later_one_is():
    progress = {A: landed(A, T0 + 10 * MIN, end=True), B: landed(B, T1 + 1), C: polled(C, T1 + GRACE)}
    leases = [lease(A), lease(B), lease(C)]
    assert window_complete(T0, T1, GRAPH[:3], progress, leases, GRACE).complete
    assert window_complete(T0 - 3_600_000, T0, GRAPH[:3], progress, leases, GRACE).complete


@pytest.mark.parametrize("t0,t1,grace", [(T1, T0, 0), (T0, T0, 0), (T0, T1, -1)])
def test_bad_arguments(t0, t1, grace):
    with pytest.raises(ValueError):
        window_complete(t0, t1, [], {}, [], grace)
