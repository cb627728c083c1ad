"""The audit judges materialisation by the window commit, as the checkpoint plan does — never by the per-dataset
`_manifest.json` files, which a run that deleted the commit and then failed leaves behind (issue 20, item 4)."""
from __future__ import annotations

import pytest

from kcl_pipeline.audit.lineage import (
    audit_window,
    check_checkpoints,
    materialised_windows,
    read_output_counts,
)
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.windows.manifest import CommitFormatError, commit_key
from kcl_pipeline.zone.batch import encode_batch, read_batch_info
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records, write_commit

W = 2 * MINUTE_MS
SHARD1 = "shardId-000000000001"
GRACE = 5 * MINUTE_MS
LATE = T0 + W + GRACE + 1  # the first window is overdue


@pytest.fixture
def zone(local_zone, memory_zone):
    """Two shards, three minutes of 30 records each, landed by the sink; an empty output (memory store)."""
    uri, store = local_zone
    records = {}
    for shard in (SHARD, SHARD1):
        records[shard] = make_records(90, shard=shard, per_minute=30, seed=len(records))
        p = LandingProcessor(uri, STREAM, max_batch_records=12, clock=Clock(T0).time)
        init(p, shard=shard)
        p.shutdown_requested(deliver(p, records[shard], 20))
    return store, memory_zone.store, records


def checks(store, output, t0=T0, **kw):
    return {o.check: o for o in audit_window(store, output, STREAM, t0, t0 + W, **kw)}


def lease(shard: str, checkpoint: Checkpoint, records) -> Lease:
    return Lease(shard, checkpoint, extra=ShardProgress(shard, records[shard][-1].checkpoint, T0).to_attributes())


def test_a_window_whose_commit_is_gone_is_not_materialised_though_its_dataset_manifests_remain(zone):
    """A re-run deleted the window's commit, rewrote the dataset manifests and failed: the checkpoint plan is
    stuck on that window, and the audit used to say counts and checkpoints were fine (it read the manifests)."""
    store, output, records = zone
    write_commit(output, T0, T0 + W, list_batches(store, STREAM, T0, T0 + W), 110, 10)
    assert checks(store, output, now_ms=LATE, transform_grace_ms=GRACE)["counts"].ok
    output.delete([commit_key(T0)])
    assert read_output_counts(output, T0) is None and materialised_windows(output) == []
    through = [lease(s, records[s][59].checkpoint, records) for s in (SHARD, SHARD1)]  # through the window
    outcome = checks(store, output, now_ms=LATE, transform_grace_ms=GRACE, leases=through)
    assert not outcome["counts"].ok and "never transformed" in outcome["counts"].summary
    assert not outcome["checkpoints"].ok and "has not materialised" in outcome["checkpoints"].summary
    assert outcome["chain"].ok  # the chain itself is sound


def test_rows_reconcile_counts_the_batches_the_commit_names_and_a_late_batch_waits_for_a_new_run(zone):
    store, output, records = zone
    batches = list_batches(store, STREAM, T0, T0 + W)
    late = max((b for b in batches if b.shard_id == SHARD), key=lambda b: b.last.key())
    named = [b for b in batches if b != late]
    late_rows = read_batch_info(store, late).rows
    rows = 120 - late_rows
    write_commit(output, T0, T0 + W, named, rows - 10, 10)  # the run read every batch but the late one
    fresh = checks(store, output, now_ms=T0 + W, transform_grace_ms=GRACE)["counts"]
    assert fresh.ok and "1 batches landed after its run" in fresh.summary and late_rows > 0
    assert fresh.metadata["landed_rows"] == rows and fresh.metadata["late_batches"] == 1
    overdue = checks(store, output, now_ms=LATE, transform_grace_ms=GRACE)["counts"]
    assert not overdue.ok and "landed after the window's run and were never transformed" in overdue.summary
    assert late.key() in overdue.summary


def test_a_checkpoint_through_a_batch_the_commit_does_not_name_fails(zone):
    store, output, records = zone
    batches = list_batches(store, STREAM, T0, T0 + W)
    late = max((b for b in batches if b.shard_id == SHARD), key=lambda b: b.last.key())
    write_commit(output, T0, T0 + W, [b for b in batches if b != late], 100, 10)
    before = [lease(SHARD, records[SHARD][0].checkpoint, records)]
    assert checks(store, output, leases=before)["checkpoints"].ok
    through = [lease(SHARD, late.last, records)]
    outcome = checks(store, output, leases=through)["checkpoints"]
    assert not outcome.ok and f"whose batch {late.key()} its commit does not name" in outcome.summary


