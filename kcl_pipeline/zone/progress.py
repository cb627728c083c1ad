"""Per-shard landing progress, published as extra attributes of the shard's lease item.

It rides on the worker's heartbeat UpdateItem (no extra DynamoDB writes), so every consumer in the fleet
and the Dagster sensor read it with the lease scan they do anyway. Attribute names start with `landing`,
which no Java KCL (2.x or 3.x) lease attribute does:

    landingSequenceNumber S, landingSubSequenceNumber N   the last landed record (every record of the
                                                          shard before it is landed too)
    landingArrivalMillis N                                its ApproximateArrivalTimestamp
    landingNextArrivalMillis N                            the ApproximateArrivalTimestamp of the record right
                                                          after the last landed one, read and held by the
                                                          sink but not landed yet (absent: none held)
    landingPolledAtMillis N, landingMillisBehindLatest N  the newest poll all of whose records are landed
                                                          (wall clock of the worker; MillisBehindLatest)
    landingShardEnd BOOL                                  the shard's last record is landed
    landingLastBatchKey S                                 the key of the batch holding the last landed record

Every fact is monotone and true "as of" its time, so progress from several sources (the lease table,
a local worker, a late report of a previous owner) merges field group by field group (`merge_progress`).

The next record's arrival belongs to the landed group: it is a fact about the shard's record that follows
`landed` (a position of the shard has one successor, whoever reads it), so it is true for every holder
and merges with `landed`. It is never published without `landed` (a holder that has landed nothing cannot
say which record follows the chain's start: another holder may claim that start from other first records).
When `landed` moves past that record, `landingArrivalMillis` is at least its arrival, so what it proved
stays proved (windows/completeness.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, overload

from ..kcl.core.model import Checkpoint, Lease

A_SEQUENCE = "landingSequenceNumber"
A_SUB_SEQUENCE = "landingSubSequenceNumber"
A_ARRIVAL = "landingArrivalMillis"
A_POLLED_AT = "landingPolledAtMillis"
A_BEHIND = "landingMillisBehindLatest"
A_SHARD_END = "landingShardEnd"
A_LAST_BATCH = "landingLastBatchKey"
A_NEXT_ARRIVAL = "landingNextArrivalMillis"
ATTRIBUTES = (A_SEQUENCE, A_SUB_SEQUENCE, A_ARRIVAL, A_POLLED_AT, A_BEHIND, A_SHARD_END, A_LAST_BATCH, A_NEXT_ARRIVAL)


@dataclass(frozen=True)
class ShardProgress:
    shard_id: str
    landed: Checkpoint | None = None
    landed_arrival_ms: int | None = None
    polled_at_ms: int | None = None
    millis_behind_latest: int | None = None
    shard_end_landed: bool = False
    last_batch_key: str | None = None
    next_arrival_ms: int | None = None  # arrival of the record right after `landed`, held but not landed

    def to_attributes(self) -> dict[str, Any]:
        """Heartbeat attributes; None removes an attribute (so the item always says exactly this)."""
        return {
            A_SEQUENCE: self.landed.sequence_number if self.landed else None,
            A_SUB_SEQUENCE: self.landed.sub_sequence_number if self.landed else None,
            A_ARRIVAL: self.landed_arrival_ms,
            A_POLLED_AT: self.polled_at_ms,
            A_BEHIND: self.millis_behind_latest,
            A_SHARD_END: True if self.shard_end_landed else None,
            A_LAST_BATCH: self.last_batch_key,
            A_NEXT_ARRIVAL: self.next_arrival_ms if self.landed else None,
        }

    @classmethod
    def from_attributes(cls, shard_id: str, attributes: Mapping[str, Any]) -> "ShardProgress | None":
        """Progress from lease attributes (plain values or DynamoDB attribute values); None if there is none.

        Malformed values (another writer, a hand edit) are ignored field by field, never trusted.
        """
        values = {name: _plain(attributes.get(name)) for name in ATTRIBUTES}
        if all(v is None for v in values.values()):
            return None
        landed = None
        seq = values[A_SEQUENCE]
        if isinstance(seq, str):
            try:
                landed = Checkpoint(seq, _int(values[A_SUB_SEQUENCE]) or 0)
                if landed.is_sentinel:
                    landed = None
            except ValueError:
                landed = None
        return cls(
            shard_id=shard_id,
            landed=landed,
            landed_arrival_ms=_int(values[A_ARRIVAL]) if landed else None,
            polled_at_ms=_int(values[A_POLLED_AT]),
            millis_behind_latest=_int(values[A_BEHIND]),
            shard_end_landed=values[A_SHARD_END] is True,
            last_batch_key=values[A_LAST_BATCH] if isinstance(values[A_LAST_BATCH], str) and landed else None,
            next_arrival_ms=_int(values[A_NEXT_ARRIVAL]) if landed else None,
        )

    @classmethod
    def from_lease(cls, lease: Lease) -> "ShardProgress | None":
        return cls.from_attributes(lease.lease_key, lease.extra)

    def caught_up_at(self) -> int | None:
        """When a poll found the shard's tip with everything before it landed (None: not known)."""
        return self.polled_at_ms if self.millis_behind_latest == 0 else None


