"""The lease item codec: Lease <-> DynamoDB item, attribute values, and every write as the request to send —
Java KCL's serializer, separate from the I/O (`shells/lease_table.py`), as Java separates its
DynamoDBLeaseSerializer from its refresher. Pure: no client, no clock.

Item attributes (Java KCL's names and types):

    leaseKey S (hash key, the shard id)        leaseOwner S (absent when free; an explicit NULL reads as free)
    leaseCounter N                             checkpoint S (sequence number or a sentinel)
    checkpointSubSequenceNumber N              ownerSwitchesSinceCheckpoint N
    parentShardId SS (singular, as Java)       childShardIds SS
    startingHashKey S / endingHashKey S        anything else: kept in Lease.extra, never overwritten

A write (`create_write`, `acquire_write`, ... `delete_write`) is a `Write`: the request with its update and
condition expressions, and the judge that tells from a re-read item whether a write of unknown outcome
was applied.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, TypeGuard

from ..model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, checkpoint_advances
from ..streams import multi_stream_attributes, related_lease_keys, stored_shard_ids
from .coordinator_state import INFERRED_ENTITIES
from .lease_rules import (
    CLAIM_ATTRIBUTE,
    CLAIM_OWNER_ATTRIBUTE,
    HANDOFF_ATTRIBUTE,
    LEASE_ATTRIBUTES,
    PENDING_CHECKPOINT_ATTRIBUTES,
    UNSETTLED_ATTRIBUTE,
    check_throughput,
)

LEASE_ENTITY_TYPE = "LEASE"

# Attributes the codec maps onto Lease fields; everything else goes to / comes from Lease.extra.
_MODELLED = frozenset({
    "leaseKey", "leaseOwner", "leaseCounter", "checkpoint", "checkpointSubSequenceNumber",
    "ownerSwitchesSinceCheckpoint", "parentShardId", "childShardIds", "startingHashKey", "endingHashKey",
})

# Java KCL 3.x's index of leases by owner (DynamoDBLeaseRefresher): leaseOwner HASH, leaseKey RANGE, KEYS_ONLY.
OWNER_INDEX_NAME = "LeaseOwnerToLeaseKeyIndex"
OWNER_INDEX = {"IndexName": OWNER_INDEX_NAME,
               "KeySchema": [{"AttributeName": "leaseOwner", "KeyType": "HASH"},
                             {"AttributeName": "leaseKey", "KeyType": "RANGE"}],
               "Projection": {"ProjectionType": "KEYS_ONLY"}}


def owner_index_active(description: Mapping[str, Any] | None) -> bool:
    return any(index.get("IndexName") == OWNER_INDEX_NAME and index.get("IndexStatus", "ACTIVE") == "ACTIVE"
               for index in (description or {}).get("GlobalSecondaryIndexes", []))


class LeaseTableError(RuntimeError):
    """The lease table could not be used (not a lost race: those are False / None answers)."""


class LeaseTableMissing(LeaseTableError):
    """The table does not exist (ResourceNotFoundException)."""


class LeaseTableUnavailable(LeaseTableError):
    """DynamoDB unreachable, or still throttling after botocore's retries."""


class LeaseItemInvalid(LeaseTableError, ValueError):
    """An item in the lease table is not a lease this code can read."""


# -- codec: python values <-> DynamoDB attribute values ----------------------------------------------------

