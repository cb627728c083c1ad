"""The lineage of a stream's shards as one ListShards call describes it.

Kinesis records a shard's parents (one after a split, two after a merge); a parent may already be trimmed
out of the listing, so parents are kept by id whether listed or not, while children are only ever listed
shards. Every walk is iterative (a long-lived stream can have thousands of generations) and linear in the
number of shards, so the planner stays fast on 10,000-shard streams.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator, Sequence

from .model import Shard


class ShardGraph:
    """Parents, children, ancestry and open/closed state of a ListShards result (listing order kept)."""

    def __init__(self, shards: Sequence[Shard]):
        self.shards: dict[str, Shard] = {}
        for shard in shards:
            if shard.shard_id in self.shards:
                raise ValueError(f"shard {shard.shard_id} is listed twice")
            self.shards[shard.shard_id] = shard
        # Precomputed once: the planner asks these questions for every shard of every cycle.
        self._parents: dict[str, tuple[str, ...]] = {}
        self._listed_parents: dict[str, tuple[str, ...]] = {}
        self._children: dict[str, list[str]] = {}
        listed = self.shards
        children = self._children
        for shard_id, shard in listed.items():
            parent, adjacent = shard.parent_shard_id, shard.adjacent_parent_shard_id
            if not parent and not adjacent:
                self._parents[shard_id] = self._listed_parents[shard_id] = ()
                continue
            parents = self._parents[shard_id] = shard.parent_ids
            self._listed_parents[shard_id] = tuple([p for p in parents if p in listed])
            for p in parents:
                if p in children:
                    children[p].append(shard_id)
                else:
                    children[p] = [shard_id]

    def __contains__(self, shard_id: object) -> bool:
        return shard_id in self.shards

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Iterator[Shard]:
        return iter(self.shards.values())

    def shard(self, shard_id: str) -> Shard:
        try:
            return self.shards[shard_id]
        except KeyError:
            raise KeyError(f"shard {shard_id} is not in the listing") from None

    def parents(self, shard_id: str) -> tuple[str, ...]:
        """Parent ids in the order (parent, adjacent parent); they may be absent from the listing."""
        try:
            return self._parents[shard_id]
        except KeyError:
            raise KeyError(f"shard {shard_id} is not in the listing") from None

    def listed_parents(self, shard_id: str) -> tuple[str, ...]:
        try:
            return self._listed_parents[shard_id]
        except KeyError:
            raise KeyError(f"shard {shard_id} is not in the listing") from None

    def children(self, shard_id: str) -> tuple[str, ...]:
        """Listed shards that name `shard_id` as a parent (it need not be listed itself)."""
        return tuple(self._children.get(shard_id, ()))

    def is_closed(self, shard_id: str) -> bool:
        """Closed: it has an ending sequence number, or a listed shard names it as parent.

        The second test matters because some listings (and emulators) omit the ending sequence number.
        """
        return self.shard(shard_id).ending_sequence_number is not None or shard_id in self._children

    def is_open(self, shard_id: str) -> bool:
        return not self.is_closed(shard_id)

    def open_shards(self) -> list[str]:
        return [s for s in self.shards if self.is_open(s)]

    def roots(self) -> list[str]:
        """The oldest generation present: shards with no listed parent."""
        return [s for s, parents in self._listed_parents.items() if not parents]

    def leaves(self) -> list[str]:
        """Shards with no listed child."""
        return [s for s in self.shards if s not in self._children]

    def ancestors(self, shard_id: str) -> set[str]:
        """Every listed shard reachable through parents (not `shard_id` itself)."""
        return self.strict_ancestors_of([shard_id])

    def descendants(self, shard_id: str) -> set[str]:
        """Every listed shard reachable through children (not `shard_id` itself)."""
        return self.strict_descendants_of([shard_id])

    def ancestors_of(self, shard_ids: Iterable[str]) -> set[str]:
        """Listed shards that are one of `shard_ids` or an ancestor of one.

        One walk for a whole set: O(shards), however many starting points.
        """
        return self._walk_up(deque(s for s in shard_ids if s in self.shards))

    def strict_ancestors_of(self, shard_ids: Iterable[str]) -> set[str]:
        """Listed shards that are an ancestor of at least one of `shard_ids`."""
        todo: deque[str] = deque()
        listed_parents = self._listed_parents
        for s in shard_ids:
            parents = listed_parents.get(s)
            if parents:
                todo.extend(parents)
        return self._walk_up(todo)

    def _walk_up(self, todo: deque[str]) -> set[str]:
        seen: set[str] = set()
        listed_parents = self._listed_parents
        while todo:
            current = todo.popleft()
            if current in seen:
                continue
            seen.add(current)
            todo.extend(listed_parents[current])
        return seen

    def descendants_of(self, shard_ids: Iterable[str]) -> set[str]:
        """Listed shards that are one of `shard_ids` or descend from one (ids may be unlisted parents)."""
        return self._walk_down(deque(shard_ids))

    def strict_descendants_of(self, shard_ids: Iterable[str]) -> set[str]:
        """Listed shards that descend from at least one of `shard_ids`."""
        todo: deque[str] = deque()
        for s in shard_ids:
            todo.extend(self._children.get(s, ()))
        return self._walk_down(todo)

    def _walk_down(self, todo: deque[str]) -> set[str]:
        seen: set[str] = set()
        children = self._children
        while todo:
            current = todo.popleft()
            if current in seen:
                continue
            if current in self.shards:
                seen.add(current)
            below = children.get(current)
            if below:
                todo.extend(below)
        return seen
