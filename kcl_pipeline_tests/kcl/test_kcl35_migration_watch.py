"""KCL 3.5 coexistence, item 2 and follower mode: the migration state is watched, and a flip is followed.

Java's workers re-read the migration state every minute (ClientVersionChangeMonitor) and the state flips while a
fleet runs: an upgrade's leader writes CLIENT_VERSION_3X_WITH_ROLLBACK once every lease owner publishes fresh worker
metrics (MigrationReadyMonitor — our own publishing can complete that), an operator rolls back to
CLIENT_VERSION_2X. Read once at start, a flip went unnoticed: this consumer kept taking beside a leader. Now each
scan of the lease table reads KCL 3.5's items (the one-table layout) and the manager re-reads the separate table once
a minute (3.0–3.4); under a leader this consumer takes nothing and works what the leader assigns to it."""
from __future__ import annotations

import random

import pytest

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.fleet import fleet_mode
from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetMode, FleetView
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.table.coordinator_state import Layout, MigrationState
from kcl_pipeline.kcl.core.table.lease_codec import LeaseScan
from kcl_pipeline.kcl.shells.fleet import kcl3_tables

SEQ = "49590338271490256608559692538361571095921575989136588898"
SHARDS = [Shard(f"shardId-00000000000{i}") for i in range(4)]


def migration(version: str) -> dict:
    # As KCL 3.5 keeps it in the lease table: leaseKey + CoordinatorState.serialize's entityType
    # (CLIENT_VERSION_MIGRATION) + MigrationState.serialize's cv, mb, mts.
    return {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"}, "cv": {"S": version},
            "mb": {"S": "java-leader"}, "mts": {"N": "1732441200000"}}


LEADER = {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": "java-leader"},
          "leaseDuration": {"S": "10000"}, "recordVersionNumber": {"S": "v1"}}  # the lock client's item


class Table:
    """The lease table as the cycle's effects see it: leases (by key) and KCL 3.5's other items."""

    def __init__(self, leases, entities):
        self.leases = {lease.lease_key: lease for lease in leases}
        self.renewals = 0
        self.entities = list(entities)
        self.spawned: list[tuple[str, bool]] = []
        self.published = 0

    def renew(self):
        """Every holder renewed since the last cycle (they are all alive here), the leader's lock too."""
        self.entities = [{**item, "recordVersionNumber": {"S": f"v{self.renewals}"}}
                         if item.get("leaseKey") == {"S": "Leader"} else item for item in self.entities]
        self.renewals += 1
        for key, held in self.leases.items():
            if held.lease_owner is not None:
                self.leases[key] = Lease(key, held.checkpoint, held.lease_owner, held.lease_counter + 1,
                                         extra=dict(held.extra))

    def handle(self, effect, now):
        if isinstance(effect, fx.Now):
            return now
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(LeaseScan(self.leases.values(), self.entities), now, now)
        if isinstance(effect, fx.ListShards):
            return SHARDS
        if isinstance(effect, fx.Spawn):
            self.spawned.append((effect.lease.lease_key, effect.stolen))
            taken = self.leases[effect.lease.lease_key]  # the spawned worker takes its lease (renewed from then on)
            self.leases[taken.lease_key] = Lease(taken.lease_key, taken.checkpoint, "me", taken.lease_counter + 1,
                                                 extra=dict(taken.extra))
            return None
        if isinstance(effect, fx.PublishWorkerMetrics):
            self.published += 1
            return None
        if isinstance(effect, (fx.Create, fx.Delete)):
            return False
        return None


def run(state, table, now, worked=(), worker="me"):
    table.renew()
    settings = cyc.CycleSettings(worker, Checkpoint(TRIM_HORIZON), 10.0, 4, 10, worker_metrics_period_seconds=30.0)
    return fx.drive(cyc.manager_cycle(state, settings, frozenset(worked), random.Random(0)),
                    lambda effect: table.handle(effect, now))


def lease(i: int, owner: str | None, counter: int = 5, **extra) -> Lease:
    return Lease(SHARDS[i].shard_id, Checkpoint(SEQ), owner, counter, extra=dict(extra))


