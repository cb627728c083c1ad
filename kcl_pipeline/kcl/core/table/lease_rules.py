"""Every write to a lease, as a pure transition: the DynamoDB condition, then the update.

Each function mirrors one conditional write of lease_codec.py exactly: it returns the item as DynamoDB
would leave it, or None where the condition fails (ConditionalCheckFailedException). The transitions are the
specification the table's writes are held to, and only tests call them: lease_codec.py builds the same rules
into expressions (shells/lease_table.py sends them), and the tests run each write both ways and compare, against
the real table (dynalite, moto) and against the simulated DynamoDB that evaluates those expressions for the
simulation (sim/aws/expressions.py). The shipped code takes the attribute names and the checks from here. Every update
is guarded by the item existing (`attribute_exists(leaseKey)`): an UpdateItem on a missing key would otherwise
create a half-made lease (an upsert).

`leaseCounter` is the fencing token (Java KCL's semantics): every write of a holder is conditioned on the
counter it last wrote or observed and moves it on by one, so a holder that lost its lease — even to a new
process under the same worker id — fails its next write. Only the ownerless checkpoint of the pipeline
(which holds no lease) and SHARD_END written by it leave the counter alone.

    create      PutItem     attribute_not_exists(leaseKey)
    acquire     UpdateItem  SET leaseOwner = :new, leaseCounter = :observed + 1, leaseClaimOwner = :new
                            ADD ownerSwitchesSinceCheckpoint :one (unless it names :new already)
                            REMOVE checkpointOwner (pendingCheckpoint* kept)
                            if leaseCounter = :observed AND checkpoint <> :SHARD_END AND
                               (leaseOwner = :seen, or free when none was seen)
    heartbeat   UpdateItem  SET leaseCounter = :mine + 1 [, <progress>] [, <checkpoint>]
                            if leaseOwner = :me AND leaseCounter = :mine AND checkpoint <> :SHARD_END
                               [AND <CHECKPOINT_ADVANCES> when a checkpoint rides along]
    renew asked UpdateItem  SET leaseCounter = :mine + 1
                            if checkpointOwner = :me AND leaseCounter = :mine AND checkpoint <> :SHARD_END
    checkpoint  UpdateItem  SET checkpoint = :seq, checkpointSubSequenceNumber = :sub,
                                ownerSwitchesSinceCheckpoint = :zero        (ownerless; counter untouched)
                            if <CHECKPOINT_ADVANCES> AND <OURS_OR_FREE>
    end         UpdateItem  SET checkpoint = :SHARD_END, ownerSwitchesSinceCheckpoint = :zero
                                [, leaseCounter = :mine + 1]  REMOVE leaseOwner
                            holder: if leaseOwner = :me AND leaseCounter = :mine;
                            ownerless: if it exists AND <OURS_OR_FREE>
    release     UpdateItem  SET leaseCounter = :mine + 1 REMOVE leaseOwner
                            if leaseOwner = :me AND leaseCounter = :mine
    delete      DeleteItem  if leaseCounter = :observed

Every write that moves the checkpoint (a checkpoint, SHARD_END) also removes pendingCheckpoint*, as Java's
setCheckpoint does.

OURS_OR_FREE: no leaseOwner (or a NULL one), or leaseOwner = leaseClaimOwner (CLAIM_OWNER_ATTRIBUTE); and no
graceful hand-off in flight (no checkpointOwner: its holder still checkpoints and renews until it steps aside).

CHECKPOINT_ADVANCES: checkpoint <> SHARD_END and (a starting sentinel, or (length, lexicographic) of the
sequence is smaller, or equal sequence and a smaller sub-sequence — a missing sub-sequence reads as 0).
"""
from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any, Mapping, TypeGuard

from ..model import SHARD_END, Checkpoint, Lease, checkpoint_advances

