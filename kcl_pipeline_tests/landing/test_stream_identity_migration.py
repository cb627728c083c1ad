"""`kcl-pipeline landing migrate`: a zone's `<name>/` directory moved into `<name>@<region>@<account>/`, so that a
consumer configured by the stream's ARN resumes where the name-configured one stopped (before, it started a new
chain from its initial position in the empty identity directory: everything landed again, or, from LATEST, the
records between lost to that directory). Local directory zones; the real consumers on the emulators are in
test_stream_identity_migrate_cli.py."""
from __future__ import annotations

import json

import pytest

from kcl_pipeline.audit.migrate import check_no_live_consumer, migrate_zone
from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.windows.checkpoints.record import RECORD_KEY, CheckpointRecord, read_checkpoint_record
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.zone.batch import read_batch_info
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.errors import LandingError
from kcl_pipeline.zone.layout import MINUTE_MS, START_DIR, link_target
from kcl_pipeline.zone.migration import COPY, DELETE, Migration, MigrationRefused, live_leases, marker_key
from kcl_pipeline.zone.sink import LandingProcessor, check_stream_chains

from .helpers import SHARD, T0, Clock, ForwardingStore, deliver, init, make_records, write_commit

A = "arn:aws:kinesis:us-east-1:111111111111:stream/orders"
B = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
TARGET = "orders@us-east-1@111111111111"
TRIM = Checkpoint("TRIM_HORIZON")
RECORDS = make_records(40, per_minute=10)


def land(store, stream: str, stream_arn: str | None, records, start: Checkpoint = TRIM) -> LandingProcessor:
    """A consumer's lease of the shard from `start`: what its reader would deliver after the resume position."""
    p = LandingProcessor(store, stream, stream_arn=stream_arn, max_batch_records=4, clock=Clock(T0 + 600_000).time)
    init(p, start)
    resume = p.resume_position()
    if resume is not None and not resume.is_sentinel:
        records = [r for r in records if r.position() > resume.key()]
    deliver(p, records, 3)
    p.flush()
    return p


@pytest.fixture
def landed(local_zone, memory_zone):
    """20 records landed under `orders/` by a consumer configured by its name (its footers name A), their first
    window committed and a late batch in the checkpoint record."""
    store, output = local_zone.store, memory_zone.store
    land(store, "orders", A, RECORDS[:20])
    first = list_batches(store, "orders", T0, T0 + MINUTE_MS)
    write_commit(output, T0, T0 + MINUTE_MS, first, 10, 0)
    late = list_batches(store, "orders", T0 + MINUTE_MS, T0 + 2 * MINUTE_MS)[-1].key()
    output.put(RECORD_KEY, CheckpointRecord.of_run(None, frontier={SHARD: T0}, late={T0 + MINUTE_MS: [late]},
                                                   uncommitted=[], now_ms=T0).to_json())
    return store, output


def snapshot(store) -> dict[str, bytes]:
    return {k: store.get(k) for k in store.list_keys("")}


def test_a_migrated_directory_reads_back_whole_under_the_streams_identity(landed):
    store, output = landed
    before = read_batches(store, "orders")
    report = migrate_zone(store, output, Migration.of("orders", A))
    assert report.lines()[-1] == f"OK: orders/ -> {TARGET}/"
    assert store.list_dirs("") == [TARGET]
    moved = read_batches(store, A)
    assert moved.column("data").to_pylist() == before.column("data").to_pylist()
    assert set(moved.column("stream").to_pylist()) == {TARGET}  # the rows' stream is the directory
    for key in list_batches(store, A):
        info = read_batch_info(store, key)
        assert info.stream_arn == A and (info.prev_key is None or info.prev_key.startswith(f"{TARGET}/"))
    for link in store.list_keys(f"{TARGET}/"):
        if "after=" in link:
            assert link_target(store.get(link)).startswith(f"{TARGET}/"), link
    assert store.list_keys(f"{TARGET}/{START_DIR}/")
    report = verify_zone("zone", store=store, stream=A, deep=True)
    assert report.ok and report.rows == 20, report.lines()
    commit = WindowCommit.from_json(output.get(commit_key(T0)))
    assert commit.batches and all(k.startswith(f"{TARGET}/") and store.exists(k) for k in commit.batches)
    record = read_checkpoint_record(output)
    assert record is not None and all(k.startswith(f"{TARGET}/") and store.exists(k)
                                      for keys in record.late.values() for k in keys)
    assert not store.exists(marker_key(TARGET))


def test_a_consumer_configured_by_the_arn_resumes_where_the_name_configured_one_stopped(landed):
    """Exactly once: the migrated chain is followed from its start link, and only the 20 new records land."""
    store, output = landed
    migrate_zone(store, output, Migration.of("orders", A))
    check_stream_chains(store, A, A)
    land(store, A, A, RECORDS)  # its reader delivers from the start; the chain says 20 are landed
    rows = read_batches(store, A)
    assert rows.column("data").to_pylist() == [r.data for r in RECORDS]
    report = verify_zone("zone", store=store, stream=A, deep=True)
    assert report.ok and report.rows == 40 and all(r.duplicate_rows == 0 for r in report.streams[TARGET].values())


