"""The lease item codec: Lease <-> DynamoDB item, attribute values, and the conditions every write is
fenced by — Java KCL's serializer, separate from the I/O (`shells/lease_table.py`), as Java separates its
DynamoDBLeaseSerializer from its refresher. Pure: no client, no clock.

Item attributes (Java KCL's names and types):

    leaseKey S (hash key, the shard id)        leaseOwner S (absent when free; an explicit NULL reads as free)
    leaseCounter N                             checkpoint S (sequence number or a sentinel)
    checkpointSubSequenceNumber N              ownerSwitchesSinceCheckpoint N
    parentShardId SS (singular, as Java)       childShardIds SS
    startingHashKey S / endingHashKey S        anything else: kept in Lease.extra, never overwritten
"""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, Mapping

from .model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from .streams import multi_stream_attributes, related_lease_keys, stored_shard_ids

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
            return {"NS": sorted(encode_value(v)["N"] for v in value)}
        if all(isinstance(v, (bytes, bytearray)) for v in value):
            return {"BS": sorted(bytes(v) for v in value)}
        raise ValueError(f"a set must hold only strings, only numbers or only bytes: {value!r}")
    if isinstance(value, (list, tuple)):
        return {"L": [encode_value(v) or {"NULL": True} for v in value]}
    if isinstance(value, Mapping):
        return {"M": {str(k): encode_value(v) or {"NULL": True} for k, v in value.items()}}
    raise ValueError(f"cannot store {type(value).__name__} {value!r} in DynamoDB")


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


def lease_from_item(item: Mapping[str, dict]) -> Lease | None:
    """A lease from its item; None for the other entities KCL 3.x keeps in the same table."""
    entity = item.get("entityType")
    if entity is not None and entity.get("S") != LEASE_ENTITY_TYPE:
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
        extra={name: decode_value(value) for name, value in item.items() if name not in _MODELLED},
    )


# -- the table -----------------------------------------------------------------------------------------

_STARTING_SENTINEL_VALUES = {":LATEST": {"S": LATEST}, ":TRIM_HORIZON": {"S": TRIM_HORIZON},
                             ":AT_TIMESTAMP": {"S": AT_TIMESTAMP}}
_ONE = {"N": "1"}
_ZERO = {"N": "0"}
_SHARD_END = {"S": SHARD_END}

# A free lease has no owner; Java may have written an explicit NULL, which also means free.
_FREE = "(attribute_not_exists(leaseOwner) OR attribute_type(leaseOwner, :NULL))"
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


# What every checkpoint-moving write sets (values :seq, :sub from `checkpoint_condition`, :zero).
_CHECKPOINT_SETS = ("checkpoint = :seq", "checkpointSubSequenceNumber = :sub", "ownerSwitchesSinceCheckpoint = :zero")


def _checkpoint_write(cp: Checkpoint, what: str, hint: str = "") -> tuple[str, dict[str, dict]]:
    """The forward-only condition and the values of a write that moves the checkpoint to `cp` (with
    `_CHECKPOINT_SETS`); a sentinel is refused, naming the write."""
    if cp.is_sentinel:
        raise ValueError(f"{what} takes a sequence number, not {cp.sequence_number}{hint}")
    condition, values = checkpoint_condition(cp)
    return condition, {**values, ":zero": _ZERO}
