"""Nothing but leases in a lease table a KCL 2.x fleet may share (issue 31, item 1).

Every KCL 2.x release lists its leases by scanning the table and deserialising every item
(DynamoDBLeaseSerializer.fromDynamoRecord: `leaseCounter` and `ownerSwitchesSinceCheckpoint` may not be null), and
one item without them fails the whole listing: its taker stops taking, failover stops, its shard sync stops. The
manager wrote its worker metrics item into the lease table from its first cycle, on a table with no KCL 3.x metadata
at all. Java 3.x publishes worker metrics only once a migration state says the fleet is upgrading or upgraded;
so does this consumer now (core/fleet_mode.publishes_worker_metrics)."""
from __future__ import annotations

import random

import pytest

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.fleet import fleet_mode
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.table.coordinator_state import Layout, MigrationState, coordinator_state_table
from kcl_pipeline.kcl.core.table.lease_codec import LeaseScan
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.core.table.worker_metrics import worker_metrics_table
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.sim.actors.java import java2_rejects

from .cycle_support import drive_cycle
from .test_kcl35_layouts import application, manager_for, migration  # noqa: F401  (application: a fixture)

UPGRADING = "CLIENT_VERSION_UPGRADE_FROM_2X"


# -- pure: the decision ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version, publishes", [
    (None, False), ("CLIENT_VERSION_INIT", False), ("CLIENT_VERSION_2X", False),
    (UPGRADING, True), ("CLIENT_VERSION_3X_WITH_ROLLBACK", True), ("CLIENT_VERSION_3X", True),
    ("CLIENT_VERSION_4X", True),  # a newer KCL's leader is followed, and reads our metrics
])
@pytest.mark.parametrize("layout", [Layout.LEASE_TABLE, Layout.SEPARATE_TABLES])
def test_worker_metrics_are_published_only_where_a_kcl3_migration_state_says_the_fleet_upgrades(
        version, publishes, layout):
    state = None if version is None else MigrationState(version)
    if layout is Layout.LEASE_TABLE:
        view = fleet_mode.FleetView(layout=layout, lease_table=state)
    else:
        view = fleet_mode.FleetView(layout=layout, separate=state)
    assert fleet_mode.publishes_worker_metrics(view) is publishes


SETTINGS = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10, worker_metrics_period_seconds=30.0)


def _cycle(state, scan, now, effects):
    """One cycle whose scan returns `scan` (a LeaseScan: its entities too); the metrics effects land in `effects`."""
    def handle(effect):
        if isinstance(effect, fx.Now):
            return now
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(scan, now, now)
        if isinstance(effect, fx.ListShards):
            return state.shards
        if isinstance(effect, (fx.PublishWorkerMetrics, fx.ReadWorkerMetrics)):
            effects.append(type(effect).__name__)
        return None
    fx.drive(cyc.manager_cycle(state, SETTINGS, frozenset(), random.Random(0)), handle)


def _cycles(entities, times=(0.0, 40.0, 80.0)):
    """Cycles of a consumer whose scans meet `entities` besides one lease; the metrics effects it yields."""
    state = cyc.ManagerState(shards=[Shard("shardId-0")], list_next=False)
    effects: list[str] = []
    for now in times:
        _cycle(state, LeaseScan([Lease("shardId-0", Checkpoint(TRIM_HORIZON), None, 1)], entities), now, effects)
    return effects


def test_a_cycle_on_a_table_without_kcl3_metadata_writes_no_worker_metrics_item():
    assert _cycles([]) == []
    assert _cycles([migration("CLIENT_VERSION_2X")]) == []  # rolled back: Java stops publishing too


def test_a_cycle_on_a_table_a_kcl3_fleet_upgrades_publishes_its_worker_metrics_each_period():
    assert _cycles([migration(UPGRADING)]) == ["ReadWorkerMetrics", "PublishWorkerMetrics"] * 3


def test_a_rollback_forgets_the_peers_the_metrics_showed():
    """Peers known from metrics before a rollback to 2X must not be asked for hand-offs or counted as idle for
    ever: nothing refreshes them once nobody publishes."""
    state = cyc.ManagerState(shards=[Shard("shardId-0")], list_next=False, live_peers=frozenset({"gone"}))
    _cycle(state, LeaseScan([], [migration("CLIENT_VERSION_2X")]), 0.0, [])
    assert state.live_peers == frozenset()