def test_a_consumer_resuming_from_its_checkpoint_after_a_migration_lands_only_the_new_records(landed):
    store, output = landed
    migrate_zone(store, output, Migration.of("orders", A))
    land(store, A, A, RECORDS, start=RECORDS[19].checkpoint)
    report = verify_zone("zone", store=store, stream=A, deep=True)
    assert report.ok and report.rows == 40, report.lines()


def test_a_batch_of_another_stream_refuses_the_migration_and_nothing_moves(landed):
    store, output = landed
    before, outputs = snapshot(store), snapshot(output)
    with pytest.raises(MigrationRefused, match="holds another stream's batches") as refused:
        migrate_zone(store, output, Migration.of("orders", B))
    assert A in str(refused.value) and B in str(refused.value) and "\n" not in str(refused.value)
    assert snapshot(store) == before and snapshot(output) == outputs


def test_a_dry_run_says_what_it_would_do_and_changes_nothing(landed):
    store, output = landed
    before, outputs = snapshot(store), snapshot(output)
    report = migrate_zone(store, output, Migration.of("orders", A), dry_run=True)
    assert snapshot(store) == before and snapshot(output) == outputs
    text = "\n".join(report.lines())
    assert report.batches == len(list_batches(store, "orders")) and "would copy" in text and "DRY RUN" in text
    assert commit_key(T0) in text and RECORD_KEY in text


class Crash(Exception):
    pass


@pytest.mark.parametrize("at", [COPY, DELETE])
def test_a_migration_stopped_at_either_phase_is_finished_by_running_it_again(landed, at):
    store, output = landed
    before = read_batches(store, "orders").column("data").to_pylist()

    def stop(phase: str) -> None:
        if phase == at:
            raise Crash

    with pytest.raises(Crash):
        migrate_zone(store, output, Migration.of("orders", A), on_step=stop)
    if at == DELETE:  # everything copied and rewritten, the marker says so
        assert json.loads(store.get(marker_key(TARGET)))["phase"] == DELETE
    with pytest.raises(LandingError, match="unfinished"):  # no consumer lands into a half-moved directory
        check_stream_chains(store, A, A)
    migrate_zone(store, output, Migration.of("orders", A))
    assert store.list_dirs("") == [TARGET]
    assert read_batches(store, A).column("data").to_pylist() == before
    assert verify_zone("zone", store=store, stream=A, deep=True).ok


class FailingAfter(ForwardingStore):
    """The zone, failing (a crash) after `n` writes or on its first delete after `n` objects."""

    def __init__(self, inner, n: int, what: str):
        self.inner, self.zone, self.what, self.n, self.kind = inner, inner.zone, inner.what, n, what

    def put(self, key, body):
        if self.kind == "put":
            self.n -= 1
            if self.n < 0:
                raise Crash
        return self.inner.put(key, body)

    def delete(self, keys):
        if self.kind == "delete":
            self.inner.delete(keys[:self.n])
            raise Crash
        return self.inner.delete(keys)


@pytest.mark.parametrize("what", ["put", "delete"])
def test_a_migration_crashed_mid_copy_or_mid_delete_resumes_with_nothing_lost_or_twice(landed, what):
    store, output = landed
    before = read_batches(store, "orders").column("data").to_pylist()
    with pytest.raises(Crash):
        migrate_zone(FailingAfter(store, 7, what), output, Migration.of("orders", A))
    report = migrate_zone(store, output, Migration.of("orders", A))
    assert report.phase == (COPY if what == "put" else DELETE)
    assert store.list_dirs("") == [TARGET]
    assert read_batches(store, A).column("data").to_pylist() == before
    assert verify_zone("zone", store=store, stream=A, deep=True).ok
    land(store, A, A, RECORDS)
    assert read_batches(store, A).column("data").to_pylist() == [r.data for r in RECORDS]


def test_an_identity_directory_a_consumer_landed_in_is_not_merged_into(landed):
    store, output = landed
    land(store, A, A, RECORDS[:8])  # an ARN-configured consumer started before the migration
    before = snapshot(store)
    with pytest.raises(MigrationRefused, match="already holds"):
        migrate_zone(store, output, Migration.of("orders", A))
    assert snapshot(store) == before


def test_nothing_to_migrate_and_bad_arguments_are_one_line_refusals(local_zone):
    with pytest.raises(MigrationRefused, match="holds nothing to migrate"):
        migrate_zone(local_zone.store, None, Migration.of("orders", A))
    for stream, arn in (("orders", "orders"), (A, A), ("payments", A), (TARGET, A)):
        with pytest.raises(MigrationRefused):
            Migration.of(stream, arn)


