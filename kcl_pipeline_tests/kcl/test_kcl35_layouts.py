"""KCL 3.5 coexistence, item 1: both layouts of KCL 3.x's metadata, chosen by what the tables hold.

KCL 3.5 keeps its metadata in the lease table for a new application and every 2.x → 3.x upgrade: no
`<app>-CoordinatorState` table; the migration state, the leader lock and each worker's metrics are items of the lease
table with an `entityType`. Reading only the separate table found nothing, concluded "2.x", and started taking beside
a leader (ping-pong, restarts from checkpoints, re-delivery), and this consumer's metrics went to a table the leader
never reads. KCL 3.0–3.4 (and 3.5 until its table migration completes) keep them in the separate tables."""
from __future__ import annotations

import copy

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetMode
from kcl_pipeline.kcl.core.table.coordinator_state import (
    Layout,
    MigrationState,
    choose_layout,
    coordinator_state_table,
    lease_table_leader,
    lease_table_migration,
)
from kcl_pipeline.kcl.core.table.worker_metrics import lease_table_last_updates, worker_metrics_table
from kcl_pipeline.kcl.shells.fleet import kcl3_tables
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec

SEQ = "49590338271490256608559692538361571095921575989136588898"


# -- items exactly as KCL 3.5 writes them into the lease table ------------------------------------------------------

def migration(version: str, by: str = "java-leader") -> dict:
    # CoordinatorStateDAODelegate.toDynamoRecord: the lease table's key (DynamoDBLeaseSerializer.LEASE_KEY_KEY) +
    # CoordinatorState.serialize (entityType CLIENT_VERSION_MIGRATION) + MigrationState.serialize (cv, mb, mts, h).
    return {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"}, "cv": {"S": version},
            "mb": {"S": by}, "mts": {"N": "1732441200000"},
            "h": {"L": [{"M": {"cv": {"S": "CLIENT_VERSION_INIT"}, "mb": {"S": by}, "mts": {"N": "1732440000000"}}}]}}


# The leader lock: LeaderLock (key "Leader", entityType LEADER as an additional attribute) written by the DynamoDB
# lock client (ownerName, leaseDuration, recordVersionNumber).
LEADER = {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": "java-leader"},
          "leaseDuration": {"S": "10000"}, "recordVersionNumber": {"S": "5b6e0ac4-96a4-4b5c-9a0c-0d4b1f2bd8e2"}}


def metrics_item(worker: str, lut: int) -> dict:
    # LeaseTableWorkerMetricStats: leaseKey (the worker id), entityType WORKER_METRIC_STATS, lut, sts, opr, sup, slu.
    return {"leaseKey": {"S": worker}, "entityType": {"S": "WORKER_METRIC_STATS"}, "lut": {"N": str(lut)},
            "sts": {"M": {"CPU": {"L": [{"N": "41.5"}, {"N": "43.25"}]}}}, "opr": {"M": {"CPU": {"L": [{"N": "100"}]}}},
            "sup": {"N": "1"}, "slu": {"N": str(lut)}}


def lease_item(key: str, owner: str | None, counter: int) -> dict:
    # DynamoDBLeaseSerializer.toDynamoRecord: leaseKey, leaseCounter, leaseOwner, ownerSwitchesSinceCheckpoint,
    # checkpoint, checkpointSubSequenceNumber, entityType LEASE.
    item = {"leaseKey": {"S": key}, "leaseCounter": {"N": str(counter)}, "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": SEQ}, "checkpointSubSequenceNumber": {"N": "0"}, "entityType": {"S": "LEASE"}}
    if owner:
        item["leaseOwner"] = {"S": owner}
    return item


# -- pure: the layout and the entities --------------------------------------------------------------------------------

def test_no_separate_table_or_a_complete_table_migration_is_the_one_table_layout():
    assert choose_layout(False, None) is Layout.LEASE_TABLE
    assert choose_layout(True, "TABLE_MIGRATION_STATUS_COMPLETE") is Layout.LEASE_TABLE
    for status in (None, "TABLE_MIGRATION_STATUS_INIT", "TABLE_MIGRATION_STATUS_DEPLOYED",
                   "TABLE_MIGRATION_STATUS_PENDING"):
        assert choose_layout(True, status) is Layout.SEPARATE_TABLES