def test_a_batch_the_commit_names_that_the_zone_lost_fails_the_counts(zone):
    store, output, records = zone
    batches = list_batches(store, STREAM, T0, T0 + W)
    write_commit(output, T0, T0 + W, batches, 110, 10)
    store.delete([batches[3].key()])
    outcome = checks(store, output)["counts"]
    assert not outcome.ok and "names 1 batches the zone no longer holds" in outcome.summary
    assert batches[3].key() in outcome.summary and outcome.metadata["missing_batches"] == 1


def test_records_landed_twice_are_counted_among_the_named_batches(zone):
    store, output, records = zone
    dup = encode_batch(STREAM, SHARD, records[SHARD][5:9], records[SHARD][4].checkpoint)
    store.put_if_absent(dup.key.key(), dup.body)
    write_commit(output, T0, T0 + W, list_batches(store, STREAM, T0, T0 + W), 110, 10)
    counts = checks(store, output)["counts"]
    assert counts.ok and counts.metadata["duplicate_rows"] == 4 and counts.metadata["landed_rows"] == 124


EMPTY_COMMIT = b'{"window_start_ms": %d, "window_end_ms": %d, "run_id": "r", "batches": [], "datasets": {}}'


@pytest.mark.parametrize("body,error", [
    (b'{"window_start_ms": 1, "window_end', "not a window commit"),  # truncated: once a raw JSONDecodeError
    (EMPTY_COMMIT % (T0, T0 + W), "no row count or files for the transformed and quarantine datasets"),
    (EMPTY_COMMIT % (T0 + W, T0 + 2 * W), "the commit of window"),
])
def test_an_unreadable_commit_fails_the_counts_check_naming_the_object(zone, body, error):
    store, output, _ = zone
    output.put(commit_key(T0), body)
    with pytest.raises(CommitFormatError, match=error):
        read_output_counts(output, T0)
    outcome = checks(store, output)["counts"]
    assert not outcome.ok and error in outcome.summary and commit_key(T0) in outcome.summary


def test_a_truncated_dataset_manifest_is_not_what_the_audit_reads(zone):
    """The audit read `_manifest.json` with a bare json.loads: a truncated one stopped it with a raw
    JSONDecodeError. The commit carries the rows; the manifest is the dataset readers' switch."""
    store, output, _ = zone
    write_commit(output, T0, T0 + W, list_batches(store, STREAM, T0, T0 + W), 110, 10)
    output.put("transformed/window=20261122T030000Z/_manifest.json", b'{"rows": 1')
    counts = read_output_counts(output, T0)
    assert counts is not None and (counts.transformed_rows, counts.quarantined_rows) == (110, 10)
    assert counts.batches == frozenset(b.key() for b in list_batches(store, STREAM, T0, T0 + W))
    assert checks(store, output)["counts"].ok


def test_the_checkpoints_check_takes_the_commits_batch_list():
    from kcl_pipeline.zone.layout import BatchKey

    from .helpers import seq

    a = BatchKey(STREAM, SHARD, T0, Checkpoint(seq(1)), Checkpoint(seq(5)))
    b = BatchKey(STREAM, SHARD, T0 + MINUTE_MS, Checkpoint(seq(6)), Checkpoint(seq(9)))
    leases = [Lease(SHARD, Checkpoint(seq(5)))]
    assert check_checkpoints(T0, T0 + W, [a, b], leases, {}, {a.key()}).ok
    assert not check_checkpoints(T0, T0 + W, [a, b], leases, {}, {b.key()}).ok
    assert check_checkpoints(T0, T0 + W, [a, b], [Lease(SHARD, Checkpoint(seq(9)))], {}, True).ok
    assert not check_checkpoints(T0, T0 + W, [a, b], [Lease(SHARD, Checkpoint(seq(9)))], {}, {a.key()}).ok


def test_output_files_the_commit_names_that_are_gone_fail_the_counts(zone):
    """The commit says the window is materialised; its transformed rows lie in the files it names. A dataset
    removed after the run (a cleanup gone wrong) is records lost, though the commit is still there."""
    store, output, _ = zone
    write_commit(output, T0, T0 + W, list_batches(store, STREAM, T0, T0 + W), 110, 10)
    output.delete_prefix("transformed/")
    outcome = checks(store, output)["counts"]
    assert not outcome.ok and "names 1 output files the output no longer holds" in outcome.summary
    assert "transformed/window=20261122T030000Z/run=job-1/part-0.parquet" in outcome.summary
