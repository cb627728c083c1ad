"""The lease table in DynamoDB, item for item what Java KCL 2.x reads and writes.

Item attributes (Java KCL's names and types):

    leaseKey S (hash key, the shard id)        leaseOwner S (absent when free; an explicit NULL reads as free)
    leaseCounter N                             checkpoint S (sequence number or a sentinel)
    checkpointSubSequenceNumber N              ownerSwitchesSinceCheckpoint N
    parentShardId SS (singular, as Java)       childShardIds SS
    startingHashKey S / endingHashKey S        anything else: kept in Lease.extra, never overwritten

Every write is one conditional request whose condition is the rule in lease_rules.py (the pure mirror the
simulation uses); a failed condition is an answer (False / None), not an error. Holders' writes are fenced
by `leaseCounter` (see lease_rules.py). A write whose outcome is unknown (its response was lost and
botocore's retry failed the condition against our own write; a timeout) is settled by re-reading the item.
Other failures raise a LeaseTableError subclass. Throttling is retried by botocore's standard retry mode
(kcl/aws.py) before it surfaces here as LeaseTableUnavailable.
"""
from __future__ import annotations

import logging
import math
import time
from decimal import Decimal
from typing import Any, Mapping

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from .lease_rules import (CLAIM_ATTRIBUTE, HANDOFF_ATTRIBUTE, JAVA_HANDOVER_ATTRIBUTES, LEASE_ATTRIBUTES,
                          UNSETTLED_ATTRIBUTE, check_throughput)
from .model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease, checkpoint_advances
from .streams import multi_stream_attributes, related_lease_keys, stored_shard_ids

log = logging.getLogger(__name__)

LEASE_ENTITY_TYPE = "LEASE"

# Attributes the codec maps onto Lease fields; everything else goes to / comes from Lease.extra.
_MODELLED = frozenset({
    "leaseKey", "leaseOwner", "leaseCounter", "checkpoint", "checkpointSubSequenceNumber",
    "ownerSwitchesSinceCheckpoint", "parentShardId", "childShardIds", "startingHashKey", "endingHashKey",
})

_THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "LimitExceededException", "InternalServerError", "ServiceUnavailable", "TransactionInProgressException",
})
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)


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


def _ours_after(owner: str, counter: int):
    """Judge of a holder's write: the item shows our owner and the counter we wrote."""
    return lambda lease: lease is not None and lease.lease_owner == owner and lease.lease_counter == counter


