"""The lineage audit: each check passes and fails on purpose; the whole audit over a landed zone and an output."""
from __future__ import annotations

import os

import pytest

from kcl_pipeline.audit.lineage import (
    AuditReport,
    OutputCounts,
    audit_window,
    check_chain,
    check_checkpoints,
    check_counts,
    materialised_windows,
    output_partition,
    read_output_counts,
)
from kcl_pipeline.audit.stream import audit
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.zone.chain import ChainReport, Gap, list_batches
from kcl_pipeline.zone.layout import MINUTE_MS, BatchKey
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor
from kcl_pipeline.zone.store import open_store

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records, seq, write_commit

W = 2 * MINUTE_MS
SHARD1 = "shardId-000000000001"
TH = Checkpoint("TRIM_HORIZON")


def cp(i: int) -> Checkpoint:
    return Checkpoint(seq(i))


def chain(shard=SHARD, first=1, last=9, after: Checkpoint | None = cp(0), gaps=()) -> ChainReport:
    return ChainReport(shard, batches=3, rows=9, first=cp(first), last=cp(last), starts_after=after, gaps=list(gaps))


@pytest.mark.parametrize("reports,previous,ok", [
    ({SHARD: chain()}, {}, True),  # nothing before it in the previous window: not stitched, not broken
    ({SHARD: chain()}, {SHARD: cp(0)}, True),  # follows on from the previous window
    ({SHARD: chain()}, {SHARD: cp(7)}, False),  # does not follow on
    ({SHARD: chain(after=TH)}, {SHARD: cp(0)}, False),  # restarted from a sentinel although records precede it
    ({SHARD: chain(gaps=[Gap(cp(3), cp(4), "k")])}, {}, False),
    ({SHARD: chain(), SHARD1: chain(SHARD1)}, {SHARD1: cp(0)}, True),
])
def test_check_chain(reports, previous, ok):
    outcome = check_chain(T0, T0 + W, reports, previous)
    assert outcome.ok is ok and outcome.check == "chain"
    assert outcome.metadata["shards"] == len(reports) and outcome.metadata["broken_shards"] == (0 if ok else 1)
    assert any(SHARD in line for line in outcome.details)


@pytest.mark.parametrize("landed,dups,output,transform,ok", [
    (10, 0, None, None, True),  # not transformed yet: nothing to reconcile
    (10, 0, OutputCounts(8, 2), None, True),
    (12, 2, OutputCounts(8, 2), None, True),  # two records landed twice, dropped
    (10, 0, OutputCounts(8, 1), None, False),  # a record went missing
    (10, 0, OutputCounts(9, 2), None, False),  # one too many
    (12, 2, OutputCounts(8, 2), {"rows_in": 12, "duplicates_dropped": 2, "rows_out": 8, "quarantined": 2}, True),
    (12, 2, OutputCounts(8, 2), {"rows_in": 11, "duplicates_dropped": 2, "rows_out": 8, "quarantined": 2}, False),
    (12, 2, OutputCounts(8, 2), {"duplicates_dropped": 1}, False),
])
def test_check_counts(landed, dups, output, transform, ok):
    outcome = check_counts(T0, T0 + W, landed, dups, output, transform)
    assert outcome.ok is ok and outcome.metadata["landed_rows"] == landed


def key(shard: str, first: int, last: int, minute: int = T0) -> BatchKey:
    return BatchKey(STREAM, shard, minute, cp(first), cp(last))


WINDOW_BATCHES = [key(SHARD, 10, 19), key(SHARD, 20, 29, T0 + MINUTE_MS), key(SHARD1, 5, 8)]


def lease(shard: str, checkpoint: Checkpoint, landed: int | None = 40, java: bool = False) -> Lease:
    """Held by "w": by this protocol's take (leaseClaimOwner names it), or `java`: taken by a Java KCL worker."""
    extra = ShardProgress(shard, cp(landed), T0).to_attributes() if landed is not None else {}
    extra[CLAIM_OWNER_ATTRIBUTE] = "an-earlier-holder" if java else "w"
    return Lease(shard, checkpoint, lease_owner="w", extra=extra)


