"""KCL 3.5 coexistence, item 5: a graceful hand-off asked of a Java holder completes.

Java's holder, asked (leaseOwner = the asker, checkpointOwner = itself), keeps renewing — DynamoDBLeaseRefresher.
renewLease retries without the checkpointOwner expectation once it sees the shutdown request, leaseCounter + 1 each
time — while its shard consumer shuts down; its processor checkpoints (updateLease, + 1), and then
LeaseGracefulShutdownHandler.attemptLeaseTransfer assigns the lease to its new owner (assignLease: leaseOwner,
REMOVE checkpointOwner, ADD leaseCounter 1, if leaseOwner and checkpointOwner are as it knows them). The asker
required the counter unchanged while pending and then exactly + 1, so it gave up, and the lease sat assigned to it,
unworked, for an expiry. It now decides from the owner, checkpointOwner and its own claim."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.lease import lease_life as life
from kcl_pipeline.kcl.core.lease.lease_hold import CurrentHold, LeaseHold, LeaseTiming, Outcome
from kcl_pipeline.kcl.core.lease.lease_life import LifeOutcome
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_codec import lease_from_item
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

TIMING = LeaseTiming(10.0, 1.0)
KEY = "shardId-000000000007"
BASE = "4959033827149025660855969253836157109592157598913658"


def seq(n: int) -> str:
    return f"{BASE}{n:04d}"


def item(counter: int, checkpoint: int, handing: bool) -> dict:
    """The lease as the Java holder's writes leave it (DynamoDBLeaseSerializer's leaseKey, leaseOwner, leaseCounter,
    checkpoint, checkpointSubSequenceNumber, ownerSwitchesSinceCheckpoint, checkpointOwner, entityType) plus the
    asker's leaseClaim, which Java's writes leave alone."""
    lease = {"leaseKey": {"S": KEY}, "leaseOwner": {"S": "me"}, "leaseCounter": {"N": str(counter)},
             "checkpoint": {"S": seq(checkpoint)}, "checkpointSubSequenceNumber": {"N": "0"},
             "ownerSwitchesSinceCheckpoint": {"N": "0"}, "entityType": {"S": "LEASE"},
             "leaseClaim": {"S": "this-process"}}
    if handing:
        lease["checkpointOwner"] = {"S": "java-holder"}
    return lease


# The asker's reads, one per poll: asked at counter 20; Java renews twice (21, 22), checkpoints (23), assigns (24).
JAVA_SEQUENCE = [item(20, 100, True), item(21, 100, True), item(22, 100, True), item(23, 150, True),
                 item(24, 150, False)]


class Asker:
    """Answers the asking worker's effects from a scripted sequence of the item as it reads it."""

    def __init__(self, reads):
        self.reads = [lease_from_item(read) for read in reads]
        self.now = 0.0
        self.acquired_from: Lease | None = None
        self.current = CurrentHold()
        self.delivered_at: float | None = None
        self.was_asked = False

    @property
    def hold(self) -> LeaseHold | None:
        """The hold the coroutines share (installed by the acquire)."""
        return self.current.hold if self.current.acquired else None

    @hold.setter
    def hold(self, hold: LeaseHold) -> None:
        self.current.move(hold)

    def __call__(self, effect):
        if isinstance(effect, fx.InitiateHandoff):
            self.was_asked = True
            return self.reads[0]
        if isinstance(effect, fx.Now):
            return self.now
        if isinstance(effect, fx.Stopping):
            return False
        if isinstance(effect, fx.GetLease):
            if not self.was_asked:  # the holder's lease, as the steal saw it
                return Lease(KEY, Checkpoint(seq(100)), "java-holder", 20)
            return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
        if isinstance(effect, fx.Wait):
            self.now += effect.seconds
            if self.hold is not None:
                self.hold = self.hold.after_renew(Outcome.APPLIED, self.now, TIMING, self.now)
            return None
        if isinstance(effect, fx.Acquire):
            self.acquired_from = effect.observed
            taken = Lease(KEY, effect.observed.checkpoint, "me", effect.observed.lease_counter + 1)
            self.hold = LeaseHold.acquired(taken, self.now, TIMING)
            return taken
        if isinstance(effect, fx.Check):
            self.hold = self.hold.held(self.now)
            return fx.Status(self.now, self.hold, False)
        if isinstance(effect, fx.Begin):
            self.delivered_at = self.now
            raise Delivering()
        return None


