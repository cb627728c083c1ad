"""This consumer's KCL 3.x worker metrics item: format, bad values, and a 3.x worker's attributes kept."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.fleet.fleet_mode import FleetView
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.table.coordinator_state import MigrationState
from kcl_pipeline.kcl.core.table.worker_metrics import metrics_update, worker_metrics_table
from kcl_pipeline.kcl.shells.fleet.kcl3_tables import publish

# A table a KCL 3.x fleet is upgrading: the only kind that gets worker metrics (a 2.x table gets none:
# test_kcl2_table_items.py).
UPGRADING = FleetView(lease_table=MigrationState("CLIENT_VERSION_UPGRADE_FROM_2X"))


def test_the_update_sets_only_lut_and_sts_with_the_most_recent_values_last():
    update = metrics_update("me#1", 1732441200, [float(i) for i in range(15)])
    assert update["Key"] == {"wid": {"S": "me#1"}}
    assert update["UpdateExpression"] == "SET lut = :lut, sts = :sts"
    values = update["ExpressionAttributeValues"]
    assert values[":lut"] == {"N": "1732441200"}
    assert values[":sts"]["M"]["THROUGHPUT"]["L"][-1] == {"N": "14.0"}
    assert len(values[":sts"]["M"]["THROUGHPUT"]["L"]) == 10


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "12"])
def test_a_bad_metric_value_is_a_specific_error(bad):
    with pytest.raises(ValueError, match="THROUGHPUT: values must be finite numbers >= 0"):
        metrics_update("me", 1, [1.0, bad])


def test_a_worker_id_is_required():
    with pytest.raises(ValueError, match="worker id"):
        metrics_update("", 1, [])


@pytest.mark.emulator
def test_publish_creates_the_table_and_keeps_attributes_it_does_not_manage(dynamodb_client, unique_name):
    app = unique_name("wm")
    publish(dynamodb_client, app, "me#1", 1732441200, [5.0])
    table = worker_metrics_table(app)
    # A KCL 3.x worker's attributes on the same item must survive our next write.
    dynamodb_client.update_item(TableName=table, Key={"wid": {"S": "me#1"}},
                                UpdateExpression="SET opr = :opr, sup = :sup, slu = :slu",
                                ExpressionAttributeValues={":opr": {"M": {"C": {"L": [{"N": "100"}]}}},
                                                           ":sup": {"N": "1"}, ":slu": {"N": "1732441100"}})
    publish(dynamodb_client, app, "me#1", 1732441260, [5.0, 7.5])
    item = dynamodb_client.get_item(TableName=table, Key={"wid": {"S": "me#1"}}, ConsistentRead=True)["Item"]
    assert item == {"wid": {"S": "me#1"}, "lut": {"N": "1732441260"},
                    "sts": {"M": {"THROUGHPUT": {"L": [{"N": "5"}, {"N": "7.5"}]}}},
                    "opr": {"M": {"C": {"L": [{"N": "100"}]}}}, "sup": {"N": "1"}, "slu": {"N": "1732441100"}}


# -- when and what the manager cycle publishes (pure) -----------------------------------------------------------

def test_worker_metrics_are_due_at_the_first_cycle_then_once_per_period():
    from kcl_pipeline.kcl.core.fleet.cycle import worker_metrics_due

    assert worker_metrics_due(None, 5.0, 30.0)
    assert not worker_metrics_due(5.0, 34.9, 30.0) and worker_metrics_due(5.0, 35.0, 30.0)
    assert not worker_metrics_due(None, 5.0, 0.0)  # 0: never


def test_a_consumers_throughput_is_what_its_holders_reported_on_its_live_leases():
    from dataclasses import replace

    from kcl_pipeline.kcl.core.fleet.cycle import worker_throughput_kbps
    from kcl_pipeline.kcl.core.model import SHARD_END, Checkpoint, Lease

    def lease(key, owner, kbps, checkpoint="5"):
        base = Lease(key, Checkpoint(checkpoint), owner, 1)
        return replace(base, extra={} if kbps is None else {"throughputKBps": kbps})

    leases = [lease("a", "me", 10.0), lease("b", "me", "7.5"), lease("c", "peer", 50.0), lease("d", "me", None),
              lease("e", "me", -3.0), lease("f", "me", 40.0, SHARD_END)]
    assert worker_throughput_kbps("me", leases) == 17.5  # unreported/corrupt count 0; ended leases none


def test_the_cycle_publishes_on_its_period_and_keeps_the_recent_values():
    import random

    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Shard

    state = cyc.ManagerState(shards=[Shard("s-0")], list_next=False, fleet=UPGRADING)
    settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10, worker_metrics_period_seconds=30.0)
    now = [0.0]
    published = []

    def handle(effect):
        if isinstance(effect, fx.Now):
            return now[0]
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned([], now[0], now[0])
        if isinstance(effect, fx.ListShards):
            return [Shard("s-0")]
        if isinstance(effect, fx.PublishWorkerMetrics):
            published.append((now[0], effect.throughput_kbps))
        return None

    for t in range(0, 400, 20):
        now[0] = float(t)
        fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
    assert [t for t, _ in published] == [0.0, 40.0, 80.0, 120.0, 160.0, 200.0, 240.0, 280.0, 320.0, 360.0]
    assert len(published[-1][1]) == 10  # KCL's item keeps the 10 most recent values


# -- reading the fleet's items: idle consumers count in the balance's mean ---------------------------------------

def test_last_updates_skips_items_it_cannot_read():
    from kcl_pipeline.kcl.core.table.worker_metrics import last_updates

    items = [{"wid": {"S": "a"}, "lut": {"N": "100"}}, {"wid": {"S": "b"}, "lut": {"N": "not-a-number"}},
             {"wid": {"S": "c"}}, {"lut": {"N": "5"}}, {"wid": {"S": "d"}, "lut": {"N": "NaN"}},
             {"wid": {"S": "e"}, "lut": {"N": "90.5"}, "sts": {"M": {}}}]
    assert last_updates(items) == {"a": 100.0, "e": 90.5}


def test_a_worker_is_live_while_its_item_is_fresh():
    from kcl_pipeline.kcl.core.table.worker_metrics import live_workers

    assert live_workers({"a": 100.0, "b": 30.0, "c": 69.0}, 100.0, 31.0) == {"a", "c"}


def test_idle_consumers_are_live_peers_holding_no_live_lease():
    from kcl_pipeline.kcl.core.fleet.cycle import idle_consumers
    from kcl_pipeline.kcl.core.model import SHARD_END, Checkpoint, Lease

    leases = [Lease("s1", Checkpoint("5"), "busy", 1), Lease("s2", Checkpoint(SHARD_END), "ended-only", 1)]
    peers = {"me", "busy", "ended-only", "idle", "old-me"}
    assert idle_consumers(peers, leases, "me") == 3
    assert idle_consumers(peers, leases, "me", predecessor=lambda owner: owner == "old-me") == 2


def test_the_cycle_counts_idle_peers_from_their_worker_metrics_in_the_balance():
    """Visible mean 53.3 leaves b (60) alone; two peers with fresh metrics and no lease make the mean 32,
    and me steals from b. Before, nothing read the metrics table: an idle consumer settled for less."""
    import random
    from dataclasses import replace

    from kcl_pipeline.kcl.core.fleet import cycle as cyc
    from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease, Shard

    def lease(key, owner, kbps):
        return Lease(key, Checkpoint(TRIM_HORIZON), owner, 1, extra={"throughputKBps": kbps})

    leases = [lease("h", "a", 100.0), lease("b1", "b", 30.0), lease("b2", "b", 30.0)]
    shards = [Shard(lease.lease_key) for lease in leases]

    def run(peer_items):
        state = cyc.ManagerState(shards=shards, list_next=False, fleet=UPGRADING)
        settings = cyc.CycleSettings("me", Checkpoint(TRIM_HORIZON), 10.0, 1, 10, worker_metrics_period_seconds=30.0)
        spawned = []

        def handle(effect):
            if isinstance(effect, fx.Now):
                return 100.0
            if isinstance(effect, fx.ScanTable):
                return fx.Scanned([replace(x, lease_counter=7) for x in leases], 100.0, 100.0)
            if isinstance(effect, fx.ListShards):
                return shards
            if isinstance(effect, fx.ReadWorkerMetrics):
                return None if peer_items is None else fx.PeerMetrics(peer_items, 1_700_000_000.0)
            if isinstance(effect, fx.Spawn):
                spawned.append(effect.lease.lease_key)
            return None
        fx.drive(cyc.manager_cycle(state, settings, (), random.Random(0)), handle)
        return spawned

    now = 1_700_000_000.0
    assert run({"a": now, "b": now}) == []
    assert run({"a": now, "b": now, "idle-1": now - 10, "idle-2": now - 5}) == ["b1"]
    assert run({"a": now, "b": now, "idle-1": now - 3600, "idle-2": now - 3600}) == []  # long gone
    assert run(None) == []  # a failed read: no peers known


@pytest.mark.emulator
def test_read_last_updates_reads_every_workers_item_and_no_table_is_no_peers(dynamodb_client, unique_name):
    from kcl_pipeline.kcl.shells.fleet.kcl3_tables import read_last_updates

    app = unique_name("wmread")
    assert read_last_updates(dynamodb_client, app) == {}
    publish(dynamodb_client, app, "w-1", 1732441200, [5.0])
    publish(dynamodb_client, app, "w-2", 1732441260, [1.0])
    assert read_last_updates(dynamodb_client, app) == {"w-1": 1732441200.0, "w-2": 1732441260.0}