@pytest.mark.parametrize("leases,materialised,ok", [
    ([lease(SHARD, cp(29)), lease(SHARD1, cp(8))], True, True),  # committed through a materialised window
    ([lease(SHARD, cp(9)), lease(SHARD1, cp(4))], False, True),  # not materialised, checkpoints before it
    ([lease(SHARD, TH), lease(SHARD1, TH)], False, True),
    ([lease(SHARD, cp(19)), lease(SHARD1, cp(4))], False, False),  # reaches into an unmaterialised window
    ([lease(SHARD, cp(10))], False, False),
    ([lease(SHARD, Checkpoint("SHARD_END"), landed=29)], False, True),  # its last record is in this window
    ([lease(SHARD, Checkpoint("SHARD_END"), landed=45)], False, False),  # ended before this window materialised
    ([lease(SHARD, cp(50), landed=40)], True, False),  # past the last landed record
    # A Java holder's checkpoint is its own processor's: past the zone (it lands nothing), not ours to judge.
    ([lease(SHARD, cp(50), landed=40, java=True)], True, True),
    ([lease("shardId-000000000009", cp(3))], False, True),  # no batch of it in this window
])
def test_check_checkpoints(leases, materialised, ok):
    progress = {lz.lease_key: ShardProgress.from_lease(lz) for lz in leases if lz.extra}
    outcome = check_checkpoints(T0, T0 + W, WINDOW_BATCHES, leases, progress, materialised)
    assert outcome.ok is ok and outcome.metadata["violations"] == (0 if ok else 1)


def test_output_partition_is_the_transforms():
    pytest.importorskip("pyspark")  # absent from a core install
    from kcl_pipeline.transform.job import window_partition

    for start in (T0, T0 + 7 * MINUTE_MS, 0):
        assert output_partition(start) == window_partition(start)


# -- over a landed zone ---------------------------------------------------------------------------------------

@pytest.fixture
def landed(local_zone, tmp_path):
    """Two shards, three minutes each (30 records a minute), landed by the sink; an empty output directory."""
    uri, store = local_zone
    records = {}
    for shard in (SHARD, SHARD1):
        records[shard] = make_records(90, shard=shard, per_minute=30, seed=len(records))
        p = LandingProcessor(uri, STREAM, max_batch_records=12, clock=Clock(T0).time)
        init(p, shard=shard)
        p.shutdown_requested(deliver(p, records[shard], 20))
    out = tmp_path / "output"
    out.mkdir()
    return uri, store, str(out), records


def write_output(out: str, start: int, transformed: int, quarantined: int, zone: str) -> None:
    """A transform run's output for the window: dataset manifests, then the commit naming its landed batches."""
    batches = list_batches(open_store(zone), STREAM, start, start + W)
    write_commit(open_store(out), start, start + W, batches, transformed, quarantined)


def test_audit_of_a_sound_window(landed):
    uri, store, out, records = landed
    write_output(out, T0, 110, 10, uri)  # the first 2-minute window: 2 shards x 60 records
    counts = read_output_counts(open_store(out), T0)
    assert counts is not None and (counts.transformed_rows, counts.quarantined_rows) == (110, 10)
    assert counts.batches == frozenset(b.key() for b in list_batches(store, STREAM, T0, T0 + W))
    assert read_output_counts(open_store(out), T0 + W) is None
    last = {s: r[59].checkpoint for s, r in records.items()}
    leases = [Lease(s, c, extra=ShardProgress(s, records[s][-1].checkpoint, T0).to_attributes())
              for s, c in last.items()]
    report = audit(uri, out, STREAM, W, window=(T0, T0 + 2 * W), leases=leases, now_ms=T0 + 2 * W)
    assert report.ok, report.lines()
    assert [(o.window_start_ms, o.check) for o in report.outcomes] == [
        (T0, "chain"), (T0, "counts"), (T0, "checkpoints"), (T0 + W, "chain"), (T0 + W, "counts"),
        (T0 + W, "checkpoints")]
    text = "\n".join(report.lines())
    assert "landed 120 = transformed 110 + duplicates 0 + quarantined 10" in text
    assert "window not transformed yet" in text and "follows" in text and text.endswith("6 checks over 2 windows")


def test_audit_finds_a_lost_batch_a_count_mismatch_and_an_early_checkpoint(landed):
    uri, store, out, records = landed
    write_output(out, T0, 110, 9, uri)
    batches = sorted(list_batches(store, STREAM, T0, T0 + W, SHARD), key=lambda b: b.first.key())
    os.unlink(os.path.join(uri, batches[2].key()))
    too_far = Lease(SHARD1, records[SHARD1][70].checkpoint)  # in the second window, which has no output
    outcomes = audit_window(store, open_store(out), STREAM, T0, T0 + W, leases=[too_far])
    by_check = {o.check: o for o in outcomes}
    assert not by_check["chain"].ok and "gap after" in " ".join(by_check["chain"].details)
    assert not by_check["counts"].ok
    assert by_check["checkpoints"].ok  # the first window materialised
    second = {o.check: o for o in audit_window(store, open_store(out), STREAM, T0 + W, T0 + 2 * W, leases=[too_far])}
    assert not second["checkpoints"].ok and "reaches into this window" in second["checkpoints"].summary
    report = AuditReport(outcomes + list(second.values()))
    assert not report.ok and report.lines()[-1].startswith("FAILED: 6 checks over 2 windows, 3 failed")


