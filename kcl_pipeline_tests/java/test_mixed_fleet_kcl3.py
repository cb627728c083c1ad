"""The real Java KCL 3.5.1 (kcl_pipeline_tests/java_peer, `-Pkcl3`) beside `kcl-pipeline consume`, on one stream
and one lease table, judged by what both kinds delivered (the union of the Java peers' output files and our JSONL
sinks holds every produced payload; a record is delivered twice only in a hand-over window) and by the lease table
sampled while they run (no checkpoint moves backwards; after the flip to 3.x, no lease taken by ours that the
leader did not assign).

DynamoDB is the session's moto server for both kinds: KCL 3.5.1 adds the `LeaseOwnerToLeaseKeyIndex` to the
on-demand lease table without ProvisionedThroughput, which dynalite refuses. Kinesis stays on kinesis-local.

**The flip to 3.x is written the way the leader writes it, not waited for.** Java's leader flips
`CLIENT_VERSION_UPGRADE_FROM_2X` to `CLIENT_VERSION_3X_WITH_ROLLBACK` only after its `MigrationReadyMonitor`
(a fixed 1-minute period) has seen the index active and every lease owner's worker metrics fresh *for 10 minutes*
(`Scheduler` passes a hard-coded `Duration.ofMinutes(10)` as the stabilisation time; no setting shortens it). The
tests check the two conditions themselves (the index ACTIVE, a fresh worker-metrics item for every lease owner,
ours included), then write the leader's own conditional update of `Migration3.0` (`cv` expected to be
`UPGRADE_FROM_2X`), and the Java worker learns it from its `ClientVersionChangeMonitor` (every minute, a first
run 60-90 s after it entered its state) as it would learn its own leader's write. A rollback is written as KCL's
`KclMigrationTool.py rollback` writes it. The follower flip of ours is at its next scan.

Timings: ours heartbeat 2 s / expiry 6 s / cycle 2 s, worker metrics every 2 s; Java failoverTimeMillis 6000
(its 2.x-compatible taker every 12.05 s), shardSyncIntervalMillis 5000, the leader's assignment every 4 s,
`LEASE_COUNT_BASED` assignment (deterministic hand-offs: a worker above ceil(leases / workers) gives one to a
worker below it, by a graceful hand-off).
"""
from __future__ import annotations

import re
import threading
import time

import pytest

from ..kcl.fleet_support import wait_until
from .conftest import FAILOVER_MS
from .test_mixed_fleet_kcl2 import _assert_no_self_repeats

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.emulator]

TAKER_INTERVAL = 2 * (FAILOVER_MS + 25) / 1000
LAM_MS = 4000
METRICS_PERIOD = "2"
JAVA_3X = ["--lease-assignment-strategy", "LEASE_COUNT_BASED", "--lease-assignment-interval-millis", str(LAM_MS),
           "--worker-metrics-reporter-millis", "3000"]
MIGRATION_KEY = "Migration3.0"
UPGRADE, WITH_ROLLBACK, ROLLED_BACK = ("CLIENT_VERSION_UPGRADE_FROM_2X", "CLIENT_VERSION_3X_WITH_ROLLBACK",
                                       "CLIENT_VERSION_2X")
# How long a Java worker may take to notice a migration-state change: its ClientVersionChangeMonitor first runs
# 60 s + up to 30 s of jitter after the worker entered its state, then every 60 s.
JAVA_NOTICES = 95


# -- the lease table and the coordinator state -----------------------------------------------------------------

def _items(fleet, table: str | None = None) -> list[dict]:
    items, kwargs = [], {"TableName": table or fleet.application, "ConsistentRead": True}
    while True:
        page = fleet.dynamodb.scan(**kwargs)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _migration(fleet, table: str | None = None, key: str = "leaseKey") -> dict | None:
    got = fleet.dynamodb.get_item(TableName=table or fleet.application, Key={key: {"S": MIGRATION_KEY}},
                                  ConsistentRead=True)
    return got.get("Item")


