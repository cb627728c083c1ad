"""Which stream a lease belongs to: single-stream keys (the shard id) and KCL's multi-stream keys.

A single-stream application keeps KCL 2.x's format: the lease key is the shard id. A multi-stream application
(several `--stream`s, one lease table) uses KCL's format: the key is `<account>:<StreamName>:<creationEpoch>:
<shardId>`, and the item carries `streamName` (the stream identifier, `<account>:<StreamName>:<creationEpoch>`)
and `shardId` (Java's DynamoDBMultiStreamLeaseSerializer writes exactly these two names; AWS's prose says
`shardID`, Java writes `shardId`). The creation time in the key is what makes a deleted and re-created stream,
whose shard ids repeat, start afresh instead of resuming from the old stream's checkpoints.

The lease manager's decisions (planner, cycle, balance) see only lease keys: a stream's listed shards are
renamed to their lease keys here (`StreamScope.shards`), at the I/O boundary, so a stream's leases are scoped,
created with parents and balanced exactly like a single stream's, and two streams' keys can never meet.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from .model import Shard

STREAM_ID_ATTRIBUTE = "streamName"  # Java keeps the stream identifier under this name "for legacy reasons"
SHARD_ID_ATTRIBUTE = "shardId"
# arn:<partition>:kinesis:<region>:<account>:stream/<name> (any partition: aws, aws-cn, aws-us-gov, ...)
STREAM_ARN_RE = re.compile(r"arn:(?P<partition>[a-z-]+):kinesis:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):"
                           r"stream/(?P<name>[A-Za-z0-9_.-]{1,128})")
_ARN_ACCOUNT_RE = re.compile(r"arn:[a-z-]+:kinesis:[a-z0-9-]+:(?P<account>\d{12}):stream/")
# Java's StreamIdentifier.STREAM_IDENTIFIER_PATTERN: any run of digits for the account (not only AWS's 12), any
# name without ':', a creation epoch > 0 — whatever the application configured, never checked against AWS.
_IDENTIFIER_RE = re.compile(r"(?P<account>[0-9]+):(?P<name>[^:]+):(?P<epoch>[0-9]+)")



def stream_name(stream: str) -> str:
    """The stream's name, for a name, an ARN or a stream identifier `<account>:<name>:<creationEpoch>` (the
    landing layout and logs use the name)."""
    m = STREAM_ARN_RE.fullmatch(stream)
    if m:
        return m["name"]
    return identifier_parts(stream)[1] if is_stream_identifier(stream) else stream


@dataclass(frozen=True)
class StreamArn:
    """Where a stream lives, as its ARN `arn:<partition>:kinesis:<region>:<account>:stream/<name>` says: what
    tells two streams of one name apart (another account, another region)."""

    partition: str
    region: str
    account: str
    name: str

    def __str__(self) -> str:
        return f"arn:{self.partition}:kinesis:{self.region}:{self.account}:stream/{self.name}"


def parse_stream_arn(arn: str) -> StreamArn:
    """The parts of a stream ARN; ValueError naming it when it is not one."""
    m = STREAM_ARN_RE.fullmatch(arn)
    if m is None:
        raise ValueError(f"{arn!r} is not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
    return StreamArn(m["partition"], m["region"], m["account"], m["name"])


def is_stream_identifier(stream: str) -> bool:
    """Whether a configured stream is a Java stream identifier `<account>:<name>:<creationEpoch>` (as a Java
    multi-stream application configures its streams: StreamIdentifier.multiStreamInstance) rather than a name
    or an ARN."""
    return not stream.startswith("arn:") and _IDENTIFIER_RE.fullmatch(stream) is not None


class StreamRecreated(Exception):
    """The stream a lease names was deleted (and maybe re-created): its checkpoints are of another stream."""


@dataclass(frozen=True)
class StreamScope:
    """One stream of the application: how it is called (`stream`, a name or an ARN) and, for a multi-stream
    application, its identifier `<account>:<name>:<creationEpoch>` (None: single-stream, key = shard id).

    `pinned`: the identifier is the application's (configured as `<account>:<name>:<creationEpoch>`, as Java's
    multi-stream applications configure theirs): its creation epoch and account are used as given — never
    compared with DescribeStreamSummary — so a fleet sharing the table with Java uses Java's keys."""

    stream: str
    identifier: str | None = None
    pinned: bool = False

    @property
    def name(self) -> str:
        return stream_name(self.stream)

    @property
    def creation_epoch(self) -> int | None:
        return None if self.identifier is None else identifier_parts(self.identifier)[2]

    def lease_key(self, shard_id: str) -> str:
        return shard_id if self.identifier is None else multi_stream_key(self.identifier, shard_id)

    def shard_id(self, lease_key: str) -> str:
        if self.identifier is None:
            return lease_key
        prefix = self.identifier + ":"
        if not lease_key.startswith(prefix):
            raise ValueError(f"lease {lease_key} is not a lease of stream {self.identifier}")
        return lease_key[len(prefix):]

    def owns(self, lease_key: str) -> bool:
        """Whether the lease is of this stream (this incarnation, for a multi-stream application)."""
        return self.identifier is None or lease_key.startswith(self.identifier + ":")

    def shards(self, listed: Iterable[Shard]) -> list[Shard]:
        """The listed shards renamed to their lease keys (parents too): what the planner sees."""
        if self.identifier is None:
            return list(listed)
        key = self.lease_key
        return [replace(shard, shard_id=key(shard.shard_id),
                        parent_shard_id=shard.parent_shard_id and key(shard.parent_shard_id),
                        adjacent_parent_shard_id=shard.adjacent_parent_shard_id and key(shard.adjacent_parent_shard_id))
                for shard in listed]