def encode_value(value: Any) -> dict | None:
    """A plain python value as a DynamoDB attribute value; None for "no attribute" (None, empty set).

    str→S, bool→BOOL, int/float→N, bytes→B, list/tuple→L, dict→M, set of str→SS, set of numbers→NS.
    """
    if value is None:
        return None
    if isinstance(value, bool):  # before int: bool is an int
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, (int, Decimal)):
        return {"N": str(value)}
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"DynamoDB numbers cannot hold {value}")
        return {"N": repr(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"B": bytes(value)}
    if isinstance(value, (set, frozenset)):
        if not value:
            return None  # DynamoDB rejects empty sets
        if all(isinstance(v, str) for v in value):
            return {"SS": sorted(value)}
        if all(isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) for v in value):
            return {"NS": sorted(_present(v)["N"] for v in value)}
        if all(isinstance(v, (bytes, bytearray)) for v in value):
            return {"BS": sorted(bytes(v) for v in value)}
        raise ValueError(f"a set must hold only strings, only numbers or only bytes: {value!r}")
    if isinstance(value, (list, tuple)):
        return {"L": [encode_value(v) or {"NULL": True} for v in value]}
    if isinstance(value, Mapping):
        return {"M": {str(k): encode_value(v) or {"NULL": True} for k, v in value.items()}}
    raise ValueError(f"cannot store {type(value).__name__} {value!r} in DynamoDB")


def _present(value: Any) -> dict:
    """A value that cannot be absent (a number, a string), encoded."""
    encoded = encode_value(value)
    if encoded is None:
        raise ValueError(f"{value!r} encodes to no attribute")
    return encoded


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        number = Decimal(text)
        return int(number) if number == number.to_integral_value() and "." not in text else float(number)


