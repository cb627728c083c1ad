"""The CLI's GraphQL documents against the installed Dagster's schema, and the backfill progress they read."""
from __future__ import annotations

import pytest

from kcl_pipeline.local import dagster_client
from kcl_pipeline.local.dagster_client import BackfillProgress


def test_the_cli_graphql_documents_are_valid_for_the_installed_dagster():
    """A field renamed in a Dagster release would otherwise surface only as a failed `backfill --wait`."""
    pytest.importorskip("dagster_graphql")
    from dagster_graphql.schema import create_schema
    from graphql import parse, validate

    schema = create_schema().graphql_schema
    for document in (dagster_client._LAUNCH, dagster_client._STATUS):
        assert validate(schema, parse(document)) == []


def test_backfill_progress_counts_the_last_asset_of_the_backfill():
    backfill = {"status": "REQUESTED", "numPartitions": 5, "assetBackfillData": {"assetBackfillStatuses": [
        {"assetKey": {"path": ["landed_records"]}, "numPartitionsTargeted": 5, "numPartitionsMaterialized": 5,
         "numPartitionsFailed": 0},
        {"assetKey": {"path": ["transformed_records"]}, "numPartitionsTargeted": 5, "numPartitionsMaterialized": 2,
         "numPartitionsFailed": 1}]}}
    assert BackfillProgress.from_graphql(backfill) == BackfillProgress("REQUESTED", 2, 1, 5)
    assert BackfillProgress.from_graphql({"status": "COMPLETED", "numPartitions": 3, "assetBackfillData": None}) \
        == BackfillProgress("COMPLETED", 0, 0, 3)