def _client_version(fleet, table: str | None = None, key: str = "leaseKey") -> str | None:
    item = _migration(fleet, table, key)
    return item["cv"]["S"] if item else None


def _write_client_version(fleet, new: str, expected: tuple[str, ...], by: str, table: str | None = None,
                          key: str = "leaseKey") -> None:
    """A conditional update of the migration item, as Java's leader (`updateCoordinatorStateWithExpectation`) and
    KCL's migration tool write it: the new version, who and when, the previous one pushed onto the history."""
    table = table or fleet.application
    item = _migration(fleet, table, key)
    assert item is not None, f"no {MIGRATION_KEY} item in {table}"
    previous = {"M": {"cv": item["cv"], "mb": item.get("mb", {"S": "Unknown"}),
                      "mts": item.get("mts", {"N": str(int(time.time() * 1000))})}}
    history = [previous, *item.get("h", {"L": []})["L"]][:10]
    values = {":new": {"S": new}, ":now": {"N": str(int(time.time() * 1000))}, ":by": {"S": by},
              ":h": {"L": history}}
    values.update({f":e{i}": {"S": v} for i, v in enumerate(expected)})
    fleet.dynamodb.update_item(
        TableName=table, Key={key: {"S": MIGRATION_KEY}},
        UpdateExpression="SET cv = :new, mts = :now, mb = :by, h = :h",
        ConditionExpression=f"cv IN ({', '.join(f':e{i}' for i in range(len(expected)))})",
        ExpressionAttributeValues=values)


def _seed_client_version(fleet, version: str, table: str, key: str = "key") -> None:
    """The migration item of an application whose fleet already upgraded (written before any worker starts)."""
    fleet.dynamodb.put_item(TableName=table, Item={
        key: {"S": MIGRATION_KEY}, "cv": {"S": version}, "mb": {"S": "operator"},
        "mts": {"N": str(int(time.time() * 1000))}, "h": {"L": []}},
        ConditionExpression="attribute_not_exists(#k)", ExpressionAttributeNames={"#k": key})


def _worker_metrics(fleet, table: str | None = None) -> dict[str, int]:
    """worker id -> `lut` (epoch seconds) of every worker-metrics item: the lease table's (entityType
    WORKER_METRIC_STATS) or a separate table's (hash key `wid`)."""
    if table:
        return {i["wid"]["S"]: int(i["lut"]["N"]) for i in _items(fleet, table) if "lut" in i}
    return {i["leaseKey"]["S"]: int(i["lut"]["N"]) for i in _items(fleet)
            if i.get("entityType", {}).get("S") == "WORKER_METRIC_STATS" and "lut" in i}


def _owner_index_active(fleet) -> bool:
    table = fleet.dynamodb.describe_table(TableName=fleet.application)["Table"]
    return any(g["IndexName"] == "LeaseOwnerToLeaseKeyIndex" and g.get("IndexStatus", "ACTIVE") == "ACTIVE"
               for g in table.get("GlobalSecondaryIndexes", []))


def _ready_for_3x(fleet, watch, metrics_table: str | None = None) -> bool:
    """What Java's MigrationReadyMonitor checks: the owner index active and every lease owner's worker metrics
    fresh (its expiry is far longer than these few seconds)."""
    now = time.time()
    fresh = {w for w, lut in _worker_metrics(fleet, metrics_table).items() if now - lut < 10}
    owners = {o for o in watch.owners().values() if o}
    return _owner_index_active(fleet) and bool(owners) and owners <= fresh


class Kcl3Watch(threading.Thread):
    """Besides LeaseWatch's history: every hand-off seen in flight in its samples (lease -> set of
    (checkpointOwner, leaseOwner)), looked at every 0.1 s while the test runs."""

    def __init__(self, watch):
        super().__init__(daemon=True)
        self.watch = watch
        self.handoffs: dict[str, set[tuple[str, str]]] = {}
        self.start()

    def run(self) -> None:
        while not self.watch.halt.is_set():
            self.sample()
            time.sleep(0.1)

    def sample(self) -> None:
        for key, item in list(self.watch.items.items()):
            if "checkpointOwner" in item:
                self.handoffs.setdefault(key, set()).add((item["checkpointOwner"]["S"],
                                                          item.get("leaseOwner", {}).get("S")))