class Delivering(Exception):
    """The history under test ends at the first delivery."""


def run(script):
    settings = life.LifeSettings(TIMING, Checkpoint(TRIM_HORIZON), heartbeat_seconds=3.0, stolen=True,
                                 handoff_from="java-holder")
    observed = Lease(KEY, Checkpoint(seq(100)), "java-holder", 20)
    return fx.drive(life.lease_life(observed, settings, script.current, "me"), script)


def test_a_java_holders_renew_checkpoint_assign_sequence_completes_the_hand_off():
    script = Asker(JAVA_SEQUENCE)
    assert run(script).outcome is LifeOutcome.FAILED  # Delivering, thrown at the first delivery: it was acquired
    assert script.acquired_from.lease_counter == 24 and script.acquired_from.checkpoint == Checkpoint(seq(150))
    assert script.delivered_at < TIMING.expiry_seconds / 2  # at once: no cold steal's expiry-long wait


def test_a_lease_taken_by_another_process_meanwhile_is_still_not_taken_as_handed_over():
    overtaken = {**item(24, 150, False), "leaseClaim": {"S": "another-process"}}  # its acquire wrote its claim
    assert run(Asker([item(20, 100, True), item(21, 100, True), overtaken])).outcome is LifeOutcome.NOT_ACQUIRED
    third = {**item(22, 100, False), "leaseOwner": {"S": "third-consumer"}}
    assert run(Asker([item(20, 100, True), third])).outcome is LifeOutcome.NOT_ACQUIRED


def test_a_java_holder_renewing_but_never_assigning_is_taken_from_cold_at_the_timeout():
    renewing = [item(20 + i, 100, True) for i in range(40)]
    script = Asker(renewing)
    run(script)
    assert script.acquired_from.extra.get("checkpointOwner") == "java-holder"  # as it stood: fences the holder
    assert script.delivered_at >= TIMING.expiry_seconds / 2 + TIMING.expiry_seconds  # then a cold steal's wait


@pytest.fixture
def table(any_dynamodb_client, unique_name) -> LeaseTable:
    t = LeaseTable(unique_name("handoff35"), any_dynamodb_client)
    t.ensure_table()
    return t


def java_renew(table: LeaseTable, counter: int) -> None:
    """Java's renewal once it knows of the shutdown request: leaseCounter + 1 if leaseCounter (no other condition)."""
    table.client.update_item(TableName=table.table_name, Key={"leaseKey": {"S": KEY}},
                             UpdateExpression="SET leaseCounter = :next", ConditionExpression="leaseCounter = :c",
                             ExpressionAttributeValues={":c": {"N": str(counter)}, ":next": {"N": str(counter + 1)}})


@pytest.mark.emulator
def test_a_hand_off_withdrawn_while_a_java_holder_renews_gives_it_the_lease_back(table):
    table.client.put_item(TableName=table.table_name, Item={**item(20, 100, False), "leaseOwner": {"S": "java-holder"}})
    assert table.initiate_handoff(KEY, "me", "java-holder", 20, "this-process") is not None
    java_renew(table, 20)
    java_renew(table, 21)
    assert table.cancel_handoff(KEY, "me", "java-holder", 20, "this-process")  # the counter moved: still withdrawn
    back = table.get(KEY)
    assert back.lease_owner == "java-holder" and "checkpointOwner" not in back.extra and back.lease_counter == 22
    java_renew(table, 22)  # its renewals go on
    assert not table.cancel_handoff(KEY, "me", "java-holder", 20, "this-process")  # nothing left to withdraw
