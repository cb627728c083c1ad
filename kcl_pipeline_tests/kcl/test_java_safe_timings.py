"""Default timings are made Java-safe when a Java fleet is seen.

The defaults favour cost (heartbeat 10 s, expiry 30 s). Java KCL judges a lease expired after failoverTimeMillis
(10 s by default) without a counter change: beside Java, a consumer on the defaults had its leases taken between two
heartbeats while it went on delivering for up to 27 s. The README documented `--java-compatible`; nothing applied
it. Timings somebody chose are kept."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.config import JAVA_COMPATIBLE_TIMINGS, ConsumerConfig, timings_beside_java
from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetView, java_fleet_seen
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table.coordinator_state import MigrationState
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec

JAVA_HELD = Lease("shardId-000000000000", Checkpoint(TRIM_HORIZON), "java-worker", 4)
OURS = Lease("shardId-000000000001", Checkpoint(TRIM_HORIZON), "consumer-b", 9,
             extra={CLAIM_OWNER_ATTRIBUTE: "consumer-b"})


def test_a_java_holder_or_a_kcl3_migration_state_is_a_java_fleet():
    assert java_fleet_seen([JAVA_HELD, OURS], FleetView())
    assert not java_fleet_seen([OURS, Lease("s-2", Checkpoint(TRIM_HORIZON))], FleetView())
    assert java_fleet_seen([OURS], FleetView(lease_table=MigrationState("CLIENT_VERSION_UPGRADE_FROM_2X")))


@pytest.mark.parametrize("chosen, switched", [
    ({}, True),  # the defaults: nobody chose them
    ({"heartbeat_seconds": 5.0, "lease_expiry_seconds": 20.0}, False),  # chosen: kept (and logged as unsafe)
    (JAVA_COMPATIBLE_TIMINGS, False),  # already safe
])
def test_only_the_default_timings_are_switched_to_java_safe_ones(chosen, switched):
    config = ConsumerConfig(stream="orders", application="app", **chosen)
    safer = timings_beside_java(config, java_seen=True)
    assert (safer is not None) is switched
    if safer is not None:
        assert safer.java_safe and (safer.heartbeat_seconds, safer.lease_expiry_seconds) == (3.0, 10.0)
    assert timings_beside_java(config, java_seen=False) is None


@pytest.mark.emulator
def test_a_consumer_starting_beside_a_java_holder_on_the_defaults_runs_java_safe(
        emulators, kinesis_client, dynamodb_client, unique_name):
    stream, app = unique_name("js"), unique_name("jsapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    first = list_shards(kinesis_client, stream)[0].shard_id
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    table.create(Lease(first, Checkpoint(TRIM_HORIZON), "java-worker", 4))  # a Java take: no leaseClaimOwner
    manager = LeaseManager(ConsumerConfig(stream=stream, application=app, aws=emulators.aws_settings()),
                           ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"))
    manager._spawn = lambda spawn: None
    manager.start()
    assert manager.config.java_safe and manager.settings.expiry_seconds == 10.0
    assert manager.transport.config.heartbeat_seconds == 3.0  # the workers it starts heartbeat every 3 s