def decode_value(attribute: Mapping[str, Any]) -> Any:
    """A DynamoDB attribute value as a plain python value (N → int or float, SS → set, NULL → None)."""
    (kind, value), = attribute.items()
    if kind == "S":
        return value
    if kind == "N":
        return _number(value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    if kind == "B":
        return bytes(value)
    if kind == "SS":
        return set(value)
    if kind == "NS":
        return {_number(v) for v in value}
    if kind == "BS":
        return {bytes(v) for v in value}
    if kind == "L":
        return [decode_value(v) for v in value]
    if kind == "M":
        return {k: decode_value(v) for k, v in value.items()}
    raise ValueError(f"unknown DynamoDB attribute type {kind}")


def lease_to_item(lease: Lease) -> dict[str, dict]:
    """The full item for a new lease (PutItem). Absent values and empty sets are left out."""
    item: dict[str, dict] = {
        "leaseKey": {"S": lease.lease_key},
        "leaseCounter": {"N": str(lease.lease_counter)},
        "checkpoint": {"S": lease.checkpoint.sequence_number},
        "checkpointSubSequenceNumber": {"N": str(lease.checkpoint.sub_sequence_number)},
        "ownerSwitchesSinceCheckpoint": {"N": str(lease.owner_switches_since_checkpoint)},
    }
    if lease.lease_owner is not None:
        item["leaseOwner"] = {"S": lease.lease_owner}
    # A multi-stream lease names its parents and children by shard id, as Java writes them; the model names
    # them by lease key, like everything the planner compares (streams.py).
    if lease.parent_shard_ids:
        item["parentShardId"] = {"SS": stored_shard_ids(lease.lease_key, lease.parent_shard_ids)}
    if lease.child_shard_ids:
        item["childShardIds"] = {"SS": stored_shard_ids(lease.lease_key, lease.child_shard_ids)}
    if lease.starting_hash_key is not None:
        item["startingHashKey"] = {"S": lease.starting_hash_key}
    if lease.ending_hash_key is not None:
        item["endingHashKey"] = {"S": lease.ending_hash_key}
    for name, value in multi_stream_attributes(lease.lease_key).items():
        item[name] = {"S": value}  # KCL's streamName and shardId beside a multi-stream key
    item["entityType"] = {"S": LEASE_ENTITY_TYPE}  # as KCL 3.x's serializer writes every lease (2.x ignores it)
    for name, value in lease.extra.items():
        if name in _MODELLED:
            raise ValueError(f"lease {lease.lease_key}: extra attribute {name} shadows a lease field")
        # None was read from an explicit NULL: write it back as one (a faithful copy of what was read).
        encoded = {"NULL": True} if value is None else encode_value(value)
        if encoded is not None:
            item[name] = encoded
    return item


def _typed(item: Mapping[str, dict], name: str, kind: str, key: str) -> Any:
    attribute = item.get(name)
    if attribute is None or "NULL" in attribute:
        return None
    if kind not in attribute:
        raise LeaseItemInvalid(f"lease {key}: attribute {name} should be of type {kind}, got {attribute!r}")
    return attribute[kind]


def _int(item: Mapping[str, dict], name: str, key: str, default: int = 0) -> int:
    value = _typed(item, name, "N", key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise LeaseItemInvalid(f"lease {key}: attribute {name} should be an integer, got {value!r}") from None


def entity_type(item: Mapping[str, Any]) -> str | None:
    """The item's `entityType` (Java's DynamoDBLeaseSerializer writes `LEASE` on every lease it creates; KCL
    3.5 keeps its other entities in the lease table under their own types); None when the item has none."""
    attribute = item.get("entityType")
    return attribute.get("S") if isinstance(attribute, Mapping) else None


def is_lease_item(item: Mapping[str, Any]) -> bool:
    """Java's rule (DynamoDBLeaseSerializer.fromDynamoRecord): an item without `entityType`, or with `LEASE`, is
    a lease; anything else is another entity sharing the table — as is an item without `entityType` under a key
    Java infers an entity from (its migration states: coordinator_state.INFERRED_ENTITIES)."""
    if "entityType" in item:
        return entity_type(item) == LEASE_ENTITY_TYPE
    key = item.get("leaseKey")
    return not (isinstance(key, Mapping) and key.get("S") in INFERRED_ENTITIES)


class LeaseScan(list):
    """The leases of one scan of the lease table (a list of Lease), with what else the scan met: `entities`,
    the items of other types KCL 3.5 keeps in the same table (its migration state, the leader lock, worker
    metrics: as read, never written back), and `skipped`, the keys of items that are no readable lease (a
    corrupt item is skipped and logged, as KCL 3.x's DynamoDBLeaseRefresher does, instead of failing the scan as
    KCL 2.x's does)."""

    def __init__(self, leases: Iterable[Lease] = (), entities: Iterable[dict] = (),
                 skipped: Iterable[str] = ()) -> None:
        super().__init__(leases)
        self.entities: tuple[dict, ...] = tuple(entities)
        self.skipped: tuple[str, ...] = tuple(skipped)


def scan_entities(leases: Any) -> tuple[dict, ...] | None:
    """The non-lease items a scan met (`LeaseScan.entities`); None when the list came from elsewhere."""
    return getattr(leases, "entities", None)


def lease_from_item(item: Mapping[str, dict]) -> Lease | None:
    """A lease from its item; None for the other entities KCL 3.x keeps in the same table."""
    if not is_lease_item(item):
        return None
    key = _typed(item, "leaseKey", "S", "?")
    if not key:
        raise LeaseItemInvalid(f"lease item without a leaseKey string: {dict(item)!r}")
    sequence = _typed(item, "checkpoint", "S", key)
    if sequence is None:
        raise LeaseItemInvalid(f"lease {key} has no checkpoint")
    try:
        checkpoint = Checkpoint(sequence, _int(item, "checkpointSubSequenceNumber", key))
    except ValueError as exc:
        raise LeaseItemInvalid(f"lease {key}: {exc}") from None
    return Lease(
        lease_key=key,
        checkpoint=checkpoint,
        lease_owner=_typed(item, "leaseOwner", "S", key),
        lease_counter=_int(item, "leaseCounter", key),
        owner_switches_since_checkpoint=_int(item, "ownerSwitchesSinceCheckpoint", key),
        parent_shard_ids=related_lease_keys(key, _typed(item, "parentShardId", "SS", key) or ()),
        child_shard_ids=related_lease_keys(key, _typed(item, "childShardIds", "SS", key) or ()),
        starting_hash_key=_typed(item, "startingHashKey", "S", key),
        ending_hash_key=_typed(item, "endingHashKey", "S", key),
        # entityType is LEASE on every lease here (is_lease_item); lease_to_item writes it back.
        extra={name: decode_value(value) for name, value in item.items()
               if name not in _MODELLED and name != "entityType"},
    )


# -- the writes ------------------------------------------------------------------------------------------
#
# Each write is one conditional request whose condition is the rule in lease_rules.py (the pure mirror the
# simulation uses). A function below builds it, with the judge that settles an ambiguous outcome: botocore
# retries a write whose response was lost, the retry then fails its condition against our own applied
# write, so the table re-reads the item and asks the judge whether it holds our write.

_STARTING_SENTINEL_VALUES = {":LATEST": {"S": LATEST}, ":TRIM_HORIZON": {"S": TRIM_HORIZON},
                             ":AT_TIMESTAMP": {"S": AT_TIMESTAMP}}
_ONE = {"N": "1"}
_ZERO = {"N": "0"}
_SHARD_END = {"S": SHARD_END}

# A free lease has no owner; Java may have written an explicit NULL, which also means free.
_FREE = "(attribute_not_exists(leaseOwner) OR attribute_type(leaseOwner, :NULL))"
# Free, or held by a holder of this protocol (lease_rules.CLAIM_OWNER_ATTRIBUTE), and no hand-off in flight
# (lease_rules.ownerless_write_refused): what an ownerless write needs.
_NO_HANDOFF = f"attribute_not_exists({HANDOFF_ATTRIBUTE})"
_OURS_OR_FREE = ("(attribute_not_exists(leaseOwner) OR attribute_type(leaseOwner, :NULL) "
                 f"OR leaseOwner = {CLAIM_OWNER_ATTRIBUTE}) AND {_NO_HANDOFF}")
_HELD = "leaseOwner = :me AND leaseCounter = :mine"

# The portable checkpoint condition: size() takes a path, so the new sequence's length is its own number
# placeholder; AND binds tighter than OR.
CHECKPOINT_CONDITION = (
    "attribute_exists(checkpoint) AND checkpoint <> :SHARD_END AND "
    "(checkpoint IN (:LATEST, :TRIM_HORIZON, :AT_TIMESTAMP) "
    "OR size(checkpoint) < :seqlen "
    "OR (size(checkpoint) = :seqlen AND checkpoint < :seq) "
    "OR (checkpoint = :seq AND checkpointSubSequenceNumber < :sub))"
)
# Other KCL implementations may leave checkpointSubSequenceNumber out; it reads as 0 (as the pure rule says),
# so a positive sub-sequence at the same sequence still advances it.
_CHECKPOINT_CONDITION_NO_SUB = CHECKPOINT_CONDITION[:-1] + (
    " OR (checkpoint = :seq AND attribute_not_exists(checkpointSubSequenceNumber)))")


def checkpoint_condition(cp: Checkpoint) -> tuple[str, dict[str, dict]]:
    """The forward-only condition for moving the checkpoint to `cp`, and its values."""
    seq = cp.sequence_number
    values = {":seq": {"S": seq}, ":sub": {"N": str(cp.sub_sequence_number)}, ":seqlen": {"N": str(len(seq))},
              ":SHARD_END": _SHARD_END, **_STARTING_SENTINEL_VALUES}
    return (_CHECKPOINT_CONDITION_NO_SUB if cp.sub_sequence_number > 0 else CHECKPOINT_CONDITION), values


# What every checkpoint-moving write sets (values :seq, :sub from `checkpoint_condition`, :zero), and removes:
# Java's setCheckpoint clears the prepared checkpoint.
_CHECKPOINT_SETS = ("checkpoint = :seq", "checkpointSubSequenceNumber = :sub", "ownerSwitchesSinceCheckpoint = :zero")
_PENDING_REMOVES = ", ".join(PENDING_CHECKPOINT_ATTRIBUTES)


def _advancing_checkpoint(cp: Checkpoint, what: str, hint: str = "") -> tuple[str, dict[str, dict]]:
    """The forward-only condition and the values of a write that moves the checkpoint to `cp` (with
    `_CHECKPOINT_SETS`); a sentinel is refused, naming the write."""
    if cp.is_sentinel:
        raise ValueError(f"{what} takes a sequence number, not {cp.sequence_number}{hint}")
    condition, values = checkpoint_condition(cp)
    return condition, {**values, ":zero": _ZERO}


def item_key(key: str) -> dict[str, dict]:
    """The lease item's primary key."""
    return {"leaseKey": {"S": key}}


# Whether a re-read item (None: there is none) holds our write.
Judge = Callable[[Lease | None], bool]


@dataclass(frozen=True)
class Write:
    """One conditional write, ready to send: the client operation, its request (everything but the table's
    name) and the judge of an ambiguous outcome, asked about the lease `key` as re-read."""

    operation: str  # put_item | update_item | delete_item
    key: str
    request: Mapping[str, Any]
    judge: Judge

    @property
    def returns_item(self) -> bool:
        """The response carries the item as written (ReturnValues ALL_NEW)."""
        return self.request.get("ReturnValues") == "ALL_NEW"


def _holds(seen: Lease | None, owner: str, counter: int) -> TypeGuard[Lease]:
    """The item shows `owner` and `counter`: what a holder's write leaves."""
    return seen is not None and seen.lease_owner == owner and seen.lease_counter == counter


def create_write(lease: Lease) -> Write:
    """Put a new lease, unless one already exists for the key."""
    item = lease_to_item(lease)
    return Write("put_item", lease.lease_key,
                 {"Item": item, "ConditionExpression": "attribute_not_exists(leaseKey)"},
                 lambda seen: seen is not None and lease_to_item(seen) == item)


def acquire_write(key: str, new_owner: str, observed_owner: str | None, observed_counter: int,
                  claim: str | None = None) -> Write:
    """Take the lease if it is still exactly as observed (owner, counter) and not ended; the counter moves on
    from the observed one, and the Java hand-over state and the unsettled mark go. The item as taken is
    returned. `claim` is judged too: an ambiguous take is ours only if this process wrote it."""
    if not new_owner:
        raise ValueError("acquire needs a worker id")
    values: dict[str, dict] = {":new": {"S": new_owner}, ":one": _ONE, ":observed": {"N": str(observed_counter)},
                               ":next": {"N": str(observed_counter + 1)}, ":SHARD_END": _SHARD_END}
    if observed_owner is None:
        owner_condition = _FREE
        values[":NULL"] = {"S": "NULL"}
    else:
        owner_condition = "leaseOwner = :seen"
        values[":seen"] = {"S": observed_owner}
    # Java's take deletes checkpointOwner and keeps pendingCheckpoint* (the next owner's processor gets them).
    removes = f" REMOVE {HANDOFF_ATTRIBUTE}, {UNSETTLED_ATTRIBUTE}"
    sets = f"leaseOwner = :new, leaseCounter = :next, {CLAIM_OWNER_ATTRIBUTE} = :new"
    if claim is not None:
        sets += f", {CLAIM_ATTRIBUTE} = :claim"
        values[":claim"] = {"S": claim}

    def judge(seen: Lease | None) -> bool:
        return _holds(seen, new_owner, observed_counter + 1) and (
            claim is None or seen.extra.get(CLAIM_ATTRIBUTE) == claim)

    # Java's take counts an owner switch only when the owner changes: a lease a KCL 3.x leader assigned to us
    # (already naming us: the assignment counted the switch) is taken without one.
    switch = "" if observed_owner == new_owner else " ADD ownerSwitchesSinceCheckpoint :one"
    if not switch:
        del values[":one"]
    return Write("update_item", key, {
        "Key": item_key(key),
        "UpdateExpression": f"SET {sets}{switch}{removes}",
        "ConditionExpression": (f"attribute_exists(leaseKey) AND leaseCounter = :observed AND checkpoint <> :SHARD_END "
                                f"AND {owner_condition}"),
        "ExpressionAttributeValues": values, "ReturnValues": "ALL_NEW"}, judge)


def initiate_handoff_write(key: str, new_owner: str, holder: str, observed_counter: int, claim: str) -> Write:
    """Name the new owner in `leaseOwner` and the live holder in `checkpointOwner`, the counter left alone;
    only a lease exactly as observed, held by `holder`, not ended and with no hand-off in flight. The item
    as written is returned."""
    if not new_owner or not holder or new_owner == holder:
        raise ValueError(f"a hand-off needs two different workers, got {holder!r} → {new_owner!r}")
    values = {":new": {"S": new_owner}, ":holder": {"S": holder}, ":observed": {"N": str(observed_counter)},
              ":SHARD_END": _SHARD_END, ":claim": {"S": claim}}

    def judge(seen: Lease | None) -> bool:
        return (_holds(seen, new_owner, observed_counter) and seen.extra.get(HANDOFF_ATTRIBUTE) == holder
                and seen.extra.get(CLAIM_ATTRIBUTE) == claim)

    return Write("update_item", key, {
        "Key": item_key(key),
        "UpdateExpression": f"SET leaseOwner = :new, {HANDOFF_ATTRIBUTE} = :holder, {CLAIM_ATTRIBUTE} = :claim",
        "ConditionExpression": (f"leaseOwner = :holder AND leaseCounter = :observed AND checkpoint <> :SHARD_END "
                                f"AND attribute_not_exists({HANDOFF_ATTRIBUTE})"),
        "ExpressionAttributeValues": values, "ReturnValues": "ALL_NEW"}, judge)


def cancel_handoff_write(key: str, new_owner: str, holder: str, counter: int, claim: str) -> Write:
    """Give the lease back to `holder`, counter untouched, while the hand-off this process asked for (its claim)
    is unfinished (`checkpointOwner` still names the holder). Not fenced on the counter the ask left (`counter`,
    kept for callers' logs): a Java holder goes on renewing while asked, and its renewals then match the table."""
    del counter
    values = {":me": {"S": new_owner}, ":holder": {"S": holder}, ":claim": {"S": claim}}
    return Write("update_item", key, {
        "Key": item_key(key),
        "UpdateExpression": f"SET leaseOwner = :holder REMOVE {HANDOFF_ATTRIBUTE}",
        "ConditionExpression": f"leaseOwner = :me AND {HANDOFF_ATTRIBUTE} = :holder AND {CLAIM_ATTRIBUTE} = :claim",
        "ExpressionAttributeValues": values},
        lambda seen: (seen is not None and seen.lease_owner == holder and HANDOFF_ATTRIBUTE not in seen.extra
                      and seen.extra.get(CLAIM_ATTRIBUTE) == claim))


def renew_asked_write(key: str, holder: str, counter: int) -> Write:
    """A holder asked to hand off renews until its last write, as a Java 3.x holder does (its renewal drops the
    checkpointOwner expectation once asked): the counter moved on while `checkpointOwner` still names it, fenced
    on its counter. Without it the counter stands still while the holder lands what it delivered, and a KCL 3.x
    leader judges the lease expired and reassigns it before the hand-off's checkpoint."""
    values: dict[str, dict] = {":holder": {"S": holder}, ":mine": {"N": str(counter)},
                               ":next": {"N": str(counter + 1)}, ":SHARD_END": _SHARD_END}
    return Write("update_item", key, {
        "Key": item_key(key), "UpdateExpression": "SET leaseCounter = :next",
        "ConditionExpression": f"{HANDOFF_ATTRIBUTE} = :holder AND leaseCounter = :mine AND checkpoint <> :SHARD_END",
        "ExpressionAttributeValues": values},
        lambda seen: (seen is not None and seen.lease_counter == counter + 1
                      and seen.extra.get(HANDOFF_ATTRIBUTE) == holder))


def finish_handoff_write(key: str, holder: str, counter: int, checkpoint: Checkpoint | None) -> Write:
    """The old holder's last write of a hand-off, fenced on its counter: the counter moved on,
    `checkpointOwner` removed, and the checkpoint when given (under its forward-only condition too)."""
    values: dict[str, dict] = {":holder": {"S": holder}, ":mine": {"N": str(counter)},
                               ":next": {"N": str(counter + 1)}, ":SHARD_END": _SHARD_END}
    sets = ["leaseCounter = :next"]
    removes = HANDOFF_ATTRIBUTE
    condition = f"{HANDOFF_ATTRIBUTE} = :holder AND leaseCounter = :mine AND checkpoint <> :SHARD_END"
    if checkpoint is not None:
        cp_condition, cp_values = _advancing_checkpoint(checkpoint, "a hand-off checkpoint")
        sets += _CHECKPOINT_SETS
        removes += f", {_PENDING_REMOVES}"
        values.update(cp_values)
        condition = f"{HANDOFF_ATTRIBUTE} = :holder AND leaseCounter = :mine AND {cp_condition}"

    def judge(seen: Lease | None) -> bool:
        return (seen is not None and seen.lease_counter == counter + 1 and HANDOFF_ATTRIBUTE not in seen.extra
                and (checkpoint is None or not checkpoint_advances(seen.checkpoint, checkpoint)))

    return Write("update_item", key, {
        "Key": item_key(key), "UpdateExpression": "SET " + ", ".join(sets) + f" REMOVE {removes}",
        "ConditionExpression": condition, "ExpressionAttributeValues": values}, judge)


def heartbeat_write(key: str, owner: str, counter: int, extra: Mapping[str, Any] | None = None,
                    checkpoint: Checkpoint | None = None, throughput_kbps: float | None = None) -> Write:
    """Renew the lease held as (`owner`, `counter`): the counter becomes counter + 1; `extra` rides along
    (None removes an attribute), and the holder's checkpoint under its own condition too, and KCL's
    `throughputKBps`. Lease attributes are refused as extras."""
    extra = dict(extra or {})
    clash = sorted(LEASE_ATTRIBUTES.intersection(extra) | _MODELLED.intersection(extra))
    if clash:
        raise ValueError(f"heartbeat attributes must not overwrite lease attributes: {', '.join(clash)}")
    names: dict[str, str] = {}
    values: dict[str, dict] = {":me": {"S": owner}, ":mine": {"N": str(counter)},
                               ":next": {"N": str(counter + 1)}, ":SHARD_END": _SHARD_END}
    sets: list[str] = ["leaseCounter = :next"]
    removes: list[str] = []
    check_throughput(throughput_kbps)
    if throughput_kbps is not None:  # KCL's attribute, read by the load-aware balance
        sets.append("throughputKBps = :kbps")
        values[":kbps"] = _present(float(throughput_kbps))
    for i, (name, value) in enumerate(sorted(extra.items())):
        names[f"#x{i}"] = name
        encoded = encode_value(value)
        if encoded is None:
            removes.append(f"#x{i}")
        else:
            values[f":x{i}"] = encoded
            sets.append(f"#x{i} = :x{i}")
    condition = f"{_HELD} AND checkpoint <> :SHARD_END"
    if checkpoint is not None:
        cp_condition, cp_values = _advancing_checkpoint(checkpoint, "heartbeat checkpoint")
        sets += _CHECKPOINT_SETS
        removes += list(PENDING_CHECKPOINT_ATTRIBUTES)
        values.update(cp_values)
        condition = f"{_HELD} AND {cp_condition}"
    update = "SET " + ", ".join(sets)
    if removes:
        update += " REMOVE " + ", ".join(removes)
    request: dict[str, Any] = {"Key": item_key(key), "UpdateExpression": update, "ConditionExpression": condition,
                               "ExpressionAttributeValues": values}
    if names:
        request["ExpressionAttributeNames"] = names

    def judge(seen: Lease | None) -> bool:
        return _holds(seen, owner, counter + 1) and (
            checkpoint is None or not checkpoint_advances(seen.checkpoint, checkpoint))

    return Write("update_item", key, request, judge)


def checkpoint_write(key: str, cp: Checkpoint, *, unless_held_by_another: str | None = None) -> Write:
    """The ownerless checkpoint: forward only, the counter untouched; with `unless_held_by_another`, only
    while the lease is free or still shows that worker; without, only while it is free or held by this
    protocol (never under a Java holder: lease_rules.CLAIM_OWNER_ATTRIBUTE)."""
    condition, values = _advancing_checkpoint(cp, "checkpoint", " (use end() for SHARD_END)")
    if unless_held_by_another is not None:
        condition = f"{condition} AND ({_FREE} OR leaseOwner = :me) AND {_NO_HANDOFF}"
        values = {**values, ":NULL": {"S": "NULL"}, ":me": {"S": unless_held_by_another}}
    else:  # the pipeline's commit: never under a Java holder, whose next checkpoint would move it back
        condition = f"{condition} AND {_OURS_OR_FREE}"
        values = {**values, ":NULL": {"S": "NULL"}}
    return Write("update_item", key, {
        "Key": item_key(key), "UpdateExpression": "SET " + ", ".join(_CHECKPOINT_SETS) + f" REMOVE {_PENDING_REMOVES}",
        "ConditionExpression": condition, "ExpressionAttributeValues": values},
        lambda seen: seen is not None and seen.checkpoint == cp)


def end_write(key: str, owner: str | None = None, counter: int | None = None) -> Write:
    """SHARD_END, the owner removed: the holder's fenced end with `owner` and `counter` (the counter moves
    on), else the pipeline's ownerless end of an existing lease that is free or held by this protocol (the
    counter left alone)."""
    values: dict[str, dict] = {":SHARD_END": _SHARD_END, ":zero": _ZERO}
    update = "SET checkpoint = :SHARD_END, ownerSwitchesSinceCheckpoint = :zero"
    if owner is not None and counter is not None:
        values.update({":me": {"S": owner}, ":mine": {"N": str(counter)}, ":next": {"N": str(counter + 1)}})
        update += ", leaseCounter = :next"
        condition = _HELD
    elif owner is not None or counter is not None:
        raise ValueError("a fenced end needs both the owner and the counter")
    else:  # the pipeline's end: never under a Java holder, which renews without looking at leaseOwner
        condition = f"attribute_exists(leaseKey) AND {_OURS_OR_FREE}"
        values[":NULL"] = {"S": "NULL"}

    def judge(seen: Lease | None) -> bool:
        return seen is not None and seen.is_ended and (counter is None or seen.lease_counter == counter + 1)

    return Write("update_item", key, {
        "Key": item_key(key), "UpdateExpression": update + f" REMOVE leaseOwner, {_PENDING_REMOVES}",
        "ConditionExpression": condition,
        "ExpressionAttributeValues": values}, judge)


def release_write(key: str, owner: str, counter: int, unsettled: bool = False) -> Write:
    """Give the lease held as (`owner`, `counter`) up, the counter moved on; `unsettled` marks it
    (UNSETTLED_ATTRIBUTE)."""
    values: dict[str, dict] = {":me": {"S": owner}, ":mine": {"N": str(counter)}, ":next": {"N": str(counter + 1)}}
    sets = "leaseCounter = :next"
    if unsettled:
        sets += f", {UNSETTLED_ATTRIBUTE} = :unsettled"
        values[":unsettled"] = {"BOOL": True}
    return Write("update_item", key, {
        "Key": item_key(key), "UpdateExpression": f"SET {sets} REMOVE leaseOwner", "ConditionExpression": _HELD,
        "ExpressionAttributeValues": values},
        lambda seen: seen is not None and seen.lease_owner is None and seen.lease_counter == counter + 1)


def delete_write(key: str, observed_counter: int) -> Write:
    """Delete the lease if its counter is still the observed one."""
    return Write("delete_item", key, {
        "Key": item_key(key), "ConditionExpression": "leaseCounter = :observed",
        "ExpressionAttributeValues": {":observed": {"N": str(observed_counter)}}},
        lambda seen: seen is None)
