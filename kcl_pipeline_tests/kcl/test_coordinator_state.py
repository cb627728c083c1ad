"""Sharing an application with KCL 3.x: the coordinator state's migration item, written exactly as KCL 3.x
writes it, decides whether this consumer may join (2.x-compatible modes) or must refuse (3.x mode)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.coordinator_state import (
    Kcl3FleetConflict,
    MigrationState,
    conflict,
    coordinator_state_table,
    read_migration_state,
)
from kcl_pipeline.kcl.manager import LeaseManager
from kcl_pipeline.kcl.shards import wait_stream_active
from kcl_pipeline.kcl.worker import ProcessorSpec


@pytest.mark.parametrize("version,refused", [
    (None, False),
    ("CLIENT_VERSION_2X", False),
    ("CLIENT_VERSION_UPGRADE_FROM_2X", False),
    ("CLIENT_VERSION_3X_WITH_ROLLBACK", True),
    ("CLIENT_VERSION_3X", True),
    ("CLIENT_VERSION_INIT", True),  # still deciding: never join a fleet that may go 3.x under us
])
def test_which_kcl3_modes_this_consumer_can_join(version, refused):
    state = None if version is None else MigrationState(version, "worker-7", 1732400000000)
    reason = conflict("orders", state)
    assert (reason is not None) is refused
    if refused:
        assert version in reason and "orders-CoordinatorState" in reason and "worker-7" in reason


def _migration_item(version: str) -> dict:
    """The item as KCL 3.x's MigrationState writes it (key, cv, mb, mts, and the history h)."""
    return {"key": {"S": "Migration3.0"}, "cv": {"S": version}, "mb": {"S": "worker-7"},
            "mts": {"N": "1732400000000"},
            "h": {"L": [{"M": {"cv": {"S": "CLIENT_VERSION_INIT"}, "mb": {"S": "worker-7"},
                               "mts": {"N": "1732399990000"}}}]}}


@pytest.fixture
def application(emulators, dynamodb_client, kinesis_client, unique_name):
    """An application whose coordinator state table KCL 3.x created; returns (config, put)."""
    stream, app = unique_name("k3"), unique_name("k3app")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis_client, stream)
    dynamodb_client.create_table(TableName=coordinator_state_table(app),
                                 AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                                 KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
                                 BillingMode="PAY_PER_REQUEST")
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", aws=emulators.aws_settings())

    def put(version: str) -> dict:
        item = _migration_item(version)
        dynamodb_client.put_item(TableName=coordinator_state_table(app), Item=item)
        return item
    return config, put


@pytest.mark.emulator
def test_a_consumer_refuses_to_join_a_kcl3_fleet_in_3x_mode(application, dynamodb_client):
    config, put = application
    item = put("CLIENT_VERSION_3X")
    with pytest.raises(Kcl3FleetConflict, match="CLIENT_VERSION_3X.*elected leader"):
        LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink")).start()
    tables = dynamodb_client.list_tables()["TableNames"]
    assert config.application not in tables, "the lease table was created although the consumer refused to start"
    after = dynamodb_client.get_item(TableName=coordinator_state_table(config.application),
                                     Key={"key": {"S": "Migration3.0"}}, ConsistentRead=True)["Item"]
    assert after == item  # only ever read


@pytest.mark.emulator
def test_a_consumer_joins_a_kcl3_fleet_in_2x_compatible_mode(application, dynamodb_client):
    config, put = application
    item = put("CLIENT_VERSION_UPGRADE_FROM_2X")
    LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink")).start()
    assert read_migration_state(dynamodb_client, config.application) == MigrationState(
        "CLIENT_VERSION_UPGRADE_FROM_2X", "worker-7", 1732400000000)
    after = dynamodb_client.get_item(TableName=coordinator_state_table(config.application),
                                     Key={"key": {"S": "Migration3.0"}}, ConsistentRead=True)["Item"]
    assert after == item


@pytest.mark.emulator
def test_consume_beside_a_3x_fleet_exits_2_with_the_reason(application, emulators, tmp_path):
    config, put = application
    put("CLIENT_VERSION_3X_WITH_ROLLBACK")
    result = subprocess.run(
        [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", config.stream, "--application",
         config.application, "--sink", f"jsonl:{tmp_path}"],
        env={**os.environ, **emulators.env()}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "CLIENT_VERSION_3X_WITH_ROLLBACK" in result.stderr and "another application name" in result.stderr