def test_audit_counts_records_landed_twice(landed):
    from kcl_pipeline.zone.batch import encode_batch

    uri, store, out, records = landed
    dup = records[SHARD][5:9]
    batch = encode_batch(STREAM, SHARD, dup, records[SHARD][4].checkpoint)
    store.put_if_absent(batch.key.key(), batch.body)
    write_output(out, T0, 110, 10, uri)
    counts, = audit_window(store, open_store(out), STREAM, T0, T0 + W, checks=["counts"])
    assert counts.ok and counts.metadata["duplicate_rows"] == 4 and counts.metadata["landed_rows"] == 124
    chain_check, = audit_window(store, open_store(out), STREAM, T0, T0 + W, checks=["chain"])
    assert not chain_check.ok and "overlap" in " ".join(chain_check.details)


def test_audit_defaults_to_the_whole_history(landed):
    uri, store, out, _ = landed
    write_output(out, T0, 110, 10, uri)
    write_output(out, T0 + W, 60, 0, uri)
    assert materialised_windows(open_store(out)) == [T0, T0 + W]
    report = audit(uri, out, STREAM, W)
    assert report.ok and report.scopes[0].windows == 2
    assert [o.check for o in report.outcomes] == ["chain", "counts", "checkpoints"]  # one summary per check
    assert "no lease table given" in report.outcomes[-1].summary


def test_a_window_landed_and_never_transformed_fails_the_audit_once_overdue(landed):
    """A stalled pipeline (a transform run lost with the code server, say) left two windows landed and never
    transformed: the audit must not stay green — not for the default selection either, which once looked
    only at materialised windows and so audited nothing at all."""
    uri, store, out, _ = landed
    grace = 5 * MINUTE_MS
    fresh = audit(uri, out, STREAM, W, now_ms=T0 + 2 * W, transform_grace_ms=grace)
    assert fresh.ok and fresh.scopes[0].windows == 2
    stalled = audit(uri, out, STREAM, W, now_ms=T0 + 2 * W + grace + 1, transform_grace_ms=grace)
    failed = [o for o in stalled.outcomes if not o.ok and not o.whole_history]
    assert not stalled.ok and {(o.window_start_ms, o.check) for o in failed} == {(T0, "counts"), (T0 + W, "counts")}
    assert "never transformed" in failed[0].summary
    write_output(out, T0, 110, 10, uri)
    write_output(out, T0 + W, 60, 0, uri)
    assert audit(uri, out, STREAM, W, now_ms=T0 + 2 * W + grace + 1, transform_grace_ms=grace).ok


def test_check_counts_fails_a_landed_window_only_once_it_is_overdue():
    assert check_counts(T0, T0 + W, 10, 0, None).ok
    assert check_counts(T0, T0 + W, 0, 0, None, overdue_ms=60_000).ok  # nothing landed: nothing to transform
    late = check_counts(T0, T0 + W, 10, 0, None, overdue_ms=60_000)
    assert not late.ok and late.metadata["overdue_seconds"] == 60


def test_audit_rejects_bad_arguments(landed):
    uri, store, out, _ = landed
    with pytest.raises(ValueError, match="whole 2-minute windows"):
        audit(uri, out, STREAM, W, window=(T0 + MINUTE_MS, T0 + W))
    with pytest.raises(ValueError, match="window_ms"):
        audit(uri, out, STREAM, 1000)
    with pytest.raises(ValueError, match="transform_grace_ms"):
        audit(uri, out, STREAM, W, transform_grace_ms=-1)
    with pytest.raises(ValueError, match="unknown audit checks"):
        audit_window(store, open_store(out), STREAM, T0, T0 + W, checks=["nope"])


def test_a_missing_output_directory_means_nothing_materialised(landed, tmp_path):
    uri, store, _, _ = landed
    missing = open_store(str(tmp_path / "nowhere"))
    assert materialised_windows(missing) == [] and read_output_counts(missing, T0) is None


# -- the chain follows predecessors directly (footer prev_key) ------------------------------------------------

