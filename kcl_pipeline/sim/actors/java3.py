"""A Java KCL 3.x worker sharing the application, in KCL 3.5's one-table layout, modelled from its requests as
the Java source makes them (no code of this project; docs/kcl3.md names the classes):

* metadata in the lease table: the leader lock (`Leader`, entityType LEADER, the lock client's ownerName,
  leaseDuration, recordVersionNumber), the migration state (`Migration3.0`, CLIENT_VERSION_MIGRATION: cv, mb,
  mts, h) and its worker metrics (its worker id, WORKER_METRIC_STATS: lut, sts THROUGHPUT), written every 30 s;
* its renewer, every expiry/3: `SET leaseCounter + 1 IF leaseCounter AND attribute_not_exists(checkpointOwner)`;
  a refusal re-reads the item, and a graceful hand-off asked of it (checkpointOwner = itself, leaseOwner another)
  shuts its shard consumer down and renews on with the counter alone (renewLease); then the shard consumer's
  checkpoint (updateLease: counter + 1) and the transfer (assignLease to the new owner: counter + 1,
  checkpointOwner removed, if leaseOwner and checkpointOwner are as it knows them);
* in the 2.x-compatible client versions (INIT, UPGRADE_FROM_2X, 2X) a 2.x-style lease taker (java_taker.py): free
  or expired leases up to its share, conditioned on the counter;
* in the 3.x client versions (3X_WITH_ROLLBACK, 3X), as the fleet's only Java worker, the leader: its lease
  assignment (every `LAM_EVERY`) assigns free and expired leases to an active worker (fresh worker metrics)
  with the fewest leases — assignLease, conditioned on leaseOwner and checkpointOwner, never on the counter —
  evicts an expired lease of a worker whose metrics went stale (evictLease: leaseOwner removed, counter + 1),
  balances lease counts by graceful hand-offs (initiateGracefulLeaseHandoff: leaseOwner = the new owner,
  checkpointOwner = the holder, the counter untouched) and transfers a hand-off unanswered after
  `HANDOFF_TIMEOUT` plus an expiry; as every 3.x worker it adopts the leases assigned to it once no
  checkpointOwner is pending (DynamoDBLeaseDiscoverer);
* as the leader in UPGRADE_FROM_2X it flips the fleet to 3X_WITH_ROLLBACK once every lease owner has fresh
  worker metrics for `STABILIZATION` (MigrationReadyMonitor: this consumer's own publishing counts), and it
  re-reads the migration state once a minute (ClientVersionChangeMonitor); an operator (KCL's migration tool)
  may roll the fleet back to 2X and forward again, and a default-config worker joining a table without migration
  state writes 3X directly;
* a crashed worker is restarted (its orchestrator) a few seconds later, and takes the leader lock again.

Timings are Java's where they matter to safety (10 s expiry); the lease assignment runs every 5 s and the hand-off
timeout is 3 s (both configurable in Java: leaseAssignmentIntervalMillis, gracefulLeaseHandoffTimeoutMillis, whose
defaults of 20 s and 30 s would let a dead worker's lease wait longer than the checker's liveness bound).

`join(world)` adds one to a world (the worlds a seed gives one, or every world when forced: `simulate`).
"""
from __future__ import annotations

import bisect
import inspect
import math
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ...kcl.core.model import SHARD_END, TRIM_HORIZON, Lease
from ...kcl.core.table.lease_codec import lease_from_item
from ..aws.dynamodb import SimDynamoDBClient
from ..runtime.engine import Host, Scope
from .java_taker import LeaseTaker

if TYPE_CHECKING:
    from .stage import Stage

EXPIRY = 10.0
RENEW_EVERY = EXPIRY / 3
TAKE_EVERY = EXPIRY / 2           # the 2.x-compatible taker's period (the sim's: Java's is twice the failover time)
POLL_EVERY = 1.0
LAM_EVERY = 5.0
BALANCE_EVERY_RUNS = 3             # varianceBalancingFrequency
HANDOFF_TIMEOUT = 3.0              # gracefulLeaseHandoffTimeoutMillis (the sim's); + an expiry, as the LAM adds
METRICS_EVERY = 30.0               # workerMetricsReporterFreqInMillis
ACTIVE_FOR = 2 * METRICS_EVERY     # a worker's metrics count as fresh this long
MONITOR_EVERY = 60.0               # ClientVersionChangeMonitor / MigrationReadyMonitor
STABILIZATION = 30.0               # the readiness must hold this long before the flip
RESTART_AFTER = (1.0, 5.0)

