"""The simulated DynamoDB evaluates LeaseTable's real requests exactly as the pure lease rules say.

Thousands of random (lease, write) pairs: the write goes through the real `LeaseTable` (its condition and
update expressions, evaluated by the simulated service), and the same write through `lease_rules`; the
answers and the items left must agree. Then the faults: a lost response after an applied write, a retry
that fails its condition against our own write, a partition, and DynamoDB's own validation.
"""
from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError

from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table import lease_rules as rules
from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableUnavailable, lease_from_item, lease_to_item
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.sim.aws.dynamodb import NetworkFaults, SimDynamoDB, SimDynamoDBClient

OWNERS = [None, "a", "b"]


def _checkpoint(rng: random.Random) -> Checkpoint:
    kind = rng.random()
    if kind < 0.25:
        return Checkpoint(rng.choice([TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END]))
    return Checkpoint(str(rng.choice([9, 10, 99, 100, 12345678901234567890])), rng.randint(0, 2))


def _lease(rng: random.Random) -> Lease | None:
    if rng.random() < 0.1:
        return None
    return Lease("shardId-000000000001", _checkpoint(rng), rng.choice(OWNERS), rng.randint(0, 3),
                 owner_switches_since_checkpoint=rng.randint(0, 2),
                 extra={"pendingCheckpoint": "5"} if rng.random() < 0.2 else {})


def _table(lease: Lease | None, drop_sub: bool = False) -> tuple[LeaseTable, SimDynamoDB]:
    service = SimDynamoDB()
    table = LeaseTable("app", SimDynamoDBClient(service, random.Random(0)))
    table.ensure_table()
    if lease is not None:
        item = lease_to_item(lease)
        if drop_sub:  # written by another KCL implementation
            item.pop("checkpointSubSequenceNumber")
        service.tables["app"].items[lease.lease_key] = item
    return table, service


def _stored(service: SimDynamoDB) -> Lease | None:
    item = service.tables["app"].items.get("shardId-000000000001")
    return lease_from_item(item) if item is not None else None


def _same(a: Lease | None, b: Lease | None) -> bool:
    if a is None or b is None:
        return a is b
    return lease_to_item(a) == lease_to_item(b)


@pytest.mark.parametrize("seed", range(4))
def test_every_lease_write_agrees_with_the_pure_rules(seed):
    rng = random.Random(seed)
    for _ in range(1500):
        before = _lease(rng)
        drop_sub = before is not None and before.checkpoint.sub_sequence_number == 0 and rng.random() < 0.3
        table, service = _table(before, drop_sub)
        key = "shardId-000000000001"
        op = rng.choice(["create", "acquire", "heartbeat", "heartbeat_cp", "checkpoint", "end_held", "end",
                         "release", "delete"])
        owner, counter = rng.choice(["a", "b"]), rng.randint(0, 3)
        cp = Checkpoint(str(rng.choice([9, 10, 99, 100, 12345678901234567890])), rng.randint(0, 2))
        if op == "create":
            new = Lease(key, Checkpoint(TRIM_HORIZON))
            expected, got = rules.create(before, new), table.create(new)
        elif op == "acquire":
            seen, claim = rng.choice(OWNERS), rng.choice([None, "p1"])
            expected = rules.acquire(before, owner, seen, counter, claim)
            got = table.acquire(key, owner, seen, counter, claim=claim)
            assert _same(got, expected), (before, op, seen, counter)
        elif op == "heartbeat":
            expected, got = rules.heartbeat(before, owner, counter, {"progress": 3}), \
                table.heartbeat(key, owner, counter, {"progress": 3})
        elif op == "heartbeat_cp":
            expected, got = rules.heartbeat(before, owner, counter, None, cp), \
                table.heartbeat(key, owner, counter, None, checkpoint=cp)
        elif op == "checkpoint":
            expected, got = rules.checkpoint(before, cp), table.checkpoint(key, cp)
        elif op == "end_held":
            expected, got = rules.end(before, owner, counter), table.end(key, owner, counter)
        elif op == "end":
            expected, got = rules.end(before), table.end(key)
        elif op == "release":
            expected, got = rules.release(before, owner, counter), table.release(key, owner, counter)
        else:
            applied = rules.delete(before, counter)
            expected, got = (None if applied else before), table.delete(key, counter)
            assert got == applied, (before, op, counter)
            assert _same(_stored(service), expected)
            continue
        if op != "acquire":
            assert bool(got) == (expected is not None), (before, op, owner, counter, cp)
        assert _same(_stored(service), expected if expected is not None else before), (before, op, owner, counter, cp)


def test_a_lost_response_after_an_applied_heartbeat_is_read_back_as_applied():
    """botocore retries; the retry fails its condition against our own write; the re-read settles it."""
    table, service = _table(Lease("shardId-000000000001", Checkpoint("5"), "a", 3))
    client = table.client
    client.faults = NetworkFaults(forced=["lost_response", "ok"])  # attempt 1: answer lost; attempt 2: refused
    assert table.heartbeat("shardId-000000000001", "a", 3) is True
    assert _stored(service).lease_counter == 4 and client.applied_writes == 1 and table.ambiguous_writes == 1