def test_a_flip_to_3x_mid_run_stops_taking_and_a_rollback_starts_again():
    state = cyc.ManagerState()
    table = Table([lease(0, None), lease(1, "java-1")], [migration("CLIENT_VERSION_UPGRADE_FROM_2X"), LEADER])
    first = run(state, table, 0.0)
    assert first.spawned == [SHARDS[0].shard_id] and state.fleet.mode is FleetMode.LEADERLESS  # 2.x-compatible
    # The leader flips (every lease owner publishes fresh metrics, ours included) and assigns a lease to us.
    table.entities = [migration("CLIENT_VERSION_3X_WITH_ROLLBACK"), LEADER]
    table.leases[SHARDS[2].shard_id] = lease(2, None)
    table.leases[SHARDS[3].shard_id] = lease(3, "me", counter=9)
    second = run(state, table, 20.0, worked={SHARDS[0].shard_id})
    assert second.fleet_change and "leaderless -> follower" in second.fleet_change
    assert second.spawned == [SHARDS[3].shard_id]  # adopted; the free lease 2 is the leader's to assign
    assert state.fleet.leader == "java-leader" and state.fleet.mode is FleetMode.FOLLOWER
    # An operator rolls the fleet back (KCL's migration tool): leaderless taking again.
    table.entities = [migration("CLIENT_VERSION_2X"), LEADER]
    third = run(state, table, 40.0, worked={SHARDS[0].shard_id, SHARDS[3].shard_id})
    assert third.fleet_change and "follower -> leaderless" in third.fleet_change
    assert third.spawned == [SHARDS[2].shard_id]


def test_a_default_config_3x_worker_writing_3x_into_our_table_makes_us_its_follower():
    state = cyc.ManagerState()
    table = Table([lease(0, None)], [])
    assert run(state, table, 0.0).spawned == [SHARDS[0].shard_id]
    table.leases[SHARDS[0].shard_id] = lease(0, "me", counter=1)
    table.leases[SHARDS[1].shard_id] = lease(1, None)
    table.entities = [migration("CLIENT_VERSION_3X"), LEADER]
    assert run(state, table, 20.0, worked={SHARDS[0].shard_id}).spawned == []


def test_a_follower_never_reports_a_leaders_assignments_as_a_duplicate_worker_id():
    state = cyc.ManagerState()
    table = Table([lease(0, "me", counter=3)], [migration("CLIENT_VERSION_3X"), LEADER])
    run(state, table, 0.0, worked={SHARDS[0].shard_id})
    table.leases[SHARDS[1].shard_id] = lease(1, "me", counter=4, checkpointOwner="java-1")  # a hand-off to us
    run(state, table, 20.0, worked={SHARDS[0].shard_id})
    table.leases[SHARDS[1].shard_id] = lease(1, "me", counter=6)  # Java's holder assigned it: done
    result = run(state, table, 40.0, worked={SHARDS[0].shard_id})
    assert result.duplicate_worker_id == [] and state.duplicate_worker_id_sightings == 0
    assert result.spawned == [SHARDS[1].shard_id]


def test_adoptions_wait_out_a_live_previous_holder_but_not_a_free_lease_or_a_finished_hand_off():
    now = [lease(0, "me"), lease(1, "me"), lease(2, "me"), lease(3, "me", checkpointOwner="java-1")]
    previous = {SHARDS[0].shard_id: lease(0, None), SHARDS[1].shard_id: lease(1, "me", checkpointOwner="java-1"),
                SHARDS[2].shard_id: lease(2, "java-1")}
    assert [(adopted.lease_key, stolen) for adopted, stolen in fleet_mode.adoptions("me", now, (), previous)] == [
        (SHARDS[0].shard_id, False), (SHARDS[1].shard_id, False), (SHARDS[2].shard_id, True)]
    # a hand-off still pending (checkpointOwner) is not adopted: the previous holder has not checkpointed yet


def test_between_cycles_a_follower_wakes_for_a_lease_assigned_to_it_not_for_a_peers_expiry():
    state = cyc.ManagerState(shards=SHARDS, fleet=FleetView(lease_table=MigrationState("CLIENT_VERSION_3X")))
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10)
    table = Table([lease(0, "java-1")], [migration("CLIENT_VERSION_3X")])
    state.ages.observe(list(table.leases.values()), 0.0)
    woke = fx.drive(cyc.watch_for_expiry(state, settings, frozenset()), lambda e: table.handle(e, 100.0))
    assert woke is False  # expired, but a leader's failover is the leader's
    table.leases[SHARDS[1].shard_id] = lease(1, "me")
    assert fx.drive(cyc.watch_for_expiry(state, settings, frozenset()), lambda e: table.handle(e, 101.0)) is True


def test_a_malformed_migration_item_at_run_time_keeps_the_last_known_mode():
    view = fleet_mode.scanned(FleetView(), [migration("CLIENT_VERSION_3X")])
    broken = {k: v for k, v in migration("CLIENT_VERSION_3X").items() if k != "cv"}
    after = fleet_mode.scanned(view, [broken])
    assert after.mode is FleetMode.FOLLOWER and "'cv'" in after.problem


