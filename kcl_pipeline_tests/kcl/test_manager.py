"""The lease manager's cycle against kinesis-local + dynalite, with a virtual clock and no worker processes:
when lease ages are stamped, which leases it touches in a shared table, and a second process under our id."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from kcl_pipeline.kcl.config import ConsumerConfig
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec

pytestmark = pytest.mark.emulator

EXPIRY = 30.0


@pytest.fixture
def fleet(emulators, kinesis_client, dynamodb_client, unique_name):
    def make(shards: int = 2, **settings):
        stream, app = unique_name("m"), unique_name("mapp")
        kinesis_client.create_stream(StreamName=stream, ShardCount=shards)
        wait_stream_active(kinesis_client, stream)
        config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=10.0,
                                lease_expiry_seconds=EXPIRY, max_leases=4, aws=emulators.aws_settings(), **settings)
        clock = [1000.0]
        manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink"), clock=lambda: clock[0])
        spawned: list[str] = []
        manager._spawn = lambda spawn: spawned.append(spawn.lease.lease_key)  # no processes: the decisions only
        manager.start()
        table = LeaseTable(app, dynamodb_client)
        return manager, table, clock, spawned, [s.shard_id for s in list_shards(kinesis_client, stream)]
    return make


def test_lease_ages_are_stamped_when_the_scan_returns_not_when_the_cycle_started(fleet):
    """A long cycle (slow creations) must not make a live peer's lease look older than it is."""
    manager, table, clock, spawned, (peer_shard, new_shard) = fleet()
    assert table.create(Lease(peer_shard, Checkpoint(TRIM_HORIZON), "peer", 5))
    real_create = manager.table.create

    def slow_create(lease):
        clock[0] += 40.0  # throttled creations: the cycle takes 40 s
        assert table.heartbeat(peer_shard, "peer", table.get(peer_shard).lease_counter)  # the peer is alive
        return real_create(lease)

    manager.table.create = slow_create
    manager.run_cycle()  # scans, creates new_shard's lease (40 s), scans again: sees the peer's heartbeat
    manager.table.create = real_create
    clock[0] += 8.0  # 8 s after the peer's heartbeat was observed: well inside the expiry
    report = manager.run_cycle()
    assert peer_shard not in spawned and report.stolen is None, "a live peer's lease was judged expired"


def test_a_shared_table_keeps_other_applications_items_byte_for_byte(fleet, emulators, unique_name):
    """A KCL multi-stream lease, another stream's lease under the same application name (a shard id this
    stream does not have), and KCL 3.x non-lease items are never changed, acquired or deleted."""
    manager, table, clock, spawned, shards = fleet()
    foreign = [
        {"leaseKey": {"S": "123456789012:orders:1700000000:shardId-000000000000"}, "leaseCounter": {"N": "3"},
         "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
         "checkpointSubSequenceNumber": {"N": "0"}, "streamName": {"S": "orders"},
         "shardID": {"S": "shardId-000000000000"}},  # free, multi-stream
        {"leaseKey": {"S": "shardId-000000000077"}, "leaseCounter": {"N": "9"}, "checkpoint": {"S": "TRIM_HORIZON"},
         "checkpointSubSequenceNumber": {"N": "0"}},  # free, another stream of the same application
        {"leaseKey": {"S": "shardId-000000000078"}, "leaseCounter": {"N": "1"}, "checkpoint": {"S": "SHARD_END"},
         "checkpointSubSequenceNumber": {"N": "0"}},  # ended, another stream
        {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"},
         "cs": {"S": "KCL_3X_COMPATIBLE"}},  # KCL 3.x non-lease entity
    ]
    for item in foreign:
        table.client.put_item(TableName=table.table_name, Item=item)
    for _ in range(3):
        manager.run_cycle()
        clock[0] += EXPIRY + 1  # everything unchanged looks expired: still never touched
    assert spawned and set(spawned) <= set(shards)  # our own shards only (no real workers here)
    for item in foreign:
        after = table.client.get_item(TableName=table.table_name, Key={"leaseKey": item["leaseKey"]},
                                      ConsistentRead=True).get("Item")
        assert after == item


def test_a_second_live_process_under_our_worker_id_is_detected(fleet):
    manager, table, clock, spawned, (a, b) = fleet()
    for key in (a, b):
        assert table.create(Lease(key, Checkpoint(TRIM_HORIZON), "me", 3))  # ours, but no local worker
    manager.run_cycle()
    assert manager.duplicate_worker_id_sightings == 0
    assert table.heartbeat(a, "me", 3)  # someone else is renewing under our id
    clock[0] += 5
    manager.run_cycle()
    assert manager.duplicate_worker_id_sightings == 1
    assert spawned == []  # and we do not fight over it


