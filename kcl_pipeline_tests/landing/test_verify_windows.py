"""`landing verify --window W --application A` on any window, and a multi-stream application's lease table
(issue 20, item 6): a window that is not the newest holds neither the last landed record nor the checkpoint,
and a multi-stream lease key is not the shard id the zone names."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from kcl_pipeline.audit.verify import leases_of_directory, verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.layout import MINUTE_MS
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records

IDENTIFIER = "123456789012:orders:1700000000"
DIRECTORY = "orders@1700000000"


def land(uri: str, directory: str, minutes: int = 3):
    records = make_records(30 * minutes, per_minute=30)
    p = LandingProcessor(uri, directory, max_batch_records=10, clock=Clock(T0).time)
    init(p)
    p.shutdown_requested(deliver(p, records, 20))
    return records


def live_lease(key: str, records, checkpoint_index: int) -> Lease:
    """A live lease: landed through the last record (minute 3), checkpointed in minute 2."""
    last = records[-1]
    progress = ShardProgress(SHARD, last.checkpoint, last.approximate_arrival_timestamp_ms)
    return Lease(key, records[checkpoint_index].checkpoint, lease_owner="w1", extra=progress.to_attributes())


def minute(i: int) -> tuple[int, int]:
    return T0 + i * MINUTE_MS, T0 + (i + 1) * MINUTE_MS


def test_verify_of_a_window_that_is_not_the_newest_passes_with_the_lease_table(local_zone):
    """It failed every window but the newest: 'the shard's last batch is missing' and 'checkpoint is past the
    zone's last landed record', comparing the lease's newest facts with an older window's chain."""
    uri, store = local_zone
    records = land(uri, STREAM)
    leases = [live_lease(SHARD, records, 45)]
    for i in range(3):
        report = verify_zone(uri, minute(i), stream=STREAM, store=store, leases=leases)
        assert report.ok, (i, report.lease_problems)
    assert verify_zone(uri, stream=STREAM, store=store, leases=leases).ok  # and the whole history


def test_verify_of_the_window_holding_the_last_landed_record_finds_its_last_batch_missing(local_zone):
    uri, store = local_zone
    records = land(uri, STREAM)
    leases = [live_lease(SHARD, records, 45)]
    last = max(list_batches(store, STREAM), key=lambda b: b.last.key())
    store.delete([last.key()])
    assert verify_zone(uri, minute(1), stream=STREAM, store=store, leases=leases).ok  # not this window's business
    report = verify_zone(uri, minute(2), stream=STREAM, store=store, leases=leases)
    assert not report.ok and any("the window's last batch is missing" in p for p in report.lease_problems)


def test_verify_of_a_window_the_shard_landed_its_last_record_in_without_a_batch_fails(local_zone):
    uri, store = local_zone
    records = land(uri, STREAM)
    leases = [live_lease(SHARD, records, 45)]
    store.delete([b.key() for b in list_batches(store, STREAM, *minute(2))])
    report = verify_zone(uri, minute(2), stream=STREAM, store=store, leases=leases)
    assert not report.ok and any("zone holds no batch of the shard in this window" in p for p in report.lease_problems)


def test_a_checkpoint_past_the_leases_own_landing_progress_fails_in_any_window(local_zone):
    uri, store = local_zone
    records = land(uri, STREAM)
    progress = ShardProgress(SHARD, records[40].checkpoint, records[40].approximate_arrival_timestamp_ms)
    lease = Lease(SHARD, records[50].checkpoint, extra=progress.to_attributes())
    report = verify_zone(uri, minute(0), stream=STREAM, store=store, leases=[lease])
    assert not report.ok and "past the lease's landing progress" in report.lease_problems[0]


def test_a_multi_stream_applications_leases_are_matched_to_their_incarnation_directory(local_zone):
    """The lease keys are `<account>:<name>:<epoch>:<shardId>`; the zone names shards by id under
    `<name>@<epoch>`: matched by lease key, every shard of a sound zone was reported as holding no batch."""
    uri, store = local_zone
    records = land(uri, DIRECTORY)
    other = Lease(f"123456789012:payments:1700000001:{SHARD}", Checkpoint("TRIM_HORIZON"))
    leases = [live_lease(f"{IDENTIFIER}:{SHARD}", records, 45), other]
    assert [x.lease_key for x in leases_of_directory(DIRECTORY, leases)] == [SHARD]
    report = verify_zone(uri, store=store, leases=leases)
    assert report.ok and report.leases_checked == 1, report.lease_problems
    assert verify_zone(uri, minute(0), stream=DIRECTORY, store=store, leases=leases).ok
    last = max(list_batches(store, DIRECTORY), key=lambda b: b.last.key())
    store.delete([last.key()])
    broken = verify_zone(uri, store=store, leases=leases)
    assert not broken.ok and broken.lease_problems[0].startswith(f"{DIRECTORY}/{SHARD}: ")


def test_a_multi_stream_lease_table_needs_the_incarnation_directory_not_the_stream_name(local_zone):
    uri, store = local_zone
    land(uri, DIRECTORY)
    leases = [Lease(f"{IDENTIFIER}:{SHARD}", Checkpoint("TRIM_HORIZON"))]
    with pytest.raises(ValueError, match=f"give --stream one of {DIRECTORY}"):
        verify_zone(uri, stream="orders", store=store, leases=leases)


def test_the_command_verifies_an_older_window_of_a_multi_stream_application(local_zone, emulators, dynamodb_client,
                                                                            unique_name):
    from kcl_pipeline.cli import main

    uri, _ = local_zone
    records = land(uri, DIRECTORY)
    application = unique_name("verifyms")
    table = LeaseTable(application, dynamodb_client)
    table.ensure_table()
    table.create(live_lease(f"{IDENTIFIER}:{SHARD}", records, 45))
    result = CliRunner(env=emulators.env()).invoke(main, [
        "landing", "verify", "--landing", uri, "--window", "2026-11-22T03:00/PT1M", "--application", application])
    assert result.exit_code == 0, result.output
    assert "lease table: 1 leases cross-checked" in result.output


def test_an_incarnation_directory_of_one_name_in_two_accounts_is_refused():
    leases = [Lease(f"{account}:orders:1700000000:{SHARD}", Checkpoint("TRIM_HORIZON"))
              for account in ("123456789012", "210987654321")]
    with pytest.raises(ValueError, match="cannot tell whose leases to cross-check"):
        leases_of_directory(DIRECTORY, leases)
    assert leases_of_directory("orders@1700000001", leases) == []  # another incarnation: none of these
    single = [Lease(SHARD, Checkpoint("TRIM_HORIZON"))]
    assert leases_of_directory(STREAM, single) == single  # a single stream's leases are named by shard already