def test_an_unknown_client_version_appearing_at_run_time_is_followed_never_fought():
    assert fleet_mode.scanned(FleetView(), [migration("CLIENT_VERSION_4X")]).mode is FleetMode.FOLLOWER


# -- the separate layout: the manager's watch, once a minute --------------------------------------------------------

class Client:
    """The three reads of the separate table's watch (describe, get), scripted; counts the reads."""

    def __init__(self, version):
        self.version = version
        self.fail = False
        self.reads = 0

    def describe_table(self, **request):
        self.reads += 1
        if self.fail:
            raise ConnectionError("the endpoint is unreachable")
        return {"Table": {"TableName": request["TableName"]}}

    def get_item(self, TableName, Key, ConsistentRead):  # noqa: N803 - boto3's names
        if Key["key"]["S"] == "Migration3.0" and self.version:
            # MigrationState in KCL 3.0–3.4's table (hash key `key`): cv, mb, mts.
            return {"Item": {"key": {"S": "Migration3.0"}, "cv": {"S": self.version}, "mb": {"S": "java-1"},
                             "mts": {"N": "1732441200000"}}}
        return {}


def test_the_separate_tables_migration_state_is_re_read_every_minute_and_a_flip_is_seen():
    client = Client("CLIENT_VERSION_UPGRADE_FROM_2X")
    view = kcl3_tables.watch(client, "app", "app", FleetView(), 0.0)
    assert view.layout is Layout.SEPARATE_TABLES and view.mode is FleetMode.LEADERLESS and client.reads == 1
    client.version = "CLIENT_VERSION_3X_WITH_ROLLBACK"
    assert kcl3_tables.watch(client, "app", "app", view, 59.0) is view and client.reads == 1  # not yet due
    view = kcl3_tables.watch(client, "app", "app", view, 60.0)
    assert view.mode is FleetMode.FOLLOWER and client.reads == 2


def test_a_failed_watch_keeps_the_mode_and_tries_again_a_minute_later():
    client = Client("CLIENT_VERSION_3X")
    view = kcl3_tables.watch(client, "app", "app", FleetView(), 0.0)
    client.fail = True
    kept = kcl3_tables.watch(client, "app", "app", view, 60.0)
    assert kept.mode is FleetMode.FOLLOWER and "unreachable" in kept.problem and kept.watched_at == 60.0


@pytest.mark.parametrize("version, mode", [(None, FleetMode.LEADERLESS), ("CLIENT_VERSION_INIT", FleetMode.LEADERLESS),
                                           ("CLIENT_VERSION_2X", FleetMode.LEADERLESS),
                                           ("CLIENT_VERSION_3X_WITH_ROLLBACK", FleetMode.FOLLOWER)])
def test_the_mode_of_each_client_version(version, mode):
    assert fleet_mode.mode_of(MigrationState(version) if version else None) is mode


def test_a_follower_never_adopts_a_lease_another_process_under_its_worker_id_took_and_renews():
    """Found by the simulation (a duplicate worker id, in 3.x mode): both processes adopted the lease the leader
    assigned to their id, one after the other's acquire, and delivered it at once. A lease whose last take was
    this id's own is adopted only once its counter stood still for the expiry (nobody renews it)."""
    ours = lease(0, "me", counter=7, leaseClaimOwner="me")  # another process under our id took it
    assert fleet_mode.adoptions("me", [ours], (), {}, {SHARDS[0].shard_id: 3.0}, 10.0) == []
    # Not renewed for the expiry: nobody works it (the leader gave back a lease we had let expire).
    assert fleet_mode.adoptions("me", [ours], (), {}, {SHARDS[0].shard_id: 12.0}, 10.0) == [(ours, True)]
    assigned = lease(1, "me", counter=7, leaseClaimOwner="java-1")  # the leader's assignment: not our take
    assert fleet_mode.adoptions("me", [assigned], (), {}, {SHARDS[1].shard_id: 0.0}, 10.0) == [(assigned, True)]


@pytest.mark.parametrize("before", [
    lease(0, "me", counter=5, checkpointOwner="java-2"),  # handed back to us by the leader's graceful hand-off
    lease(0, "java-2", counter=5),  # assigned to us after java-2's lease expired
])
def test_a_lease_the_leader_moves_back_to_a_worker_that_held_it_before_is_adopted_at_once(before):
    """Our earlier take left leaseClaimOwner = our id; the follower took it for another process under our id and
    left the lease unworked for a full expiry, while the leader, seeing its counter stand still, could judge it
    expired and move it again. Seen elsewhere since the last scan, it is adopted now (renewed at once) and its
    worker waits one expiry before delivering (another process under our id may have adopted it first)."""
    back = lease(0, "me", counter=7, leaseClaimOwner="me")
    assert fleet_mode.adoptions("me", [back], (), {SHARDS[0].shard_id: before}, {SHARDS[0].shard_id: 0.5},
                                10.0) == [(back, True)]
    # Never seen elsewhere: still another process's, possibly (the duplicate worker id guard).
    assert fleet_mode.adoptions("me", [back], (), {SHARDS[0].shard_id: back}, {SHARDS[0].shard_id: 0.5}, 10.0) == []


