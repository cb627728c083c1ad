"""`kcl-pipeline landing verify --application A`: the zone's chains against the consumer's lease table.

Without the lease table a shard whose first or last batch was removed still looks like an unbroken chain;
with it, verify exits 1 naming what is missing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kcl_pipeline.audit.verify import check_leases, verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.sink import LandingProcessor

from .helpers import SHARD, STREAM, T0, Clock, deliver, init, make_records

pytestmark = pytest.mark.emulator


@pytest.fixture
def landed_with_leases(local_zone, dynamodb_client, unique_name):
    uri, store = local_zone
    records = make_records(60, per_minute=30)
    p = LandingProcessor(uri, STREAM, max_batch_records=10, clock=Clock(T0).time)
    init(p)
    p.shutdown_requested(deliver(p, records, 20))
    app = unique_name("verifyapp")
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    progress = ShardProgress(SHARD, records[-1].checkpoint, records[-1].approximate_arrival_timestamp_ms)
    table.create(Lease(SHARD, records[39].checkpoint, lease_owner="w1", lease_counter=1,
                       extra=progress.to_attributes()))
    return uri, store, app, records


def _verify(emulators, uri, app):
    env = {**os.environ, **emulators.env()}
    return subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "landing", "verify", "--landing", uri,
                           "--application", app], capture_output=True, text=True, env=env, timeout=120)


def test_verify_with_the_lease_table_passes_on_a_sound_zone(emulators, landed_with_leases):
    uri, store, app, _ = landed_with_leases
    proc = _verify(emulators, uri, app)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lease table: 1 leases cross-checked" in proc.stdout


def test_verify_fails_on_a_removed_first_batch(emulators, landed_with_leases):
    uri, store, app, _ = landed_with_leases
    first = min(list_batches(store, STREAM), key=lambda b: b.first.key())
    os.unlink(os.path.join(uri, first.key()))
    # The next batch's footer names the removed one: the chain alone tells (as the audit's chain check does).
    assert verify_zone(uri, stream=STREAM, store=store).missing_predecessors
    proc = _verify(emulators, uri, app)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the shard's first batch is missing" in proc.stdout


def test_verify_fails_on_a_removed_last_batch(emulators, landed_with_leases):
    uri, store, app, _ = landed_with_leases
    last = max(list_batches(store, STREAM), key=lambda b: b.last.key())
    os.unlink(os.path.join(uri, last.key()))
    assert verify_zone(uri, stream=STREAM, store=store).ok  # the chain alone cannot tell
    proc = _verify(emulators, uri, app)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the shard's last batch is missing" in proc.stdout


def test_check_leases_flags_a_checkpoint_past_the_zone():
    from kcl_pipeline.zone.chain import ChainReport

    chain = ChainReport(SHARD, batches=1, rows=3, first=Checkpoint("1"), last=Checkpoint("3"),
                        starts_after=Checkpoint("TRIM_HORIZON"))
    assert check_leases({SHARD: chain}, [Lease(SHARD, Checkpoint("3"))], whole_history=True) == []
    problems = check_leases({SHARD: chain}, [Lease(SHARD, Checkpoint("4"))], whole_history=True)
    assert problems and "past the zone's last landed record" in problems[0]
    problems = check_leases({}, [Lease(SHARD, Checkpoint("4"))], whole_history=True)
    assert problems and "holds no batch" in problems[0]