# KCL 3.x's graceful hand-off in flight; a take removes it (Java's getDynamoTakeLeaseUpdate deletes
# checkpointOwner), so that no peer acts on another owner's half-finished hand-off.
HANDOFF_ATTRIBUTE = "checkpointOwner"
# Java's two-phase checkpoint (prepareCheckpoint): a take keeps it — Java hands it to the next owner's
# processor (InitializationInput's pending checkpoint; here `InitializationInput.extra`) — and a checkpoint
# clears it (Java's setCheckpoint), as does SHARD_END. `childShardIds` and `throughputKBps` are kept by both.
PENDING_CHECKPOINT_ATTRIBUTES = (
    "pendingCheckpoint",
    "pendingCheckpointSubSequenceNumber",
    "pendingCheckpointState",
)
JAVA_HANDOVER_ATTRIBUTES = (HANDOFF_ATTRIBUTE, *PENDING_CHECKPOINT_ATTRIBUTES)

# Written by a release that comes before the releasing worker's wait after a cold steal ended: the holder it
# stole from may still be delivering, so the next owner waits one expiry before delivering, as the stealer
# would have. Every acquire removes it.
UNSETTLED_ATTRIBUTE = "previousHolderMayDeliver"

# Written by every acquire of this protocol: the worker id that took the lease. While it equals `leaseOwner`, the
# lease is held by a holder of this protocol; a Java take or assignment changes `leaseOwner` and leaves it, so a
# lease whose owner differs from it is held by a Java holder. The ownerless writes (the pipeline's checkpoint and
# end, which no holder fences) touch a lease only while it is free or held by this protocol: a Java holder
# checkpoints with its counter alone (its next checkpoint would overwrite ours, moving it back) and renews
# without looking at leaseOwner (an end removing it would leave the holder renewing an ownerless lease).
CLAIM_OWNER_ATTRIBUTE = "leaseClaimOwner"

# Attributes the lease protocol owns; extra attributes written on a heartbeat must not use them.
LEASE_ATTRIBUTES = frozenset(
    {
        "leaseKey",
        "leaseOwner",
        "leaseCounter",
        "checkpoint",
        "checkpointSubSequenceNumber",
        "ownerSwitchesSinceCheckpoint",
        "parentShardId",
        "childShardIds",
        "startingHashKey",
        "endingHashKey",
        "entityType",
        "throughputKBps",
        UNSETTLED_ATTRIBUTE,
        CLAIM_OWNER_ATTRIBUTE,
        *JAVA_HANDOVER_ATTRIBUTES,
    }
)


def _copy(lease: Lease, **changes: Any) -> Lease:
    # Lease is mutable; never share the `extra` dict between the old and the new item.
    changes.setdefault("extra", dict(lease.extra))
    return replace(lease, **changes)


def _held_by(lease: Lease | None, owner: str, counter: int) -> TypeGuard[Lease]:
    return lease is not None and lease.lease_owner == owner and lease.lease_counter == counter


def create(existing: Lease | None, lease: Lease) -> Lease | None:
    """PutItem if attribute_not_exists(leaseKey): the first creator wins, the others change nothing."""
    if existing is not None:
        return None
    return _copy(lease)


# Written by every acquire: a token unique to the acquiring process. Two processes running under one
# worker id are otherwise indistinguishable in the table, so an acquire whose outcome is unknown (response
# lost, retried into a failed condition) is judged ours only when the item carries our own claim.
CLAIM_ATTRIBUTE = "leaseClaim"


def acquire(lease: Lease | None, new_owner: str, observed_owner: str | None, observed_counter: int,
            claim: str | None = None) -> Lease | None:
    """Take the lease if it is exactly as we observed it (owner and counter) and not ended.

    The counter moves on from the observed one (never back to 1): a lease going A→B→A between two scans
    still changes counter, and a Java holder's renew conditioned on its counter fails after the take.
    """
    if not new_owner:
        raise ValueError("acquire needs a worker id")
    if lease is None or lease.is_ended or lease.lease_counter != observed_counter:
        return None
    if lease.lease_owner != observed_owner:
        return None
    extra = {k: v for k, v in lease.extra.items() if k not in (HANDOFF_ATTRIBUTE, UNSETTLED_ATTRIBUTE)}
    if claim is not None:
        extra[CLAIM_ATTRIBUTE] = claim
    extra[CLAIM_OWNER_ATTRIBUTE] = new_owner
    return _copy(
        lease,
        lease_owner=new_owner,
        lease_counter=observed_counter + 1,
        owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint + (observed_owner != new_owner),
        extra=extra,
    )