def _checkpoints_never_back(watch) -> None:
    for key, hist in watch.history.items():
        seen = [int(cp) for _, _, _, cp in hist if cp.isdigit()]
        back = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b < a]
        assert not back, f"the checkpoint of {key} moved backwards: {back[:3]} (history {hist})"
        ended = [i for i, (_, _, _, cp) in enumerate(hist) if cp == "SHARD_END"]
        assert not ended or all(cp == "SHARD_END" for _, _, _, cp in hist[ended[0]:]), (key, hist)


_CYCLE = re.compile(r"cycle (.*)$")
_SPAWN = re.compile(r"spawned worker pid \d+ for (\S+) \(previous owner (\S+)\)")


def _takes_beside_the_leader(log: str, worker: str) -> list[str]:
    """Lines of our consumer's log, from its first follower cycle on, that show a lease it took rather than was
    assigned: a steal in a cycle summary, or a worker spawned for a lease whose owner was not this worker."""
    follower = False
    out = []
    for line in log.splitlines():
        m = _CYCLE.search(line)
        if m and "mode=" in line:
            follower = "mode=follower" in line
            if follower and "stole=" in m.group(1):
                out.append(line)
        s = _SPAWN.search(line)
        if follower and s and s.group(2) != worker:
            out.append(line)
    return out


def _owners(watch) -> list[str]:
    return sorted(str(o) for o in watch.owners().values())


def _follower_since(fleet, name: str) -> bool:
    return "mode=follower" in fleet.our_log(name)


def _leaderless_again(fleet, name: str) -> bool:
    lines = [line for line in fleet.our_log(name).splitlines() if "kcl3:" in line and "mode=" in line]
    return bool(lines) and "mode=follower" not in lines[-1]


def _assert_complete(fleet, what: str):
    missing = fleet.missing()
    assert not missing, (f"{what}: {len(missing)} produced records delivered by nobody, e.g. {missing[:10]}\n"
                         f"{fleet.logs()}")
    return fleet.deliveries()


def _java_complaints(peer, ours: list[str]) -> list[str]:
    """Exception or error lines of the Java log that name one of our workers or one of their items."""
    return [line for line in peer.exceptions() if any(w in line for w in ours)]


def _put(fleet, n: int = 100) -> None:
    fleet.producer.put(n, 1)
    fleet.producer.put(n, 10)


def _sampling(kw: Kcl3Watch, predicate):
    def check():
        kw.sample()
        return predicate()
    return check