def test_a_lease_whose_counter_moves_during_the_watch_is_a_live_consumer():
    held = [Lease(SHARD, Checkpoint("TRIM_HORIZON"), "w1", 4), Lease("shardId-1", TRIM, None, 9)]
    moved = [Lease(SHARD, Checkpoint("TRIM_HORIZON"), "w1", 5), Lease("shardId-1", TRIM, None, 9)]
    assert live_leases(held, held) == []
    assert live_leases(held, moved) == [f"{SHARD} (w1, counter 4 -> 5)"]
    scans = iter([held, moved])
    with pytest.raises(MigrationRefused, match="holds 1 live leases"):
        check_no_live_consumer(lambda: next(scans), 0.0, sleep=lambda s: None)
    scans = iter([held, held])
    assert check_no_live_consumer(lambda: next(scans), 0.0, sleep=lambda s: None) == 2


@pytest.mark.emulator
def test_a_migrated_s3_zone_is_resumed_by_the_arn_configured_consumer(s3_zone, tmp_path):
    """The same on S3 (moto): the copies, the output's commit (a directory that was never created: no output
    written yet) and the deletes go through the S3 store."""
    from kcl_pipeline.zone.store import open_store

    store = s3_zone.store
    land(store, "orders", A, RECORDS[:20])
    output = open_store(str(tmp_path / "never-created"), what="transform output")
    migrate_zone(store, output, Migration.of("orders", A))
    assert store.list_dirs("") == [TARGET] and not (tmp_path / "never-created").exists()
    land(store, A, A, RECORDS)
    assert read_batches(store, A).column("data").to_pylist() == [r.data for r in RECORDS]
    assert verify_zone(s3_zone.uri, store=store, stream=A, deep=True).ok


@pytest.mark.parametrize("batch_format,compression", [("parquet", "zstd"), ("parquet", "snappy"),
                                                      ("parquet", "none"), ("rows", "zstd")])
def test_a_rewritten_batch_holds_the_same_records_in_its_own_encoding_naming_the_new_directory(
        batch_format, compression):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kcl_pipeline.zone.batch import decode_batch, encode_batch, rewrite_batch

    records = RECORDS[:10]
    old = encode_batch("orders", SHARD, records, Checkpoint(RECORDS[0].sequence_number, 0), compression,
                       prev_key="orders/dt=x/prev.parquet", batch_format=batch_format)
    info = read_batch_info(_OneObject(old.key.key(), old.body), old.key)
    new = rewrite_batch(old.body, info, TARGET, f"{TARGET}/dt=x/prev.parquet", A)
    assert new.key.key() == f"{TARGET}/{old.key.key().partition('/')[2]}"
    moved = read_batch_info(_OneObject(new.key.key(), new.body), new.key)
    assert (moved.prev, moved.rows, moved.first_arrival_ms, moved.last_arrival_ms) == \
        (info.prev, info.rows, info.first_arrival_ms, info.last_arrival_ms)
    assert (moved.prev_key, moved.stream_arn) == (f"{TARGET}/dt=x/prev.parquet", A)
    before, after = decode_batch(old.body), decode_batch(new.body)
    assert after.drop(["stream"]).equals(before.drop(["stream"]))
    assert set(after.column("stream").to_pylist()) == {TARGET}
    if batch_format == "parquet":
        codec = pq.read_metadata(pa.BufferReader(new.body)).row_group(0).column(7).compression.lower()
        assert codec == ("uncompressed" if compression == "none" else compression)
    else:
        assert new.body.endswith(b"KCLROWS1")


class _OneObject:
    """A store holding one object (the footer reader's ranged reads)."""

    uri = "memory://one"

    def __init__(self, key: str, body: bytes):
        self.key, self.body = key, body

    def get_tail(self, key, nbytes):
        assert key == self.key
        return self.body[-nbytes:], len(self.body)

    def get(self, key):
        assert key == self.key
        return self.body


@pytest.mark.parametrize("extra,says", [
    ([], "exactly one of --output URI or --no-output"),
    (["--no-output", "--output", "out"], "exactly one of --output URI or --no-output"),
    (["--no-output", "--stream-arn", "orders"], "is not a stream ARN"),
    (["--no-output", "--stream", "payments"], "names stream orders, not payments"),
])
def test_the_command_refuses_bad_arguments_in_one_line_before_touching_anything(local_zone, extra, says):
    from click.testing import CliRunner

    from kcl_pipeline.cli import main

    args = ["landing", "migrate", "--landing", local_zone.uri, "--stream", "orders", "--stream-arn", A,
            "--application", "app"]
    result = CliRunner().invoke(main, [*args, *extra])
    assert result.exit_code == 2 and says in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output
    assert list(local_zone.store.list_keys("")) == []