def test_the_lease_tables_entities_are_read_and_an_item_of_another_type_under_the_key_is_not_the_state():
    items = [migration("CLIENT_VERSION_3X"), LEADER, metrics_item("java-1", 1732441200)]
    assert lease_table_migration(items) == MigrationState("CLIENT_VERSION_3X", "java-leader", 1732441200000)
    assert lease_table_leader(items) == "java-leader"
    assert lease_table_leader([{**LEADER, "isReleased": {"BOOL": True}}]) is None
    assert lease_table_last_updates(items) == {"java-1": 1732441200.0}
    # Not KCL's entity type (another tool's item under that key, as in the simulation's table): not the state.
    assert lease_table_migration([{**migration("CLIENT_VERSION_3X"), "entityType": {"S": "COORDINATOR_STATE"}}]) is None


# -- against the emulators --------------------------------------------------------------------------------------------

@pytest.fixture
def application(kinesis_client, unique_name):
    stream, app = unique_name("k35"), unique_name("k35app")
    kinesis_client.create_stream(StreamName=stream, ShardCount=3)
    wait_stream_active(kinesis_client, stream)
    return stream, app, [s.shard_id for s in list_shards(kinesis_client, stream)]


def manager_for(emulators, stream: str, app: str) -> tuple[LeaseManager, list]:
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=1.0,
                            lease_expiry_seconds=3.0, leases_to_acquire=3, aws=emulators.aws_settings())
    clock = [1000.0]
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"), clock=lambda: clock[0])
    spawned: list = []
    manager._spawn = lambda spawn: spawned.append((spawn.lease.lease_key, spawn.stolen, spawn.handoff))
    return manager, spawned


@pytest.mark.emulator
def test_a_35_application_in_the_one_table_layout_is_not_taken_for_2x_its_leader_is_followed(
        emulators, dynamodb_client, application):
    stream, app, (assigned, held, free) = application
    LeaseTable(app, dynamodb_client).ensure_table()
    java_items = [migration("CLIENT_VERSION_3X"), LEADER, metrics_item("java-leader", 1732441200),
                  lease_item(held, "java-leader", 40), lease_item(free, None, 3)]
    for item in [*java_items, lease_item(assigned, "me", 7)]:  # the leader assigned one lease to our worker id
        dynamodb_client.put_item(TableName=app, Item=item)
    before = copy.deepcopy(java_items[:3])
    manager, spawned = manager_for(emulators, stream, app)
    manager.start()
    assert manager.state.fleet.layout is Layout.LEASE_TABLE and manager.state.fleet.mode is FleetMode.FOLLOWER
    report = manager.run_cycle()
    assert spawned == [(assigned, True, False)]  # adopted; the free lease is the leader's
    assert "mode=follower" in report.summary() and "leader=java-leader" in report.summary()
    # Our metrics where the leader reads them: an item of the lease table, keyed by our worker id.
    ours = dynamodb_client.get_item(TableName=app, Key={"leaseKey": {"S": "me"}}, ConsistentRead=True)["Item"]
    assert ours["entityType"] == {"S": "WORKER_METRIC_STATS"} and "THROUGHPUT" in ours["sts"]["M"]
    tables = dynamodb_client.list_tables()["TableNames"]
    assert coordinator_state_table(app) not in tables and worker_metrics_table(app) not in tables
    after = [dynamodb_client.get_item(TableName=app, Key={"leaseKey": item["leaseKey"]}, ConsistentRead=True)["Item"]
             for item in before]
    assert after == before  # the migration state, the leader lock, another worker's metrics: untouched
    scanned = LeaseTable(app, dynamodb_client).scan()
    assert sorted(lease.lease_key for lease in scanned) == sorted([assigned, held, free])