def test_a_frozen_local_worker_is_killed_and_its_lease_worked_again(fleet):
    """One worker process stopped (SIGSTOP) while its manager lives: its heartbeats stop, peers wait for the
    lease to expire and this manager counts it as worked — nobody would work it until it thawed."""
    manager, table, clock, spawned, (a,) = fleet(shards=1)
    assert table.create(Lease(a, Checkpoint(TRIM_HORIZON), "me", 3))
    frozen = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,), daemon=True)
    frozen.start()
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        manager.workers[a] = frozen
        manager.run_cycle()
        assert a not in spawned and frozen.is_alive()  # renewed recently enough, as far as we know
        clock[0] += EXPIRY + 1
        manager.run_cycle()
        frozen.join(timeout=10)
        assert frozen.exitcode == -signal.SIGKILL, "the frozen worker was left running"
        assert a in spawned, "the lease of the frozen worker was not taken again"
        assert a not in manager.workers or manager.workers[a] is not frozen
    finally:
        if frozen.is_alive():
            frozen.kill()


def upgrading(table: LeaseTable) -> None:
    """KCL 3.5's migration state in the lease table, a 2.x → 3.x upgrade under way (written as Java writes it)."""
    table.client.put_item(TableName=table.table_name, Item={
        "leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
        "cv": {"S": "CLIENT_VERSION_UPGRADE_FROM_2X"}, "mb": {"S": "java-1"}, "mts": {"N": "1732441200000"}})


def test_the_manager_writes_its_worker_metrics_every_period_with_its_leases_throughput(fleet, dynamodb_client):
    """Before: worker_metrics.publish existed and nothing called it, so a KCL 3.x fleet (and load-aware
    peers) never saw this consumer's throughput. In KCL 3.5's one-table layout the item is the lease table's, keyed
    by the worker id (test_kcl35_layouts.py has the separate tables of 3.0–3.4); only in a table a KCL 3.x fleet
    upgrades (a 2.x table gets none: test_kcl2_table_items.py)."""
    manager, table, clock, spawned, (mine, peer_shard) = fleet()
    upgrading(table)
    assert manager.settings.worker_metrics_period_seconds == 30.0  # ConsumerConfig's default
    table.create(Lease(mine, Checkpoint(TRIM_HORIZON), "me", 3))
    table.create(Lease(peer_shard, Checkpoint(TRIM_HORIZON), "peer", 3))
    # The holders' heartbeats report throughput (throughputKBps); only this consumer's counts for its item.
    for key, kbps in ((mine, 12.5), (peer_shard, 99.0)):
        table.client.update_item(TableName=table.table_name, Key={"leaseKey": {"S": key}},
                                 UpdateExpression="SET throughputKBps = :t",
                                 ExpressionAttributeValues={":t": {"N": str(kbps)}})
    def item():
        return dynamodb_client.get_item(TableName=table.table_name, Key={"leaseKey": {"S": "me"}},
                                        ConsistentRead=True).get("Item")

    manager.run_cycle()
    first = item()
    assert first["sts"] == {"M": {"THROUGHPUT": {"L": [{"N": "12.5"}]}}}
    clock[0] += 10.0
    manager.run_cycle()  # inside the period: not written again
    assert item() == first
    clock[0] += 25.0
    manager.run_cycle()
    assert item()["sts"] == {"M": {"THROUGHPUT": {"L": [{"N": "12.5"}, {"N": "12.5"}]}}}


def test_a_failed_worker_metrics_write_never_fails_the_cycle(fleet, caplog):
    manager, table, clock, spawned, _ = fleet()
    upgrading(table)

    def throttled(*args, **kwargs):
        raise RuntimeError("ProvisionedThroughputExceededException")

    manager.table.client.update_item = throttled  # the metrics write only: leases are created with PutItem
    report = manager.run_cycle()
    assert report.total_leases == 2 and "could not write this consumer's worker metrics" in caplog.text


