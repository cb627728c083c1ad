"""Pure lease transitions: each DynamoDB condition passing and failing, and what each write leaves."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table import lease_rules as rules

SEQ56 = "49590338271490256608559692538361571095921575989136588898"  # a real-sized Kinesis sequence number
assert len(SEQ56) == 56


def lease(cp="100", sub=0, owner="w1", counter=7, switches=2, **kw) -> Lease:
    return Lease("shardId-000000000001", Checkpoint(cp, sub), owner, counter, switches,
                 parent_shard_ids=("shardId-000000000000",), **kw)


def ours(held: Lease) -> Lease:
    """The lease as this protocol's acquire leaves it held: its owner wrote leaseClaimOwner."""
    return replace(held, extra={**held.extra, rules.CLAIM_OWNER_ATTRIBUTE: held.lease_owner})


# -- create ------------------------------------------------------------------------------------------

def test_create_only_when_absent_and_copies():
    new = Lease("s", Checkpoint(TRIM_HORIZON), extra={"x": 1})
    made = rules.create(None, new)
    assert made == new and made is not new and made.extra is not new.extra
    assert rules.create(lease(), new) is None


# -- acquire -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("owner", [None, "w1"])
def test_acquire_passes_when_exactly_as_observed_and_moves_the_counter_on(owner):
    before = lease(owner=owner, extra={"pendingCheckpoint": "5", "checkpointOwner": "w1", "progress": "kept",
                                       "throughputKBps": 3}, child_shard_ids=("c1",))
    after = rules.acquire(before, "w2", owner, 7)
    assert after.lease_owner == "w2" and after.lease_counter == 8  # observed + 1, never reset to 1
    assert after.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint + 1
    # The hand-off in flight removed (Java's take deletes checkpointOwner); Java's prepared checkpoint kept for
    # the next owner's processor (Java's take keeps pendingCheckpoint); unknown ones, throughput, children kept.
    assert after.extra == {"pendingCheckpoint": "5", "progress": "kept", "throughputKBps": 3,
                           rules.CLAIM_OWNER_ATTRIBUTE: "w2"}
    assert after.child_shard_ids == ("c1",)
    assert after.checkpoint == before.checkpoint
    assert before.lease_owner == owner and "pendingCheckpoint" in before.extra  # input untouched


@pytest.mark.parametrize("owner, observed_owner, observed_counter", [
    ("w1", None, 7), ("w1", "w3", 7),  # someone else got there first
    ("w1", "w1", 6),                   # A→B→A between two scans: same owner, counter moved
])
def test_acquire_fails_unless_owner_and_counter_are_as_observed(owner, observed_owner, observed_counter):
    assert rules.acquire(lease(owner=owner), "w2", observed_owner, observed_counter) is None


def test_acquire_refuses_an_ended_lease():
    assert rules.acquire(lease(cp=SHARD_END, owner=None), "w2", None, 7) is None


def test_acquire_never_upserts_and_needs_an_owner():
    assert rules.acquire(None, "w2", None, 0) is None
    with pytest.raises(ValueError):
        rules.acquire(lease(), "", "w1", 7)


# -- heartbeat ---------------------------------------------------------------------------------------

def test_heartbeat_passes_for_the_holder_and_carries_progress():
    after = rules.heartbeat(lease(extra={"a": 1, "gone": 2}), "w1", 7, {"landedTo": "42", "gone": None})
    assert after.lease_counter == 8 and after.lease_owner == "w1"
    assert after.extra == {"a": 1, "landedTo": "42"}


@pytest.mark.parametrize("before, counter", [
    (lease(owner="w2"), 7), (lease(owner=None), 7), (lease(cp=SHARD_END), 7), (None, 7),
    (lease(), 6),  # same owner id, other counter: a new incarnation under the same worker id took it
])
def test_heartbeat_fails_when_not_held_ended_or_missing(before, counter):
    assert rules.heartbeat(before, "w1", counter) is None


def test_heartbeat_attributes_must_not_clobber_the_lease():
    with pytest.raises(ValueError, match="leaseCounter"):
        rules.heartbeat(lease(), "w1", 7, {"leaseCounter": 0})


def test_oversized_heartbeat_attributes_are_refused_before_any_round_trip():
    """A hook that grows its progress attributes past the cap is refused locally: a 400 KB write the table
    rejects costs a round trip each heartbeat, and on a loaded host the lease lapsed over it."""
    with pytest.raises(ValueError, match="at most 32,768"):
        rules.check_heartbeat_attributes({"landingBlob": "x" * 410_000})
    with pytest.raises(ValueError, match="at most"):
        rules.check_heartbeat_attributes({"landingShards": [{"k": "v" * 100}] * 400})
    rules.check_heartbeat_attributes({"landingBatch": "x" * 30_000, "landingCount": 10 ** 20})  # under the cap


def test_attribute_size_counts_utf8_bytes_and_containers():
    assert rules.attribute_size("é") == 2
    assert rules.attribute_size(b"abc") == 3
    assert rules.attribute_size({"a": [1, "bc"]}) == 3 + (1 + (3 + (1 + 1) + (2 + 1)) + 1)


def test_heartbeat_with_a_checkpoint_needs_it_to_advance():
    assert rules.heartbeat(lease(), "w1", 7, checkpoint=Checkpoint("101")).checkpoint == Checkpoint("101")
    assert rules.heartbeat(lease(), "w1", 7, checkpoint=Checkpoint("99")) is None