@pytest.mark.emulator
def test_the_separate_layout_of_3_0_to_3_4_is_read_and_written_where_it_is(
        emulators, dynamodb_client, application):
    stream, app, (first, _second, _third) = application
    for name, key in ((coordinator_state_table(app), "key"), (worker_metrics_table(app), "wid")):
        dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                     AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                                     KeySchema=[{"AttributeName": key, "KeyType": "HASH"}])
    # MigrationState in KCL 3.0–3.4's table (hash key `key`, no entityType), a 2.x-compatible upgrade in progress.
    dynamodb_client.put_item(TableName=coordinator_state_table(app), Item={
        "key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_UPGRADE_FROM_2X"}, "mb": {"S": "java-1"},
        "mts": {"N": "1732441200000"}})
    manager, spawned = manager_for(emulators, stream, app)
    manager.start()
    assert manager.state.fleet.layout is Layout.SEPARATE_TABLES and manager.state.fleet.mode is FleetMode.LEADERLESS
    manager.run_cycle()  # creates the leases and takes them, leaderless
    assert first in {key for key, _, _ in spawned}
    legacy = dynamodb_client.get_item(TableName=worker_metrics_table(app), Key={"wid": {"S": "me"}},
                                      ConsistentRead=True).get("Item")
    assert legacy is not None and "THROUGHPUT" in legacy["sts"]["M"]
    assert dynamodb_client.get_item(TableName=app, Key={"leaseKey": {"S": "me"}}).get("Item") is None


@pytest.mark.emulator
def test_worker_metrics_are_read_from_the_lease_table_in_the_one_table_layout_and_merged_in_the_separate_one(
        dynamodb_client, unique_name):
    app = unique_name("k35wm")
    LeaseTable(app, dynamodb_client).ensure_table()
    for item in (metrics_item("java-1", 1000), metrics_item("java-2", 2000), lease_item("shardId-0", "java-1", 1)):
        dynamodb_client.put_item(TableName=app, Item=item)
    assert kcl3_tables.read_last_updates(dynamodb_client, app, Layout.LEASE_TABLE, app) == {
        "java-1": 1000.0, "java-2": 2000.0}
    kcl3_tables.publish(dynamodb_client, app, "java-2", 1500, [1.0])  # the separate table, created (3.0–3.4)
    assert kcl3_tables.read_last_updates(dynamodb_client, app, Layout.SEPARATE_TABLES, app) == {
        "java-1": 1000.0, "java-2": 2000.0}  # both read, the latest per worker


@pytest.mark.emulator
def test_our_metrics_item_never_overwrites_a_lease_whose_key_is_our_worker_id(dynamodb_client, unique_name):
    app = unique_name("k35clash")
    LeaseTable(app, dynamodb_client).ensure_table()
    dynamodb_client.put_item(TableName=app, Item=lease_item("shardId-000000000000", "java-1", 4))
    with pytest.raises(dynamodb_client.exceptions.ConditionalCheckFailedException):
        kcl3_tables.publish(dynamodb_client, app, "shardId-000000000000", 1732441200, [1.0], Layout.LEASE_TABLE, app)
    item = dynamodb_client.get_item(TableName=app, Key={"leaseKey": {"S": "shardId-000000000000"}})["Item"]
    assert item == lease_item("shardId-000000000000", "java-1", 4)


@pytest.mark.emulator
def test_leases_shows_the_fleets_mode_and_its_leader(emulators, dynamodb_client, unique_name):
    import os
    import subprocess
    import sys

    app = unique_name("k35cli")
    LeaseTable(app, dynamodb_client).ensure_table()
    for item in (migration("CLIENT_VERSION_3X_WITH_ROLLBACK"), LEADER, lease_item("shardId-000000000000", "me", 2)):
        dynamodb_client.put_item(TableName=app, Item=item)
    done = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "leases", "--application", app],
                          env={**os.environ, **emulators.env()}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "shardId-000000000000" in done.stdout and "Migration3.0" not in done.stdout  # entities are no leases
    line = next(line for line in done.stderr.splitlines() if line.startswith("kcl3: "))
    assert "mode=follower" in line and "CLIENT_VERSION_3X_WITH_ROLLBACK" in line and "leader=java-leader" in line
    assert "one-table layout" in line
