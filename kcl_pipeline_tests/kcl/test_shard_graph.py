"""The shard graph over a ListShards result: lineage, open/closed, roots, leaves."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.model import Shard
from kcl_pipeline.kcl.core.shard_graph import ShardGraph


def S(shard_id, parent=None, adjacent=None, ending=None):
    return Shard(shard_id, parent, adjacent, None, "1", ending)


# Java's "graph A" (lease-lifecycle doc): 0..5 at the start; 6 = merge(0,1), 7 = merge(2,3),
# 8 = merge(6,7), 9 and 10 = split(5); 4 stays open throughout. Ending numbers as Kinesis reports them.
GRAPH_A = [
    S("0", ending="102"), S("1", ending="102"), S("2", ending="102"), S("3", ending="102"), S("4"),
    S("5", ending="102"), S("6", "0", "1", ending="205"), S("7", "2", "3", ending="205"),
    S("8", "6", "7"), S("9", "5"), S("10", "5"),
]


@pytest.fixture
def graph_a():
    return ShardGraph(GRAPH_A)


@pytest.mark.parametrize(
    "shard_id, parents, children, ancestors, descendants",
    [
        ("0", (), ("6",), set(), {"6", "8"}),
        ("4", (), (), set(), set()),
        ("5", (), ("9", "10"), set(), {"9", "10"}),
        ("6", ("0", "1"), ("8",), {"0", "1"}, {"8"}),
        ("8", ("6", "7"), (), {"0", "1", "2", "3", "6", "7"}, set()),
        ("10", ("5",), (), {"5"}, set()),
    ],
)
def test_lineage(graph_a, shard_id, parents, children, ancestors, descendants):
    assert graph_a.parents(shard_id) == parents
    assert graph_a.children(shard_id) == children
    assert graph_a.ancestors(shard_id) == ancestors
    assert graph_a.descendants(shard_id) == descendants


def test_open_roots_leaves_keep_listing_order(graph_a):
    assert graph_a.open_shards() == ["4", "8", "9", "10"]
    assert graph_a.roots() == ["0", "1", "2", "3", "4", "5"]
    assert graph_a.leaves() == ["4", "8", "9", "10"]
    assert [s.shard_id for s in graph_a] == [s.shard_id for s in GRAPH_A]
    assert len(graph_a) == 11 and "8" in graph_a and "99" not in graph_a


def test_a_parent_is_closed_even_without_an_ending_sequence_number():
    # Emulators (and some listings) omit EndingSequenceNumber: having a listed child closes a shard.
    g = ShardGraph([S("p"), S("c", "p"), S("q", ending="5"), S("r")])
    assert g.is_closed("p") and g.is_closed("q")
    assert g.is_open("c") and g.is_open("r")


def test_trimmed_parents_are_kept_by_id_but_not_walked():
    g = ShardGraph([S("c", "gone"), S("d", "c", "gone2")])
    assert g.parents("c") == ("gone",) and g.listed_parents("c") == ()
    assert g.roots() == ["c"]
    assert g.ancestors("d") == {"c"}
    assert g.children("gone") == ("c",)
    assert g.descendants_of(["gone"]) == {"c", "d"}


def test_set_walks(graph_a):
    assert graph_a.ancestors_of(["8", "9"]) == {"0", "1", "2", "3", "5", "6", "7", "8", "9"}
    assert graph_a.strict_ancestors_of(["6", "9"]) == {"0", "1", "5"}
    assert graph_a.descendants_of(["6", "5"]) == {"6", "8", "5", "9", "10"}
    assert graph_a.strict_descendants_of(["6", "5"]) == {"8", "9", "10"}
    assert graph_a.ancestors_of(["unlisted"]) == set()


def test_long_lineage_does_not_recurse():
    chain = [S("s0", ending="1")] + [S(f"s{i}", f"s{i - 1}", ending="1") for i in range(1, 5000)]
    g = ShardGraph(chain)
    assert len(g.ancestors("s4999")) == 4999
    assert len(g.descendants("s0")) == 4999


def test_duplicate_and_unknown_shards_are_clear_errors():
    with pytest.raises(ValueError, match="listed twice"):
        ShardGraph([S("a"), S("a")])
    with pytest.raises(KeyError, match="not in the listing"):
        ShardGraph([S("a")]).parents("b")