def test_kcl3_upgrade_from_2x_then_3x_followers_and_handoffs(kcl3_fleet):
    """(1) KCL 3.5.1 in 2.x-compatible mode (it writes CLIENT_VERSION_UPGRADE_FROM_2X) beside ours: both take
    leases and balance (2 + 2) with nothing lost, and ours publishes its worker metrics in the lease table. The
    flip to CLIENT_VERSION_3X_WITH_ROLLBACK (written once Java's readiness conditions hold): ours become followers
    at their next scan, the Java worker becomes the 3.x leader; two more of ours join and the leader hands one
    lease from the Java worker and one from ours to them by graceful hand-offs (checkpointOwner seen in the
    table), which lose and repeat nothing; then they stop (release their leases) and, once their worker metrics
    are stale to the leader (2 x Java's reporter period: it assigns to a stopped worker until then, ours or Java's
    alike), the leader assigns their leases to c1 and j1.
    Ours never take a lease beside the leader; no checkpoint moves backwards."""
    fleet = kcl3_fleet(4)
    _put(fleet, 150)
    ours = ["c1", "c2", "c3"]
    with fleet.watch() as watch:
        kw = Kcl3Watch(watch)
        fleet.start_ours("c1", extra=["--worker-metrics-period-seconds", METRICS_PERIOD])
        wait_until(lambda: len(watch.owners()) == 4 and all(o == "c1" for o in watch.owners().values()), 40,
                   "four leases held by c1")
        j1 = fleet.start_java("j1", extra=["--client-version", "2X", *JAVA_3X])
        wait_until(lambda: _client_version(fleet) == UPGRADE, 60, "Java writing CLIENT_VERSION_UPGRADE_FROM_2X")
        started = time.monotonic()
        wait_until(lambda: _owners(watch) == ["c1", "c1", "j1", "j1"], 3 * TAKER_INTERVAL + 15,
                   "two leases each for c1 and j1 (2.x-compatible taking)")
        _put(fleet)
        wait_until(lambda: not fleet.missing(), 60, "every record delivered in 2.x-compatible mode")
        wait_until(lambda: "c1" in _worker_metrics(fleet), 20, "c1's worker metrics in the lease table")
        wait_until(lambda: _ready_for_3x(fleet, watch), 30, "the index active and every lease owner's metrics fresh")
        # The leader's write (Java's own would come only after 10 minutes of readiness).
        _write_client_version(fleet, WITH_ROLLBACK, (UPGRADE,), "j1")
        wait_until(lambda: _follower_since(fleet, "c1"), 15, "c1 following the 3.x leader")
        wait_until(lambda: "transition to CLIENT_VERSION_3X_WITH_ROLLBACK" in j1.log_text(),
                   max(10.0, JAVA_NOTICES - (time.monotonic() - started)), "the Java worker entering 3.x")
        flipped = time.monotonic()
        before = dict(watch.owners())
        java_before = {k for k, o in before.items() if o == "j1"}
        ours_before = {k for k, o in before.items() if o == "c1"}
        for name in ("c2", "c3"):
            fleet.start_ours(name, extra=["--worker-metrics-period-seconds", METRICS_PERIOD])

        def one_each():
            owners = watch.owners()
            # a lease between owners has none (a hand-off's release): not yet one each, and no crash of the sort
            return sorted(owner or "" for owner in owners.values()) == ["c1", "c2", "c3", "j1"] and not any(
                "checkpointOwner" in watch.items[k] for k in owners)

        wait_until(_sampling(kw, one_each), 60, "the leader handing one lease each to c2 and c3")
        moved_to_new = {k for k, o in watch.owners().items() if o in ("c2", "c3")}
        _put(fleet)
        wait_until(lambda: not fleet.missing(), 60, "every record delivered after the hand-offs")
        assert fleet.stop_ours("c2") == 0, fleet.our_log("c2")[-3000:]
        assert fleet.stop_ours("c3") == 0, fleet.our_log("c3")[-3000:]
        wait_until(_sampling(kw, lambda: _owners(watch) == ["c1", "c1", "j1", "j1"]),
                   45, "the leader assigning the released leases to c1 and j1")
        _put(fleet)
        wait_until(lambda: not fleet.missing(), 60, "every record delivered after c2 and c3 left")
        print(f"2.x-compatible balance then the flip in {flipped - started:.0f}s; handed to c2/c3: "
              f"{sorted(moved_to_new)} (from Java: {sorted(moved_to_new & java_before)}, from ours: "
              f"{sorted(moved_to_new & ours_before)}); hand-offs seen {kw.handoffs}")
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert j1.stop() == 0, j1.log_tail()
    got = _assert_complete(fleet, "upgrade")
    _assert_no_self_repeats(got)
    _checkpoints_never_back(watch)
    assert moved_to_new & java_before and moved_to_new & ours_before, (moved_to_new, before)
    handed = {k for k, pairs in kw.handoffs.items() if any(new in ("c2", "c3") for _, new in pairs)}
    assert moved_to_new <= handed, f"leases moved to c2/c3 without a hand-off seen in flight: {kw.handoffs}"
    duplicated = {k[0] for k in got.duplicates()}
    assert not duplicated & handed, f"records repeated on gracefully handed leases {duplicated & handed}"
    for name in ours:
        steals = _takes_beside_the_leader(fleet.our_log(name), name)
        assert not steals, f"{name} took leases beside the 3.x leader:\n" + "\n".join(steals)
    for name in ours:  # the leader's assignment lists only workers whose metrics it read as valid and fresh
        assert f"Worker : {name} and total leases" in j1.log_text(), f"the leader never counted {name} as active"
    invalid = [line for line in j1.log_text().splitlines() if "invalid entries" in line]
    assert not any(name in line for line in invalid for name in ours), invalid
    assert _java_complaints(j1, ours) == [], "\n".join(_java_complaints(j1, ours))


