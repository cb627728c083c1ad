"""Issue 20 §7 through Dagster: a window whose rows_reconcile fails is passed by no later checkpoint run.

Before: transformed_records wrote the window's commit, its blocking rows_reconcile check then failed — which
stopped only that run — and the next kinesis_checkpoints run, trusting the commit, checkpointed through the
window. The steps run here as separate runs (the transform, its check, a later checkpoint run), as they
would across the window runs of two windows.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey

from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.windows.manifest import commit_key, pending_commit_key
from kcl_pipeline.zone.chain import list_batches
from kcl_pipeline.zone.progress import ShardProgress
from kcl_pipeline.zone.store import open_store

from .test_assets import W, evaluations, pipeline, run  # noqa: F401 - the pipeline fixture

pytestmark = pytest.mark.slow
SHARDS = ("shardId-000000000000", "shardId-000000000001")


def lose_a_transformed_row(output_uri: str, window: int) -> None:
    """The window's output says one row fewer than the run read (a writer that lost a row): whichever commit
    the run left (pending, or published by an older pipeline) is changed."""
    for key in (pending_commit_key(window), commit_key(window)):
        path = Path(output_uri) / key
        if path.exists():
            commit = json.loads(path.read_bytes())
            commit["datasets"]["transformed"]["rows"] -= 1
            path.write_text(json.dumps(commit))
            return
    raise AssertionError(f"the run left no commit of window {window}")


def test_a_window_that_does_not_reconcile_blocks_every_later_checkpoint_run(spark, pipeline, aws_settings):  # noqa: F811
    p = pipeline
    assert run(p, [AssetKey("landed_records")]).success
    store = open_store(p["consumer"].landing_uri, aws_settings)
    table = LeaseTable(p["consumer"].application, client("dynamodb", aws_settings))
    table.ensure_table()
    start = Checkpoint("AT_TIMESTAMP", p["first"])  # where the backfill began: its start links prove the chains
    for shard_id in SHARDS:
        mine = [b for b in list_batches(store, p["stream"], p["first"], p["last"] + W) if b.shard_id == shard_id]
        progress = ShardProgress(shard_id, mine[-1].last, p["last"] + W, last_batch_key=mine[-1].key())
        attrs = {k: v for k, v in progress.to_attributes().items() if v is not None}
        assert table.create(Lease(shard_id, start, lease_owner="live", extra={**attrs, CLAIM_OWNER_ATTRIBUTE: "live"}))

    assert run(p, [AssetKey("transformed_records")]).success
    lose_a_transformed_row(p["consumer"].output_uri, p["first"])
    checked = run(p, [], [AssetCheckKey(AssetKey("transformed_records"), "rows_reconcile")])
    assert evaluations(checked) == {"rows_reconcile": False}

    later = run(p, [AssetKey("kinesis_checkpoints")])
    assert later.success
    assert {lease.lease_key: lease.checkpoint for lease in table.scan()} == {s: start for s in SHARDS}
