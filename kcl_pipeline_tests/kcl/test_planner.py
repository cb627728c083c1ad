"""The planner against the conformance vectors (Disney and Java), plus the project's own rules."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kcl_pipeline.kcl.core.fleet.planner import AcquirePlan, LeaseAges, leases_to_acquire
from kcl_pipeline.kcl.core.lineage import (
    blocked_on_parents,
    child_leases_on_end,
    leases_to_create,
    leases_to_delete,
    parent_finished,
    scoped_leases,
    unknown_lease_keys,
)
from kcl_pipeline.kcl.core.model import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    HashKeyRange,
    Lease,
    Shard,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())


def vector_params(name: str) -> list:
    return [pytest.param(case, id=f"{i:02d}-{case['comment'][:70]}") for i, case in enumerate(load(name))]


def strategy(value) -> Checkpoint:
    if isinstance(value, dict):
        return Checkpoint(AT_TIMESTAMP, value[AT_TIMESTAMP])
    return Checkpoint(value)


def shard(d: dict) -> Shard:
    hkr = d.get("hash_key_range")
    snr = d.get("sequence_number_range") or {}
    return Shard(
        shard_id=d["shard_id"],
        parent_shard_id=d.get("parent_shard_id"),
        adjacent_parent_shard_id=d.get("adjacent_parent_shard_id"),
        hash_key_range=HashKeyRange(hkr["starting_hash_key"], hkr["ending_hash_key"]) if hkr else None,
        starting_sequence_number=snr.get("starting_sequence_number"),
        ending_sequence_number=snr.get("ending_sequence_number"),
    )


def lease(d: dict) -> Lease:
    cp = d["checkpoint"]
    return Lease(
        lease_key=d["lease_key"],
        checkpoint=Checkpoint(cp["sequence_number"], cp.get("sub_sequence_number", 0)),
        lease_owner=d.get("lease_owner"),
        lease_counter=d.get("lease_counter", 0),
        parent_shard_ids=tuple(d.get("parent_shard_ids", ())),
        starting_hash_key=d.get("starting_hash_key"),
        ending_hash_key=d.get("ending_hash_key"),
    )


def disney_fields(item: Lease) -> tuple:
    """What the Disney vectors compare (child_shard_ids is informational there)."""
    return (item.lease_key, item.lease_owner, item.lease_counter, item.checkpoint, item.parent_shard_ids,
            item.starting_hash_key, item.ending_hash_key)


# -- conformance: creating -----------------------------------------------------------------------

@pytest.mark.parametrize("case", vector_params("create_new_leases.json"))
def test_create_new_leases_disney(case):
    got = leases_to_create(strategy(case["strategy"]), [shard(s) for s in case["shards"]],
                           [lease(item) for item in case["leases"]])
    expected = [lease(item) for item in case["to_create"]]
    assert sorted(map(disney_fields, got)) == sorted(map(disney_fields, expected))
    assert len({item.lease_key for item in got}) == len(got), "a lease is planned twice"


@pytest.mark.parametrize("case", vector_params("hierarchical_shard_sync.json"))
def test_hierarchical_shard_sync_java(case):
    got = leases_to_create(strategy(case["strategy"]), [shard(s) for s in case["shards"]],
                           [lease(item) for item in case["leases"]])
    expected = [lease(item) for item in case["to_create"]]
    # The Java vectors compare lease keys and checkpoints only.
    assert sorted((i.lease_key, i.checkpoint) for i in got) == sorted((i.lease_key, i.checkpoint) for i in expected)


# -- conformance: acquiring ----------------------------------------------------------------------

@pytest.mark.parametrize("case", vector_params("calculate_acquire.json"))
@pytest.mark.parametrize("rng_seed", [0, 1, 2, 3, 4])
def test_calculate_acquire_disney(case, rng_seed):
    plan = leases_to_acquire(
        case["worker"], [lease(item) for item in case["leases"]], case["heartbeats"],
        expiry_seconds=10, leases_to_acquire=case["leases_to_acquire"], max_leases=case["max_leases"],
        recently_ended_by_us=case["recently_ended_by_us"], locally_worked=(), rng=random.Random(rng_seed),
    )
    picked = [item.lease_key for item in plan.leases]
    assert len(picked) == case["expected"]
    assert len(set(picked)) == len(picked)
    assert set(picked) <= set(case["available"])


# -- the project's own rules, beyond the vectors ---------------------------------------------------

def S(shard_id, *parents, closed=False, hkr=None):
    parents = list(parents) + [None, None]
    return Shard(shard_id, parents[0], parents[1], hkr, "1", "99" if closed else None)


def L(key, cp=TRIM_HORIZON, owner=None, counter=0, parents=()):
    return Lease(key, Checkpoint(cp), owner, counter, parent_shard_ids=tuple(parents))


def keys(leases):
    return sorted(item.lease_key for item in leases)


@pytest.mark.parametrize("initial", [TRIM_HORIZON, LATEST])
def test_no_child_while_a_parent_lease_is_in_progress(initial):
    # Merge of a (ended) and b (still read): the child must wait for b, whatever the strategy.
    shards = [S("a", closed=True), S("b", closed=True), S("c", "a", "b")]
    leases = [L("a", SHARD_END), L("b", "5")]
    assert leases_to_create(Checkpoint(initial), shards, leases) == []
    assert child_leases_on_end("a", shards, leases, Checkpoint(initial)) == []


def test_no_child_while_a_listed_parent_has_no_lease_yet():
    shards = [S("a", closed=True), S("b", closed=True), S("c", "a", "b")]
    assert keys(leases_to_create(Checkpoint(TRIM_HORIZON), shards, [L("a", SHARD_END)])) == ["b"]
    assert child_leases_on_end("a", shards, [L("a", "7")], Checkpoint(TRIM_HORIZON)) == []


@pytest.mark.parametrize("parent_checkpoint", [SHARD_END, "5"])
def test_a_latest_application_reads_a_child_whose_leased_parents_were_trimmed_from_its_start(parent_checkpoint):
    """Simulation seed 2577 (`mixed-batch-sizes`): a merge's parents were trimmed by retention before the child had
    a lease (one parent never ended: a lost batch held its checkpoint), and the cycle that deleted their leases
    created the child's at LATEST, as for a new root: the child's records before the tip were never read."""
    shards = [S("c", "a", "b")]  # a and b no longer listed
    leases = [L("a", SHARD_END), L("b", parent_checkpoint)]
    created = leases_to_create(Checkpoint(LATEST), shards, leases)
    assert [(lease.lease_key, lease.checkpoint) for lease in created] == [("c", Checkpoint(TRIM_HORIZON))]
    at = leases_to_create(Checkpoint(AT_TIMESTAMP, 1234), shards, leases)
    assert [lease.checkpoint for lease in at] == [Checkpoint(AT_TIMESTAMP, 1234)]


def test_a_new_latest_application_starts_a_child_of_trimmed_parents_at_the_tip():
    """Parents trimmed and never leased by this application: the child is the oldest data it meets (a root)."""
    shards = [S("c", "a", "b")]
    assert [lease.checkpoint for lease in leases_to_create(Checkpoint(LATEST), shards, [])] == [Checkpoint(LATEST)]


def test_never_a_lease_for_a_shard_with_a_leased_descendant():
    # Java deleted the finished parent's lease; Disney's orphan rule would re-create it (a re-read).
    shards = [S("p", closed=True), S("c1", "p"), S("c2", "p")]
    for initial in (TRIM_HORIZON, LATEST):
        assert leases_to_create(Checkpoint(initial), shards, [L("c1", "9"), L("c2", "9")]) == []


def test_children_of_ended_parents_start_at_trim_horizon_but_at_timestamp_keeps_its_time():
    shards = [S("p", closed=True), S("c", "p", hkr=HashKeyRange("0", "9"))]
    leases = [L("p", SHARD_END)]
    for initial, expected in [(Checkpoint(LATEST), Checkpoint(TRIM_HORIZON)),
                              (Checkpoint(TRIM_HORIZON), Checkpoint(TRIM_HORIZON)),
                              (Checkpoint(AT_TIMESTAMP, 1234), Checkpoint(AT_TIMESTAMP, 1234))]:
        (made,) = leases_to_create(initial, shards, leases)
        (on_end,) = child_leases_on_end("p", shards, [L("p", "5")], initial)
        for new in (made, on_end):
            assert new.checkpoint == expected
            assert (new.lease_key, new.lease_owner, new.lease_counter) == ("c", None, 0)
            assert new.parent_shard_ids == ("p",)
            assert (new.starting_hash_key, new.ending_hash_key) == ("0", "9")


def test_merged_child_is_created_by_the_parent_that_ends_last():
    shards = [S("a", closed=True), S("b", closed=True), S("m", "a", "b")]
    initial = Checkpoint(TRIM_HORIZON)
    # a ends first while b is still in progress: nothing; then b ends and sees a at SHARD_END.
    assert child_leases_on_end("a", shards, [L("a", "5"), L("b", "5")], initial) == []
    (child,) = child_leases_on_end("b", shards, [L("a", SHARD_END), L("b", "5")], initial)
    assert child.parent_shard_ids == ("a", "b")


def test_child_on_end_when_the_other_parent_is_gone_or_child_exists():
    shards = [S("b", closed=True), S("m", "a", "b")]  # parent a trimmed out of the listing
    assert keys(child_leases_on_end("b", shards, [L("b", "5")], Checkpoint(TRIM_HORIZON))) == ["m"]
    assert child_leases_on_end("b", shards, [L("b", "5"), L("m", "3")], Checkpoint(TRIM_HORIZON)) == []


def test_split_children_are_both_created_on_end():
    shards = [S("p", closed=True), S("c1", "p"), S("c2", "p"), S("x")]
    assert keys(child_leases_on_end("p", shards, [L("p", "5"), L("x", "1")], Checkpoint(LATEST))) == ["c1", "c2"]


def test_leases_of_unlisted_shards_do_not_block_children():
    # The parent shard was trimmed; its unfinished lease is about to be deleted and must not block.
    shards = [S("c", "p")]
    assert keys(leases_to_create(Checkpoint(TRIM_HORIZON), shards, [L("p", "5")])) == ["c"]
    assert keys(leases_to_delete([L("p", "5"), L("c", "1")], shards)) == ["p"]


def test_delete_keeps_every_lease_when_the_listing_is_empty():
    assert leases_to_delete([L("a"), L("b")], []) == []


# -- scoped deletion (a shared table: other streams, multi-stream keys, KCL 3.x entities) -------------------

MULTI_STREAM_KEY = "123456789012:orders:1700000000:shardId-000000000001"


def test_foreign_leases_are_never_deleted():
    # A KCL multi-stream lease, another stream's lease under the same application name, and a lease key this
    # consumer does not understand: none is a shard of this stream, none is named by its lineage.
    ours = [S("shardId-000000000001"), S("shardId-000000000002")]
    foreign = [L(MULTI_STREAM_KEY, "7"), L("shardId-000000000099", "42", owner="java-peer"), L("weird key")]
    assert leases_to_delete(foreign + [L("shardId-000000000001", "5")], ours) == []


def test_gone_lease_is_deleted_only_when_the_stream_proves_it_was_ours():
    # Trimmed past retention: a listed child still names it as a parent.
    shards = [S("c1", "gone"), S("c2", "gone")]
    assert keys(leases_to_delete([L("gone", "5", counter=3), L("c1", "9"), L("c2", "9")], shards)) == ["gone"]
    # Deletion carries the observed counter (the table conditions the delete on it).
    assert leases_to_delete([L("gone", "5", counter=3)], shards)[0].lease_counter == 3


def test_ended_lease_is_deleted_only_once_every_child_has_started():
    shards = [S("p", closed=True), S("c1", "p"), S("c2", "p")]
    ended = L("p", SHARD_END)
    assert leases_to_delete([ended, L("c1", "9"), L("c2", TRIM_HORIZON)], shards) == []   # c2 not started
    assert leases_to_delete([ended, L("c1", "9")], shards) == []                           # c2 has no lease
    assert keys(leases_to_delete([ended, L("c1", "9"), L("c2", "3")], shards)) == ["p"]
    # An ended child removed already, with a grandchild leased, counts as finished.
    shards.append(S("g", "c2"))
    assert keys(leases_to_delete([ended, L("c1", "9"), L("g", "1")], shards)) == ["p"]
    # A lease still in progress is never deleted, whatever its children.
    assert leases_to_delete([L("p", "77"), L("c1", "9"), L("c2", "3")], shards) == []


def test_scoped_leases_are_only_the_listed_shards():
    shards = [S("shardId-000000000001")]
    mine = L("shardId-000000000001")
    assert scoped_leases([mine, L(MULTI_STREAM_KEY), L("shardId-000000000099")], shards) == [mine]
    assert unknown_lease_keys([mine, L(MULTI_STREAM_KEY)], shards) == {MULTI_STREAM_KEY}


# -- parent gating (Java's BlockOnParentShard, at acquisition) --------------------------------------------

def test_merged_child_created_early_is_not_acquired_while_a_parent_is_in_progress():
    # A Java peer creates a merged child as soon as both parent leases exist; one parent is still read.
    leases = [L("a", SHARD_END), L("b", "42", owner="peer", counter=5), L("ab", TRIM_HORIZON, parents=("a", "b"))]
    plan = leases_to_acquire("me", leases, {}, expiry_seconds=10, leases_to_acquire=4, max_leases=10,
                             rng=random.Random(1))
    assert "ab" not in keys(plan.leases)
    # Once b is SHARD_END (or its lease is gone) the child is taken.
    leases[1] = L("b", SHARD_END)
    assert keys(leases_to_acquire("me", leases, {}, expiry_seconds=10, leases_to_acquire=4, max_leases=10,
                                  rng=random.Random(1)).take) == ["ab"]
    assert keys(leases_to_acquire("me", [leases[0], leases[2]], {}, expiry_seconds=10, leases_to_acquire=4,
                                  max_leases=10, rng=random.Random(1)).take) == ["ab"]


def test_a_drained_parent_unblocks_its_children_only_when_the_pipeline_says_so():
    drained = Lease("p", Checkpoint("42"), "peer", 5, extra={"landingShardEnd": True})
    child = L("c", TRIM_HORIZON, parents=("p",))
    assert not parent_finished(drained) and parent_finished(drained, "landingShardEnd")
    assert blocked_on_parents(child, {"p": drained}) == ["p"]
    assert blocked_on_parents(child, {"p": drained}, "landingShardEnd") == []
    assert keys(leases_to_create(Checkpoint(TRIM_HORIZON), [S("p", closed=True), S("c", "p")],
                                 [drained], "landingShardEnd")) == ["c"]
    assert leases_to_create(Checkpoint(TRIM_HORIZON), [S("p", closed=True), S("c", "p")], [drained]) == []


def test_create_rejects_a_non_starting_initial_position():
    with pytest.raises(ValueError, match="initial position"):
        leases_to_create(Checkpoint("5"), [S("a")], [])
    with pytest.raises(ValueError, match="initial position"):
        child_leases_on_end("a", [S("a")], [], Checkpoint(SHARD_END))


def test_create_is_linear_in_the_order_listed():
    shards = [S(f"s{i}") for i in range(5)]
    assert [item.lease_key for item in leases_to_create(Checkpoint(TRIM_HORIZON), shards, [])] == \
        [f"s{i}" for i in range(5)]


# -- LeaseAges ---------------------------------------------------------------------------------------

def test_lease_ages_first_sight_is_young_and_changes_reset_the_age():
    ages = LeaseAges()
    ages.observe([L("a", owner="w1", counter=5)], now=100.0)
    assert ages.age("a", 100.0) == 0.0
    assert not ages.expired("a", 105.0, 10.0)
    assert ages.age("unknown", 100.0) is None and not ages.expired("unknown", 1e9, 10.0)
    ages.observe([L("a", owner="w1", counter=5)], now=108.0)  # unchanged: keeps ageing
    assert ages.age("a", 111.0) == 11.0 and ages.expired("a", 111.0, 10.0)
    assert not ages.expired("a", 110.0, 10.0)  # expired means strictly older than the expiry
    ages.observe([L("a", owner="w1", counter=6)], now=112.0)  # heartbeat seen
    assert ages.age("a", 112.0) == 0.0
    ages.observe([L("a", owner="w2", counter=6)], now=115.0)  # owner change alone also counts
    assert ages.ages(116.0) == {"a": 1.0}
    ages.observe([], now=120.0)  # deleted leases are forgotten
    assert ages.age("a", 120.0) is None


# -- acquiring: the project's own rules -------------------------------------------------------------

def acquire(worker, leases, ages, **kw):
    options = dict(expiry_seconds=10.0, leases_to_acquire=8, max_leases=8, recently_ended_by_us=(),
                   locally_worked=(), rng=random.Random(7))
    options.update(kw)
    return leases_to_acquire(worker, leases, ages, **options)


def test_acquire_never_takes_a_lease_worked_locally_but_retakes_our_own_expired_lease():
    leases = [L("a", "5", owner="me", counter=3), L("b", "5", owner="me", counter=3)]
    plan = acquire("me", leases, {"a": 30.0, "b": 30.0}, locally_worked={"a"})
    assert keys(plan.take) == ["b"] and plan.steal is None


def test_acquire_respects_max_leases_and_leases_to_acquire():
    free = [L(f"f{i}") for i in range(6)]
    mine = [L(f"m{i}", "5", owner="me", counter=2) for i in range(3)]
    ages = {item.lease_key: 1.0 for item in mine}
    assert len(acquire("me", free + mine, ages, max_leases=5).take) == 2
    assert len(acquire("me", free + mine, ages, max_leases=5, locally_worked={"x"}).take) == 1
    assert acquire("me", free + mine, ages, max_leases=3) == AcquirePlan()
    assert len(acquire("me", free, {}, leases_to_acquire=1).take) == 1
    with pytest.raises(ValueError):
        acquire("me", free, {}, leases_to_acquire=-1)


def test_acquire_skips_ended_leases_and_prefers_children_of_our_ended_shards():
    leases = [L("p", SHARD_END), L("c", parents=("p",)), L("other"), L("z", SHARD_END, owner="w9")]
    assert keys(acquire("me", leases, {}).take) == ["c", "other"]
    assert keys(acquire("me", leases, {}, recently_ended_by_us={"p"}).take) == ["c"]
    # When the children are gone (taken by others) the preference falls back to everything free.
    assert keys(acquire("me", leases[2:], {}, recently_ended_by_us={"p"}).take) == ["other"]


def owned(owner, n, start=0):
    return [L(f"{owner}-{i}", "5", owner=owner, counter=1) for i in range(start, start + n)]


@pytest.mark.parametrize(
    "ours, others, steals",
    [
        (0, [1], False),          # 1 vs 0: spread 1 is balanced
        (0, [2], True),           # 2 vs 0
        (1, [2, 2], False),       # ours + 2 = 3 > 2
        (1, [3, 3, 3], True),     # integer mean 2, threshold max(3, 3)
        (2, [3, 3, 3], False),    # spread 1
        (0, [1, 1, 1, 1, 2], True),  # mean 1, threshold max(2, 2): the 2 gives one up
    ],
)
def test_steal_threshold(ours, others, steals):
    leases = owned("me", ours)
    for i, count in enumerate(others):
        leases += owned(f"w{i}", count)
    ages = {item.lease_key: 1.0 for item in leases}
    plan = acquire("me", leases, ages)
    assert plan.take == []
    assert (plan.steal is not None) == steals
    if steals:
        richest = max(others)
        assert plan.steal.lease_owner != "me"
        assert sum(1 for item in leases if item.lease_owner == plan.steal.lease_owner) == richest


def test_steal_never_reaches_beyond_max_leases_or_a_local_lease_or_a_dead_owner():
    leases = owned("me", 1) + owned("w1", 4)
    ages = {item.lease_key: 1.0 for item in leases}
    assert acquire("me", leases, ages, max_leases=1).steal is None
    local = {item.lease_key for item in leases if item.lease_owner == "w1"}
    assert acquire("me", leases, ages, locally_worked=local).steal is None
    # w1's leases all expired: they are taken, not stolen.
    dead = {item.lease_key: (30.0 if item.lease_owner == "w1" else 1.0) for item in leases}
    plan = acquire("me", leases, dead, leases_to_acquire=1)
    assert len(plan.take) == 1 and plan.take[0].lease_owner == "w1" and plan.steal is None


def test_acquire_pick_depends_on_the_rng_not_on_scan_order():
    leases = [L(f"s{i:02d}") for i in range(20)]
    a = acquire("me", leases, {}, leases_to_acquire=3, rng=random.Random(5))
    b = acquire("me", list(reversed(leases)), {}, leases_to_acquire=3, rng=random.Random(5))
    assert keys(a.take) == keys(b.take)


def test_an_earlier_incarnation_of_this_consumer_is_never_stolen_from_only_taken_when_expired():
    # A reloaded code server: the old process's workers are stopping; stealing from them would put two workers
    # on one lease for nothing. Its leases are not counted for balance either.
    leases = [L("a", "5", owner="me#old", counter=3), L("b", "5", owner="me#old", counter=3)]
    kw = dict(expiry_seconds=10, leases_to_acquire=2, max_leases=10, rng=random.Random(3))
    assert leases_to_acquire("me#new", leases, {}, **kw).steal is not None  # a stranger would be stolen from
    plan = leases_to_acquire("me#new", leases, {}, predecessor=lambda o: o.startswith("me#"), **kw)
    assert plan.leases == []
    expired = leases_to_acquire("me#new", leases, {"a": 11.0}, predecessor=lambda o: o.startswith("me#"), **kw)
    assert keys(expired.take) == ["a"]