def _seed_lease_table_version(fleet, version: str) -> None:
    """The migration item of a fleet that already upgraded, in the lease table (the one-table layout), as Java
    writes it."""
    fleet.dynamodb.put_item(TableName=fleet.application, Item={
        "leaseKey": {"S": MIGRATION_KEY}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"}, "cv": {"S": version},
        "mb": {"S": "operator"}, "mts": {"N": str(int(time.time() * 1000))}, "h": {"L": []}},
        ConditionExpression="attribute_not_exists(leaseKey)")


def test_kcl3_rollback_returns_ours_to_leaderless_taking(kcl3_fleet):
    """(2) A fleet already in CLIENT_VERSION_3X_WITH_ROLLBACK: ours follows, the 3.5.1 worker leads and takes one
    of our two leases by a graceful hand-off (ours -> Java: nothing lost, nothing repeated). An operator rolls back
    (CLIENT_VERSION_2X, as KclMigrationTool.py writes it): ours is leaderless at its next scan, so when the Java
    worker then dies (kill -9) ours takes its lease itself after the expiry — a follower would wait for a leader
    that is gone — and reads on from Java's checkpoint."""
    fleet = kcl3_fleet(2)
    _put(fleet)
    with fleet.watch() as watch:
        kw = Kcl3Watch(watch)
        fleet.start_ours("c1", extra=["--worker-metrics-period-seconds", METRICS_PERIOD])
        wait_until(lambda: _owners(watch) == ["c1", "c1"], 40, "both leases held by c1")
        _seed_lease_table_version(fleet, WITH_ROLLBACK)
        wait_until(lambda: _follower_since(fleet, "c1"), 15, "c1 following (no leader yet)")
        j1 = fleet.start_java("j1", extra=["--client-version", "2X", *JAVA_3X])
        wait_until(_sampling(kw, lambda: _owners(watch) == ["c1", "j1"] and not any(
            "checkpointOwner" in i for i in watch.items.values())), 60, "the leader handing one lease to itself")
        java_shard = next(k for k, o in watch.owners().items() if o == "j1")
        assert (("c1", "j1") in kw.handoffs.get(java_shard, set())), f"no graceful hand-off seen: {kw.handoffs}"
        _put(fleet)
        wait_until(lambda: not fleet.missing(), 60, "every record delivered by c1 and the 3.x leader")
        handed = fleet.deliveries()
        assert not handed.duplicates(), f"records repeated over the graceful hand-off: {list(handed.duplicates())[:3]}"
        _write_client_version(fleet, ROLLED_BACK, (UPGRADE, WITH_ROLLBACK), "KclMigrationTool-rollback")
        wait_until(lambda: _leaderless_again(fleet, "c1"), 15, "c1 leaderless again after the rollback")
        wait_until(lambda: watch.items[java_shard].get("checkpoint", {}).get("S", "").isdigit(), 20,
                   "j1 checkpointing its lease")
        time.sleep(2)
        j1.kill()
        killed, killed_ms = time.monotonic(), time.time() * 1000
        java_checkpoint = int(watch.checkpoint(java_shard))
        _put(fleet)
        wait_until(lambda: watch.owners().get(java_shard) == "c1", 40, "c1 taking the dead leader's lease itself")
        print(f"c1 took j1's lease {time.monotonic() - killed:.1f}s after kill -9, leaderless after the rollback")
        wait_until(lambda: not fleet.missing(), 60, "every record delivered after the rollback")
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    got = _assert_complete(fleet, "rollback")
    _assert_no_self_repeats(got)
    _checkpoints_never_back(watch)
    c1_early = [d for d in got.of_shard(java_shard, "c1") if d.at_ms >= killed_ms and d.position[0] < java_checkpoint]
    assert not c1_early, f"c1 re-read {len(c1_early)} records before j1's checkpoint"
    assert {k[0] for k in got.duplicates()} <= {java_shard}
    steals = _takes_beside_the_leader(fleet.our_log("c1"), "c1")
    assert not steals, "c1 took leases beside the 3.x leader:\n" + "\n".join(steals)
    assert _java_complaints(j1, ["c1"]) == [], "\n".join(_java_complaints(j1, ["c1"]))