def stream_identifier(summary: dict[str, Any]) -> str:
    """`<account>:<name>:<creationEpoch>` from a DescribeStreamSummary answer (KCL's StreamIdentifier)."""
    arn = summary["StreamARN"]
    match = _ARN_ACCOUNT_RE.match(arn)
    if match is None:
        raise ValueError(f"stream ARN {arn!r} names no account")
    created = summary["StreamCreationTimestamp"]
    epoch = int(created.timestamp()) if hasattr(created, "timestamp") else int(created)
    return f"{match['account']}:{summary['StreamName']}:{epoch}"


def identifier_parts(identifier: str) -> tuple[str, str, int]:
    """(account, stream name, creation epoch) of a stream identifier `<account>:<name>:<creationEpoch>`, as
    Java's StreamIdentifier parses it (any digits for the account, a creation epoch > 0)."""
    match = _IDENTIFIER_RE.fullmatch(identifier)
    if match is None:
        raise ValueError(f"{identifier!r} is not a stream identifier (<account>:<name>:<creationEpoch>)")
    if int(match["epoch"]) <= 0:
        raise ValueError(f"{identifier!r}: a stream's creation epoch must be > 0 (Java's StreamIdentifier)")
    return match["account"], match["name"], int(match["epoch"])


def pinned_scope(identifier: str) -> StreamScope:
    """The scope of a stream configured by its identifier: the API calls it by name (in the client's account),
    its lease keys carry the identifier exactly as configured."""
    return StreamScope(identifier_parts(identifier)[1], identifier, pinned=True)


def multi_stream_key(identifier: str, shard_id: str) -> str:
    """KCL's multi-stream lease key: `<account>:<name>:<creationEpoch>:<shardId>`."""
    return f"{identifier}:{shard_id}"


def parse_multi_stream_key(lease_key: str) -> tuple[str, str] | None:
    """(stream identifier, shard id) of a multi-stream lease key; None for a single-stream key."""
    identifier, sep, shard_id = lease_key.rpartition(":")
    if not sep or not shard_id or _IDENTIFIER_RE.fullmatch(identifier) is None:
        return None
    if int(identifier.rsplit(":", 1)[1]) <= 0:
        return None  # Java refuses a creation epoch of 0: no lease of a multi-stream application has one
    return identifier, shard_id


def multi_stream_attributes(lease_key: str) -> dict[str, str]:
    """The attributes KCL writes beside a multi-stream key (none for a single-stream key)."""
    parsed = parse_multi_stream_key(lease_key)
    if parsed is None:
        return {}
    return {STREAM_ID_ATTRIBUTE: parsed[0], SHARD_ID_ATTRIBUTE: parsed[1]}


def related_lease_keys(lease_key: str, stored: Iterable[str]) -> tuple[str, ...]:
    """A lease's parents or children as the model names them (lease keys, sorted), from the item, where a
    multi-stream lease stores them by shard id as Java writes them."""
    parsed = parse_multi_stream_key(lease_key)
    if parsed is None:
        return tuple(sorted(stored))
    return tuple(sorted(key if ":" in key else multi_stream_key(parsed[0], key) for key in stored))


def stored_shard_ids(lease_key: str, related: Iterable[str]) -> list[str]:
    """The inverse of `related_lease_keys`: parents or children as the item stores them (sorted, unique)."""
    parsed = parse_multi_stream_key(lease_key)
    if parsed is None:
        return sorted(set(related))
    prefix = parsed[0] + ":"
    return sorted({key[len(prefix):] if key.startswith(prefix) else key for key in related})


def scope_of(streams: Iterable[str], lease_key: str) -> StreamScope:
    """The configured stream a lease key belongs to (a worker is given only its lease and the config)."""
    streams = list(streams)
    parsed = parse_multi_stream_key(lease_key) if len(streams) > 1 else None
    if parsed is None:
        if len(streams) > 1:
            raise ValueError(f"lease {lease_key} is not a multi-stream lease key")
        return StreamScope(stream_name(streams[0]) if is_stream_identifier(streams[0]) else streams[0])
    identifier = parsed[0]
    name = identifier_parts(identifier)[1]
    for stream in streams:
        if is_stream_identifier(stream):
            if stream == identifier:
                return pinned_scope(stream)
        elif stream_name(stream) == name:
            return StreamScope(stream, identifier)
    raise ValueError(f"lease {lease_key} names stream {identifier}, which is not one of this consumer's streams "
                     f"({', '.join(streams)})")