@pytest.mark.parametrize("operation", ["acquire", "create", "checkpoint", "end", "release", "delete"])
def test_every_write_whose_answer_was_lost_is_read_back_as_applied(operation):
    key = "shardId-000000000001"
    # Held by this protocol (its acquire wrote leaseClaimOwner): the ownerless checkpoint may write under it.
    ours = {rules.CLAIM_OWNER_ATTRIBUTE: "a"}
    lease = None if operation == "create" else Lease(key, Checkpoint("5"), "a", 3, extra=ours)
    table, service = _table(lease)
    table.client.faults = NetworkFaults(forced=["timeout", "ok"])
    applied = {"acquire": lambda: table.acquire(key, "b", "a", 3) is not None,
               "create": lambda: table.create(Lease(key, Checkpoint(TRIM_HORIZON))),
               "checkpoint": lambda: table.checkpoint(key, Checkpoint("6")),
               "end": lambda: table.end(key, "a", 3), "release": lambda: table.release(key, "a", 3),
               "delete": lambda: table.delete(key, 3)}[operation]()
    assert applied and table.client.applied_writes == 1 and table.client.elapsed >= 20.0


def test_a_write_lost_before_it_reached_the_table_is_reported_not_applied():
    table, service = _table(Lease("shardId-000000000001", Checkpoint("5"), "a", 3))
    table.client.faults = NetworkFaults(lost_request=1.0)
    with pytest.raises(LeaseTableUnavailable):  # the re-read after the ambiguous error fails too
        table.heartbeat("shardId-000000000001", "a", 3)
    assert _stored(service).lease_counter == 3 and table.client.applied_writes == 0


def test_a_partition_spends_the_connect_timeouts_and_applies_nothing():
    table, service = _table(Lease("shardId-000000000001", Checkpoint("5"), "a", 3))
    table.client.faults = NetworkFaults(partitioned=True)
    table.client.elapsed = 0.0
    with pytest.raises(LeaseTableUnavailable):
        table.release("shardId-000000000001", "a", 3)
    assert table.client.elapsed >= 8 * 5.0 and _stored(service).lease_owner == "a"


def test_placeholders_must_be_defined_and_used_as_dynamodb_demands():
    _, service = _table(Lease("shardId-000000000001", Checkpoint("5"), "a", 3))
    request = {"TableName": "app", "Key": {"leaseKey": {"S": "shardId-000000000001"}},
               "UpdateExpression": "SET leaseCounter = :next", "ConditionExpression": "leaseOwner = :me",
               "ExpressionAttributeValues": {":next": {"N": "4"}, ":me": {"S": "a"}, ":mine": {"N": "3"}}}
    with pytest.raises(ClientError, match="unused in expressions: keys: {:mine}"):
        service.execute("update_item", request)
    del request["ExpressionAttributeValues"][":me"]
    with pytest.raises(ClientError, match="not defined; attribute value: :me"):
        service.execute("update_item", {**request, "ExpressionAttributeValues": {":next": {"N": "4"}}})


def test_comparisons_follow_dynamodb_semantics():
    """Missing attributes: `<>` true, every other comparison false; numbers by value; AND before OR."""
    _, service = _table(None)
    service.tables["app"].items["k"] = {"leaseKey": {"S": "k"}, "n": {"N": "10"}, "s": {"S": "10"}}

    def holds(condition, **values):
        try:
            service.execute("update_item", {
                "TableName": "app", "Key": {"leaseKey": {"S": "k"}}, "UpdateExpression": "SET z = :z",
                "ConditionExpression": condition,
                "ExpressionAttributeValues": {":z": {"N": "1"}, **values}})
            return True
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException"
            return False

    assert holds("missing <> :v", **{":v": {"S": "x"}}) and not holds("missing = :v", **{":v": {"S": "x"}})
    assert holds("n > :v", **{":v": {"N": "9"}}) and not holds("s > :v", **{":v": {"S": "9"}})  # "10" < "9"
    assert not holds("n = :v", **{":v": {"S": "10"}})  # types differ
    assert holds("size(s) = :two", **{":two": {"N": "2"}}) and not holds("size(missing) = :two", **{":two": {"N": "0"}})
    assert holds("n = :a OR n = :b AND n = :c", **{":a": {"N": "10"}, ":b": {"N": "1"}, ":c": {"N": "2"}})
    assert not holds("(n = :a OR n = :b) AND n = :c", **{":a": {"N": "10"}, ":b": {"N": "1"}, ":c": {"N": "2"}})
    assert holds("NOT attribute_exists(missing) AND attribute_type(n, :N)", **{":N": {"S": "N"}})
    assert holds("s IN (:a, :b)", **{":a": {"S": "x"}, ":b": {"S": "10"}})


def test_a_timed_out_attempt_is_applied_late_after_the_retry_and_after_another_clients_write():
    """DynamoDB applies a request its client gave up on: after the client's retry and after other clients'
    writes, with its condition judged then — and its observers learn when it was sent, not applied."""
    service = SimDynamoDB()
    scheduled: list = []
    seen: list = []
    service.observers.append(lambda table, key, before, after, actor, sent_at: seen.append((actor, sent_at)))
    now = [100.0]
    ours = LeaseTable("app", SimDynamoDBClient(
        service, random.Random(1), NetworkFaults(forced=["timeout"], late_application=1.0), actor="ours",
        max_attempts=3, read_timeout=2.0, now=lambda: now[0], later=lambda delay, apply: scheduled.append(apply)))
    other = LeaseTable("app", SimDynamoDBClient(service, random.Random(2), actor="other", now=lambda: now[0]))
    ours.ensure_table()
    assert other.create(Lease("shardId-000000000001", Checkpoint(TRIM_HORIZON), "me", 4))
    assert ours.heartbeat("shardId-000000000001", "me", 4)  # the retry applied; the first attempt waits
    assert _stored(service).lease_counter == 5 and len(scheduled) == 1
    now[0] = 107.0
    assert other.heartbeat("shardId-000000000001", "me", 5)
    scheduled[0]()  # applied late: its condition (counter 4) fails now, nothing changes
    assert _stored(service).lease_counter == 6
    assert [actor for actor, _ in seen] == ["other", "ours", "other"]
    assert seen[1][1] == 100.0  # the retry's write: sent when the call was
