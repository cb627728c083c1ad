"""A Java KCL 2.x peer sharing the lease table, modelled from its documented behaviour (its own requests,
not this project's code):

* a lease renewer: every expiry/3 (3.33 s) `SET leaseCounter = :c+1 IF leaseCounter = :c AND leaseOwner = :me`;
  a lease is held while its last renewal (as the response arrived) is younger than the expiry (10 s). It renews
  the leases it holds by UpdateItem alone: a failed listing does not stop it;
* a lease taker every 2 × expiry (20 s), as DynamoDBLeaseTaker (java_taker.py): lists the table, reading every item as
  DynamoDBLeaseSerializer.fromDynamoRecord does (`java2_rejects`: one item it cannot read fails the whole
  listing, and that round takes nothing; the checker is told); counts the leases of each owner that it has not
  seen unchanged for the expiry, itself included (target = ceil(leases / owners), or 1 when owners ≥ leases);
  takes expired or unowned leases up to its target; when none is available and it is short of its target,
  steals one lease (maxLeasesToStealAtOneTime) at random from the most loaded owner, if that owner holds more
  than the target (or exactly the target while it needs more than one). Its steal waits for nothing: the old
  holder finds out at its next renewal. Takes and steals are `SET leaseOwner, leaseCounter = :c+1 IF
  leaseCounter = :c`; it never takes SHARD_END;
* a shard consumer per held lease: blocks until every parent lease is SHARD_END or gone, delivers records
  after its checkpoint, checkpoints each batch (`leaseCounter` moves on), writes SHARD_END keeping its
  owner, and creates its children's leases — a merged child as soon as both parents' leases exist, which is
  how a merged child can appear before its other parent has ended;
* it never releases a lease on shutdown.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from ...kcl.core.model import SHARD_END, TRIM_HORIZON
from ...kcl.core.table.lease_codec import lease_from_item
from ..aws.dynamodb import SimDynamoDBClient
from ..runtime.engine import Host, Scope
from .java_taker import LeaseTaker

if TYPE_CHECKING:
    from .stage import Stage

EXPIRY = 10.0
# Lease's setters that refuse null (@NonNull): a number attribute fromDynamoRecord finds absent (or not of type N)
# fails the item, and with it the whole listing (DynamoDBLeaseRefresher.list catches nothing of it).
REQUIRED_NUMBERS = ("leaseCounter", "ownerSwitchesSinceCheckpoint")


def java2_rejects(item: dict) -> str | None:
    """Why KCL 2.x's DynamoDBLeaseSerializer.fromDynamoRecord throws on `item` (None: it reads it). It knows no
    `entityType`: every item of the table is read as a lease."""
    if not isinstance(item.get("leaseKey", {}).get("S"), str):
        return "no string leaseKey"
    for name in REQUIRED_NUMBERS:
        number = item.get(name, {}).get("N")
        if number is None:
            return f"no number {name}"
        try:
            int(number)
        except ValueError:
            return f"{name} {number!r} is not a long"
    return None
RENEW_EVERY = EXPIRY / 3
TAKE_EVERY = 2 * EXPIRY
POLL_EVERY = 1.0


@dataclass
class _Held:
    counter: int
    renewed_at: float          # local clock when the last renewal's answer arrived
    tenure: int = 0            # this hold of the lease, as the checker tells holders apart
    position: int = -1         # index of the last delivered user record in the shard (-1: none yet)
    started: bool = False


class JavaPeer:
    is_java_peer = True  # its requests are its own: mutations of our code never touch them

    def __init__(self, world: "Stage", host: Host, worker_id: str):
        self.world = world
        self.host = host
        self.worker_id = worker_id
        self.group = Scope(f"java {worker_id}")
        self.client = SimDynamoDBClient(world.dynamodb, world.child_rng(), host.faults, actor=self,
                                        now=lambda: world.now, later=world.apply_later)
        self.held: dict[str, _Held] = {}
        self.taker = LeaseTaker(worker_id, EXPIRY)
        # Which lease a steal picks (Java shuffles the victim's leases): a stream of its own.
        self.steal_rng = random.Random(f"{world.scenario.seed}-java-steal-{worker_id}")

    def __repr__(self) -> str:
        return f"java peer {self.worker_id}"

    def leads(self) -> bool:
        return False  # KCL 2.x has no leader

    def alive(self) -> bool:
        return self.group.alive()

    def works(self, key: str) -> bool:
        held = self.held.get(key)
        return (held is not None and self.group.alive() and self.group.thaw_time() <= self.world.now
                and self.host.monotonic() - held.renewed_at < EXPIRY)

    def start(self, delay: float = 0.0) -> None:
        self._every(delay, TAKE_EVERY, self._take)
        self._every(delay + RENEW_EVERY, RENEW_EVERY, self._renew)
        self._every(delay + POLL_EVERY, POLL_EVERY, self._consume)

    def _every(self, delay: float, period: float, action) -> None:
        def tick():
            action()
            self.world.schedule(self.host.true_delay(period), tick, self.group)
        self.world.schedule(self.host.true_delay(delay), tick, self.group)

    def _call(self, method: str, **request):
        """One request at this instant (the model does not spread its own I/O over time)."""
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

    # -- taker ---------------------------------------------------------------------------------------------
    def _take(self) -> None:
        try:
            items = self._call("scan", ConsistentRead=True)["Items"]
        except Exception:
            return
        for item in items:
            why = java2_rejects(item)
            if why is not None:  # the listing throws: this round takes nothing
                self.world.stats["java listings failed"] += 1
                self.world.checker.on_java_listing_failed(self, item.get("leaseKey", {}).get("S"), why)
                return
        now = self.host.monotonic()
        listed = {s.shard_id for s in self.world.stream.listed()}
        leases = [lease for lease in (lease_from_item(i) for i in items) if lease is not None
                  and lease.lease_key in listed]
        taking = self.taker.round(leases, now, self.held)
        live, available = taking.live, taking.available
        free = {lease.lease_key for lease in available}
        counts: dict[str, int] = {self.worker_id: 0}
        for lease in live:
            if lease.lease_key not in free and lease.lease_owner is not None:
                counts[lease.lease_owner] = counts.get(lease.lease_owner, 0) + 1
        if not live:
            return
        target = 1 if len(counts) >= len(live) else math.ceil(len(live) / len(counts))
        needed = target - counts[self.worker_id]
        if needed <= 0:
            return
        if available:
            for lease in available[:needed]:
                self._take_one(lease, stolen=False)
            return
        victim = max(sorted(counts), key=lambda owner: counts[owner])
        steals = min(needed, counts[victim] - target)
        if needed > 1 and steals == 0:
            steals = 1
        if counts[victim] < target or min(steals, 1) <= 0:
            return
        candidates = sorted((lease for lease in live if lease.lease_owner == victim), key=lambda x: x.lease_key)
        self._take_one(self.steal_rng.choice(candidates), stolen=True)

    def _take_one(self, lease, stolen: bool) -> None:
        key = lease.lease_key
        try:
            taken = self.taker.take(self._update, lease)
        except Exception:
            return
        if taken:
            if stolen:
                self.world.checker.on_java_steal(key)
                self.world.stats["java steals"] += 1
            self.held[key] = _Held(lease.lease_counter + 1, self.host.monotonic(), self.world.next_serial())
            self.world.stats["java takes"] += 1

    # -- renewer -------------------------------------------------------------------------------------------
    def _renew(self) -> None:
        for key, held in list(self.held.items()):
            try:
                ok = self._update(key, "SET leaseCounter = :next", "leaseCounter = :c AND leaseOwner = :me",
                                  {":c": {"N": str(held.counter)}, ":next": {"N": str(held.counter + 1)},
                                   ":me": {"S": self.worker_id}})
            except Exception:
                continue
            if ok:
                held.counter += 1
                held.renewed_at = self.host.monotonic()
            else:
                del self.held[key]
                self.world.stats["java leases lost"] += 1

    # -- shard consumers -----------------------------------------------------------------------------------
    def _consume(self) -> None:
        for key in sorted(self.held):
            if key in self.held:
                self._consume_one(key, self.held[key])

    def _consume_one(self, key: str, held: _Held) -> None:
        world = self.world
        if self.host.monotonic() - held.renewed_at >= EXPIRY:
            del self.held[key]  # expired: the shard consumer shuts down
            return
        shard = world.stream.shards.get(key)
        if shard is None or shard.trimmed:
            return
        try:
            if not held.started:
                item = self._call("get_item", Key={"leaseKey": {"S": key}}, ConsistentRead=True).get("Item")
                lease = lease_from_item(item) if item else None
                if lease is None or lease.is_ended:
                    del self.held[key]
                    return
                for parent in shard.parents:  # BlockOnParentShard
                    p = self._call("get_item", Key={"leaseKey": {"S": parent}}, ConsistentRead=True).get("Item")
                    if p is not None and p.get("checkpoint", {}).get("S") != SHARD_END:
                        return
                cp = lease.checkpoint
                held.position = -1 if cp.is_starting_sentinel else bisect.bisect_right(shard.positions, cp.key()) - 1
                held.started = True
            positions = shard.positions[held.position + 1:held.position + 11]
            if positions:
                world.checker.on_deliver(self, key, positions, java=True, tenure=held.tenure)
                last = positions[-1]
                if not self._checkpoint(key, held, {":seq": {"S": last[1]}, ":sub": {"N": str(last[2])}},
                                        "checkpoint = :seq, checkpointSubSequenceNumber = :sub, "):
                    return
                held.position += len(positions)
            elif shard.closed_at is not None and held.position + 1 >= len(shard.positions):
                if self._checkpoint(key, held, {":end": {"S": SHARD_END}}, "checkpoint = :end, "):
                    del self.held[key]
                    world.stats["java shard ends"] += 1
                    self._create_children(key)
        except ClientError:
            return
        except Exception:
            return

    def _checkpoint(self, key: str, held: _Held, values: dict, sets: str) -> bool:
        ok = self._update(key, f"SET {sets}leaseCounter = :next", "leaseCounter = :c AND leaseOwner = :me",
                          {**values, ":c": {"N": str(held.counter)}, ":next": {"N": str(held.counter + 1)},
                           ":me": {"S": self.worker_id}})
        if ok:
            held.counter += 1
        else:
            self.held.pop(key, None)
            self.world.stats["java leases lost"] += 1
        return ok

    def _create_children(self, key: str) -> None:
        for child in self.world.stream.shards.values():
            if key not in child.parents:
                continue
            if len(child.parents) > 1:
                exists = [self._call("get_item", Key={"leaseKey": {"S": p}}, ConsistentRead=True).get("Item")
                          for p in child.parents]
                if not all(exists):
                    continue  # Java creates a merged child once both parents' leases exist
            item = {"leaseKey": {"S": child.shard_id}, "leaseCounter": {"N": "0"},
                    "checkpoint": {"S": TRIM_HORIZON}, "checkpointSubSequenceNumber": {"N": "0"},
                    "ownerSwitchesSinceCheckpoint": {"N": "0"}, "parentShardId": {"SS": sorted(child.parents)}}
            try:
                self._call("put_item", Item=item, ConditionExpression="attribute_not_exists(leaseKey)")
                self.world.stats["java child leases created"] += 1
            except ClientError:
                pass

    def crash(self) -> None:
        self.group.dead = True  # never releases anything


__all__ = ["JavaPeer"]