UPGRADE = "CLIENT_VERSION_UPGRADE_FROM_2X"
ROLLBACK_2X = "CLIENT_VERSION_2X"
WITH_ROLLBACK = "CLIENT_VERSION_3X_WITH_ROLLBACK"
V3X = "CLIENT_VERSION_3X"
LEADER_ASSIGNED = frozenset({WITH_ROLLBACK, V3X})
PENDING = ("pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState")


@dataclass
class _Held:
    counter: int
    renewed_at: float          # local clock when the last renewal's answer arrived
    tenure: int                # this hold of the lease, as the checker tells holders apart
    position: int = -1         # index of the last delivered user record (-1: none yet)
    started: bool = False
    handing_to: str | None = None  # a graceful hand-off was asked of it: its consumer has shut down


@dataclass(frozen=True)
class Plan:
    """What the seed decides for the fleet's migration: the client version at the start (None: no state; the
    Java worker joining writes 3X), and when an operator rolls it back to 2X and forward again."""

    initial: str | None
    join_at: float
    rollback_at: float | None
    forward_at: float | None
    forward_to: str

    @classmethod
    def draw(cls, rng: random.Random) -> "Plan":
        # A run's main phase lasts one to a few virtual minutes: the flips fall inside it.
        initial = rng.choice([None, UPGRADE, UPGRADE, WITH_ROLLBACK, V3X])
        rollback = rng.uniform(15.0, 120.0) if rng.random() < 0.5 else None
        forward = rollback + rng.uniform(15.0, 90.0) if rollback is not None and rng.random() < 0.5 else None
        return cls(initial, rng.uniform(0.0, 20.0), rollback, forward, rng.choice([UPGRADE, V3X]))


