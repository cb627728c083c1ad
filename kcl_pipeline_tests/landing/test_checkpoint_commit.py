"""One checkpoint commit (the kinesis_checkpoints asset's work): list from the zone, plan, commit, report."""
from __future__ import annotations

from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.windows.checkpoints.run import commit_checkpoints
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.zone.layout import BatchKey, link_key
from kcl_pipeline.zone.store import open_store
from kcl_pipeline.zone.stream_slice import StreamSlice

from .helpers import T0, seq

W = 120_000  # 2-minute windows
A = "shardId-000000000000"
TH = Checkpoint("TRIM_HORIZON")


class Table:
    """The lease table's writes the plan makes, in memory: checkpoints only move forward."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases = {lease.lease_key: lease for lease in leases}
        self.checkpoints: dict[str, Checkpoint] = {}

    def checkpoint(self, key: str, checkpoint: Checkpoint) -> bool:
        self.checkpoints[key] = checkpoint
        return True

    def end(self, key: str) -> bool:
        raise AssertionError(f"{key} has not landed its last record: it must not be ended")


def batch(minute: int, first: int, last: int) -> BatchKey:
    return BatchKey("s", A, minute, Checkpoint(seq(first)), Checkpoint(seq(last)))


def test_a_commit_plans_from_the_zone_commits_and_names_the_late_batches(tmp_path):
    zone, output = open_store(str(tmp_path / "zone")), open_store(str(tmp_path / "out"))
    zone.ensure_zone(create=True)
    output.ensure_zone(create=True)
    read, late, later = batch(T0, 1, 5), batch(T0 + 60_000, 6, 7), batch(T0 + W, 8, 9)
    for prev, b in ((TH, read), (read.last, late), (late.last, later)):
        # the plan reads keys only: each batch's link (what it follows) and the batch
        zone.put_if_absent(link_key("s", b.minute_ms, A, prev), b.key().encode())
        zone.put_if_absent(b.key(), b"a batch")
    # the first window's run read `read` only; `late` landed in that window after it listed the zone
    output.put_if_absent(commit_key(T0), WindowCommit(T0, T0 + W, "run-1", frozenset({read.key()})).to_json())
    leases = [Lease(A, TH, lease_owner="w")]
    table = Table(leases)

    report = commit_checkpoints(table, StreamSlice(StreamScope("s"), leases, [Shard(A)]), zone, output,
                                window_ms=W, first_window_ms=T0, initial=TH, grace_ms=0)

    assert table.checkpoints == {A: Checkpoint(seq(5))}  # never past the batch no run transformed
    assert report.late == {T0: [late.key()]} and report.materialised_windows == 1
    assert report.listed_from_ms == T0 and report.frontier == {A: T0}
    assert (report.commits, report.shard_ends, report.before_start) == (1, [], {})
    assert report.committed_rows() == [{"shard_id": A, "sequence_number": seq(5), "sub_sequence_number": 0,
                                        "checkpointed": True, "shard_end": False, "children_created": []}]
    assert report.plan_rows()[A]["commit"] == [seq(5), 0] and report.plan_rows()[A]["end"] is False