def test_the_manager_reads_the_fleets_worker_metrics_and_a_failed_read_never_fails_the_cycle(fleet, caplog):
    from kcl_pipeline.kcl.core.table.coordinator_state import Layout
    from kcl_pipeline.kcl.shells.fleet import kcl3_tables

    manager, table, clock, spawned, _ = fleet()
    upgrading(table)
    kcl3_tables.publish(table.client, manager.config.application, "idle-peer", int(time.time()), [0.0],
                        Layout.LEASE_TABLE, table.table_name)  # a peer's item where a 3.5 fleet keeps it
    manager.run_cycle()
    assert manager.state.live_peers == frozenset({"idle-peer"})  # read before our first write

    def throttled(*args, **kwargs):
        raise RuntimeError("ProvisionedThroughputExceededException")

    scan = type(manager.table.client).scan  # only the metrics read (the filtered scan) fails
    manager.table.client.scan = lambda **request: (throttled() if "FilterExpression" in request
                                                   else scan(manager.table.client, **request))
    clock[0] += 60.0
    report = manager.run_cycle()
    assert report.total_leases == 2 and "could not read the fleet's worker metrics" in caplog.text
    assert manager.state.live_peers == frozenset({"idle-peer"})  # the last known peers stay


@pytest.mark.parametrize("since", [None, "renewed", "same-id-took-it"])
def test_a_lease_a_lost_worker_left_in_our_name_is_released_when_the_consumer_stops(fleet, since):
    """Simulation seed 6197: a worker cut off from DynamoDB lost its lease (no heartbeat within the expiry) and could
    not read the table to release it; the consumer then stopped gracefully and exited with the lease still in its
    name, so every peer waited an expiry for it. The worker reports the counter it left the lease at, and its
    manager releases the lease fenced on that counter when it stops — never one another process wrote since
    (another process under the same worker id, say)."""
    from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
    from kcl_pipeline.kcl.shells.workers.worker import WorkerResult

    manager, table, clock, spawned, (shard, _) = fleet()
    assert table.create(Lease(shard, Checkpoint(TRIM_HORIZON)))
    left = table.acquire(shard, "me", None, 0)
    assert left is not None
    if since == "renewed":
        assert table.heartbeat(shard, "me", left.lease_counter)
    elif since == "same-id-took-it":
        assert table.acquire(shard, "me", "me", left.lease_counter) is not None
    manager._pending.append(WorkerResult(shard, LifeOutcome.LEASE_LOST, "no successful heartbeat",
                                         left_at=left.lease_counter))
    manager.shutdown(timeout=1.0)
    assert table.get(shard).lease_owner == (None if since is None else "me")


class _Worker:
    """A local worker process as the manager sees it: `on_kill` runs what the process wrote just before dying."""

    pid = 4242
    exitcode = None

    def __init__(self, on_kill=lambda: None):
        self.alive, self.on_kill = True, on_kill

    def is_alive(self):
        return self.alive

    def terminate(self):
        self.alive = False  # stopped before its take: it wrote nothing

    def kill(self):
        self.on_kill()
        self.alive, self.exitcode = False, -9

    def join(self, timeout=None):
        return None


@pytest.mark.parametrize("after_kill", ["nothing", "taken-by-a-peer"])
def test_a_lease_a_worker_took_just_before_its_manager_killed_it_is_released_when_the_consumer_stops(fleet, caplog,
                                                                                                   after_kill):
    """Simulation seed 4450: a worker's take raced the scan that judged it stuck before its take (a consumer
    thawed after a long freeze); its manager killed it just after the take, spawned the next worker, and was
    stopped gracefully before that worker's take: it exited with the lease in its name and no worker, and every
    peer waited an expiry for it. The stopping manager now reads
    the leases of the workers it killed and releases each still in its name, at the counter it read — never one
    another consumer took since."""
    caplog.set_level("INFO")
    manager, table, clock, spawned, (shard,) = fleet(shards=1)
    taken: list[Lease] = []

    def take():  # the worker's take lands just before its SIGKILL
        taken.append(table.acquire(shard, "me", None, 0))

    manager._spawn = lambda spawn: manager.workers.__setitem__(spawn.lease.lease_key, _Worker(take))
    manager.run_cycle()  # creates the lease and spawns its worker, which never shows its take
    assert shard in manager.workers
    clock[0] += 3 * EXPIRY  # past its start patience (two expiries)
    manager.run_cycle()  # kills it, its take landing just before the kill, and spawns the next worker
    assert taken and taken[0] is not None and "before its take" in caplog.text, "the stuck worker was not killed"
    assert shard in manager.workers  # the next worker: stopped below before its own take
    if after_kill == "taken-by-a-peer":
        assert table.acquire(shard, "peer", "me", taken[0].lease_counter) is not None
    manager.shutdown(timeout=1.0)
    owner = table.get(shard).lease_owner
    if after_kill == "nothing":
        assert owner is None, "the lease a killed worker took stayed in the stopped consumer's name"
        assert "released lease" in caplog.text and "a worker this consumer killed" in caplog.text
    else:
        assert owner == "peer", "the stopping consumer released a lease a peer had taken"