class JavaKcl3Peer:
    is_java_peer = True  # its requests are its own: mutations of our code never touch them

    def __init__(self, world: "Stage", host: Host, worker_id: str, plan: Plan):
        self.world = world
        self.host = host
        self.worker_id = worker_id
        self.plan = plan
        self.rng = world.child_rng()
        self.client = SimDynamoDBClient(world.dynamodb, world.child_rng(), host.faults, actor=self,
                                        **_accepted(SimDynamoDBClient, now=lambda: world.now,
                                                    later=getattr(world, "apply_later", None)))
        self.incarnation = 0
        self.group = Scope(f"java3 {worker_id}")
        self.held: dict[str, _Held] = {}
        self.version: str | None = None          # the client version as this worker knows it
        self.lam_seen: dict[str, tuple[int, str | None, str | None, float]] = {}
        self.taker = LeaseTaker(worker_id, EXPIRY, also=" REMOVE checkpointOwner")
        self.handoff_since: dict[str, float] = {}
        self.lam_runs = 0
        self.ready_since: float | None = None
        self.assigned_expired: dict[str, float] = {}  # worker → when a lease the leader assigned it expired

    def __repr__(self) -> str:
        return f"java 3.x peer {self.worker_id}"

    # -- the checker's view ----------------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.group.alive()

    def leads(self) -> bool:
        return self.group.alive() and self.version in (WITH_ROLLBACK, V3X)

    def works(self, key: str) -> bool:
        held = self.held.get(key)
        return (held is not None and held.handing_to is None and self.group.alive()
                and self.group.thaw_time() <= self.world.now and self.host.monotonic() - held.renewed_at < EXPIRY)

    # -- life ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        world = self.world
        world.schedule(self.plan.join_at, self._join, None)
        if self.plan.rollback_at is not None:
            world.at(self.plan.rollback_at, lambda: self._operator(ROLLBACK_2X))
        if self.plan.forward_at is not None:
            world.at(self.plan.forward_at, lambda: self._operator(self.plan.forward_to))

    def _join(self) -> None:
        """A (new) incarnation starts: the leader lock, its state from the table, its timers."""
        group = self.group
        self._write_leader()
        self.version = self._read_version()
        if self.version is None:  # a default-config 3.x worker joining a table without migration state
            self._write_version(V3X, None)
            self.version = V3X
        self._every(group, 0.0, METRICS_EVERY, self._publish_metrics)
        self._every(group, RENEW_EVERY, RENEW_EVERY, self._renew)
        self._every(group, POLL_EVERY, POLL_EVERY, self._consume)
        self._every(group, LAM_EVERY, LAM_EVERY, self._lead)
        self._every(group, TAKE_EVERY * self.rng.random(), TAKE_EVERY, self._take)
        self._every(group, MONITOR_EVERY * (1 + 0.5 * self.rng.random()), MONITOR_EVERY, self._monitor)
        self.world.note(f"{self!r} joined as leader, client version {self.version}")

    def _every(self, group: Scope, delay: float, period: float, action) -> None:
        def tick():
            action()
            self.world.schedule(self.host.true_delay(period), tick, group)
        self.world.schedule(self.host.true_delay(delay), tick, group)

    def crash(self) -> None:
        """Killed, releasing nothing; its orchestrator starts it again a few seconds later."""
        self.group.dead = True
        self.world.stats["java 3.x peer crashes"] += 1
        self.world.at(self.world.now + self.rng.uniform(*RESTART_AFTER), self._restart)

    def _restart(self) -> None:
        self.incarnation += 1
        self.group = Scope(f"java3 {self.worker_id} #{self.incarnation}")
        self.held = {}
        self.lam_seen, self.handoff_since, self.assigned_expired = {}, {}, {}
        self.taker = replace(self.taker, seen={})  # a new incarnation remembers nothing of the last
        self.ready_since = None
        self._join()

    # -- requests --------------------------------------------------------------------------------------------
    def _call(self, method: str, **request: Any) -> Any:
        return getattr(self.client, method)(TableName=self.world.table_name, **request)

    def _update(self, key: str, update: str, condition: str, values: dict) -> bool:
        try:
            self._call("update_item", Key={"leaseKey": {"S": key}}, UpdateExpression=update,
                       ConditionExpression=condition, ExpressionAttributeValues=values)
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise

    def _get(self, key: str) -> dict | None:
        return self._call("get_item", Key={"leaseKey": {"S": key}}, ConsistentRead=True).get("Item")

    def _scan(self) -> list[dict]:
        return self._call("scan", ConsistentRead=True)["Items"]

    def _leases(self, items: list[dict]) -> list[Lease]:
        listed = {s.shard_id for s in self.world.stream.listed()}
        found = []
        for item in items:
            try:
                lease = lease_from_item(item)
            except Exception:  # a corrupt item: skipped, as DynamoDBLeaseRefresher does
                continue
            if lease is not None and lease.lease_key in listed:
                found.append(lease)
        return found

    # -- metadata ---------------------------------------------------------------------------------------------
    def _write_leader(self) -> None:
        self._call("put_item", Item={
            "leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "ownerName": {"S": self.worker_id},
            "leaseDuration": {"S": str(int(EXPIRY * 1000))},
            "recordVersionNumber": {"S": f"{self.worker_id}-{self.incarnation}-{self.rng.getrandbits(32):08x}"}})

    def _read_version(self) -> str | None:
        item = self._get("Migration3.0")
        if item is None or item.get("entityType", {}).get("S") != "CLIENT_VERSION_MIGRATION":
            return None
        return item.get("cv", {}).get("S")

    def _write_version(self, version: str, expected: str | None, by: str | None = None) -> bool:
        """MigrationState.update + the conditional write on the client version (or its creation)."""
        by = by or self.worker_id
        item = {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
                "cv": {"S": version}, "mb": {"S": by}, "mts": {"N": str(int(self.host.wall() * 1000))}}
        try:
            if expected is None:
                self._call("put_item", Item=item, ConditionExpression="attribute_not_exists(leaseKey)")
            else:
                self._call("put_item", Item=item, ConditionExpression="cv = :expected",
                           ExpressionAttributeValues={":expected": {"S": expected}})
        except ClientError:
            return False
        self.world.note(f"client version {expected or 'none'} -> {version} (by {by})")
        self.world.stats[f"client version -> {version}"] += 1
        return True

    def _operator(self, version: str) -> None:
        """KCL's migration tool, run by an operator: a rollback to 2X, or forward again."""
        current = self._read_version()
        if current is not None and current != version:
            self._write_version(version, current, by="KclMigrationTool")

    def _publish_metrics(self) -> None:
        stand_in = getattr(self.world, "worker_metrics", None)
        if stand_in is not None:  # a world whose consumers keep their metrics in the simulation's stand-in table
            stand_in[self.worker_id] = self.world.now
        try:
            self._call("update_item", Key={"leaseKey": {"S": self.worker_id}},
                       UpdateExpression="SET entityType = :e, lut = :lut, sts = :sts",
                       ExpressionAttributeValues={":e": {"S": "WORKER_METRIC_STATS"},
                                                  ":lut": {"N": str(int(self.host.wall()))},
                                                  ":sts": {"M": {"THROUGHPUT": {"L": [{"N": "0.0"}]}}}})
        except Exception:
            return

    def _monitor(self) -> None:
        """ClientVersionChangeMonitor: the client version, re-read once a minute."""
        try:
            version = self._read_version()
        except Exception:
            return
        if version is not None and version != self.version:
            self.world.note(f"{self!r} sees client version {version}")
            self.version = version
            self.ready_since = None

    @property
    def leading(self) -> bool:
        return self.version in LEADER_ASSIGNED

    # -- the renewer -------------------------------------------------------------------------------------------
    def _renew(self) -> None:
        for key, held in list(self.held.items()):
            condition = "leaseCounter = :c"
            if held.handing_to is None:
                condition += " AND attribute_not_exists(checkpointOwner)"
            try:
                ok = self._update(key, "SET leaseCounter = :next", condition,
                                  {":c": {"N": str(held.counter)}, ":next": {"N": str(held.counter + 1)}})
                if not ok and held.handing_to is None:
                    item = self._get(key)
                    lease = lease_from_item(item) if item else None
                    if (lease is not None and lease.extra.get("checkpointOwner") == self.worker_id
                            and lease.lease_owner not in (None, self.worker_id)
                            and lease.lease_counter == held.counter):
                        # A graceful hand-off asked of it: its shard consumer shuts down; it renews on.
                        held.handing_to = lease.lease_owner
                        self.world.stats["java 3.x hand-offs asked of it"] += 1
                        ok = self._update(key, "SET leaseCounter = :next", "leaseCounter = :c",
                                          {":c": {"N": str(held.counter)}, ":next": {"N": str(held.counter + 1)}})
            except Exception:
                continue
            if ok:
                held.counter += 1
                held.renewed_at = self.host.monotonic()
            else:
                del self.held[key]
                self.world.stats["java 3.x leases lost"] += 1

    # -- its shard consumers ------------------------------------------------------------------------------------
    def _consume(self) -> None:
        for key in sorted(self.held):
            held = self.held.get(key)
            if held is None:
                continue
            try:
                if held.handing_to is not None:
                    self._finish_handoff(key, held)
                else:
                    self._consume_one(key, held)
            except Exception:
                continue

    def _finish_handoff(self, key: str, held: _Held) -> None:
        """The shard consumer shut down: its last checkpoint, then the transfer to the new owner."""
        if held.started and held.position >= 0:
            shard = self.world.stream.shards[key]
            last = shard.positions[held.position]
            if not self._checkpoint(key, held, {":seq": {"S": last[1]}, ":sub": {"N": str(last[2])}},
                                    "checkpoint = :seq, checkpointSubSequenceNumber = :sub, "):
                return
        new_owner = held.handing_to
        assigned = self._update(
            key, "SET leaseOwner = :new REMOVE checkpointOwner ADD leaseCounter :one",
            "leaseOwner = :new AND checkpointOwner = :me AND attribute_exists(leaseKey)",
            {":new": {"S": new_owner}, ":me": {"S": self.worker_id}, ":one": {"N": "1"}})
        self.held.pop(key, None)
        self.world.stats["java 3.x hand-offs completed" if assigned else "java 3.x hand-offs overtaken"] += 1

    def _consume_one(self, key: str, held: _Held) -> None:
        world = self.world
        if self.host.monotonic() - held.renewed_at >= EXPIRY:
            del self.held[key]
            return
        shard = world.stream.shards.get(key)
        if shard is None or shard.trimmed:
            return
        if not held.started:
            item = self._get(key)
            lease = lease_from_item(item) if item else None
            if lease is None or lease.is_ended or lease.lease_owner != self.worker_id:
                del self.held[key]
                return
            for parent in shard.parents:  # BlockOnParentShard
                p = self._get(parent)
                if p is not None and p.get("checkpoint", {}).get("S") != SHARD_END:
                    return
            cp = lease.checkpoint
            held.position = -1 if cp.is_starting_sentinel else bisect.bisect_right(shard.positions, cp.key()) - 1
            held.started = True
        positions = shard.positions[held.position + 1:held.position + 11]
        if positions:
            world.checker.on_deliver(self, key, positions, java=True,
                                     **_accepted(world.checker.on_deliver, tenure=held.tenure))
            last = positions[-1]
            if not self._checkpoint(key, held, {":seq": {"S": last[1]}, ":sub": {"N": str(last[2])}},
                                    "checkpoint = :seq, checkpointSubSequenceNumber = :sub, "):
                return
            held.position += len(positions)
        elif shard.closed_at is not None and held.position + 1 >= len(shard.positions):
            if self._checkpoint(key, held, {":end": {"S": SHARD_END}}, "checkpoint = :end, "):
                del self.held[key]
                world.stats["java 3.x shard ends"] += 1
                self._create_children(key)

    def _checkpoint(self, key: str, held: _Held, values: dict, sets: str) -> bool:
        """updateLease: fenced by the counter alone; the prepared checkpoint cleared (setCheckpoint)."""
        ok = self._update(key, f"SET {sets}ownerSwitchesSinceCheckpoint = :zero, leaseCounter = :next "
                               f"REMOVE {', '.join(PENDING)}", "leaseCounter = :c",
                          {**values, ":zero": {"N": "0"}, ":c": {"N": str(held.counter)},
                           ":next": {"N": str(held.counter + 1)}})
        if ok:
            held.counter += 1
        else:
            self.held.pop(key, None)
            self.world.stats["java 3.x leases lost"] += 1
        return ok

    def _create_children(self, key: str) -> None:
        for child in self.world.stream.shards.values():
            if key not in child.parents:
                continue
            if len(child.parents) > 1 and not all(self._get(p) for p in child.parents):
                continue  # a merged child once both parents' leases exist
            item = {"leaseKey": {"S": child.shard_id}, "leaseCounter": {"N": "0"}, "checkpoint": {"S": TRIM_HORIZON},
                    "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "0"},
                    "parentShardId": {"SS": sorted(child.parents)}, "entityType": {"S": "LEASE"}}
            try:
                self._call("put_item", Item=item, ConditionExpression="attribute_not_exists(leaseKey)")
            except ClientError:
                pass

    def _hold(self, lease: Lease) -> None:
        self.held[lease.lease_key] = _Held(lease.lease_counter, self.host.monotonic(), self.world.next_serial())

    # -- 2.x-compatible: the lease taker ---------------------------------------------------------------------
    def _take(self) -> None:
        if self.leading:
            return
        try:
            items = self._scan()
        except Exception:
            return
        now = self.host.monotonic()
        taking = self.taker.round(self._leases(items), now, self.held)
        owners = {lease.lease_owner for lease in taking.live if lease.lease_owner} | {self.worker_id}
        target = math.ceil(len(taking.live) / len(owners))
        for lease in taking.available:
            if len(self.held) >= target:
                break
            try:
                taken = self.taker.take(self._update, lease)
            except Exception:
                continue
            if taken:
                self._hold(replace(lease, lease_counter=lease.lease_counter + 1))
                self.world.stats["java 3.x takes"] += 1

    # -- 3.x: the leader's lease assignment, and the discovery of what it assigned to itself -------------------
    def _lead(self) -> None:
        try:
            items = self._scan()
        except Exception:
            return
        now = self.host.monotonic()
        leases = self._leases(items)
        metrics = {item["leaseKey"]["S"]: float(item["lut"]["N"]) for item in items
                   if item.get("entityType", {}).get("S") == "WORKER_METRIC_STATS" and "lut" in item}
        for worker, at in (getattr(self.world, "worker_metrics", None) or {}).items():  # the stand-in, when kept
            metrics[worker] = max(metrics.get(worker, -math.inf), self.host.wall() - (self.world.now - at))
        if self.version == UPGRADE:
            self._check_readiness(leases, metrics)
        if not self.leading:
            return
        self._discover(leases)
        self.lam_runs += 1
        seen: dict[str, tuple[int, str | None, str | None, float]] = {}
        for lease in leases:
            previous = self.lam_seen.get(lease.lease_key)
            state = (lease.lease_counter, lease.lease_owner, lease.extra.get("checkpointOwner"))
            seen[lease.lease_key] = previous if previous and previous[:3] == state else (*state, now)
        self.lam_seen = seen
        wall = self.host.wall()
        active = {worker for worker, lut in metrics.items()
                  if wall - lut <= ACTIVE_FOR and self.assigned_expired.get(worker, -1.0) < lut}
        active.add(self.worker_id)
        counts = {worker: 0 for worker in active}
        for lease in leases:
            if not lease.is_ended and lease.lease_owner in counts:
                counts[lease.lease_owner] += 1
        for lease in sorted(leases, key=lambda x: x.lease_key):
            if lease.is_ended:
                continue
            pending = lease.extra.get("checkpointOwner")
            expired = lease.lease_owner is not None and now - seen[lease.lease_key][3] > EXPIRY
            if pending is not None:
                if now - seen[lease.lease_key][3] > HANDOFF_TIMEOUT + EXPIRY:
                    self._assign(lease, lease.lease_owner, "hand-off timed out")  # unanswered: transferred
                continue
            if lease.lease_owner is not None and not expired:
                continue
            if expired and lease.lease_owner not in active:
                self._evict(lease)
                continue
            if expired:
                self.assigned_expired[lease.lease_owner] = wall  # it let a lease expire: no more, till it reports
                counts.pop(lease.lease_owner, None)
            if counts:
                target = min(sorted(counts), key=lambda worker: counts[worker])
                if self._assign(lease, target, "expired" if expired else "unassigned"):
                    counts[target] += 1
        if self.lam_runs % BALANCE_EVERY_RUNS == 0 and len(counts) > 1:
            renewing = {lease.lease_owner for lease in leases if lease.lease_owner is not None
                        and not lease.is_ended and now - seen[lease.lease_key][3] < EXPIRY / 2}
            self._balance(leases, counts, renewing)

    def _check_readiness(self, leases: list[Lease], metrics: dict[str, float]) -> None:
        """MigrationReadyMonitor: every lease owner emits fresh worker metrics (the leaseOwner index is taken
        as active), for STABILIZATION, and the leader flips the fleet to 3X_WITH_ROLLBACK."""
        wall, now = self.host.wall(), self.host.monotonic()
        owners = {lease.lease_owner for lease in leases if lease.lease_owner is not None}
        ready = all(owner in metrics and wall - metrics[owner] <= ACTIVE_FOR for owner in owners)
        if not ready:
            self.ready_since = None
            return
        if self.ready_since is None:
            self.ready_since = now
        elif now - self.ready_since >= STABILIZATION and self._write_version(WITH_ROLLBACK, UPGRADE):
            self.version = WITH_ROLLBACK

    def _discover(self, leases: list[Lease]) -> None:
        for lease in leases:
            if (lease.lease_owner == self.worker_id and lease.lease_key not in self.held and not lease.is_ended
                    and lease.extra.get("checkpointOwner") is None):
                self._hold(lease)
                self.world.stats["java 3.x leases discovered"] += 1

    def _assign(self, lease: Lease, new_owner: str | None, why: str) -> bool:
        """assignLease: leaseOwner and checkpointOwner as seen (the item exists); never the counter."""
        if new_owner is None:
            return False
        values: dict[str, dict] = {":new": {"S": new_owner}, ":one": {"N": "1"}}
        conditions = ["attribute_exists(leaseKey)"]
        if lease.lease_owner is None:
            conditions.append("attribute_not_exists(leaseOwner)")
        else:
            conditions.append("leaseOwner = :seen")
            values[":seen"] = {"S": lease.lease_owner}
        pending = lease.extra.get("checkpointOwner")
        if pending is None:
            conditions.append("attribute_not_exists(checkpointOwner)")
        else:
            conditions.append("checkpointOwner = :cp")
            values[":cp"] = {"S": pending}
        switches = ", ownerSwitchesSinceCheckpoint :one" if lease.lease_owner not in (None, new_owner) else ""
        try:
            ok = self._update(lease.lease_key, f"SET leaseOwner = :new REMOVE checkpointOwner ADD leaseCounter :one"
                                               f"{switches}", " AND ".join(conditions), values)
        except Exception:
            return False
        if ok:
            self.world.stats[f"java 3.x leader assigned ({why})"] += 1
        return ok

    def _evict(self, lease: Lease) -> None:
        """evictLease: the owner removed (or, during a hand-off, the checkpointOwner), counter + 1."""
        values: dict[str, dict] = {":seen": {"S": lease.lease_owner or ""}, ":one": {"N": "1"}}
        try:
            if self._update(lease.lease_key, "REMOVE leaseOwner, checkpointOwner ADD leaseCounter :one",
                            "attribute_exists(leaseKey) AND leaseOwner = :seen "
                            "AND attribute_not_exists(checkpointOwner)", values):
                self.world.stats["java 3.x leader evicted"] += 1
        except Exception:
            return

    def _balance(self, leases: list[Lease], counts: dict[str, int], renewing: set[str]) -> None:
        """Variance balancing by lease count: one graceful hand-off from the richest worker to the poorest of
        those seen renewing a lease (the model's choice: a worker that stopped renewing — partitioned, frozen,
        dead — is not handed a lease it would leave unworked until it expired again)."""
        richest = max(sorted(counts), key=lambda worker: counts[worker])
        targets = sorted(worker for worker in counts if worker in renewing or worker == self.worker_id)
        if not targets:
            return
        poorest = min(targets, key=lambda worker: counts[worker])
        if counts[richest] - counts[poorest] < 2:
            return
        movable = [lease for lease in leases if lease.lease_owner == richest and not lease.is_ended
                   and "checkpointOwner" not in lease.extra]
        if not movable:
            return
        lease = self.rng.choice(sorted(movable, key=lambda x: x.lease_key))
        try:
            if self._update(lease.lease_key, "SET leaseOwner = :new, checkpointOwner = :old",
                            "attribute_exists(leaseKey) AND leaseOwner = :old "
                            "AND attribute_not_exists(checkpointOwner)",
                            {":new": {"S": poorest}, ":old": {"S": richest}}):
                self.world.stats["java 3.x leader hand-offs"] += 1
                self.world.note(f"{self!r}: hand-off of {lease.lease_key} from {richest} to {poorest}")
        except Exception:
            return


