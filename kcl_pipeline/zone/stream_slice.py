"""One stream's slice of a multi-stream fleet: its current incarnation, leases, shards and landing directory.

The lease table names a multi-stream application's leases `<account>:<name>:<creationEpoch>:<shardId>`; the
landing zone names shards by id under the incarnation's directory `<name>@<creationEpoch>`. The pipeline's
planning (window completeness, the checkpoint plan) works in lease keys, so landed batches are renamed to
lease keys (`lease_key`); readers that match leases to batches by shard id (the audit, a backfill) get the
leases renamed the other way (`leases_by_shard_id`). A single stream's lease key is its shard id: both are
the identity.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.model import Lease, Shard
from ..kcl.core.streams import StreamScope, identifier_parts, parse_multi_stream_key
from ..kcl.shells.aws import client
from ..kcl.shells.shards import list_shards, stream_scope
from .layout import landing_directory


@dataclass(frozen=True)
class StreamSlice:
    scope: StreamScope
    leases: list[Lease]
    shards: list[Shard]  # named by lease key

    @property
    def directory(self) -> str:
        """Where this incarnation lands (the landing zone's stream directory)."""
        return landing_directory(self.scope.stream, self.scope.identifier)

    def lease_key(self, shard_id: str) -> str:
        return self.scope.lease_key(shard_id)

    def leases_by_shard_id(self) -> list[Lease]:
        """The leases renamed to shard ids (parents and children too); read-only views, never written back."""
        if self.scope.identifier is None:
            return list(self.leases)
        shard_id = self.scope.shard_id
        return [replace(lease, lease_key=shard_id(lease.lease_key),
                        parent_shard_ids=tuple(shard_id(p) for p in lease.parent_shard_ids),
                        child_shard_ids=tuple(shard_id(c) for c in lease.child_shard_ids))
                for lease in self.leases]


def slice_of(scope: StreamScope, leases: Iterable[Lease], shards: Iterable[Shard]) -> StreamSlice:
    """The stream's part of the fleet from leases and shards already named by lease key (the lease manager's)."""
    return StreamSlice(scope, [lease for lease in leases if scope.owns(lease.lease_key)],
                       [shard for shard in shards if scope.owns(shard.shard_id)])


def earlier_incarnations(scope: StreamScope, leases: Iterable[Lease]) -> list[str]:
    """The identifiers of earlier incarnations of the stream (deleted, then re-created under the same name)
    that still have unfinished leases in the table: what they landed after their last complete window is in
    no window of the stream's partitions, which follow the current incarnation."""
    if scope.identifier is None:
        return []
    found = set()
    for lease in leases:
        parsed = parse_multi_stream_key(lease.lease_key)
        if parsed is not None and parsed[0] != scope.identifier and not lease.is_ended \
                and identifier_parts(parsed[0])[1] == scope.name:
            found.add(parsed[0])
    return sorted(found)


def current_scope(stream: str, multi_stream: bool, aws: AwsSettings, kinesis=None) -> StreamScope:
    """The stream's current incarnation (DescribeStreamSummary; no call for a single-stream application)."""
    if not multi_stream:
        return StreamScope(stream)
    return stream_scope(kinesis or client("kinesis", aws), stream)


def read_slice(stream: str, multi_stream: bool, aws: AwsSettings, leases: Iterable[Lease], *,
               shards: bool = True) -> StreamSlice:
    """The stream's slice as a run sees it now: its current incarnation, its leases in `leases`, its shards
    from ListShards (`shards=False`: none listed, for readers that need only the leases and the directory)."""
    kinesis = client("kinesis", aws)
    scope = current_scope(stream, multi_stream, aws, kinesis)
    return slice_of(scope, leases, scope.shards(list_shards(kinesis, stream)) if shards else [])