@pytest.fixture
def sparse(local_zone, tmp_path):
    """One shard with records in minutes 0 and 5 only: the windows between them hold no batch."""
    uri, store = local_zone
    records = make_records(40, per_minute=20)
    records = records[:20] + [r.__class__(r.shard_id, r.sequence_number, r.sub_sequence_number, r.partition_key,
                                          r.explicit_hash_key, r.approximate_arrival_timestamp_ms + 4 * MINUTE_MS,
                                          r.data, r.aggregated) for r in records[20:]]
    p = LandingProcessor(uri, STREAM, max_batch_records=8, clock=Clock(T0).time)
    init(p)
    p.shutdown_requested(deliver(p, records, 20))
    out = tmp_path / "output"
    out.mkdir()
    return uri, store, str(out), records


def _chain(store, out, t0):
    outcome, = audit_window(store, open_store(out), STREAM, t0, t0 + W, checks=["chain"])
    return outcome


def test_chain_detects_a_deleted_batch_when_the_previous_window_is_empty(sparse):
    uri, store, out, records = sparse
    late = T0 + 4 * MINUTE_MS  # the window of minute 5; the window before it has no batch
    assert _chain(store, out, late).ok
    last_early = max(list_batches(store, STREAM, T0, T0 + W), key=lambda b: b.last.key())
    os.unlink(os.path.join(uri, last_early.key()))
    outcome = _chain(store, out, late)
    assert not outcome.ok and "which the zone does not hold" in " ".join(outcome.details)


def test_chain_detects_a_duplicated_batch(sparse):
    from kcl_pipeline.zone.batch import encode_batch

    uri, store, out, records = sparse
    copy = encode_batch(STREAM, SHARD, records[2:9], records[1].checkpoint)
    store.put_if_absent(copy.key.key(), copy.body)
    outcome = _chain(store, out, T0)
    assert not outcome.ok and "overlap" in " ".join(outcome.details)


def test_chain_detects_a_reordered_batch(sparse):
    """A batch replaced by one that covers the same records but names another predecessor (re-ordered chain)."""
    from kcl_pipeline.zone.batch import encode_batch

    uri, store, out, records = sparse
    batches = sorted(list_batches(store, STREAM, T0, T0 + W), key=lambda b: b.first.key())
    second = batches[1]
    os.unlink(os.path.join(uri, second.key()))
    rows = [r for r in records if second.first.key() <= r.position() <= second.last.key()]
    forged = encode_batch(STREAM, SHARD, rows, batches[0].last, prev_key=batches[2].key())
    store.put_if_absent(forged.key.key(), forged.body)
    outcome = _chain(store, out, T0)
    assert not outcome.ok and "gap after" in " ".join(outcome.details)


def test_a_backfills_first_batch_is_a_valid_chain_start(local_zone, tmp_path):
    from kcl_pipeline.zone.batch import encode_batch

    uri, store = local_zone
    records = make_records(20, per_minute=10)
    first = encode_batch(STREAM, SHARD, records[10:15], Checkpoint("AT_TIMESTAMP", T0 + MINUTE_MS))
    store.put_if_absent(first.key.key(), first.body)
    (tmp_path / "out").mkdir()
    earlier = encode_batch(STREAM, SHARD, records[:10], TH)  # live data of the previous window
    store.put_if_absent(earlier.key.key(), earlier.body)
    outcome, = audit_window(store, open_store(str(tmp_path / "out")), STREAM, T0 + MINUTE_MS, T0 + 2 * MINUTE_MS,
                            checks=["chain"])
    assert outcome.ok, outcome.details


def test_the_overlap_sweep_finds_exactly_the_batches_a_pairwise_comparison_finds():
    """The counts check reads only the batches whose ranges overlap another's; one sort and sweep per shard must
    pick the same ones, in the same order, as comparing every pair (ties, nesting, touching ends, equal ranges,
    two shards interleaved)."""
    import random

    from kcl_pipeline.zone.layout import overlapping_batches

    rng = random.Random(11)
    for trial in range(400):
        batches = []
        for _ in range(rng.randrange(0, 12)):
            first = (rng.randrange(1, 40), rng.randrange(0, 3))
            last = max(first, (first[0] + rng.randrange(0, 6), rng.randrange(0, 3)))
            batches.append(BatchKey(STREAM, rng.choice([SHARD, "shardId-000000000009"]), T0,
                                    Checkpoint(str(first[0]), first[1]), Checkpoint(str(last[0]), last[1])))
        by_shard: dict[str, list[BatchKey]] = {}
        for b in batches:
            by_shard.setdefault(b.shard_id, []).append(b)
        pairwise = [b for mine in by_shard.values() for b in mine if any(o is not b and o.overlaps(b) for o in mine)]
        assert overlapping_batches(batches) == pairwise, (trial, batches)