def progress_from_leases(leases: Iterable[Lease]) -> dict[str, ShardProgress]:
    out = {}
    for lease in leases:
        progress = ShardProgress.from_lease(lease)
        if progress is not None:
            out[lease.lease_key] = progress
    return out


@overload
def merge_progress(a: ShardProgress, b: ShardProgress | None) -> ShardProgress: ...
@overload
def merge_progress(a: ShardProgress | None, b: ShardProgress) -> ShardProgress: ...
@overload
def merge_progress(a: ShardProgress | None, b: ShardProgress | None) -> ShardProgress | None: ...


def merge_progress(a: ShardProgress | None, b: ShardProgress | None) -> ShardProgress | None:
    """The union of two reports of one shard: each fact from whichever report has it newer.

    A late report (an old snapshot, or a previous owner's) never moves progress back.
    """
    if a is None or b is None:
        return a or b
    if a.shard_id != b.shard_id:
        raise ValueError(f"cannot merge progress of {a.shard_id} and {b.shard_id}")
    out = a
    if b.landed is not None and (a.landed is None or b.landed.key() > a.landed.key()):
        out = replace(out, landed=b.landed, landed_arrival_ms=b.landed_arrival_ms, last_batch_key=b.last_batch_key,
                      next_arrival_ms=b.next_arrival_ms)
    elif (b.landed is not None and a.landed is not None and b.landed.key() == a.landed.key()
          and b.next_arrival_ms is not None and a.next_arrival_ms is None):
        out = replace(out, next_arrival_ms=b.next_arrival_ms)  # the same record follows: one report read it
    if b.polled_at_ms is not None and (a.polled_at_ms is None or b.polled_at_ms > a.polled_at_ms):
        out = replace(out, polled_at_ms=b.polled_at_ms, millis_behind_latest=b.millis_behind_latest)
    if b.shard_end_landed and not a.shard_end_landed:
        out = replace(out, shard_end_landed=True)
    return out


def merge_all(*sources: Mapping[str, ShardProgress]) -> dict[str, ShardProgress]:
    out: dict[str, ShardProgress] = {}
    for source in sources:
        for shard_id, progress in source.items():
            out[shard_id] = merge_progress(out.get(shard_id), progress)
    return out


def _plain(value: Any) -> Any:
    """A DynamoDB attribute value ({"S": ...}) as a plain value; plain values pass through."""
    if isinstance(value, Mapping) and len(value) == 1:
        (kind, inner), = value.items()
        if kind == "S":
            return inner
        if kind == "N":
            return _int(inner)
        if kind == "BOOL":
            return bool(inner)
        if kind == "NULL":
            return None
    return value


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    try:  # Decimal (boto3's TypeDeserializer) or float
        as_int = int(value)
    except (TypeError, ValueError):
        return None
    return as_int if as_int == value else None
