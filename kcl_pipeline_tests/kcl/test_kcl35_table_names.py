"""KCL 3.x's metadata tables under the application's own names (Java's CoordinatorStateTableConfig and
WorkerMetricsTableConfig `tableName`; multilang's `coordinatorStateTableName` / `workerMetricsTableName`).

The consumer looked only for `<app>-CoordinatorState` / `<app>-WorkerMetricStats`: beside a renamed coordinator-state
table holding a 3.x leader's state it found no table, chose the one-table layout, saw no migration state there and
ran leaderless — taking and stealing beside the leader — and a 3.x leader never saw its metrics."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.config import ConfigError, ConsumerConfig
from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetMode
from kcl_pipeline.kcl.core.table.coordinator_state import Layout
from kcl_pipeline.kcl.properties import read_properties_file
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec
from kcl_pipeline_tests.kcl.test_kcl35_layouts import lease_item


def _create(dynamodb_client, name: str, key: str) -> None:
    dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                 AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                                 KeySchema=[{"AttributeName": key, "KeyType": "HASH"}])
    dynamodb_client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})


@pytest.mark.emulator
def test_a_renamed_coordinator_state_table_with_a_3x_leader_is_followed_and_our_metrics_go_to_the_renamed_table(
        emulators, kinesis_client, dynamodb_client, unique_name):
    stream, app = unique_name("k3n"), unique_name("k3napp")
    state_table, metrics_table = unique_name("ops-state"), unique_name("ops-metrics")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    assigned, held = (s.shard_id for s in list_shards(kinesis_client, stream))
    _create(dynamodb_client, state_table, "key")
    _create(dynamodb_client, metrics_table, "wid")
    # KCL 3.0-3.4's separate layout (no entityType), under the application's own table names: a 3.x leader.
    dynamodb_client.put_item(TableName=state_table, Item={
        "key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3X"}, "mb": {"S": "java-leader"},
        "mts": {"N": "1732441200000"}})
    dynamodb_client.put_item(TableName=state_table, Item={
        "key": {"S": "Leader"}, "ownerName": {"S": "java-leader"}, "leaseDuration": {"S": "10000"},
        "recordVersionNumber": {"S": "5b6e0ac4"}})
    LeaseTable(app, dynamodb_client).ensure_table()
    for item in (lease_item(held, "java-leader", 40), lease_item(assigned, "me", 7)):
        dynamodb_client.put_item(TableName=app, Item=item)

    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=1.0,
                            lease_expiry_seconds=3.0, leases_to_acquire=3, aws=emulators.aws_settings(),
                            coordinator_state_table_name=state_table, worker_metrics_table_name=metrics_table)
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"), clock=lambda: 1000.0)
    spawned: list = []
    manager._spawn = lambda spawn: spawned.append(spawn.lease.lease_key)
    manager.start()
    assert manager.state.fleet.layout is Layout.SEPARATE_TABLES and manager.state.fleet.mode is FleetMode.FOLLOWER
    report = manager.run_cycle()
    assert spawned == [assigned]  # the leader's assignment, nothing taken or stolen
    assert "leader=java-leader" in report.summary()
    ours = dynamodb_client.get_item(TableName=metrics_table, Key={"wid": {"S": "me"}}, ConsistentRead=True)
    assert "THROUGHPUT" in ours["Item"]["sts"]["M"]
    assert f"{app}-WorkerMetricStats" not in dynamodb_client.list_tables()["TableNames"]


def test_the_table_names_come_from_a_kcl_properties_file_and_are_checked(tmp_path):
    path = tmp_path / "app.properties"
    path.write_text("streamName = orders\napplicationName = app\ncoordinatorStateTableName = ops-state\n"
                    "workerMetricsTableName = ops-metrics\n")
    settings = read_properties_file(str(path)).settings
    assert (settings["coordinator_state_table_name"], settings["worker_metrics_table_name"]) == ("ops-state",
                                                                                                 "ops-metrics")
    with pytest.raises(ConfigError, match="coordinator_state_table_name"):
        ConsumerConfig(stream="orders", application="app", coordinator_state_table_name="x")
    with pytest.raises(ConfigError, match="worker_metrics_table_name"):
        ConsumerConfig(stream="orders", application="app", worker_metrics_table_name="bad name")