# -- checkpoint --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "current, new",
    [
        ((TRIM_HORIZON, 0), ("5", 0)),
        ((LATEST, 0), ("5", 0)),
        ((AT_TIMESTAMP, 1_700_000_000_000), ("5", 0)),  # the sub-sequence there is a timestamp
        (("9", 0), ("10", 0)),                            # numeric, not lexicographic
        (("99999", 3), (SEQ56, 0)),                      # 56 digits beat any shorter number
        ((SEQ56, 0), (SEQ56[:-1] + "9", 0)),
        ((SEQ56, 3), (SEQ56, 4)),                         # mid-aggregate: same sequence, later sub
        (("5", 9), ("6", 0)),                             # a later sequence resets the sub-sequence
    ],
)
def test_checkpoint_advances(current, new):
    before = ours(lease(*current))
    after = rules.checkpoint(before, Checkpoint(*new))
    assert after.checkpoint == Checkpoint(*new)
    assert after.owner_switches_since_checkpoint == 0
    assert (after.lease_owner, after.lease_counter) == (before.lease_owner, before.lease_counter)


@pytest.mark.parametrize(
    "current, new",
    [
        (("10", 0), ("9", 0)),
        ((SEQ56, 0), ("99999", 0)),
        ((SEQ56, 0), (SEQ56, 0)),                          # equal is not an advance
        ((SEQ56, 4), (SEQ56, 3)),
        ((SEQ56[:-1] + "9", 0), (SEQ56, 7)),
        ((SHARD_END, 0), ("5", 0)),                         # SHARD_END is final
    ],
)
def test_checkpoint_never_regresses(current, new):
    assert rules.checkpoint(lease(*current), Checkpoint(*new)) is None


def test_checkpoint_by_a_non_owner_is_allowed_under_this_protocols_holders_and_missing_items_are_not_created():
    assert rules.checkpoint(ours(lease(owner="someone-else")), Checkpoint("200")).checkpoint == Checkpoint("200")
    assert rules.checkpoint(lease(owner=None), Checkpoint("200")).checkpoint == Checkpoint("200")
    assert rules.checkpoint(None, Checkpoint("200")) is None


def test_the_ownerless_checkpoint_and_end_never_write_under_a_java_holder():
    java_held = lease(owner="java-worker", extra={rules.CLAIM_OWNER_ATTRIBUTE: "w1"})  # a Java take after ours
    assert rules.checkpoint(java_held, Checkpoint("200")) is None
    assert rules.end(java_held) is None
    assert rules.end(lease(owner="java-worker"), "java-worker", 7) is not None  # a holder's own fenced end


def test_the_ownerless_checkpoint_and_end_never_write_while_a_hand_off_is_in_flight():
    # A KCL 3.x leader hands a Java holder's lease to our worker, whose earlier take left leaseClaimOwner:
    # the Java holder (checkpointOwner) still checkpoints and renews until it steps aside.
    handing = lease(owner="w1", extra={rules.CLAIM_OWNER_ATTRIBUTE: "w1", rules.HANDOFF_ATTRIBUTE: "java-worker"})
    assert rules.checkpoint(handing, Checkpoint("200")) is None
    assert rules.end(handing) is None
    stepped_aside = replace(handing, extra={rules.CLAIM_OWNER_ATTRIBUTE: "w1"})
    assert rules.checkpoint(stepped_aside, Checkpoint("200")) is not None


@pytest.mark.parametrize("sentinel", [SHARD_END, TRIM_HORIZON, LATEST, AT_TIMESTAMP])
def test_checkpoint_refuses_sentinels(sentinel):
    with pytest.raises(ValueError):
        rules.checkpoint(lease(), Checkpoint(sentinel))


# -- end and release -----------------------------------------------------------------------------------

@pytest.mark.parametrize("owner", ["w1", "w2", None])
def test_ownerless_end_leaves_the_counter_and_lets_the_lease_go(owner):
    after = rules.end(ours(lease(owner=owner, sub=3)))
    assert after.checkpoint.is_shard_end and after.checkpoint.sub_sequence_number == 3
    assert after.lease_owner is None and after.owner_switches_since_checkpoint == 0
    assert after.lease_counter == 7
    assert rules.end(None) is None
    # Once ended, a lease can be neither acquired, heartbeated nor checkpointed.
    assert rules.acquire(after, "w3", None, 7) is None
    assert rules.heartbeat(after, "w1", 7) is None
    assert rules.checkpoint(after, Checkpoint("999")) is None


def test_stale_holder_cannot_end_a_lease_it_lost():
    assert rules.end(lease(), "w1", 7).lease_counter == 8
    assert rules.end(lease(), "w1", 6) is None   # taken and given back to a same-id incarnation meanwhile
    assert rules.end(lease(owner="w2"), "w1", 7) is None
    with pytest.raises(ValueError):
        rules.end(lease(), "w1")


def test_release_passes_for_the_holder_only_and_moves_the_counter_on():
    after = rules.release(lease(), "w1", 7)
    assert after.lease_owner is None and after.lease_counter == 8 and after.checkpoint == Checkpoint("100")
    assert rules.release(lease(), "w1", 6) is None  # a zombie's release cannot free the new holder's lease
    assert rules.release(lease(), "w2", 7) is None
    assert rules.release(lease(owner=None), "w1", 7) is None
    assert rules.release(None, "w1", 7) is None


def test_a_release_before_a_steals_wait_ended_is_marked_unsettled_and_the_next_acquire_clears_it():
    after = rules.release(lease(), "w1", 7, unsettled=True)
    assert after.lease_owner is None and after.extra == {rules.UNSETTLED_ATTRIBUTE: True}
    assert rules.UNSETTLED_ATTRIBUTE not in rules.release(lease(), "w1", 7).extra
    assert rules.acquire(after, "w2", None, 8).extra == {rules.CLAIM_OWNER_ATTRIBUTE: "w2"}


def test_delete_is_conditional_on_the_observed_counter():
    assert rules.delete(lease(), 7) and not rules.delete(lease(), 6) and not rules.delete(None, 7)
