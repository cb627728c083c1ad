"""Shard lineage, as pure functions: which leases are this stream's, which parents still block a child, and which
leases to delete or create as shards split, merge and age out of retention.

No clock and no I/O: the manager and the worker feed in what they scanned and listed. Everything is linear in
the number of shards and leases (dicts and sets, one graph walk per question).
"""

from typing import Mapping, Sequence

from .model import AT_TIMESTAMP, LATEST, TRIM_HORIZON, Checkpoint, Lease, Shard
from .shard_graph import ShardGraph

# -- scope: which leases are this stream's -----------------------------------------------------------

def scoped_leases(leases: Sequence[Lease], shards: Sequence[Shard]) -> list[Lease]:
    """The leases of this stream's listed shards: the only ones this consumer may acquire, renew or steal.

    A table may be shared: a KCL multi-stream application (keys `account:stream:epoch:shardId`), another
    application of the same name on another stream, KCL 3.x's other entities. Keys it does not know are
    never touched.
    """
    listed = {shard.shard_id for shard in shards}
    return [lease for lease in leases if lease.lease_key in listed]


def unknown_lease_keys(leases: Sequence[Lease], shards: Sequence[Shard]) -> frozenset[str]:
    """Lease keys not among the listed shards (new shards since the last listing, or other streams')."""
    listed = {shard.shard_id for shard in shards}
    return frozenset(lease.lease_key for lease in leases if lease.lease_key not in listed)


def parent_finished(lease: Lease | None, drained_attribute: str | None = None) -> bool:
    """Reading order: a child may be read once every parent is finished — its lease SHARD_END or gone
    (Java's BlockOnParentShard), or, with `drained_attribute`, marked as having every record delivered
    durably (the pipeline lands a parent's last record long before it may write SHARD_END)."""
    if lease is None or lease.is_ended:
        return True
    return drained_attribute is not None and lease.extra.get(drained_attribute) is True


def blocked_on_parents(lease: Lease, by_key: Mapping[str, Lease | None],
                       drained_attribute: str | None = None) -> list[str]:
    """The parents of `lease` not yet finished (empty: it may be read)."""
    return [p for p in lease.parent_shard_ids if not parent_finished(by_key.get(p), drained_attribute)]


# -- deleting ------------------------------------------------------------------------------------

def leases_to_delete(leases: Sequence[Lease], shards: Sequence[Shard]) -> list[Lease]:
    """Leases of this stream whose shard is finished; each is deleted on condition of its observed counter.

    Finished (Java's lease cleanup): SHARD_END with every child's lease started (its checkpoint past the
    starting sentinel) or itself finished and removed; or gone from the stream past retention — provably
    this stream's because a listed shard still names it as a parent. A lease this consumer cannot prove
    to be its own (other streams, other applications, keys it does not understand) is never deleted.
    An empty listing deletes nothing: a stream always has an open shard, so an empty result is a failed or
    misdirected call, never evidence that every lease is obsolete.
    """
    if not shards:
        return []
    graph = ShardGraph(shards)
    by_key = {lease.lease_key: lease for lease in leases}
    named_as_parent = {parent for shard in shards for parent in shard.parent_ids}
    leased_below = graph.strict_ancestors_of({k: v for k, v in by_key.items() if k in graph})
    doomed: list[Lease] = []
    for lease in leases:
        key = lease.lease_key
        if key not in graph:
            if key in named_as_parent:
                doomed.append(lease)  # trimmed out of the stream: nothing can be read from it any more
            continue
        if not lease.is_ended:
            continue
        children = graph.children(key)
        if children and all(_started(by_key.get(c)) or (c not in by_key and c in leased_below) for c in children):
            doomed.append(lease)
    return doomed


def _started(lease: Lease | None) -> bool:
    return lease is not None and not lease.checkpoint.is_starting_sentinel


# -- creating ------------------------------------------------------------------------------------

def _starting_positions(initial: Checkpoint) -> tuple[Checkpoint, Checkpoint]:
    """(first use, child of an ended parent). Children start at TRIM_HORIZON so that nothing between the
    parent's end and the child's first record is skipped; AT_TIMESTAMP keeps its timestamp (Java and
    Disney agree), which still reads the child from its start when the timestamp is older."""
    if initial.sequence_number not in (TRIM_HORIZON, LATEST, AT_TIMESTAMP):
        raise ValueError(
            f"initial position must be TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {initial.sequence_number!r}"
        )
    if initial.sequence_number == AT_TIMESTAMP:
        return initial, initial
    return initial, Checkpoint(TRIM_HORIZON)


def _new_lease(graph: ShardGraph, shard: Shard, checkpoint: Checkpoint) -> Lease:
    hkr = shard.hash_key_range
    return Lease(
        lease_key=shard.shard_id,
        checkpoint=checkpoint,
        lease_owner=None,
        lease_counter=0,
        parent_shard_ids=graph.parents(shard.shard_id),
        starting_hash_key=hkr.starting_hash_key if hkr else None,
        ending_hash_key=hkr.ending_hash_key if hkr else None,
    )