# Progress attributes ride on every heartbeat and every peer's Scan reads them each cycle: a lease item is
# kept small (DynamoDB's hard limit is 400 KB an item; a Scan is billed per 4 KB). Refusing an oversized set
# here costs no round trip, so a misbehaving hook cannot slow the heartbeat until the lease lapses.
MAX_HEARTBEAT_ATTRIBUTES_BYTES = 32 * 1024


def attribute_size(value: Any) -> int:
    """DynamoDB's sizing of a value, near enough to bound it: strings and binary by their bytes, numbers
    by about one byte per two digits, containers by their members plus a few bytes each."""
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, (int, float, Decimal)):
        return len(str(value)) // 2 + 1
    if isinstance(value, Mapping):
        return 3 + sum(attribute_size(k) + attribute_size(v) + 1 for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return 3 + sum(attribute_size(v) + 1 for v in value)
    return len(str(value))  # not encodable anyway: the encoder says so


def check_heartbeat_attributes(attributes: Mapping[str, Any] | None) -> None:
    if attributes:
        clash = sorted(LEASE_ATTRIBUTES.intersection(attributes))
        if clash:
            raise ValueError(f"heartbeat attributes must not overwrite lease attributes: {', '.join(clash)}")
        size = attribute_size(dict(attributes))
        if size > MAX_HEARTBEAT_ATTRIBUTES_BYTES:
            raise ValueError(f"heartbeat attributes are {size:,} bytes; at most {MAX_HEARTBEAT_ATTRIBUTES_BYTES:,} "
                             "ride on a lease (every peer scans every lease each cycle)")


THROUGHPUT_ATTRIBUTE = "throughputKBps"


def check_throughput(throughput_kbps: float | None) -> None:
    if throughput_kbps is not None and not (throughput_kbps >= 0 and throughput_kbps != float("inf")):
        raise ValueError(f"throughputKBps must be a finite number >= 0, got {throughput_kbps!r}")


def heartbeat(lease: Lease | None, owner: str, counter: int, attributes: Mapping[str, Any] | None = None,
              checkpoint: Checkpoint | None = None, throughput_kbps: float | None = None) -> Lease | None:
    """Renew: the holder (owner and counter it last wrote) moves the counter on; progress and a
    checkpoint may ride along (the checkpoint under its own forward-only condition too), and the
    holder's recent throughput as KCL's `throughputKBps` (read by the load-aware balance)."""
    check_heartbeat_attributes(attributes)
    check_throughput(throughput_kbps)
    if checkpoint is not None and checkpoint.is_sentinel:
        raise ValueError(f"heartbeat checkpoint takes a sequence number, not {checkpoint.sequence_number}")
    if not _held_by(lease, owner, counter) or lease.is_ended:
        return None
    if checkpoint is not None and not checkpoint_advances(lease.checkpoint, checkpoint):
        return None
    extra = dict(lease.extra)
    for name, value in (attributes or {}).items():
        if value is None:
            extra.pop(name, None)
        else:
            extra[name] = value
    if throughput_kbps is not None:
        extra[THROUGHPUT_ATTRIBUTE] = throughput_kbps
    changes: dict[str, Any] = {"lease_counter": counter + 1, "extra": extra}
    if checkpoint is not None:
        changes.update(checkpoint=checkpoint, owner_switches_since_checkpoint=0, extra=without_pending(extra))
    return _copy(lease, **changes)


def renew_asked(lease: Lease | None, holder: str, counter: int) -> Lease | None:
    """A holder asked to hand off (it is `checkpointOwner`; `leaseOwner` names the next owner) renews, fenced on
    its counter, until its last write steps aside."""
    if lease is None or lease.is_ended or lease.extra.get(HANDOFF_ATTRIBUTE) != holder \
            or lease.lease_counter != counter:
        return None
    return _copy(lease, lease_counter=counter + 1)


def without_pending(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes a checkpoint leaves: Java's setCheckpoint clears the prepared (pending) checkpoint."""
    return {k: v for k, v in extra.items() if k not in PENDING_CHECKPOINT_ATTRIBUTES}


def held_by_another_protocol(lease: Lease) -> bool:
    """The lease has a holder that did not take it by this protocol's acquire (a Java holder: see
    CLAIM_OWNER_ATTRIBUTE). A free lease (no owner) is held by nobody."""
    return lease.lease_owner is not None and lease.extra.get(CLAIM_OWNER_ATTRIBUTE) != lease.lease_owner


def ownerless_write_refused(lease: Lease) -> bool:
    """An ownerless write (the pipeline's checkpoint and end, a worker's flush after its lease went) would land
    under a live holder: one of another protocol, or any holder still finishing a graceful hand-off
    (`checkpointOwner`). A KCL 3.x leader's hand-off names the next owner in `leaseOwner`, which may be a
    worker of ours whose earlier take left `leaseClaimOwner`, while the Java holder still checkpoints (its
    checkpoint would move ours back) and may end its hand-off after our SHARD_END (un-ending the shard)."""
    return held_by_another_protocol(lease) or HANDOFF_ATTRIBUTE in lease.extra


def checkpoint(lease: Lease | None, new: Checkpoint) -> Lease | None:
    """The ownerless checkpoint (the pipeline's commit): forward only, counter untouched, and only while the
    lease is free or held by this protocol with no hand-off in flight (`ownerless_write_refused`).

    SHARD_END is written by `end`, never here; a starting sentinel is never a checkpoint.
    """
    if new.is_sentinel:
        raise ValueError(f"checkpoint takes a sequence number, not {new.sequence_number} (use end() for SHARD_END)")
    if lease is None or ownerless_write_refused(lease) or not checkpoint_advances(lease.checkpoint, new):
        return None
    return _copy(lease, checkpoint=new, owner_switches_since_checkpoint=0, extra=without_pending(lease.extra))


def end(lease: Lease | None, owner: str | None = None, counter: int | None = None) -> Lease | None:
    """Mark the shard finished and let the lease go (only once every record is processed).

    With `owner` and `counter` this is the holder's fenced end (a stale holder cannot end a lease it lost);
    without, the pipeline's ownerless end, which leaves the counter alone and is refused while another
    protocol's holder (Java) holds the lease. The sub-sequence number is left as it was: the write sets
    `checkpoint` alone, as Java and Disney do.
    """
    if (owner is None) != (counter is None):
        raise ValueError("a fenced end needs both the owner and the counter")
    if lease is None:
        return None
    changes: dict[str, Any] = {}
    if owner is not None and counter is not None:
        if not _held_by(lease, owner, counter):
            return None
        changes["lease_counter"] = counter + 1
    elif ownerless_write_refused(lease):
        return None
    return _copy(lease, checkpoint=Checkpoint(SHARD_END, lease.checkpoint.sub_sequence_number),
                 lease_owner=None, owner_switches_since_checkpoint=0, extra=without_pending(lease.extra), **changes)


def release(lease: Lease | None, owner: str, counter: int, unsettled: bool = False) -> Lease | None:
    """Give the lease up on graceful shutdown; fails harmlessly if someone took it meanwhile. `unsettled`:
    the holder it was stolen from may still deliver (UNSETTLED_ATTRIBUTE)."""
    if not _held_by(lease, owner, counter):
        return None
    released = _copy(lease, lease_counter=counter + 1, lease_owner=None)
    if unsettled:
        released.extra[UNSETTLED_ATTRIBUTE] = True
    return released


def delete(lease: Lease | None, observed_counter: int) -> bool:
    """DeleteItem if the lease is still as observed (no one took or renewed it since)."""
    return lease is not None and lease.lease_counter == observed_counter
