"""The lease table in DynamoDB, item for item what Java KCL 2.x reads and writes.

The item codec and every write's request are `core/table/lease_codec.py`; this module sends them: the requests,
the scan's pages, the table's lifecycle, the mapping of botocore's errors, and the settling of writes whose
outcome is unknown.

Every write is one conditional request whose condition is the rule in lease_rules.py (the pure mirror the
simulation uses); a failed condition is an answer (False / None), not an error. Holders' writes are fenced
by `leaseCounter` (see lease_rules.py). A write whose outcome is unknown (its response was lost and
botocore's retry failed the condition against our own write; a timeout) is settled by re-reading the item.
Other failures raise a LeaseTableError subclass. Throttling is retried by botocore's standard retry mode
(shells/aws.py) before it surfaces here as LeaseTableUnavailable.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ..core.model import Checkpoint, Lease
from ..core.table.lease_codec import (
    OWNER_INDEX,
    OWNER_INDEX_NAME,
    LeaseItemInvalid,
    LeaseScan,
    LeaseTableError,
    LeaseTableMissing,
    LeaseTableUnavailable,
    Write,
    acquire_write,
    cancel_handoff_write,
    checkpoint_write,
    create_write,
    delete_write,
    end_write,
    finish_handoff_write,
    heartbeat_write,
    initiate_handoff_write,
    is_lease_item,
    item_key,
    lease_from_item,
    owner_index_active,
    release_write,
    renew_asked_write,
)

log = logging.getLogger(__name__)

_THROTTLING_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "LimitExceededException", "InternalServerError", "ServiceUnavailable", "TransactionInProgressException",
})
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)

# Failures after which a write may or may not have been applied.
AMBIGUOUS_FAILURES = (ReadTimeoutError, ConnectionClosedError)


@dataclass(frozen=True)
class WriteResult:
    """What a conditional write came to: applied or not, and the lease as the table holds it after the
    write when that is known (the item it returned, or the re-read that settled an unknown outcome)."""

    applied: bool
    lease: Lease | None = None


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
        self.corrupt_items = 0  # items scans skipped: no readable lease (logged)
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

    def scan(self) -> LeaseScan:
        """Every lease (consistent read, all pages). Other KCL 3.x entities are not leases: the scan keeps them
        apart (`LeaseScan.entities`). An item that is no readable lease (corrupt, half-written by another tool)
        is skipped and logged, as KCL 3.x's DynamoDBLeaseRefresher skips it (2.x fails its listing), rather than
        failing every cycle of every consumer: its key is in `LeaseScan.skipped` and `corrupt_items` counts it."""
        leases: list[Lease] = []
        entities: list[dict] = []
        skipped: list[str] = []
        request: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
        if self.scan_page_size:
            request["Limit"] = self.scan_page_size
        while True:
            page = self._call("scan", **request)
            for item in page.get("Items", []):
                if not is_lease_item(item):
                    entities.append(item)
                    continue
                try:
                    lease = lease_from_item(item)
                except LeaseItemInvalid as exc:
                    self.corrupt_items += 1
                    skipped.append(str(item.get("leaseKey", {}).get("S", "?")))
                    log.error("lease table %s: skipping an item that is no readable lease: %s", self.table_name, exc)
                    continue
                if lease is not None:
                    leases.append(lease)
            if not page.get("LastEvaluatedKey"):
                return LeaseScan(leases, entities, skipped)
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def get(self, key: str) -> Lease | None:
        item = self._call("get_item", TableName=self.table_name, Key=item_key(key), ConsistentRead=True).get("Item")
        return lease_from_item(item) if item else None

    # -- writes --------------------------------------------------------------------------------------
    #
    # The requests and the judges of ambiguous outcomes are the codec's (core/table/lease_codec.py); these send
    # them. A condition failure is an answer (False / None): someone else won.

    def create(self, lease: Lease) -> bool:
        """Put a new lease; False if one already exists for the key (another consumer created it)."""
        return self._write(create_write(lease)).applied

    def acquire(self, key: str, new_owner: str, observed_owner: str | None, observed_counter: int,
                claim: str | None = None) -> Lease | None:
        """Take the lease if it is still exactly as observed (owner, counter) and not ended.

        The counter moves on from the observed one: it is the fencing token every later write of the new
        holder is conditioned on. `claim`, unique to the calling process, is written with the take so that
        an ambiguous outcome is judged ours only if this process wrote it (see CLAIM_ATTRIBUTE). Returns the
        lease as taken, or None when someone else moved it first.
        """
        return self._write(acquire_write(key, new_owner, observed_owner, observed_counter, claim)).lease

    def initiate_handoff(self, key: str, new_owner: str, holder: str, observed_counter: int,
                         claim: str) -> Lease | None:
        """Ask the live `holder` to hand the lease over (KCL 3.x's graceful hand-off): `leaseOwner` names
        the new owner and `checkpointOwner` the holder, which checkpoints what it delivered and removes
        `checkpointOwner` (`finish_handoff`); the new owner then takes the lease (`acquire`, observed owner
        itself). The counter is left alone, as KCL 3.x does, so that the holder's final checkpoint can be
        fenced on it. Only a lease exactly as observed, held by `holder`, not ended and with no hand-off in
        flight. `claim` settles an unknown outcome as for `acquire`, and tells the new owner later whether
        the lease it sees is still the one it asked for. Returns the lease as written, or None."""
        return self._write(initiate_handoff_write(key, new_owner, holder, observed_counter, claim)).lease

    def cancel_handoff(self, key: str, new_owner: str, holder: str, counter: int, claim: str) -> bool:
        """Withdraw a hand-off this process asked for and the holder has not finished: the lease is the
        holder's again, its counter untouched (so its renewals go on; a Java holder's renewals moved it while
        it was asked, which is why `counter` does not fence this write). False when the holder finished
        meanwhile (or the lease moved on)."""
        return self._write(cancel_handoff_write(key, new_owner, holder, counter, claim)).applied

    def renew_asked(self, key: str, holder: str, counter: int) -> bool:
        """Renew a lease this holder was asked to hand off (it is `checkpointOwner`), fenced on its counter;
        False when the hand-off was withdrawn, taken over or finished."""
        return self._write(renew_asked_write(key, holder, counter)).applied

    def finish_handoff(self, key: str, holder: str, counter: int, checkpoint: Checkpoint | None = None) -> bool:
        """The old holder's last write in a hand-off: its checkpoint (when given and ahead of the table's),
        the counter moved on, `checkpointOwner` removed — the new owner may start. False when the hand-off
        is no longer ours to finish (the new owner or someone else took the lease meanwhile)."""
        if checkpoint is not None and self._write(finish_handoff_write(key, holder, counter, checkpoint)).applied:
            return True
        # The checkpoint was not ahead, or we lost: the hand-off without it.
        return self._write(finish_handoff_write(key, holder, counter, None)).applied

    def heartbeat(self, key: str, owner: str, counter: int, extra: Mapping[str, Any] | None = None,
                  checkpoint: Checkpoint | None = None, throughput_kbps: float | None = None) -> bool:
        """Renew the lease held as (`owner`, `counter`): the counter becomes counter + 1; `extra` rides along.

        Extra values: str→S, int/float→N, bool→BOOL (and bytes, lists, dicts, sets); None removes.
        With `checkpoint`, the holder's checkpoint rides on the same write (one write instead of two), under
        the checkpoint's own condition too: False then means "not holder, or the checkpoint would not
        advance" — retry without it to tell the two apart.
        """
        return self._write(heartbeat_write(key, owner, counter, extra, checkpoint, throughput_kbps)).applied

    def checkpoint(self, key: str, cp: Checkpoint, *, unless_held_by_another: str | None = None) -> bool:
        """The ownerless checkpoint: advance if `cp` is strictly after it (never touches leaseCounter).

        `unless_held_by_another` (a worker id): only while the lease is free or still shows that worker — a
        worker flushing what it processed after losing its lease. A Java KCL holder's checkpoints are
        fenced by its counter alone, not by order: moving the checkpoint under it would be undone by its
        next checkpoint (a checkpoint going back)."""
        return self._write(checkpoint_write(key, cp, unless_held_by_another=unless_held_by_another)).applied

    def end(self, key: str, owner: str | None = None, counter: int | None = None) -> bool:
        """Mark the shard finished (SHARD_END is final) and let the lease go.

        With `owner` and `counter`: the holder's fenced end (False if it no longer holds the lease). Without:
        the pipeline's ownerless end, which leaves the counter alone (False only if the lease is gone).
        """
        return self._write(end_write(key, owner, counter)).applied

    def release(self, key: str, owner: str, counter: int, unsettled: bool = False) -> bool:
        """Give the lease held as (`owner`, `counter`) up; False if someone else holds it now. `unsettled`:
        the holder it was stolen from may still deliver, so its next owner waits one expiry (lease_rules)."""
        return self._write(release_write(key, owner, counter, unsettled)).applied

    def delete(self, key: str, observed_counter: int) -> bool:
        """Delete the lease if its counter is still the observed one; False if it moved (or is gone)."""
        return self._write(delete_write(key, observed_counter)).applied

    # -- plumbing ------------------------------------------------------------------------------------
    #
    # botocore retries a write whose response was lost (reset, timeout), and the retry then fails its
    # condition against our own applied write. So after a retried condition failure, a timeout or a dropped
    # connection, the item is re-read and the outcome judged from it: an unknown outcome is never reported
    # as a lost race.

    def _write(self, write: Write) -> WriteResult:
        """Send one conditional write; its outcome, settled by `_settle` when the request raised."""
        try:
            response = getattr(self.client, write.operation)(TableName=self.table_name, **write.request)
        except Exception as exc:
            return self._settle(write, exc)
        return WriteResult(True, lease_from_item(response["Attributes"]) if write.returns_item else None)

    def _settle(self, write: Write, exc: Exception) -> WriteResult:
        """The outcome of a write whose request raised: not applied when its condition failed at the first
        attempt (another writer won); an error when it surely was not applied; otherwise unknown, settled by
        re-reading the item and asking the write's judge whether it holds our write. When even that read
        fails, the error says the outcome is unknown."""
        condition_failed = is_condition_failure(exc)
        if condition_failed and not _retried(exc):
            return WriteResult(False)
        if not condition_failed and not isinstance(exc, AMBIGUOUS_FAILURES):
            raise self._error(write.operation, exc) from exc
        self.ambiguous_writes += 1
        try:
            seen = self.get(write.key)
        except LeaseTableError as read_exc:
            raise LeaseTableUnavailable(
                f"lease table {self.table_name}: {write.operation} on {write.key} has an unknown outcome ({exc}) "
                f"and re-reading the item failed ({read_exc})") from exc
        applied = bool(write.judge(seen))
        log.info("lease %s: %s had an ambiguous outcome (%s); re-read says %s", write.key, write.operation,
                 type(exc).__name__, "applied" if applied else "not applied")
        return WriteResult(applied, seen if applied else None)

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
        if code in _THROTTLING_CODES and isinstance(exc, ClientError):
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


def _retried(exc: Exception) -> bool:
    """botocore retried the request before this answer: an earlier attempt may have been applied."""
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) > 0
    return False


def _code(exc: Exception) -> str | None:
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def is_condition_failure(exc: Exception) -> bool:
    """DynamoDB refused the write: its condition does not hold (ConditionalCheckFailedException)."""
    return _code(exc) == "ConditionalCheckFailedException"


__all__ = ["AMBIGUOUS_FAILURES", "LeaseTable", "WriteResult", "is_condition_failure"]