def _listed_leases(graph: ShardGraph, leases: Sequence[Lease]) -> dict[str, Lease]:
    # A lease whose shard is not listed is about to be deleted: its shard is gone, nothing waits for it.
    return {lease.lease_key: lease for lease in leases if lease.lease_key in graph}


def _parents_done(graph: ShardGraph, shard_id: str, leases: Mapping[str, Lease], ended: str | None = None,
                  drained_attribute: str | None = None) -> bool:
    """Every parent has a finished lease or is gone from the listing (`ended` counts as SHARD_END)."""
    for parent in graph.parents(shard_id):
        if parent == ended or parent not in graph:
            continue
        lease = leases.get(parent)
        if lease is None or not parent_finished(lease, drained_attribute):
            return False
    return True


def leases_to_create(initial: Checkpoint, shards: Sequence[Shard], leases: Sequence[Lease],
                     drained_attribute: str | None = None) -> list[Lease]:
    """The leases missing from the table, in listing order (conditional puts: the first creator wins).

    One rule, for an empty table and a running fleet alike. Never a lease for a shard with a leased
    descendant (it was processed, or deliberately skipped) nor for a child of a parent lease that has not
    reached SHARD_END (its records would overtake the parent's). Otherwise a shard gets a lease when:
      * all its listed parents' leases are SHARD_END (or drained, see `parent_finished`): the child of
        ended parents, from TRIM_HORIZON (AT_TIMESTAMP keeps the timestamp); the worker that ended the
        parent usually made it already;
      * TRIM_HORIZON / AT_TIMESTAMP: it is a root (oldest generation present) — read the whole history;
      * LATEST, for a shard descending from no lease: it is open (the newest data), or it is the parent
        of an unleased descendant of a lease — Java's gap fill, without which that descendant's other
        parent would never be read and the descendant never unblocked;
      * a child whose parents are all gone from the listing (trimmed by retention) while one still has a
        lease in the table: this application was reading its parents, so it reads the child from
        TRIM_HORIZON (AT_TIMESTAMP keeps the timestamp). Taken for a root, a LATEST application would start it
        at the tip and never read what the child holds (its parents' leases can be deleted in the very
        cycle that creates it). Workers create children at SHARD_END first; this
        covers a parent whose end never came (a lost batch held it, its shard trimmed meanwhile). A new
        application, with no lease of those parents, still starts such a child as a root.
    """
    first_use, after_parent = _starting_positions(initial)
    graph = ShardGraph(shards)
    by_key = _listed_leases(graph, leases)
    # Both sets come from one linear walk each, so the loop below does O(1) work per shard.
    has_leased_descendant = graph.strict_ancestors_of(by_key)
    under_a_lease = graph.descendants_of(by_key)  # leased shards and everything below them
    latest = initial.sequence_number == LATEST
    leased = {lease.lease_key for lease in leases}  # listed or not: a lease of a trimmed shard is still there

    created: list[Lease] = []
    for shard_id, shard in graph.shards.items():
        if shard_id in by_key or shard_id in has_leased_descendant:
            continue
        listed_parents = graph.listed_parents(shard_id)
        if listed_parents:
            parent_leases = [by_key.get(p) for p in listed_parents]
            if any(lease is not None and not parent_finished(lease, drained_attribute) for lease in parent_leases):
                continue  # a parent is still being read
            if all(lease is not None for lease in parent_leases):
                created.append(_new_lease(graph, shard, after_parent))
                continue
        elif any(p in leased for p in graph.parents(shard_id)):
            created.append(_new_lease(graph, shard, after_parent))  # its parents trimmed: read on from them
            continue
        elif not latest:
            created.append(_new_lease(graph, shard, first_use))  # a root: TRIM_HORIZON / AT_TIMESTAMP start here
            continue
        if latest and shard_id not in under_a_lease and (
            graph.is_open(shard_id)
            or any(c not in by_key and c in under_a_lease for c in graph.children(shard_id))
        ):
            created.append(_new_lease(graph, shard, first_use))
    return created


def child_leases_on_end(
    ended_shard_id: str, shards: Sequence[Shard], leases: Sequence[Lease], initial: Checkpoint,
    drained_attribute: str | None = None,
) -> list[Lease]:
    """The leases the worker that just ended `ended_shard_id` creates for its children.

    `leases` may predate the SHARD_END write, so the ended shard counts as ended whatever it says. A merged
    child waits until every other parent is SHARD_END or gone; whichever parent ends last creates it.
    """
    _, after_parent = _starting_positions(initial)
    graph = ShardGraph(shards)
    by_key = _listed_leases(graph, leases)
    children = [c for c in graph.children(ended_shard_id) if c not in by_key]
    has_leased_descendant = graph.strict_ancestors_of(by_key)
    return [
        _new_lease(graph, graph.shard(child), after_parent)
        for child in children
        if child not in has_leased_descendant
        and _parents_done(graph, child, by_key, ended=ended_shard_id, drained_attribute=drained_attribute)
    ]


