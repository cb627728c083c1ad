"""A window counts as materialised only through its commit (written last, naming the batches read)."""
from __future__ import annotations

import shutil

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.transform.job import transform_window, window_partition
from kcl_pipeline.windows.checkpoints.plan import plan_checkpoints
from kcl_pipeline.windows.manifest import (
    CommitFormatError,
    Materialised,
    WindowCommit,
    batch_materialised,
    commit_key,
    late_batches,
    read_materialised,
    reopened_windows,
)
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import parse_batch_key
from kcl_pipeline.zone.store import open_store as open_zone

from .landing_batches import MINUTE, SHARD0, T0, Rec, seq, write_local

WINDOW_MS = 2 * MINUTE
TH = Checkpoint("TRIM_HORIZON")


def good(i: int) -> bytes:
    return b'{"i":%d}' % i


def run(spark, zone, out):
    return transform_window(spark, zone=str(zone), stream="s1", window_start_ms=T0, window_end_ms=T0 + WINDOW_MS,
                            output_uri=str(out))


def plan(zone, out):
    batches = {SHARD0: list_batches(open_zone(str(zone)), "s1", T0, T0 + WINDOW_MS)}
    return plan_checkpoints(read_materialised(open_zone(str(out))), WINDOW_MS, batches, {}, [Lease(SHARD0, TH)])


@pytest.fixture
def zone(tmp_path):
    root = tmp_path / "zone"
    write_local(root, "s1", [Rec(SHARD0, seq(i), good(i), T0 + i) for i in range(1, 4)])
    write_local(root, "s1", [Rec(SHARD0, seq(5), b"not json", T0 + MINUTE + 1)])  # quarantined
    return root


def test_committed_window_advances_through_its_batches(spark, zone, tmp_path):
    out = tmp_path / "out"
    run(spark, zone, out)
    commit = WindowCommit.from_json((out / commit_key(T0)).read_bytes())
    assert commit.batches == {b.key() for b in list_batches(open_zone(str(zone)), "s1")}
    assert commit.datasets["quarantine"]["rows"] == 1 and commit.datasets["transformed"]["rows"] == 3
    assert plan(zone, out).commits == {SHARD0: Checkpoint(seq(5))}


def test_window_folder_without_commit_does_not_advance_checkpoints(spark, zone, tmp_path):
    out = tmp_path / "out"
    run(spark, zone, out)
    (out / commit_key(T0)).unlink()  # the state of a run cut off before its commit
    assert (out / "transformed" / window_partition(T0) / "_manifest.json").exists()
    assert read_materialised(open_zone(str(out))).windows == []
    assert plan(zone, out).commits == {}


def test_failed_quarantine_write_leaves_window_unmaterialised(spark, zone, tmp_path):
    out = tmp_path / "out"
    run(spark, zone, out)
    assert plan(zone, out).commits == {SHARD0: Checkpoint(seq(5))}
    shutil.rmtree(out / "quarantine")
    (out / "quarantine").write_bytes(b"")  # the quarantine dataset can no longer be written
    # The error is the Spark backend's own (Py4J, Spark Connect or the OS): any failure of the run will do.
    with pytest.raises(Exception):  # noqa: B017
        run(spark, zone, out)
    assert (out / "transformed" / window_partition(T0) / "_manifest.json").exists()  # transformed was replaced
    assert not (out / commit_key(T0)).exists()
    assert plan(zone, out).commits == {}


def test_late_batch_reopens_window_and_is_not_checkpointed(spark, zone, tmp_path):
    out = tmp_path / "out"
    run(spark, zone, out)
    late = write_local(zone, "s1", [Rec(SHARD0, seq(7), good(7), T0 + MINUTE + 30)])
    shard_plan = plan(zone, out).shards[SHARD0]
    assert shard_plan.commit == Checkpoint(seq(5))  # through what the run read, not the late batch
    assert "landed after its run" in shard_plan.reason
    materialised = read_materialised(open_zone(str(out)))
    assert reopened_windows(materialised, [(T0, late)]) == [T0]
    run(spark, zone, out)  # the new run takes the late batch in
    assert plan(zone, out).commits == {SHARD0: Checkpoint(seq(7))}
    assert reopened_windows(read_materialised(open_zone(str(out))), [(T0, late)]) == []


def test_batch_materialised_needs_the_batch_named():
    m = Materialised({T0: frozenset({"a"})})
    assert batch_materialised(m, T0, "a")
    assert not batch_materialised(m, T0, "b")
    assert not batch_materialised(m, T0 + WINDOW_MS, "a")
    assert batch_materialised({T0}, T0, "b")  # a window asserted whole by the caller
    assert not batch_materialised({T0: frozenset({"a"})}, T0, "b")


@pytest.mark.parametrize("raw", [b"{", b"{}",
                                 b'{"window_start_ms": 2, "window_end_ms": 1, "run_id": "r", "batches": []}'])
def test_malformed_commit_is_a_clear_error(raw, tmp_path):
    (tmp_path / "_commits").mkdir()
    (tmp_path / commit_key(T0)).write_bytes(raw)
    with pytest.raises(CommitFormatError, match="not a window commit|not after its start"):
        read_materialised(open_zone(str(tmp_path)))


def test_commit_keys_parse_back_to_batches():
    assert parse_batch_key(commit_key(T0)) is None  # a commit is never mistaken for a landed batch


def test_late_batches_names_each_materialised_window_and_its_unnamed_batches():
    m = Materialised({T0: frozenset({"a"}), T0 + WINDOW_MS: frozenset({"c"})})
    landed = [(T0, "a"), (T0, "z"), (T0, "b"), (T0 + WINDOW_MS, "c"), (T0 + 2 * WINDOW_MS, "d")]
    assert late_batches(m, landed) == {T0: ["b", "z"]}  # an unmaterialised window is not late, only pending
    assert reopened_windows(m, landed) == [T0]
