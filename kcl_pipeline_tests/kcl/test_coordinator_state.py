"""Sharing an application with KCL 3.x: start beside a 2.x-compatible fleet (leaderless) and beside a
leader-assigned one (as its follower: core/fleet/fleet_mode.py), refuse an unknown client version, and leave every
KCL 3.x item exactly as KCL 3.x wrote it."""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.core.table.coordinator_state import (
    CLIENT_VERSION_2X,
    CLIENT_VERSION_3X,
    CLIENT_VERSION_3X_WITH_ROLLBACK,
    CLIENT_VERSION_INIT,
    CLIENT_VERSION_UPGRADE_FROM_2X,
    CoordinatorStateInvalid,
    MigrationState,
    coordinator_state_table,
    decide,
    migration_state_from_item,
)
from kcl_pipeline.kcl.shells.fleet.kcl3_tables import Kcl3FleetActive
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec


def migration_item(version: str) -> dict:
    """Numbers in DynamoDB's normal form (it stores 100.0 as 100). The item as KCL 3.x's MigrationState
    writes it (key, cv, mb, mts, h)."""
    return {"key": {"S": "Migration3.0"}, "cv": {"S": version}, "mb": {"S": "java-3x-worker-1"},
            "mts": {"N": "1732441200000"},
            "h": {"L": [{"M": {"cv": {"S": CLIENT_VERSION_UPGRADE_FROM_2X}, "mb": {"S": "java-3x-worker-1"},
                               "mts": {"N": "1732440000000"}}}]}}


# -- the pure decision -------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [CLIENT_VERSION_INIT, CLIENT_VERSION_UPGRADE_FROM_2X, CLIENT_VERSION_2X])
def test_a_2x_compatible_fleet_does_not_stop_this_consumer(version):
    verdict = decide(migration_state_from_item(migration_item(version)), "app")
    assert verdict.proceed and version in verdict.reason


@pytest.mark.parametrize("version", [CLIENT_VERSION_3X_WITH_ROLLBACK, CLIENT_VERSION_3X])
def test_a_leader_assigned_3x_fleet_is_joined_as_its_follower(version):
    verdict = decide(migration_state_from_item(migration_item(version)), "app")
    assert verdict.proceed
    assert version in verdict.reason and "follows" in verdict.reason
    assert "java-3x-worker-1" in verdict.reason


def test_no_migration_item_means_a_2x_table():
    assert decide(None, "app").proceed


def test_an_unknown_client_version_is_refused_not_guessed():
    verdict = decide(MigrationState("CLIENT_VERSION_4X"), "app")
    assert not verdict.proceed and "CLIENT_VERSION_4X" in verdict.reason


@pytest.mark.parametrize("item", [{"key": {"S": "Migration3.0"}}, {"key": {"S": "Migration3.0"}, "cv": {"N": "3"}},
                                  {"key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3X"}, "mts": {"N": "x"}}])
def test_a_malformed_migration_item_is_a_specific_error(item):
    with pytest.raises(CoordinatorStateInvalid, match="Migration3.0"):
        migration_state_from_item(item)


# -- against the emulators ------------------------------------------------------------------------------
def _create_table(dynamodb_client, name: str, hash_key: str) -> None:
    dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                 AttributeDefinitions=[{"AttributeName": hash_key, "AttributeType": "S"}],
                                 KeySchema=[{"AttributeName": hash_key, "KeyType": "HASH"}])
    dynamodb_client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})


@pytest.mark.emulator
@pytest.mark.parametrize("version", ["CLIENT_VERSION_4X"])
def test_consume_beside_an_unknown_client_version_exits_2_without_touching_the_lease_table(
        version, emulators, kinesis_client, dynamodb_client, unique_name):
    stream, app = unique_name("k3"), unique_name("k3app")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis_client, stream)
    _create_table(dynamodb_client, coordinator_state_table(app), "key")
    dynamodb_client.put_item(TableName=coordinator_state_table(app), Item=migration_item(version))
    done = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream,
                           "--application", app, "--worker-id", "me", "--sink", "jsonl:/dev/null"],
                          env={**os.environ, **emulators.env()}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "unknown KCL client version" in done.stderr and version in done.stderr and "Traceback" not in done.stderr
    assert app not in dynamodb_client.list_tables()["TableNames"]  # no lease table created