class LeaseTable:
    """One lease table. Methods answer False / None when their condition fails (someone else won)."""

    def __init__(self, table_name: str, dynamodb_client, *, wait_timeout: float = 120.0,
                 scan_page_size: int | None = None):
        if not table_name:
            raise ValueError("a lease table needs a name")
        self.table_name = table_name
        self.client = dynamodb_client
        self.wait_timeout = wait_timeout
        self.scan_page_size = scan_page_size  # Scan Limit; None lets DynamoDB fill 1 MB pages
        self.ambiguous_writes = 0  # writes whose outcome had to be read back (lost responses)
        self.has_owner_index = False  # set by ensure_table

    # -- table lifecycle ----------------------------------------------------------------------------

    def ensure_table(self) -> bool:
        """Create the table when missing (PAY_PER_REQUEST, hash key leaseKey, with KCL 3.x's leaseOwner
        index), wait until ACTIVE; `has_owner_index` tells whether an existing table has the index ACTIVE.

        True if this call created it. Consumers race to create it: losing that race is fine. An existing
        table without the index is used as it is (scans only): adding an index is the operator's call.
        """
        created = False
        description = self._describe()
        if description is None:
            try:
                self._call("create_table", TableName=self.table_name, BillingMode="PAY_PER_REQUEST",
                           AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"},
                                                 {"AttributeName": "leaseOwner", "AttributeType": "S"}],
                           KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
                           GlobalSecondaryIndexes=[OWNER_INDEX])
                created = True
            except _ConditionFailed:  # ResourceInUseException: another consumer is creating it
                pass
            description = self._describe()
        self._check_schema(description)
        deadline = time.monotonic() + self.wait_timeout
        delay = 0.05
        while description is None or description.get("TableStatus") != "ACTIVE":
            if time.monotonic() > deadline:
                status = description.get("TableStatus") if description else "missing"
                raise LeaseTableUnavailable(
                    f"lease table {self.table_name} not ACTIVE after {self.wait_timeout:.0f}s (status {status})")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            description = self._describe()
        self.has_owner_index = owner_index_active(description)
        return created

    def owned_keys(self, owner: str) -> list[str]:
        """The keys of the leases `owner` holds, from the leaseOwner index (KEYS_ONLY, so one read unit
        covers many keys; eventually consistent, as every GSI read: a hint between full scans, never a
        basis for a conditional write)."""
        if not self.has_owner_index:
            raise LeaseTableError(f"lease table {self.table_name} has no ACTIVE {OWNER_INDEX_NAME} index")
        keys: list[str] = []
        request: dict[str, Any] = dict(TableName=self.table_name, IndexName=OWNER_INDEX_NAME,
                                       KeyConditionExpression="leaseOwner = :owner",
                                       ExpressionAttributeValues={":owner": {"S": owner}})
        while True:
            page = self._call("query", **request)
            keys += [item["leaseKey"]["S"] for item in page.get("Items", [])]
            if not page.get("LastEvaluatedKey"):
                return keys
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _describe(self) -> dict | None:
        try:
            return self._call("describe_table", TableName=self.table_name)["Table"]
        except LeaseTableMissing:
            return None

    def _check_schema(self, description: dict | None) -> None:
        if not description:
            return
        keys = [(k["AttributeName"], k["KeyType"]) for k in description.get("KeySchema", [])]
        types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
        if keys != [("leaseKey", "HASH")] or types.get("leaseKey") != "S":
            raise LeaseTableError(
                f"table {self.table_name} is not a lease table: its key is {keys} (expected leaseKey S as the "
                f"only hash key)")

    # -- reads ---------------------------------------------------------------------------------------

    def scan(self) -> list[Lease]:
        """Every lease (consistent read, all pages); other KCL 3.x entities are skipped."""
        leases: list[Lease] = []
        request: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        if self.scan_page_size:
            request["Limit"] = self.scan_page_size
        while True:
            page = self._call("scan", **request)
            for item in page.get("Items", []):
                lease = lease_from_item(item)
                if lease is not None:
                    leases.append(lease)
            if not page.get("LastEvaluatedKey"):
                return leases
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def get(self, key: str) -> Lease | None:
        item = self._call("get_item", TableName=self.table_name, Key=_key(key), ConsistentRead=True).get("Item")
        return lease_from_item(item) if item else None

    # -- writes --------------------------------------------------------------------------------------
    #
    # A condition failure is an answer (False / None): someone else won. But botocore retries a write whose
    # response was lost (reset, timeout), and the retry then fails its condition against our own applied
    # write. So after a retried condition failure, a timeout or a dropped connection, the item is re-read
    # and the outcome judged from it: an unknown outcome is never reported as a lost race.

    def create(self, lease: Lease) -> bool:
        """Put a new lease; False if one already exists for the key (another consumer created it)."""
        item = lease_to_item(lease)
        return self._write("put_item", lambda seen: seen is not None and lease_to_item(seen) == item,
                           lease.lease_key, TableName=self.table_name, Item=item,
                           ConditionExpression="attribute_not_exists(leaseKey)")

    def acquire(self, key: str, new_owner: str, observed_owner: str | None, observed_counter: int,
                claim: str | None = None) -> Lease | None:
        """Take the lease if it is still exactly as observed (owner, counter) and not ended.

        The counter moves on from the observed one: it is the fencing token every later write of the new
        holder is conditioned on. `claim`, unique to the calling process, is written with the take so that
        an ambiguous outcome is judged ours only if this process wrote it (see CLAIM_ATTRIBUTE). Returns the
        lease as taken, or None when someone else moved it first.
        """
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
        removes = f" REMOVE {', '.join((*JAVA_HANDOVER_ATTRIBUTES, UNSETTLED_ATTRIBUTE))}"
        sets = "leaseOwner = :new, leaseCounter = :next"
        if claim is not None:
            sets += f", {CLAIM_ATTRIBUTE} = :claim"
            values[":claim"] = {"S": claim}
        request = dict(
            TableName=self.table_name, Key=_key(key),
            UpdateExpression=f"SET {sets} ADD ownerSwitchesSinceCheckpoint :one{removes}",
            ConditionExpression=(f"attribute_exists(leaseKey) AND leaseCounter = :observed AND checkpoint <> :SHARD_END "
                                 f"AND {owner_condition}"),
            ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        taken: list[Lease] = []

        def judge(seen: Lease | None) -> bool:
            if _ours_after(new_owner, observed_counter + 1)(seen) and (
                    claim is None or seen.extra.get(CLAIM_ATTRIBUTE) == claim):
                taken.append(seen)
                return True
            return False

        response = self._write("update_item", judge, key, returns=True, **request)
        if response is False:
            return None
        if taken:
            return taken[0]
        return lease_from_item(response["Attributes"])

    def initiate_handoff(self, key: str, new_owner: str, holder: str, observed_counter: int,
                         claim: str) -> Lease | None:
        """Ask the live `holder` to hand the lease over (KCL 3.x's graceful hand-off): `leaseOwner` names
        the new owner and `checkpointOwner` the holder, which checkpoints what it delivered and removes
        `checkpointOwner` (`finish_handoff`); the new owner then takes the lease (`acquire`, observed owner
        itself). The counter is left alone, as KCL 3.x does, so that the holder's final checkpoint can be
        fenced on it. Only a lease exactly as observed, held by `holder`, not ended and with no hand-off in
        flight. `claim` settles an unknown outcome as for `acquire`, and tells the new owner later whether
        the lease it sees is still the one it asked for. Returns the lease as written, or None."""
        if not new_owner or not holder or new_owner == holder:
            raise ValueError(f"a hand-off needs two different workers, got {holder!r} → {new_owner!r}")
        values = {":new": {"S": new_owner}, ":holder": {"S": holder}, ":observed": {"N": str(observed_counter)},
                  ":SHARD_END": _SHARD_END, ":claim": {"S": claim}}

        asked: list[Lease] = []

        def judge(seen: Lease | None) -> bool:
            if (seen is not None and seen.lease_owner == new_owner and seen.lease_counter == observed_counter
                    and seen.extra.get(HANDOFF_ATTRIBUTE) == holder and seen.extra.get(CLAIM_ATTRIBUTE) == claim):
                asked.append(seen)
                return True
            return False

        response = self._write(
            "update_item", judge, key, returns=True, TableName=self.table_name, Key=_key(key),
            UpdateExpression=f"SET leaseOwner = :new, {HANDOFF_ATTRIBUTE} = :holder, {CLAIM_ATTRIBUTE} = :claim",
            ConditionExpression=(f"leaseOwner = :holder AND leaseCounter = :observed AND checkpoint <> :SHARD_END "
                                 f"AND attribute_not_exists({HANDOFF_ATTRIBUTE})"),
            ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        if response is False:
            return None
        return asked[0] if asked else lease_from_item(response["Attributes"])

    def cancel_handoff(self, key: str, new_owner: str, holder: str, counter: int, claim: str) -> bool:
        """Withdraw a hand-off this process asked for and the holder has not finished: the lease is the
        holder's again exactly as it was (same counter, so its renewals go on). False when the holder
        finished meanwhile (or the lease moved on)."""
        values = {":me": {"S": new_owner}, ":holder": {"S": holder}, ":mine": {"N": str(counter)},
                  ":claim": {"S": claim}}
        return self._write(
            "update_item",
            lambda seen: (seen is not None and seen.lease_owner == holder and seen.lease_counter == counter
                          and HANDOFF_ATTRIBUTE not in seen.extra),
            key, TableName=self.table_name, Key=_key(key),
            UpdateExpression=f"SET leaseOwner = :holder REMOVE {HANDOFF_ATTRIBUTE}",
            ConditionExpression=(f"leaseOwner = :me AND leaseCounter = :mine AND {HANDOFF_ATTRIBUTE} = :holder "
                                 f"AND {CLAIM_ATTRIBUTE} = :claim"),
            ExpressionAttributeValues=values)

    def finish_handoff(self, key: str, holder: str, counter: int, checkpoint: Checkpoint | None = None) -> bool:
        """The old holder's last write in a hand-off: its checkpoint (when given and ahead of the table's),
        the counter moved on, `checkpointOwner` removed — the new owner may start. False when the hand-off
        is no longer ours to finish (the new owner or someone else took the lease meanwhile)."""
        if checkpoint is not None and self._finish_handoff(key, holder, counter, checkpoint):
            return True
        return self._finish_handoff(key, holder, counter, None)  # the checkpoint was not ahead, or we lost

    def _finish_handoff(self, key: str, holder: str, counter: int, checkpoint: Checkpoint | None) -> bool:
        values: dict[str, dict] = {":holder": {"S": holder}, ":mine": {"N": str(counter)},
                                   ":next": {"N": str(counter + 1)}, ":SHARD_END": _SHARD_END}
        sets = ["leaseCounter = :next"]
        condition = f"{HANDOFF_ATTRIBUTE} = :holder AND leaseCounter = :mine AND checkpoint <> :SHARD_END"
        if checkpoint is not None:
            cp_condition, cp_values = _checkpoint_write(checkpoint, "a hand-off checkpoint")
            sets += _CHECKPOINT_SETS
            values.update(cp_values)
            condition = f"{HANDOFF_ATTRIBUTE} = :holder AND leaseCounter = :mine AND {cp_condition}"

        def judge(seen: Lease | None) -> bool:
            return (seen is not None and seen.lease_counter == counter + 1 and HANDOFF_ATTRIBUTE not in seen.extra
                    and (checkpoint is None or not checkpoint_advances(seen.checkpoint, checkpoint)))

        return self._write("update_item", judge, key, TableName=self.table_name, Key=_key(key),
                           UpdateExpression="SET " + ", ".join(sets) + f" REMOVE {HANDOFF_ATTRIBUTE}",
                           ConditionExpression=condition, ExpressionAttributeValues=values)

    def heartbeat(self, key: str, owner: str, counter: int, extra: Mapping[str, Any] | None = None,
                  checkpoint: Checkpoint | None = None, throughput_kbps: float | None = None) -> bool:
        """Renew the lease held as (`owner`, `counter`): the counter becomes counter + 1; `extra` rides along.

        Extra values: str→S, int/float→N, bool→BOOL (and bytes, lists, dicts, sets); None removes.
        With `checkpoint`, the holder's checkpoint rides on the same write (one write instead of two), under
        the checkpoint's own condition too: False then means "not holder, or the checkpoint would not
        advance" — retry without it to tell the two apart.
        """
        extra = dict(extra or {})
        clash = sorted(LEASE_ATTRIBUTES.intersection(extra) | _MODELLED.intersection(extra))
        if clash:
            raise ValueError(f"heartbeat attributes must not overwrite lease attributes: {', '.join(clash)}")
        names: dict[str, str] = {}
        values: dict[str, dict] = {":me": {"S": owner}, ":mine": {"N": str(counter)},
                                   ":next": {"N": str(counter + 1)}, ":SHARD_END": _SHARD_END}
        sets, removes = ["leaseCounter = :next"], []
        check_throughput(throughput_kbps)
        if throughput_kbps is not None:  # KCL's attribute, read by the load-aware balance
            sets.append("throughputKBps = :kbps")
            values[":kbps"] = encode_value(float(throughput_kbps))
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
            cp_condition, cp_values = _checkpoint_write(checkpoint, "heartbeat checkpoint")
            sets += _CHECKPOINT_SETS
            values.update(cp_values)
            condition = f"{_HELD} AND {cp_condition}"
        update = "SET " + ", ".join(sets)
        if removes:
            update += " REMOVE " + ", ".join(removes)
        request: dict[str, Any] = dict(
            TableName=self.table_name, Key=_key(key), UpdateExpression=update,
            ConditionExpression=condition, ExpressionAttributeValues=values)
        if names:
            request["ExpressionAttributeNames"] = names
        ours = _ours_after(owner, counter + 1)
        return self._write("update_item", lambda seen: ours(seen) and (
            checkpoint is None or not checkpoint_advances(seen.checkpoint, checkpoint)), key, **request)

    def checkpoint(self, key: str, cp: Checkpoint, *, unless_held_by_another: str | None = None) -> bool:
        """The ownerless checkpoint: advance if `cp` is strictly after it (never touches leaseCounter).

        `unless_held_by_another` (a worker id): only while the lease is free or still shows that worker — a
        worker flushing what it processed after losing its lease. A Java KCL holder's checkpoints are
        fenced by its counter alone, not by order: moving the checkpoint under it would be undone by its
        next checkpoint (a checkpoint going back)."""
        condition, values = _checkpoint_write(cp, "checkpoint", " (use end() for SHARD_END)")
        if unless_held_by_another is not None:
            condition = f"{condition} AND ({_FREE} OR leaseOwner = :me)"
            values = {**values, ":NULL": {"S": "NULL"}, ":me": {"S": unless_held_by_another}}
        return self._write(
            "update_item", lambda seen: seen is not None and seen.checkpoint == cp, key,
            TableName=self.table_name, Key=_key(key), UpdateExpression="SET " + ", ".join(_CHECKPOINT_SETS),
            ConditionExpression=condition, ExpressionAttributeValues=values)

    def end(self, key: str, owner: str | None = None, counter: int | None = None) -> bool:
        """Mark the shard finished (SHARD_END is final) and let the lease go.

        With `owner` and `counter`: the holder's fenced end (False if it no longer holds the lease). Without:
        the pipeline's ownerless end, which leaves the counter alone (False only if the lease is gone).
        """
        if (owner is None) != (counter is None):
            raise ValueError("a fenced end needs both the owner and the counter")
        values: dict[str, dict] = {":SHARD_END": _SHARD_END, ":zero": _ZERO}
        update = "SET checkpoint = :SHARD_END, ownerSwitchesSinceCheckpoint = :zero"
        condition = "attribute_exists(leaseKey)"
        if owner is not None:
            values.update({":me": {"S": owner}, ":mine": {"N": str(counter)}, ":next": {"N": str(counter + 1)}})
            update += ", leaseCounter = :next"
            condition = _HELD

        def judge(seen: Lease | None) -> bool:
            return seen is not None and seen.is_ended and (owner is None or seen.lease_counter == counter + 1)

        return self._write("update_item", judge, key, TableName=self.table_name, Key=_key(key),
                           UpdateExpression=update + " REMOVE leaseOwner", ConditionExpression=condition,
                           ExpressionAttributeValues=values)

    def release(self, key: str, owner: str, counter: int, unsettled: bool = False) -> bool:
        """Give the lease held as (`owner`, `counter`) up; False if someone else holds it now. `unsettled`:
        the holder it was stolen from may still deliver, so its next owner waits one expiry (lease_rules)."""
        values = {":me": {"S": owner}, ":mine": {"N": str(counter)}, ":next": {"N": str(counter + 1)}}
        sets = "leaseCounter = :next"
        if unsettled:
            sets += f", {UNSETTLED_ATTRIBUTE} = :unsettled"
            values[":unsettled"] = {"BOOL": True}
        return self._write(
            "update_item",
            lambda seen: seen is not None and seen.lease_owner is None and seen.lease_counter == counter + 1, key,
            TableName=self.table_name, Key=_key(key),
            UpdateExpression=f"SET {sets} REMOVE leaseOwner",
            ConditionExpression=_HELD, ExpressionAttributeValues=values)

    def delete(self, key: str, observed_counter: int) -> bool:
        """Delete the lease if its counter is still the observed one; False if it moved (or is gone)."""
        return self._write("delete_item", lambda seen: seen is None, key, TableName=self.table_name,
                           Key=_key(key), ConditionExpression="leaseCounter = :observed",
                           ExpressionAttributeValues={":observed": {"N": str(observed_counter)}})

    # -- plumbing ------------------------------------------------------------------------------------

    def _write(self, operation: str, judge, key: str, *, returns: bool = False, **request):
        """One conditional write: True (or the response with `returns`) when applied, False when another
        writer won. An ambiguous outcome is settled by re-reading the item and asking `judge` whether it
        holds our write; when even that read fails, the error says the outcome is unknown."""
        try:
            response = getattr(self.client, operation)(**request)
        except Exception as exc:
            condition_failed = _is_condition_failure(exc)
            if condition_failed and not _retried(exc):
                return False
            if not condition_failed and not isinstance(exc, _AMBIGUOUS):
                raise self._error(operation, exc) from exc
            self.ambiguous_writes += 1
            try:
                seen = self.get(key)
            except LeaseTableError as read_exc:
                raise LeaseTableUnavailable(
                    f"lease table {self.table_name}: {operation} on {key} has an unknown outcome ({exc}) and "
                    f"re-reading the item failed ({read_exc})") from exc
            applied = bool(judge(seen))
            log.info("lease %s: %s had an ambiguous outcome (%s); re-read says %s", key, operation,
                     type(exc).__name__, "applied" if applied else "not applied")
            return applied
        return response if returns else True

    def _call(self, operation: str, **request) -> dict:
        try:
            return getattr(self.client, operation)(**request)
        except Exception as exc:
            if operation == "create_table" and _code(exc) == "ResourceInUseException":
                raise _ConditionFailed() from exc
            raise self._error(operation, exc) from exc

    def _error(self, operation: str, exc: Exception) -> Exception:
        """The LeaseTableError that says what went wrong; anything unexpected passes through unchanged."""
        code = _code(exc)
        if code == "ResourceNotFoundException":
            return LeaseTableMissing(f"lease table {self.table_name} does not exist ({operation})")
        if code in _THROTTLING_CODES:
            attempts = 1 + int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))
            return LeaseTableUnavailable(
                f"lease table {self.table_name}: DynamoDB still answered {code} to {operation} after "
                f"{attempts} attempt(s); raise the table's capacity or lower the consumer's write rate")
        if isinstance(exc, _UNREACHABLE):
            return LeaseTableUnavailable(
                f"lease table {self.table_name}: DynamoDB unreachable during {operation} ({exc})")
        if isinstance(exc, ClientError):
            message = exc.response.get("Error", {}).get("Message", "")
            return LeaseTableError(f"lease table {self.table_name}: {operation} failed: {code}: {message}")
        if isinstance(exc, BotoCoreError):
            return LeaseTableError(f"lease table {self.table_name}: {operation} failed: {exc}")
        return exc


class _ConditionFailed(Exception):
    pass


# Failures after which a write may or may not have been applied.
_AMBIGUOUS = (ReadTimeoutError, ConnectionClosedError)


def _retried(exc: Exception) -> bool:
    """botocore retried the request before this answer: an earlier attempt may have been applied."""
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) > 0
    return False


def _code(exc: Exception) -> str | None:
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def _is_condition_failure(exc: Exception) -> bool:
    return _code(exc) == "ConditionalCheckFailedException"


def _key(key: str) -> dict:
    return {"leaseKey": {"S": key}}
