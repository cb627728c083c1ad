"""Every write to a lease, as a pure transition: the DynamoDB condition, then the update.

Each function mirrors one conditional write of lease_table.py exactly: it returns the item as DynamoDB
would leave it, or None where the condition fails (ConditionalCheckFailedException). The functions are
what the unit tests and the fleet simulation use as "the table"; lease_table.py turns the same rules
into expressions. Every update is guarded by the item existing (`attribute_exists(leaseKey)`): an
UpdateItem on a missing key would otherwise create a half-made lease (an upsert).

    create      PutItem     attribute_not_exists(leaseKey)
    acquire     UpdateItem  SET leaseOwner = :new_owner, leaseCounter = :one
                            ADD ownerSwitchesSinceCheckpoint :one  REMOVE <JAVA_HANDOVER_ATTRIBUTES>
                            if attribute_not_exists(leaseOwner) OR leaseOwner = :last_owner
    heartbeat   UpdateItem  ADD leaseCounter :one [SET <progress attributes>]
                            if leaseOwner = :owner AND checkpoint <> :SHARD_END
    checkpoint  UpdateItem  SET checkpoint = :seq, checkpointSubSequenceNumber = :sub,
                                ownerSwitchesSinceCheckpoint = :zero
                            if checkpoint <> :SHARD_END AND (checkpoint IN (:TRIM_HORIZON, :LATEST,
                               :AT_TIMESTAMP) OR size(checkpoint) < :seq_len OR (size(checkpoint) =
                               :seq_len AND checkpoint < :seq) OR (checkpoint = :seq AND
                               checkpointSubSequenceNumber < :sub))
    end         UpdateItem  SET checkpoint = :SHARD_END, ownerSwitchesSinceCheckpoint = :zero
                            REMOVE leaseOwner                              (no other condition)
    release     UpdateItem  SET leaseCounter = :zero REMOVE leaseOwner  if leaseOwner = :owner
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from .model import SHARD_END, Checkpoint, Lease, checkpoint_advances

# Java KCL 2.x attributes used for its graceful handover; a new owner clears them (Disney does the same)
# so that a Java peer never acts on another owner's half-finished handover.
JAVA_HANDOVER_ATTRIBUTES = (
    "checkpointOwner",
    "pendingCheckpoint",
    "pendingCheckpointSubSequenceNumber",
    "pendingCheckpointState",
    "childShardIds",
    "throughputKBps",
)

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
        "startingHashKey",
        "endingHashKey",
        "entityType",
        *JAVA_HANDOVER_ATTRIBUTES,
    }
)


def _copy(lease: Lease, **changes: Any) -> Lease:
    # Lease is mutable; never share the `extra` dict between the old and the new item.
    changes.setdefault("extra", dict(lease.extra))
    return replace(lease, **changes)


def create(existing: Lease | None, lease: Lease) -> Lease | None:
    """PutItem if attribute_not_exists(leaseKey): the first creator wins, the others change nothing."""
    if existing is not None:
        return None
    return _copy(lease)


def acquire(lease: Lease | None, new_owner: str, last_owner: str | None) -> Lease | None:
    """Take the lease if it is free or still held by the owner we saw (conditional on what we saw).

    The condition does not look at the checkpoint: the planner never acquires a SHARD_END lease, and
    the mirror of the DynamoDB write must not be stricter than the write itself.
    """
    if not new_owner:
        raise ValueError("acquire needs a worker id")
    if lease is None:
        return None
    if lease.lease_owner is not None and lease.lease_owner != last_owner:
        return None
    extra = {k: v for k, v in lease.extra.items() if k not in JAVA_HANDOVER_ATTRIBUTES}
    return _copy(
        lease,
        lease_owner=new_owner,
        lease_counter=1,
        owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint + 1,
        child_shard_ids=(),
        extra=extra,
    )


def heartbeat(lease: Lease | None, owner: str, attributes: Mapping[str, Any] | None = None) -> Lease | None:
    """Bump the counter if we still own the lease and it is not ended; progress may ride along."""
    if attributes:
        clash = sorted(LEASE_ATTRIBUTES.intersection(attributes))
        if clash:
            raise ValueError(f"heartbeat attributes must not overwrite lease attributes: {', '.join(clash)}")
    if lease is None or lease.lease_owner is None or lease.lease_owner != owner or lease.is_ended:
        return None
    extra = dict(lease.extra)
    extra.update(attributes or {})
    return _copy(lease, lease_counter=lease.lease_counter + 1, extra=extra)


def checkpoint(lease: Lease | None, new: Checkpoint) -> Lease | None:
    """Advance the checkpoint (anyone may, owner or not) if it moves strictly forward.

    SHARD_END is written by `end`, never here; a starting sentinel is never a checkpoint.
    """
    if new.is_sentinel:
        raise ValueError(f"checkpoint takes a sequence number, not {new.sequence_number} (use end() for SHARD_END)")
    if lease is None or not checkpoint_advances(lease.checkpoint, new):
        return None
    return _copy(lease, checkpoint=new, owner_switches_since_checkpoint=0)


def end(lease: Lease | None) -> Lease | None:
    """Mark the shard finished and let the lease go (only once every record is processed).

    The sub-sequence number is left as it was: the write sets `checkpoint` alone, as Java and Disney do.
    """
    if lease is None:
        return None
    return _copy(
        lease,
        checkpoint=Checkpoint(SHARD_END, lease.checkpoint.sub_sequence_number),
        lease_owner=None,
        owner_switches_since_checkpoint=0,
    )


def release(lease: Lease | None, owner: str) -> Lease | None:
    """Give the lease up on graceful shutdown; fails harmlessly if someone took it meanwhile."""
    if lease is None or lease.lease_owner is None or lease.lease_owner != owner:
        return None
    return _copy(lease, lease_counter=0, lease_owner=None)