@pytest.mark.emulator
def test_kcl3_items_round_trip_unchanged_through_this_consumer(
        emulators, kinesis_client, dynamodb_client, unique_name):
    """Lease with checkpointOwner held by a 3.x worker, worker metrics, coordinator state: byte-for-byte the
    same after this consumer started, cycled and renewed its own lease (which carries a 3.x attribute too)."""
    stream, app = unique_name("k3rt"), unique_name("k3rtapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    theirs, mine = [s.shard_id for s in list_shards(kinesis_client, stream)]
    _create_table(dynamodb_client, coordinator_state_table(app), "key")
    _create_table(dynamodb_client, f"{app}-WorkerMetricStats", "wid")
    coordinator = migration_item(CLIENT_VERSION_UPGRADE_FROM_2X)
    metrics = {"wid": {"S": "java-3x-worker-1"}, "lut": {"N": "1732441200"},
               "sts": {"M": {"CPU": {"L": [{"N": "41.5"}, {"N": "43.25"}]},
                             "NETWORK_IN": {"L": [{"N": "1024"}]}}},
               "opr": {"M": {"CPU": {"L": [{"N": "100"}]}}}}
    dynamodb_client.put_item(TableName=coordinator_state_table(app), Item=coordinator)
    dynamodb_client.put_item(TableName=f"{app}-WorkerMetricStats", Item=metrics)

    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=10.0,
                            lease_expiry_seconds=30.0, max_leases=4, aws=emulators.aws_settings())
    clock = [1000.0]
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"), clock=lambda: clock[0])
    manager._spawn = lambda spawn: None  # the decisions only
    manager.start()  # 2.x-compatible: proceeds and creates the lease table
    table = LeaseTable(app, dynamodb_client)
    # A 3.x graceful hand-off in flight: the new owner holds the lease, the old one still has to checkpoint.
    their_lease = {"leaseKey": {"S": theirs}, "leaseOwner": {"S": "java-3x-worker-2"}, "leaseCounter": {"N": "12"},
                   "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
                   "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "1"},
                   "checkpointOwner": {"S": "java-3x-worker-1"}, "throughputKBps": {"N": "12.5"},
                   "startingHashKey": {"S": "0"}, "endingHashKey": {"S": "170141183460469231731687303715884105727"}}
    my_lease = {"leaseKey": {"S": mine}, "leaseOwner": {"S": "me"}, "leaseCounter": {"N": "3"},
                "checkpoint": {"S": "TRIM_HORIZON"}, "checkpointSubSequenceNumber": {"N": "0"},
                "ownerSwitchesSinceCheckpoint": {"N": "0"}, "throughputKBps": {"N": "3"},
                "startingHashKey": {"S": "170141183460469231731687303715884105728"},
                "endingHashKey": {"S": "340282366920938463463374607431768211455"}}
    for item in (their_lease, my_lease):
        dynamodb_client.put_item(TableName=app, Item=item)
    before = copy.deepcopy([their_lease, metrics, coordinator])
    for _ in range(3):
        manager.run_cycle()
        clock[0] += 5.0  # within the expiry: the 3.x worker is alive
    assert table.heartbeat(mine, "me", 3)
    assert table.release(mine, "me", 4)

    def get(table_name, key):
        return dynamodb_client.get_item(TableName=table_name, Key=key, ConsistentRead=True)["Item"]
    after = [get(app, {"leaseKey": {"S": theirs}}),
             get(f"{app}-WorkerMetricStats", {"wid": {"S": "java-3x-worker-1"}}),
             get(coordinator_state_table(app), {"key": {"S": "Migration3.0"}})]
    assert after == before
    mine_after = get(app, {"leaseKey": {"S": mine}})
    for name in ("throughputKBps", "startingHashKey", "endingHashKey"):
        assert mine_after[name] == my_lease[name], f"{name} was stripped or changed by our own writes"


@pytest.mark.emulator
def test_a_malformed_coordinator_state_stops_the_manager_with_a_specific_error(
        emulators, kinesis_client, dynamodb_client, unique_name):
    stream, app = unique_name("k3bad"), unique_name("k3badapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_stream_active(kinesis_client, stream)
    _create_table(dynamodb_client, coordinator_state_table(app), "key")
    dynamodb_client.put_item(TableName=coordinator_state_table(app), Item={"key": {"S": "Migration3.0"}})
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", aws=emulators.aws_settings())
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"))
    with pytest.raises(CoordinatorStateInvalid, match="'cv'"):
        manager.start()
    assert app not in dynamodb_client.list_tables()["TableNames"]


def test_kcl3_fleet_active_is_a_runtime_error_the_cli_reports():
    assert issubclass(Kcl3FleetActive, RuntimeError)