@pytest.mark.emulator
def test_adopting_a_lease_the_leader_assigned_counts_no_second_owner_switch(dynamodb_client, unique_name):
    """KCL 3.x's assignLease adds the owner switch; Java's take adds one only when the owner changes. Our
    adoption (a take of a lease already naming us) added a second."""
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    table = LeaseTable(unique_name("adopt"), dynamodb_client)
    table.ensure_table()
    assert table.create(Lease("shardId-0", Checkpoint(TRIM_HORIZON), "me", 7, 1))
    adopted = table.acquire("shardId-0", "me", "me", 7, claim="c1")
    assert adopted is not None and adopted.lease_counter == 8 and adopted.owner_switches_since_checkpoint == 1
    taken = table.acquire("shardId-0", "other", "me", 8, claim="c2")
    assert taken is not None and taken.owner_switches_since_checkpoint == 2


def test_a_released_or_stale_leader_lock_shows_no_leader():
    """The lock client releases by writing isReleased = "1" (a string), and a holder that stops heartbeating
    leaves its record version standing: stale after its leaseDuration. Both showed the old holder as leader."""
    view = fleet_mode.scanned(FleetView(), [{**LEADER, "isReleased": {"S": "1"}}], 0.0)
    assert view.leader is None
    view = fleet_mode.scanned(FleetView(), [LEADER], 0.0)
    assert view.leader == "java-leader"
    view = fleet_mode.scanned(view, [LEADER], 9.0)
    assert view.leader == "java-leader"  # inside its 10 s lease duration
    view = fleet_mode.scanned(view, [LEADER], 10.5)
    assert view.leader is None  # its version stood still past the duration: the lock is stale
    view = fleet_mode.scanned(view, [{**LEADER, "recordVersionNumber": {"S": "v2"}}], 11.0)
    assert view.leader == "java-leader"  # heartbeating again


def test_a_migration_item_without_entity_type_is_inferred_from_its_key_not_read_as_a_corrupt_lease():
    """Java's CoordinatorStateDAODelegate.resolveEntityType infers CLIENT_VERSION_MIGRATION and TABLE_MIGRATION
    from the keys of records written without entityType."""
    from kcl_pipeline.kcl.core.table.lease_codec import is_lease_item

    legacy = {k: v for k, v in migration("CLIENT_VERSION_3X").items() if k != "entityType"}
    assert not is_lease_item(legacy)
    assert fleet_mode.scanned(FleetView(), [legacy]).mode is FleetMode.FOLLOWER


def test_a_34_to_35_table_migration_flips_no_mode_back_and_forth():
    """KCL 3.5's table migration copies the state into the lease table and marks it COMPLETE there, while the
    separate table keeps its own (no COMPLETE of its own). A scan that met COMPLETE before the copied state read
    "no state" (leaderless), and the next minute's watch of the separate table flipped the layout back (follower):
    a pair of mode-change warnings with no change of the fleet."""
    from kcl_pipeline.kcl.core.table.coordinator_state import TABLE_MIGRATION_KEY

    complete = {"leaseKey": {"S": TABLE_MIGRATION_KEY}, "entityType": {"S": "TABLE_MIGRATION"},
                "tm": {"S": "TABLE_MIGRATION_STATUS_COMPLETE"}}
    view = fleet_mode.watched(FleetView(), 0.0, Layout.SEPARATE_TABLES, MigrationState("CLIENT_VERSION_3X"))
    assert view.mode is FleetMode.FOLLOWER
    changes = []
    for step in (lambda v: fleet_mode.scanned(v, [complete], 10.0),  # COMPLETE seen, the state not copied yet
                 lambda v: fleet_mode.watched(v, 60.0, Layout.SEPARATE_TABLES, MigrationState("CLIENT_VERSION_3X")),
                 lambda v: fleet_mode.scanned(v, [complete, migration("CLIENT_VERSION_3X")], 70.0)):
        after = step(view)
        changes.append(fleet_mode.change(view, after))
        view = after
    assert changes == [None, None, None] and view.layout is Layout.LEASE_TABLE and view.mode is FleetMode.FOLLOWER
