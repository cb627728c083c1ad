"""`kcl-pipeline audit` covers the whole history, incrementally (issue 20, item 5): it looked at the newest 24
windows only, so a window that stalled earlier passed. Every run now judges every window, reading only the
objects its index (in the output zone) has no facts for."""
from __future__ import annotations

import re

import pytest

from kcl_pipeline.audit.history import AuditIncompleteError, audit_history
from kcl_pipeline.audit.index import INDEX_FORMAT, index_key
from kcl_pipeline.audit.stream import audit
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.windows.manifest import commit_key
from kcl_pipeline.zone.batch import read_batch_info
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.errors import ZoneUnavailableError
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, ForwardingStore, deliver, init, make_records, write_commit

W = MINUTE_MS
WINDOWS = 30
NOW = T0 + (WINDOWS + 1) * W  # a minute after the last window ended: every earlier window is overdue
GRACE = 0


class Counting(ForwardingStore):
    """The store, counting the objects read (footers and commits)."""

    def __init__(self, inner):
        self.inner = inner
        self.zone = inner.zone
        self.what = inner.what
        self.reads: list[str] = []

    def get(self, key):
        self.reads.append(key)
        return self.inner.get(key)

    def get_optional(self, key):
        self.reads.append(key)
        return self.inner.get_optional(key)

    def get_tail(self, key, nbytes):
        self.reads.append(key)
        return self.inner.get_tail(key, nbytes)

    def list_versions(self, prefix):
        return self.inner.list_versions(prefix)


def land(store, minutes: int = WINDOWS, first: int = 0, records=None):
    """One shard, 4 records a minute, landed by the sink (one batch a minute, fenced by links)."""
    records = records or make_records(4 * WINDOWS * 2, per_minute=4)
    p = LandingProcessor(store, STREAM, clock=Clock(T0).time)
    init(p, records[4 * first - 1].checkpoint if first else Checkpoint("TRIM_HORIZON"))  # a lease checkpoint
    p.shutdown_requested(deliver(p, records[4 * first:4 * (first + minutes)], 8))
    return records


def commit(zone_store, output, w: int, quarantined: int = 0) -> None:
    batches = list_batches(zone_store, STREAM, w, w + W)
    rows = sum(read_batch_info(zone_store, b).rows for b in batches)
    write_commit(output, w, w + W, batches, rows - quarantined, quarantined, manifests=False)


@pytest.fixture
def history(local_zone, memory_zone):
    """30 one-minute windows landed and committed; the output in memory."""
    store, output = local_zone.store, memory_zone.store
    records = land(store)
    for i in range(WINDOWS):
        commit(store, output, T0 + i * W)
    return store, output, records


def run(store, output, **kw):
    return audit_history(store, output, STREAM, W, now_ms=kw.pop("now_ms", NOW), transform_grace_ms=GRACE, **kw)