def _accepted(function: Any, **kwargs: Any) -> dict[str, Any]:
    """The keyword arguments `function` takes (the world's services and checker gain some as they grow)."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in kwargs.items() if name in parameters and value is not None}


def _guard_metadata(world: "Stage", peer: JavaKcl3Peer) -> None:
    """Invariant: nobody but the Java fleet (and the operator's tool) writes the leader lock, the migration
    state or a Java worker's metrics item — this consumer never touches them."""
    protected = {"Leader", "Migration3.0", peer.worker_id}

    def observe(table: str, key: str, before: Any, after: Any, actor: Any, *rest: Any) -> None:
        if table == world.table_name and key in protected and actor is not peer:
            world.checker.violation(f"{actor!r} wrote {key}, KCL 3.x's own item: {before} -> {after}")
    world.dynamodb.observers.append(observe)


def chosen(world: "Stage") -> bool:
    """Whether this world has a KCL 3.x peer: the seed decides, in worlds with a Java peer fault kind, no KCL
    2.x peer and no landing pipeline (the peer delivers without landing), or always when forced."""
    scenario = world.scenario
    if getattr(world, "java3_forced", False):
        return True
    if "java-peer" not in scenario.faults or scenario.java or scenario.pipeline_period is not None:
        return False
    return random.Random(f"java3-{scenario.seed}").random() < 0.3


def join(world: "Stage") -> JavaKcl3Peer | None:
    """Add a KCL 3.x peer to the world when `chosen`: it replaces the stand-in item another tool left under
    `Migration3.0` (the fleet's own state is written there), and joins the Java peers the checker watches."""
    if not chosen(world):
        return None
    items = world.dynamodb.tables[world.table_name].items
    if "Migration3.0" in getattr(world.checker, "foreign", {}):
        del world.checker.foreign["Migration3.0"]
        items.pop("Migration3.0", None)
    plan = Plan.draw(random.Random(f"java3-plan-{world.scenario.seed}"))
    if plan.initial is not None:
        items["Migration3.0"] = {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
                                 "cv": {"S": plan.initial}, "mb": {"S": "java3-peer-0"}, "mts": {"N": "0"}}
    peer = JavaKcl3Peer(world, world.new_host("java3-host"), "java3-peer-0", plan)  # type: ignore[attr-defined]
    _guard_metadata(world, peer)
    world.java_peers.append(peer)  # type: ignore[attr-defined]
    world.stats[f"java 3.x peer (start {plan.initial or 'no state'})"] += 1
    peer.start()
    return peer


__all__ = ["JavaKcl3Peer", "Plan", "chosen", "join"]