def test_a_holder_that_took_its_lease_by_this_protocol_is_asked_for_a_hand_off_without_worker_metrics():
    """In a 2.x table nobody publishes metrics; this protocol's holders still answer hand-offs, and its acquire
    names them (`leaseClaimOwner`), which a KCL 2.x take (it sets `leaseOwner` only) leaves stale."""
    ours = [Lease(f"s-{i}", Checkpoint(TRIM_HORIZON), "peer", 5, extra={CLAIM_OWNER_ATTRIBUTE: "peer"})
            for i in range(4)]
    java = [Lease(f"s-{i}", Checkpoint(TRIM_HORIZON), "peer", 5, extra={CLAIM_OWNER_ATTRIBUTE: "someone-before"})
            for i in range(4)]

    def spawned(leases):
        state = cyc.ManagerState(shards=[Shard(lease.lease_key) for lease in leases], list_next=False)
        spawns = []

        def seen(effect):
            if isinstance(effect, fx.Spawn):
                spawns.append((effect.stolen, effect.handoff))
        drive_cycle(state, SETTINGS, leases, 100.0, seen=seen)
        return spawns

    assert spawned(ours) == [(True, True)]
    assert spawned(java) == [(True, False)]  # a Java 2.x holder: stolen from cold


# -- against dynalite -------------------------------------------------------------------------------------------------

def _items(dynamodb_client, table):
    return dynamodb_client.scan(TableName=table, ConsistentRead=True)["Items"]


@pytest.mark.emulator
def test_a_manager_cycling_on_a_fresh_table_leaves_only_items_java_2x_can_list(emulators, dynamodb_client,
                                                                               application):  # noqa: F811
    stream, app, shards = application
    manager, spawned = manager_for(emulators, stream, app)
    manager.start()
    for cycle in range(3):
        manager.clock = lambda at=1000.0 + 40.0 * cycle: at  # past the metrics period each time
        manager.run_cycle()
    items = _items(dynamodb_client, app)
    assert sorted(item["leaseKey"]["S"] for item in items) == sorted(shards)
    assert [item for item in items if java2_rejects(item)] == []
    tables = dynamodb_client.list_tables()["TableNames"]
    assert worker_metrics_table(app) not in tables and coordinator_state_table(app) not in tables


@pytest.mark.emulator
def test_with_kcl3_metadata_the_worker_metrics_are_still_published_where_the_leader_reads_them(
        emulators, dynamodb_client, application):  # noqa: F811
    stream, app, shards = application
    LeaseTable(app, dynamodb_client).ensure_table()
    dynamodb_client.put_item(TableName=app, Item=migration(UPGRADING))  # KCL 3.5's one-table layout
    manager, _ = manager_for(emulators, stream, app)
    manager.start()
    manager.run_cycle()
    ours = dynamodb_client.get_item(TableName=app, Key={"leaseKey": {"S": "me"}}, ConsistentRead=True).get("Item")
    assert ours is not None and ours["entityType"] == {"S": "WORKER_METRIC_STATS"}


@pytest.mark.emulator
def test_a_rolled_back_separate_layout_gets_no_worker_metrics_item(emulators, dynamodb_client, application):  # noqa: F811
    stream, app, _shards = application
    dynamodb_client.create_table(TableName=coordinator_state_table(app), BillingMode="PAY_PER_REQUEST",
                                 AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                                 KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}])
    dynamodb_client.get_waiter("table_exists").wait(TableName=coordinator_state_table(app),
                                                    WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    dynamodb_client.put_item(TableName=coordinator_state_table(app), Item={
        "key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_2X"}, "mb": {"S": "java-1"},
        "mts": {"N": "1732441200000"}})
    manager, _ = manager_for(emulators, stream, app)
    manager.start()
    manager.run_cycle()
    assert worker_metrics_table(app) not in dynamodb_client.list_tables()["TableNames"]
    assert [item for item in _items(dynamodb_client, app) if java2_rejects(item)] == []