def failed(report) -> set[tuple[int, str]]:
    return {((o.window_start_ms - T0) // W, o.check) for o in report.outcomes if not o.ok and not o.whole_history}


def test_a_clean_history_passes_and_says_what_it_covered(history):
    store, output, records = history
    report = run(store, output)
    assert report.ok, report.lines()
    scope, = report.scopes
    assert (scope.windows, scope.batches, scope.commits) == (WINDOWS, WINDOWS, WINDOWS)
    assert [o.check for o in report.outcomes] == ["chain", "counts", "checkpoints"]  # one summary each
    assert report.lines()[-1] == f"OK: the whole history, {WINDOWS} windows"


def test_a_window_that_stalled_before_the_newest_24_fails_the_audit(history):
    """The default audit looked at the newest 24 windows: window 2, never transformed, passed for ever."""
    store, output, records = history
    output.delete([commit_key(T0 + 2 * W)])
    report = audit(store.uri, output.uri, STREAM, W, store=store, output=output, now_ms=NOW, transform_grace_ms=GRACE)
    assert not report.ok and failed(report) == {(2, "counts")}
    assert "never transformed" in next(o for o in report.outcomes if not o.ok).summary


def test_a_batch_lost_from_an_old_window_fails_the_next_incremental_audit(history):
    store, output, records = history
    assert run(store, output).ok
    lost = list_batches(store, STREAM, T0 + 3 * W, T0 + 4 * W)[0]
    store.delete([lost.key()])
    report = run(store, output)
    assert failed(report) == {(4, "chain"), (3, "counts")}  # window 4's batch follows the lost one
    text = "\n".join(report.lines())
    assert f"follows {lost.key()}, which the zone does not hold" in text and "no longer holds" in text


def test_the_incremental_audit_reads_only_what_changed(history):
    zone_store, output, records = history
    store, out = Counting(zone_store), Counting(output)
    assert run(store, out).ok
    assert len(store.reads) == WINDOWS and len(out.reads) == WINDOWS + 1  # every footer, every commit, the index
    store.reads.clear(), out.reads.clear()
    assert run(store, out).ok
    assert store.reads == [] and out.reads == [index_key(STREAM)]  # nothing changed: only the index is read
    land(zone_store, minutes=1, first=WINDOWS, records=records)  # one new window lands and commits
    commit(zone_store, output, T0 + WINDOWS * W)
    out.reads.clear()
    report = run(store, out, now_ms=NOW + W)
    assert report.ok and report.scopes[0].windows == WINDOWS + 1, report.lines()
    assert len(store.reads) == 1 and out.reads == [index_key(STREAM), commit_key(T0 + WINDOWS * W)]


def test_a_full_audit_reads_everything_again(history):
    zone_store, output, _ = history
    run(zone_store, output)
    store, out = Counting(zone_store), Counting(output)
    report = run(store, out, full=True)
    assert report.ok and "full audit" in report.scopes[0].note
    assert len(store.reads) == WINDOWS and len(out.reads) == WINDOWS  # the index is not even read


def test_a_rewritten_commit_is_read_again(history):
    zone_store, output, _ = history
    assert run(zone_store, output).ok
    commit(zone_store, output, T0 + 5 * W, quarantined=1)  # a re-run: same rows, one now quarantined
    out = Counting(output)
    assert run(zone_store, out).ok and commit_key(T0 + 5 * W) in out.reads
    write_commit(output, T0 + 5 * W, T0 + 6 * W, list_batches(zone_store, STREAM, T0 + 5 * W, T0 + 6 * W), 1, 0,
                 manifests=False)  # a commit that lost rows
    assert failed(run(zone_store, output)) == {(5, "counts")}


@pytest.mark.parametrize("garbage", [b"not gzip", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03truncated"])
def test_an_unreadable_index_is_ignored_and_rebuilt(history, garbage):
    store, output, _ = history
    output.put(index_key(STREAM), garbage)
    report = run(store, output)
    assert report.ok and "index unreadable" in report.scopes[0].note
    assert "not an audit index" in report.scopes[0].note and output.get(index_key(STREAM)) != garbage
    assert run(store, output).scopes[0].note == ""  # the rebuilt index serves the next audit


def test_checkpoints_are_judged_against_the_whole_history(history):
    store, output, records = history
    last = records[4 * WINDOWS - 1]
    progress = ShardProgress(SHARD, last.checkpoint, last.approximate_arrival_timestamp_ms).to_attributes()
    sound = [Lease(SHARD, records[4 * 20].checkpoint, extra=progress)]
    assert run(store, output, leases=sound).ok
    output.delete([commit_key(T0 + 7 * W)])
    report = run(store, output, leases=sound, now_ms=T0 + 8 * W - 1)  # window 7 is not overdue yet
    assert failed(report) == {(7, "checkpoints")}
    assert "reaches into batch" in "\n".join(report.lines())
    ended = [Lease(SHARD, Checkpoint("SHARD_END"), extra=progress)]
    assert failed(run(store, output, leases=ended, now_ms=T0 + 8 * W - 1)) == {(7, "checkpoints")}
    past = [Lease(SHARD, Checkpoint(last.sequence_number, 99), extra=progress)]
    commit(store, output, T0 + 7 * W)
    assert failed(run(store, output, leases=past)) == {(WINDOWS - 1, "checkpoints")}


def test_a_shards_lost_last_batch_that_no_batch_follows_fails_its_window(history):
    """Sim seed 6446: a closed shard's newest batch, not transformed yet, was lost; no batch follows it (no footer
    names it), so the chain check saw nothing and both audits passed the window. The lease's landing progress
    names the batch and its last record: a zone that does not hold that record has lost the shard's last batch."""
    store, output, records = history
    last = records[4 * WINDOWS - 1]
    lost = list_batches(store, STREAM, T0 + (WINDOWS - 1) * W, T0 + WINDOWS * W)[0]
    progress = ShardProgress(SHARD, last.checkpoint, last.approximate_arrival_timestamp_ms, shard_end_landed=True,
                             last_batch_key=lost.key()).to_attributes()
    leases = [Lease(SHARD, records[4 * 20].checkpoint, extra=progress)]
    output.delete([commit_key(T0 + (WINDOWS - 1) * W)])
    now = T0 + WINDOWS * W - 1  # the window is not overdue: its counts check waits
    assert run(store, output, leases=leases, now_ms=now).ok
    store.delete([lost.key()])
    report = run(store, output, leases=leases, now_ms=now)
    assert failed(report) == {(WINDOWS - 1, "checkpoints")}, report.lines()
    assert f"names {lost.key()}" in "\n".join(report.lines())
    windowed = audit(store.uri, output.uri, STREAM, W, store=store, output=output, leases=leases, now_ms=now,
                     transform_grace_ms=GRACE, window=(T0, T0 + WINDOWS * W))
    assert failed(windowed) == {(WINDOWS - 1, "checkpoints")}, windowed.lines()


def test_the_index_of_another_zone_is_not_used(history, tmp_path):
    store, output, _ = history
    run(store, output)
    other = LandingProcessor(str(tmp_path), STREAM)  # noqa: F841 - a second zone, same output
    from kcl_pipeline.zone.store import open_store

    empty = open_store(str(tmp_path))
    report = run(empty, output)
    assert "the index was of" in report.scopes[0].note


def test_the_command_audits_the_whole_history_and_fails_on_an_old_stalled_window(local_zone, tmp_path, emulators,
                                                                                  dynamodb_client, unique_name):
    import json

    from click.testing import CliRunner

    from kcl_pipeline.cli import main
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable
    from kcl_pipeline.zone.store import open_store

    application = unique_name("audit")
    LeaseTable(application, dynamodb_client).ensure_table()  # empty: no checkpoint to compare
    uri, store = local_zone
    (tmp_path / "out").mkdir()
    output = open_store(str(tmp_path / "out"))
    land(store)
    for i in range(WINDOWS):
        if i != 1:  # window 1 never transformed: long overdue by now
            commit(store, output, T0 + i * W)
    args = ["audit", "--landing", uri, "--output", str(tmp_path / "out"), "--stream", STREAM, "--window-minutes", "1",
            "--application", application]
    result = CliRunner(env=emulators.env()).invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "2026-11-22T03:01:00Z counts      FAILED" in result.output
    assert result.output.splitlines()[-1] == f"FAILED: the whole history, {WINDOWS} windows, 2 failed checks"
    full = CliRunner(env=emulators.env()).invoke(main, args + ["--full", "--json"])
    body = json.loads(full.stdout)
    assert full.exit_code == 1 and body["ok"] is False and body["scopes"][0]["read_batches"] == WINDOWS


def test_an_output_not_created_yet_is_a_history_never_transformed(local_zone, tmp_path):
    store = local_zone.store
    land(store, minutes=3)
    from kcl_pipeline.zone.store import open_store

    missing = open_store(str(tmp_path / "no-output"))
    report = run(store, missing, now_ms=T0 + W - 1)  # no window is overdue yet
    assert report.ok and report.scopes[0].windows == 3 and "index not saved" in report.scopes[0].note
    assert failed(run(store, missing, now_ms=NOW)) == {(0, "counts"), (1, "counts"), (2, "counts")}


def test_unreadable_batches_and_commits_and_foreign_keys_fail_naming_them(history):
    store, output, records = history
    victim = list_batches(store, STREAM, T0 + 4 * W, T0 + 5 * W)[0]
    store.delete([victim.key()])
    store.put_if_absent(victim.key(), b"not parquet")  # a batch the zone holds but nobody can read
    output.put(commit_key(T0 + 9 * W), b'{"window_start_ms": ')  # a truncated commit
    store.put_if_absent(f"{STREAM}/dt=2026-11-22/hh=03/mm=12/{SHARD}/stray.parquet", b"x")
    report = run(store, output)
    assert failed(report) == {(4, "chain"), (4, "counts"), (9, "counts")}
    text = "\n".join(report.lines())
    assert f"unreadable: {victim.key()}" in text and "cannot be read, their rows not counted" in text
    assert f"{commit_key(T0 + 9 * W)}: not a window commit" in text
    assert "1 .parquet objects are not batch keys" in text and "stray.parquet" in text


def test_records_landed_twice_fail_the_chain_and_are_counted_as_duplicates(history):
    from kcl_pipeline.zone.batch import encode_batch

    store, output, records = history
    copy = encode_batch(STREAM, SHARD, records[41:43], records[40].checkpoint)  # two records of window 10 again
    store.put_if_absent(copy.key.key(), copy.body)
    batches = list_batches(store, STREAM, T0 + 10 * W, T0 + 11 * W)
    write_commit(output, T0 + 10 * W, T0 + 11 * W, batches, 4, 0, manifests=False)  # 6 landed, 2 duplicates
    report = run(store, output)
    assert failed(report) == {(10, "chain")} and "overlap" in "\n".join(report.lines())
    counts = next(o for o in report.outcomes if o.check == "counts" and o.whole_history)
    assert counts.ok


def test_an_index_of_another_format_is_not_used(history):
    import gzip
    import json

    store, output, _ = history
    output.put(index_key(STREAM), gzip.compress(json.dumps({"format": 99}).encode()))
    report = run(store, output)
    assert report.ok and f"index format 99, this audit reads {INDEX_FORMAT}" in report.scopes[0].note


def test_an_old_windows_output_files_removed_after_its_audit_fail_the_next_one(history):
    store, output, _ = history
    assert run(store, output).ok
    output.delete_prefix("quarantine/window=20261122T030600Z/")
    report = run(store, output)
    assert failed(report) == {(6, "counts")} and "output no longer holds" in "\n".join(report.lines())


def test_the_command_sweeps_killed_writers_leftovers_in_both_zones_when_asked(local_zone, tmp_path, emulators,
                                                                               dynamodb_client, unique_name):
    import os
    import uuid

    from click.testing import CliRunner

    from kcl_pipeline.cli import main
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    application = unique_name("audit")
    LeaseTable(application, dynamodb_client).ensure_table()
    uri, store = local_zone
    land(store, minutes=2)
    leftovers = []
    for root in (uri, str(tmp_path / "out" / "transformed")):
        os.makedirs(root, exist_ok=True)
        leftovers.append(os.path.join(root, f".part-0.parquet.{uuid.uuid4().hex}.tmp"))
        with open(leftovers[-1], "wb") as f:
            f.write(b"half")
        os.utime(leftovers[-1], (0, 0))
    args = ["audit", "--landing", uri, "--output", str(tmp_path / "out"), "--stream", STREAM, "--window-minutes", "1",
            "--application", application, "--sweep-temporaries"]
    result = CliRunner(env=emulators.env()).invoke(main, args)
    assert "swept 1 leftovers of killed writers" in result.stderr and not any(map(os.path.exists, leftovers))
    missing = CliRunner(env=emulators.env()).invoke(main, args[:4] + [str(tmp_path / "none")] + args[5:])
    assert "nothing to sweep" in missing.stderr, missing.output


def test_one_output_file_removed_from_a_partition_is_found_by_a_full_audit(history):
    """An incremental audit lists the output's partitions (one entry a window), not every file: a partition
    removed is found at once, a single file of a partition that is still there by a full audit."""
    store, output, _ = history
    assert run(store, output).ok
    output.delete(["transformed/window=20261122T030800Z/run=job-1/part-0.parquet"])
    output.put("transformed/window=20261122T030800Z/run=job-1/part-1.parquet", b"another file")
    assert run(store, output).ok  # the partition is there
    assert failed(run(store, output, full=True)) == {(8, "counts")}


class Changing(Counting):
    """The store, doing `change(inner)` once its listing of the landing directory is taken and before any object
    listed is read (the audit reads each object as soon as its page is listed); `fail`: keys whose reads fail."""

    def __init__(self, inner, change=None, fail=()):
        super().__init__(inner)
        self.change, self.fail = change, set(fail)

    def list_versions(self, prefix):
        listed = list(self.inner.list_versions(prefix))
        if self.change is not None:
            self.change(self.inner)
            self.change = None
        return iter(listed)

    def _read(self, key):
        if key in self.fail:
            raise ZoneUnavailableError(f"{self.what} {self.uri}: S3 unreachable during read {key} (a test)")
        self.reads.append(key)

    def get_version(self, key):
        self._read(key)
        return self.inner.get_version(key)

    def get_tail_version(self, key, nbytes):
        self._read(key)
        return self.inner.get_tail_version(key, nbytes)


@pytest.mark.parametrize("what", ["footer", "commit"])
def test_a_read_that_fails_stops_the_audit_with_no_verdict_naming_the_object(history, what):
    """Reads run concurrently: one that fails (after the SDK's retries) is an error naming its object, never a
    fact taken for read nor an object skipped; the reads still queued are dropped, and no index is saved."""
    zone_store, output, _ = history
    batch = list_batches(zone_store, STREAM, T0 + 7 * W, T0 + 8 * W)[0].key()
    bad = batch if what == "footer" else commit_key(T0 + 7 * W)
    store = Changing(zone_store, fail={bad} if what == "footer" else ())
    out = Changing(output, fail={bad} if what == "commit" else ())
    stopped = f"stopped without a verdict.*unreachable during read {re.escape(bad)}"
    with pytest.raises(AuditIncompleteError, match=stopped):
        run(store, out, workers=4)
    assert output.get_optional(index_key(STREAM)) is None
    assert run(zone_store, output).ok  # the store answers again: the next audit has its verdict


def test_a_batch_replaced_after_it_was_listed_is_judged_as_read_and_indexed_as_read(history):
    """The listing names the objects, the reads give their facts: a batch corrupted between the two fails the
    audit as read, and its facts are indexed under the tag of what was read — the next audit, listing that same
    file, needs no read to fail it again (and a full audit agrees)."""
    zone_store, output, _ = history
    victim = list_batches(zone_store, STREAM, T0 + 4 * W, T0 + 5 * W)[0].key()

    def corrupt(inner):
        inner.delete([victim])
        inner.put_if_absent(victim, b"not parquet")

    store = Changing(zone_store, change=corrupt)
    report = run(store, output)
    assert failed(report) == {(4, "chain"), (4, "counts")} and victim in store.reads
    assert f"unreadable: {victim}" in "\n".join(report.lines())
    again = Changing(zone_store)
    assert failed(run(again, output)) == {(4, "chain"), (4, "counts")} and again.reads == []
    assert failed(run(zone_store, output, full=True)) == {(4, "chain"), (4, "counts")}


def test_a_batch_deleted_after_it_was_listed_stops_the_audit_naming_it(history):
    """Listed, then gone before its read: not a fact, not an OK — an error naming it (the next audit, whose
    listing no longer holds it, reports the chain's gap)."""
    zone_store, output, _ = history
    victim = list_batches(zone_store, STREAM, T0 + 4 * W, T0 + 5 * W)[0].key()
    with pytest.raises(AuditIncompleteError, match=f"stopped without a verdict.*read {re.escape(victim)}"):
        run(Changing(zone_store, change=lambda inner: inner.delete([victim])), output)
    assert failed(run(zone_store, output)) == {(4, "counts"), (5, "chain")}


def test_facts_are_kept_under_the_tag_of_the_bytes_read_not_the_one_listed(s3_zone, memory_zone):
    """On S3 a tag is the content's digest: a batch listed as A, read as B (replaced in between), then restored
    to A's very bytes has A's tag again. Its facts were B's: filed under the tag listed, the next audits would
    judge A by B's facts for ever (here: fail a sound batch; the other way round, pass a broken one)."""
    store, output = s3_zone.store, memory_zone.store
    land(store, minutes=6)
    for i in range(6):
        commit(store, output, T0 + i * W)
    now = T0 + 7 * W
    assert run(store, output, now_ms=now).ok
    victim = list_batches(store, STREAM, T0 + 4 * W, T0 + 5 * W)[0].key()
    sound = store.get(victim)

    def corrupt(inner):
        inner.delete([victim])
        inner.put_if_absent(victim, b"not parquet")

    full = run(Changing(store, change=corrupt), output, now_ms=now, full=True)  # listed as A, read as B
    assert failed(full) == {(4, "chain"), (4, "counts")}
    store.delete([victim])
    store.put_if_absent(victim, sound)  # A's bytes again: A's ETag
    again = Changing(store)
    report = run(again, output, now_ms=now)
    assert report.ok and again.reads == [victim], report.lines()  # read again, judged by what it holds