def test_kcl3_custom_table_names_ours_follow_the_leader_found_there(kcl3_fleet):
    """(3) An application with its own coordinator-state and worker-metrics table names, in the separate-tables
    layout (its coordinator-state table exists, as KCL 3.0-3.4 created it, holding CLIENT_VERSION_3X_WITH_ROLLBACK):
    ours, given the same names, finds the 3.5.1 worker's leader lock under the custom name (at its next once-a-minute
    read of that table) and follows it, publishes its worker metrics in the custom worker-metrics table (none in
    the lease table), and the leader — which assigns only to workers whose metrics it reads — assigns it a lease;
    nothing lost."""
    fleet = kcl3_fleet(2)
    cs, wm = f"{fleet.application}-cs-custom", f"{fleet.application}-wm-custom"
    for table, key in ((cs, "key"), (wm, "wid")):
        fleet.dynamodb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                                    KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                                    AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}])
    _seed_client_version(fleet, WITH_ROLLBACK, cs)
    _put(fleet)
    names = ["--coordinator-state-table-name", cs, "--worker-metrics-table-name", wm]
    # Ours first: it creates the lease table with the owner index in CreateTable. (When the 3.5.1 worker created the
    # table itself on moto, adding the index by UpdateTable, its DynamoDBLeaseDiscoverer never found the lease its
    # own leader assigned it — a moto index gap: it re-assigned the lease to itself every few seconds, unworked.)
    with fleet.watch() as watch:
        fleet.start_ours("c1", extra=["--worker-metrics-period-seconds", METRICS_PERIOD, *names])
        wait_until(lambda: len(watch.owners()) == 2, 40, "c1 creating the two leases")
        j1 = fleet.start_java("j1", extra=["--client-version", "2X", "--coordinator-state-table", cs,
                                           "--worker-metrics-table", wm, *JAVA_3X])
        try:  # ours reads the separate table at its start, then once a minute (as Java's ClientVersionChangeMonitor)
            wait_until(lambda: "leader=j1" in fleet.our_log("c1"), 75, "c1 seeing j1 lead under the custom name")
        except AssertionError:
            leader = fleet.dynamodb.get_item(TableName=cs, Key={"key": {"S": "Leader"}}).get("Item")
            raise AssertionError(f"c1 never showed leader=j1; the Leader item in {cs}: {leader}") from None
        wait_until(lambda: _owners(watch) == ["c1", "j1"], 60, "the leader assigning one lease to c1")
        wait_until(lambda: not fleet.missing(), 60, "every record delivered")
        assert "c1" in _worker_metrics(fleet, wm), _items(fleet, wm)
        assert "c1" not in _worker_metrics(fleet), "c1 published its metrics in the lease table"
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert j1.stop() == 0, j1.log_tail()
    got = _assert_complete(fleet, "custom names")
    _assert_no_self_repeats(got)
    _checkpoints_never_back(watch)
    follower = [line for line in fleet.our_log("c1").splitlines() if "mode=follower" in line]
    assert follower and "separate" in follower[-1] and "leader=j1" in follower[-1], follower[-1:]
    steals = _takes_beside_the_leader(fleet.our_log("c1"), "c1")
    assert not steals, "c1 took leases beside the 3.x leader:\n" + "\n".join(steals)
    assert _java_complaints(j1, ["c1"]) == [], "\n".join(_java_complaints(j1, ["c1"]))