def test_a_stopping_manager_that_cannot_read_the_leases_of_its_killed_workers_says_so_and_exits(fleet, caplog):
    """The table unreachable at the stop: one warning naming the leases and when they expire; the stop completes."""
    from kcl_pipeline.kcl.core.fleet import cycle as cyc

    manager, table, clock, spawned, (shard,) = fleet(shards=1)
    assert table.create(Lease(shard, Checkpoint(TRIM_HORIZON)))
    assert table.acquire(shard, "me", None, 0) is not None  # the take of the worker killed as stuck
    cyc.note_killed(manager.state, shard)

    def unreachable():
        raise ConnectionError("Could not connect to the endpoint URL")

    manager.table.scan = unreachable
    manager.shutdown(timeout=1.0)
    assert f"could not read the lease table for the leases of the workers this consumer killed ({shard})" \
        in caplog.text and "ConnectionError" in caplog.text and f"expires {EXPIRY:.0f}s after" in caplog.text
    assert table.get(shard).lease_owner == "me" and manager.state.killed == set()


def test_a_manager_whose_cycles_fail_gives_up_with_one_line_after_the_stall_time_and_counts_each(fleet, tmp_path,
                                                                                                dynamodb_client):
    """An outage looked healthy: with the lease table deleted, the manager logged an error every cycle forever."""
    from kcl_pipeline.kcl.shells.fleet.manager import ManagerStalled

    health = tmp_path / "healthy"
    manager, table, clock, spawned, _ = fleet(stall_seconds=60.0, health_file=str(health))
    manager.run_cycle()
    assert health.exists()  # touched by a successful cycle
    touched = health.stat().st_mtime_ns
    dynamodb_client.delete_table(TableName=table.table_name)
    clock[0] += 30.0
    with pytest.raises(Exception) as failed:  # within the stall time: the cycle's own error
        manager.run_cycle()
    assert not isinstance(failed.value, ManagerStalled)
    clock[0] += 31.0
    with pytest.raises(ManagerStalled, match=r"^no lease-manager cycle succeeded for 61 s \(2 failed\): "
                                             r"LeaseTableMissing: lease table .* does not exist"):
        manager.run_cycle()
    assert manager.metrics.snapshot()["counters"]["cycle_failures"] == 2
    assert health.stat().st_mtime_ns == touched, "a failed cycle must not look alive"


def test_a_lease_held_through_its_back_off_is_renewed_until_a_peer_takes_it(fleet, caplog):
    """The manager renews the lease its failed worker kept (peers see it alive); once another consumer has it,
    the renewal is refused, the lease is no longer held here, and its back-off is forgotten."""
    from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
    from kcl_pipeline.kcl.shells.workers.worker import WorkerResult

    manager, table, clock, spawned, (shard, _) = fleet()
    assert table.create(Lease(shard, Checkpoint(TRIM_HORIZON)))
    kept = table.acquire(shard, "me", None, 0)
    manager._pending.append(WorkerResult(shard, LifeOutcome.FAILED, "PermissionError: zone refused",
                                         left_at=kept.lease_counter, kept=True))
    report = manager.run_cycle()
    assert report.backing_off == [shard] and shard not in spawned
    assert (table.get(shard).lease_owner, table.get(shard).lease_counter) == ("me", kept.lease_counter + 1)
    assert table.acquire(shard, "peer", "me", kept.lease_counter + 1) is not None  # taken (as if it had expired)
    manager.transport.run(manager._renew_held_leases())  # the watch between cycles: refused
    assert "no longer held here" in caplog.text and manager.state.backoffs[shard].held_at is None
    manager.run_cycle()
    assert shard not in manager.state.backoffs and table.get(shard).lease_owner == "peer"
    assert manager.metrics.snapshot()["counters"]["worker_failures"] == 1


def test_a_health_file_that_cannot_be_touched_never_fails_the_cycle(fleet, tmp_path, caplog):
    """The probe then fails on the file's age, which says it better than a consumer that stopped over it."""
    gone = tmp_path / "gone"
    gone.mkdir()
    manager, *_ = fleet(health_file=str(gone / "healthy"))
    gone.rmdir()
    manager.run_cycle()
    assert "could not touch the health file" in caplog.text and manager.health.failure is None
