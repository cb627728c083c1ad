"""The domain types shared by every layer: checkpoints, leases, shards, user records.

Sequence numbers stay strings everywhere (they reach 128 digits; DynamoDB numbers hold 38 and
Spark's decimal(38,0) cannot hold them). Ordering is (length, lexicographic), which is numeric order
for non-padded decimal strings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

TRIM_HORIZON = "TRIM_HORIZON"
LATEST = "LATEST"
AT_TIMESTAMP = "AT_TIMESTAMP"
SHARD_END = "SHARD_END"
STARTING_SENTINELS = frozenset({TRIM_HORIZON, LATEST, AT_TIMESTAMP})
SENTINELS = STARTING_SENTINELS | {SHARD_END}

_SEQUENCE_RE = re.compile(r"0|[1-9][0-9]{0,128}")


def is_sequence_number(value: str) -> bool:
    return bool(_SEQUENCE_RE.fullmatch(value))


def sequence_key(sequence_number: str) -> tuple[int, str]:
    """Sort key giving numeric order of non-padded decimal strings without big-int parsing."""
    return (len(sequence_number), sequence_number)


@dataclass(frozen=True, order=False)
class Checkpoint:
    """An extended sequence number: a sequence (or sentinel) and a KPL sub-sequence.

    In the lease table AT_TIMESTAMP carries sub-sequence 0 (as Java KCL writes it); the timestamp is the
    application's configuration. A reader's *start position* AT_TIMESTAMP carries that timestamp in epoch
    millis as its sub-sequence (`lease_life.start_position` puts it there).
    """

    sequence_number: str
    sub_sequence_number: int = 0

    def __post_init__(self) -> None:
        if self.sequence_number not in SENTINELS and not is_sequence_number(self.sequence_number):
            raise ValueError(
                f"checkpoint {self.sequence_number!r} is neither a sentinel "
                f"({', '.join(sorted(SENTINELS))}) nor a non-padded decimal sequence number"
            )
        if self.sub_sequence_number < 0:
            raise ValueError(f"sub-sequence number must be >= 0, got {self.sub_sequence_number}")

    @property
    def is_sentinel(self) -> bool:
        return self.sequence_number in SENTINELS

    @property
    def is_shard_end(self) -> bool:
        return self.sequence_number == SHARD_END

    @property
    def is_starting_sentinel(self) -> bool:
        return self.sequence_number in STARTING_SENTINELS

    def key(self) -> tuple[int, str, int]:
        """Order of real sequence numbers; callers must handle sentinels first."""
        seq = self.sequence_number  # (no property call: listings and the exclusion order batches by this)
        if seq in SENTINELS:
            raise ValueError(f"sentinel {seq} has no position in a shard")
        return (len(seq), seq, self.sub_sequence_number)

    def __str__(self) -> str:
        return f"{self.sequence_number}/{self.sub_sequence_number}"


def checkpoint_advances(current: Checkpoint | None, new: Checkpoint) -> bool:
    """Whether writing `new` over `current` moves the checkpoint forward (the rule the table enforces).

    SHARD_END is final; a starting sentinel (or nothing) is before every sequence number; otherwise
    (sequence, sub-sequence) must be strictly greater.
    """
    if new.is_starting_sentinel:
        raise ValueError("a checkpoint never moves to a starting sentinel")
    if current is not None and current.is_shard_end:
        return False
    if new.is_shard_end:
        return True
    if current is None or current.is_starting_sentinel:
        return True
    return new.key() > current.key()


@dataclass(frozen=True)
class HashKeyRange:
    starting_hash_key: str
    ending_hash_key: str


@dataclass(frozen=True)
class Shard:
    """A shard as ListShards describes it."""

    shard_id: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    hash_key_range: HashKeyRange | None = None
    starting_sequence_number: str | None = None
    # Present when the shard is closed. kinesis-local reports 2^63-1 here: never compare it to records.
    ending_sequence_number: str | None = None

    @property
    def parent_ids(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)

    @classmethod
    def from_api(cls, item: Mapping[str, Any]) -> "Shard":
        hkr = item.get("HashKeyRange")
        snr = item.get("SequenceNumberRange") or {}
        return cls(
            shard_id=item["ShardId"],
            parent_shard_id=item.get("ParentShardId"),
            adjacent_parent_shard_id=item.get("AdjacentParentShardId"),
            hash_key_range=HashKeyRange(hkr["StartingHashKey"], hkr["EndingHashKey"]) if hkr else None,
            starting_sequence_number=snr.get("StartingSequenceNumber"),
            ending_sequence_number=snr.get("EndingSequenceNumber"),
        )


@dataclass
class Lease:
    """One item of the lease table, with Java KCL 2.x attribute names (see lease_codec.py).

    `extra` holds attributes this project does not model; they are never overwritten.
    """

    lease_key: str
    checkpoint: Checkpoint
    lease_owner: str | None = None
    lease_counter: int = 0
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: tuple[str, ...] = ()
    child_shard_ids: tuple[str, ...] = ()
    starting_hash_key: str | None = None
    ending_hash_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_ended(self) -> bool:
        return self.checkpoint.is_shard_end


@dataclass(frozen=True)
class UserRecord:
    """One deaggregated user record as delivered to a record processor."""

    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    explicit_hash_key: str | None
    approximate_arrival_timestamp_ms: int
    data: bytes
    # True when the record came out of a KPL aggregate (sub_sequence_number is its index then).
    aggregated: bool = False

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.sequence_number, self.sub_sequence_number)

    def position(self) -> tuple[int, str, int]:
        return (len(self.sequence_number), self.sequence_number, self.sub_sequence_number)
