"""The lease table in DynamoDB, item for item what Java KCL 2.x reads and writes.

The item codec and the write conditions are `core/lease_codec.py`; this module sends them.

Every write is one conditional request whose condition is the rule in lease_rules.py (the pure mirror the
simulation uses); a failed condition is an answer (False / None), not an error. Holders' writes are fenced
by `leaseCounter` (see lease_rules.py). A write whose outcome is unknown (its response was lost and
botocore's retry failed the condition against our own write; a timeout) is settled by re-reading the item.
Other failures raise a LeaseTableError subclass. Throttling is retried by botocore's standard retry mode
(kcl/aws.py) before it surfaces here as LeaseTableUnavailable.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ..core.lease_codec import (
    _CHECKPOINT_SETS, _FREE, _HELD, _MODELLED, _ONE, _SHARD_END, _ZERO, OWNER_INDEX, OWNER_INDEX_NAME,
    LeaseItemInvalid, LeaseTableError, LeaseTableMissing, LeaseTableUnavailable, _checkpoint_write,
    checkpoint_condition, decode_value, encode_value, lease_from_item, lease_to_item, owner_index_active,
)
from ..core.lease_rules import (CLAIM_ATTRIBUTE, HANDOFF_ATTRIBUTE, JAVA_HANDOVER_ATTRIBUTES, LEASE_ATTRIBUTES,
                          UNSETTLED_ATTRIBUTE, check_throughput)
from ..core.model import Checkpoint, Lease, checkpoint_advances

log = logging.getLogger(__name__)

_THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "LimitExceededException", "InternalServerError", "ServiceUnavailable", "TransactionInProgressException",
})
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)


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
