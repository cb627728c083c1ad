"""The lease table: Java KCL 2.x item codec (unit), every conditional write passing and failing against
dynalite AND moto's DynamoDB over HTTP, agreement with the pure rules in lease_rules.py, and the error
paths (throttling through botocore's retries, unreachable endpoint, missing table)."""
from __future__ import annotations

import json
import socket
from dataclasses import replace

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.stub import Stubber

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table import lease_codec
from kcl_pipeline.kcl.core.table import lease_rules as rules
from kcl_pipeline.kcl.core.table.lease_codec import (
    LeaseItemInvalid,
    LeaseTableError,
    LeaseTableMissing,
    LeaseTableUnavailable,
    decode_value,
    encode_value,
    lease_from_item,
    lease_to_item,
)
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

SEQ56 = "49590338271490256608559692538361571095921575989136588898"
SEQ56_NEXT = "49590338271490256608559692538361571095921575989136588899"
KEY = "shardId-000000000001"

# An item as Java KCL 2.x writes it (names, types), plus what KCL 3.x and others may add.
JAVA_ITEM = {
    "leaseKey": {"S": KEY},
    "leaseOwner": {"S": "java-worker-1"},
    "leaseCounter": {"N": "42"},
    "checkpoint": {"S": SEQ56},
    "checkpointSubSequenceNumber": {"N": "3"},
    "ownerSwitchesSinceCheckpoint": {"N": "1"},
    "parentShardId": {"SS": ["shardId-000000000000"]},
    "childShardIds": {"SS": ["shardId-000000000002", "shardId-000000000003"]},
    "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "340282366920938463463374607431768211455"},
    "pendingCheckpoint": {"S": "49590338271490256608559692538361571095921575989136588999"},
    "throughputKBps": {"N": "12.5"},
    "entityType": {"S": "LEASE"},
    "someFutureFlag": {"BOOL": True},
    "notes": {"M": {"a": {"L": [{"N": "1"}, {"S": "x"}, {"NULL": True}]}, "b": {"B": b"\x00\x01"}}},
    "tags": {"SS": ["a", "b"]},
    "weights": {"NS": ["1", "2.5"]},
}


def lease(key=KEY, cp="100", sub=0, owner="w1", counter=7, switches=2, **kw) -> Lease:
    return Lease(key, Checkpoint(cp, sub), owner, counter, switches, parent_shard_ids=("shardId-000000000000",), **kw)


# == codec (unit) ======================================================================================

def test_java_item_round_trips_with_java_names_and_types():
    decoded = lease_from_item(JAVA_ITEM)
    assert decoded == Lease(
        lease_key=KEY, checkpoint=Checkpoint(SEQ56, 3), lease_owner="java-worker-1", lease_counter=42,
        owner_switches_since_checkpoint=1, parent_shard_ids=("shardId-000000000000",),
        child_shard_ids=("shardId-000000000002", "shardId-000000000003"), starting_hash_key="0",
        ending_hash_key="340282366920938463463374607431768211455",
        extra={"pendingCheckpoint": "49590338271490256608559692538361571095921575989136588999",
               "throughputKBps": 12.5, "someFutureFlag": True,
               "notes": {"a": [1, "x", None], "b": b"\x00\x01"}, "tags": {"a", "b"}, "weights": {1, 2.5}})
    assert lease_to_item(decoded) == JAVA_ITEM


def test_new_lease_item_leaves_out_absent_values_and_empty_sets():
    item = lease_to_item(Lease("s-1", Checkpoint(TRIM_HORIZON), extra={"empty": set(), "kept": None}))
    assert item == {
        "leaseKey": {"S": "s-1"}, "leaseCounter": {"N": "0"}, "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "entityType": {"S": "LEASE"}, "kept": {"NULL": True},  # entityType as KCL 3.x writes every lease
    }
    assert lease_from_item(item).lease_owner is None


def test_explicit_null_owner_reads_as_free():
    assert lease_from_item({**JAVA_ITEM, "leaseOwner": {"NULL": True}}).lease_owner is None


@pytest.mark.parametrize("entity", ["WORKER_METRICS", "COORDINATOR_STATE", ""])
def test_other_kcl3_entities_are_skipped(entity):
    assert lease_from_item({**JAVA_ITEM, "entityType": {"S": entity}}) is None
    assert lease_from_item({**JAVA_ITEM, "entityType": {"NULL": True}}) is None


def test_item_without_entity_type_is_a_lease():
    item = {k: v for k, v in JAVA_ITEM.items() if k != "entityType"}
    assert lease_from_item(item).lease_key == KEY


@pytest.mark.parametrize("item, message", [
    ({k: v for k, v in JAVA_ITEM.items() if k != "checkpoint"}, "has no checkpoint"),
    ({**JAVA_ITEM, "checkpoint": {"S": "00123"}}, "neither a sentinel"),
    ({**JAVA_ITEM, "leaseCounter": {"S": "42"}}, "leaseCounter should be of type N"),
    ({**JAVA_ITEM, "leaseCounter": {"N": "4.2"}}, "leaseCounter should be an integer"),
    ({**JAVA_ITEM, "parentShardId": {"S": "shardId-0"}}, "parentShardId should be of type SS"),
    ({k: v for k, v in JAVA_ITEM.items() if k != "leaseKey"}, "without a leaseKey"),
])
def test_malformed_items_are_a_clear_error(item, message):
    with pytest.raises(LeaseItemInvalid, match=message):
        lease_from_item(item)


def test_extra_must_not_shadow_a_lease_field():
    with pytest.raises(ValueError, match="shadows a lease field"):
        lease_to_item(lease(extra={"leaseOwner": "x"}))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"a", 1}, object()])
def test_values_dynamodb_cannot_hold_are_rejected(value):
    with pytest.raises(ValueError):
        encode_value(value)


@pytest.mark.parametrize("value, attribute", [
    ("s", {"S": "s"}), (True, {"BOOL": True}), (7, {"N": "7"}), (0.25, {"N": "0.25"}), (b"b", {"B": b"b"}),
    ([1, None], {"L": [{"N": "1"}, {"NULL": True}]}), ({"k": "v"}, {"M": {"k": {"S": "v"}}}),
    ({"b", "a"}, {"SS": ["a", "b"]}), ({2, 1}, {"NS": ["1", "2"]}), ({b"x"}, {"BS": [b"x"]}),
])
def test_value_codec_round_trips(value, attribute):
    assert encode_value(value) == attribute
    assert decode_value(attribute) == value
    assert type(decode_value(attribute)) is type(value)


def test_every_write_is_a_request_for_any_table_with_its_judge():
    """The codec builds the requests (no client, no table name: LeaseTable adds it); a write that returns
    the item asks for it, and the judge of an ambiguous take knows it by owner, counter and claim."""
    writes = [lease_codec.create_write(lease()), lease_codec.acquire_write(KEY, "w2", "w1", 7, claim="ours"),
              lease_codec.initiate_handoff_write(KEY, "w2", "w1", 7, "ours"),
              lease_codec.cancel_handoff_write(KEY, "w2", "w1", 7, "ours"),
              lease_codec.finish_handoff_write(KEY, "w1", 7, Checkpoint("5")),
              lease_codec.heartbeat_write(KEY, "w1", 7, {"x": 1}), lease_codec.checkpoint_write(KEY, Checkpoint("5")),
              lease_codec.end_write(KEY, "w1", 7), lease_codec.release_write(KEY, "w1", 7),
              lease_codec.delete_write(KEY, 7)]
    assert all(w.key == KEY and "TableName" not in w.request for w in writes)
    assert [w.returns_item for w in writes] == [False, True, True] + [False] * 7
    taken = lease(owner="w2", counter=8, extra={rules.CLAIM_ATTRIBUTE: "ours"})
    judge = writes[1].judge
    assert judge(taken) and not judge(None)
    assert not judge(replace(taken, extra={rules.CLAIM_ATTRIBUTE: "a twin"}))
    assert not judge(replace(taken, lease_counter=9))


# == error paths (unit: stubs, and a closed port) =======================================================

def _offline_client(max_attempts: int = 1, endpoint: str = "http://127.0.0.1:9"):
    session = boto3.session.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    return session.client("dynamodb", endpoint_url=endpoint, config=Config(
        retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=1, read_timeout=2))


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
def test_throttling_after_retries_is_unavailable(code):
    ddb = _offline_client()
    with Stubber(ddb) as stub:
        stub.add_client_error("update_item", service_error_code=code, service_message="slow down",
                              http_status_code=400)
        with pytest.raises(LeaseTableUnavailable, match=f"lease table t: DynamoDB still answered {code} to "
                                                        "update_item after 1 attempt"):
            LeaseTable("t", ddb).heartbeat(KEY, "w1", 1)
        stub.assert_no_pending_responses()


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def test_botocore_retries_throttling_before_it_surfaces(monkeypatch):
    """The real retry handler (standard mode): every attempt is throttled, then LeaseTableUnavailable."""
    ddb = _offline_client(max_attempts=4)  # botocore's "max_attempts" counts retries: 1 + 4 requests
    attempts, sleeps = [], []

    def throttled(request, **_):
        attempts.append(request.url)
        body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                           "message": "The level of configured provisioned throughput was exceeded"}).encode()
        return AWSResponse(request.url, 400, {"x-amzn-RequestId": "r"}, _Body(body))

    ddb.meta.events.register("before-send.dynamodb.UpdateItem", throttled)
    monkeypatch.setattr("botocore.endpoint.time.sleep", sleeps.append)  # no real back-off wait in a unit test
    with pytest.raises(LeaseTableUnavailable, match="ProvisionedThroughputExceededException to update_item after "
                                                    "5 attempt"):
        LeaseTable("t", ddb).checkpoint(KEY, Checkpoint("5"))
    assert len(attempts) == 5 and len(sleeps) == 4


@pytest.mark.parametrize("operation, call", [
    ("scan", lambda t: t.scan()), ("get_item", lambda t: t.get(KEY)), ("put_item", lambda t: t.create(lease())),
    ("update_item", lambda t: t.acquire(KEY, "w", None, 0)), ("update_item", lambda t: t.heartbeat(KEY, "w", 0)),
    ("update_item", lambda t: t.end(KEY)), ("delete_item", lambda t: t.delete(KEY, 0)),
])
def test_missing_table_stubbed(operation, call):
    ddb = _offline_client()
    with Stubber(ddb) as stub:
        stub.add_client_error(operation, service_error_code="ResourceNotFoundException",
                              service_message="Requested resource not found", http_status_code=400)
        with pytest.raises(LeaseTableMissing, match=f"^lease table orders-leases does not exist \\({operation}\\)$"):
            call(LeaseTable("orders-leases", ddb))
        stub.assert_no_pending_responses()


def test_ensure_table_reports_a_failed_creation():
    ddb = _offline_client()
    with Stubber(ddb) as stub:
        stub.add_client_error("describe_table", service_error_code="ResourceNotFoundException",
                              service_message="Requested resource not found", http_status_code=400)
        stub.add_client_error("create_table", service_error_code="AccessDeniedException",
                              service_message="not allowed", http_status_code=400)
        with pytest.raises(LeaseTableError,
                           match="orders-leases: create_table failed: AccessDeniedException: not allowed"):
            LeaseTable("orders-leases", ddb).ensure_table()


def test_other_service_errors_say_what_failed():
    ddb = _offline_client()
    with Stubber(ddb) as stub:
        stub.add_client_error("put_item", service_error_code="ValidationException",
                              service_message="Item size has exceeded the maximum allowed size", http_status_code=400)
        with pytest.raises(LeaseTableError, match="put_item failed: ValidationException: Item size has exceeded"):
            LeaseTable("t", ddb).create(lease())


def test_condition_failure_is_an_answer_not_an_error():
    ddb = _offline_client()
    with Stubber(ddb) as stub:
        for operation in ("put_item", "update_item", "update_item"):
            stub.add_client_error(operation, service_error_code="ConditionalCheckFailedException",
                                  service_message="The conditional request failed", http_status_code=400)
        table = LeaseTable("t", ddb)
        assert table.create(lease()) is False
        assert table.acquire(KEY, "w2", "w1", 1) is None
        assert table.release(KEY, "w1", 1) is False


def test_unreachable_endpoint_is_unavailable():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ddb = client("dynamodb", AwsSettings(region="us-east-1", endpoint_urls={"dynamodb": f"http://127.0.0.1:{port}"}),
                 max_attempts=2)
    with pytest.raises(LeaseTableUnavailable, match="lease table t: DynamoDB unreachable during scan"):
        LeaseTable("t", ddb).scan()


def test_bad_arguments_are_rejected_before_any_request():
    table = LeaseTable("t", _offline_client())
    with pytest.raises(ValueError, match="not SHARD_END"):
        table.checkpoint(KEY, Checkpoint(SHARD_END))
    for sentinel in (TRIM_HORIZON, LATEST, AT_TIMESTAMP):
        with pytest.raises(ValueError, match=f"not {sentinel}"):
            table.checkpoint(KEY, Checkpoint(sentinel))
    with pytest.raises(ValueError, match="leaseCounter, leaseOwner"):
        table.heartbeat(KEY, "w1", 1, {"leaseOwner": "x", "leaseCounter": 1, "ok": 1})
    with pytest.raises(ValueError, match="worker id"):
        table.acquire(KEY, "", None, 0)
    with pytest.raises(ValueError, match="both the owner and the counter"):
        table.end(KEY, "w1")
    with pytest.raises(ValueError, match="needs a name"):
        LeaseTable("", _offline_client())


# == against dynalite and moto's DynamoDB over HTTP ==================================================

@pytest.fixture
def table(any_dynamodb_client, unique_name) -> LeaseTable:
    t = LeaseTable(unique_name("leases"), any_dynamodb_client)
    assert t.ensure_table() is True
    return t


@pytest.fixture
def plain_table(any_dynamodb_client, unique_name) -> LeaseTable:
    """A lease table as KCL 2.x creates it, without the leaseOwner index: DynamoDB refuses a NULL-typed
    leaseOwner in a table that indexes it, so items with an explicit NULL owner can only exist here."""
    name = unique_name("plain")
    any_dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                     AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                                     KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}])
    t = LeaseTable(name, any_dynamodb_client)
    t.ensure_table()
    return t


def put_raw(table: LeaseTable, item: dict) -> None:
    table.client.put_item(TableName=table.table_name, Item=item)


def raw(table: LeaseTable, key: str = KEY) -> dict | None:
    return table.client.get_item(TableName=table.table_name, Key={"leaseKey": {"S": key}},
                                 ConsistentRead=True).get("Item")


def test_ensure_table_creates_once_with_the_java_schema(table):
    assert table.ensure_table() is False
    description = table.client.describe_table(TableName=table.table_name)["Table"]
    assert description["TableStatus"] == "ACTIVE"
    assert description["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def test_ensure_table_refuses_a_table_that_is_not_a_lease_table(any_dynamodb_client, unique_name):
    name = unique_name("notleases")
    any_dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                                     KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}])
    with pytest.raises(LeaseTableError, match=f"table {name} is not a lease table"):
        LeaseTable(name, any_dynamodb_client).ensure_table()


def test_missing_table_over_http(any_dynamodb_client, unique_name):
    table = LeaseTable(unique_name("nothere"), any_dynamodb_client)
    for call in (table.scan, lambda: table.get(KEY), lambda: table.create(lease()),
                 lambda: table.acquire(KEY, "w1", None, 0), lambda: table.checkpoint(KEY, Checkpoint("1"))):
        with pytest.raises(LeaseTableMissing, match=f"lease table {table.table_name} does not exist"):
            call()


def test_create_and_get_round_trip_java_items(table):
    put_raw(table, JAVA_ITEM)
    assert table.get(KEY) == lease_from_item(JAVA_ITEM)
    assert table.get("shardId-missing") is None
    fresh = Lease("shardId-000000000009", Checkpoint(AT_TIMESTAMP, 1_700_000_000_000),
                  parent_shard_ids=("shardId-000000000007", "shardId-000000000008"))
    assert table.create(fresh) is True
    assert table.get(fresh.lease_key) == fresh
    assert "leaseOwner" not in raw(table, fresh.lease_key) and "childShardIds" not in raw(table, fresh.lease_key)


def test_create_fails_when_the_lease_exists_and_changes_nothing(table):
    assert table.create(lease(owner="w1", counter=5))
    assert table.create(lease(owner=None, counter=0, cp=TRIM_HORIZON)) is False
    assert table.get(KEY) == lease(owner="w1", counter=5)


def test_scan_reads_every_page_and_skips_other_entities(any_dynamodb_client, unique_name):
    table = LeaseTable(unique_name("leases"), any_dynamodb_client, scan_page_size=2)
    table.ensure_table()
    keys = [f"shardId-{i:012d}" for i in range(7)]
    for key in keys:
        assert table.create(Lease(key, Checkpoint(TRIM_HORIZON)))
    put_raw(table, {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRICS"}})
    assert sorted(lease.lease_key for lease in table.scan()) == keys


# -- acquire ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("owner_attribute, observed_owner", [
    (None, None), ({"NULL": True}, None), ({"S": "w1"}, "w1"),
])
def test_acquire_passes_when_exactly_as_observed(plain_table, owner_attribute, observed_owner):
    table = plain_table
    item = {**JAVA_ITEM, "ownerSwitchesSinceCheckpoint": {"N": "4"}}
    item.pop("leaseOwner")
    if owner_attribute:
        item["leaseOwner"] = owner_attribute
    put_raw(table, item)
    acquired = table.acquire(KEY, "w2", observed_owner, 42)
    assert acquired is not None and acquired == table.get(KEY)
    # The counter moves on from the observed 42: never reset (it fences the previous holder).
    assert (acquired.lease_owner, acquired.lease_counter, acquired.owner_switches_since_checkpoint) == ("w2", 43, 5)
    assert acquired.checkpoint == Checkpoint(SEQ56, 3)
    assert acquired.child_shard_ids == ("shardId-000000000002", "shardId-000000000003")
    left = raw(table)
    assert left["pendingCheckpoint"] == JAVA_ITEM["pendingCheckpoint"]  # Java's take keeps it (two-phase)
    assert left["throughputKBps"] == {"N": "12.5"} and left["childShardIds"] == JAVA_ITEM["childShardIds"]
    assert left["someFutureFlag"] == {"BOOL": True} and left["parentShardId"] == {"SS": ["shardId-000000000000"]}


@pytest.mark.parametrize("observed_owner, observed_counter", [
    (None, 7), ("w3", 7),   # someone else holds it
    ("w1", 6),              # owner as seen, but the counter moved: A→B→A between two scans
])
def test_acquire_fails_unless_exactly_as_observed(table, observed_owner, observed_counter):
    assert table.create(lease(owner="w1"))
    assert table.acquire(KEY, "w2", observed_owner, observed_counter) is None
    assert table.get(KEY) == lease(owner="w1")


def test_acquire_refuses_a_lease_ended_since_it_was_observed(table):
    # Ended between our scan and our acquire: taking it would spawn a worker for a finished shard.
    assert table.create(lease(owner=None, counter=3))
    assert table.end(KEY) is True
    assert table.acquire(KEY, "w2", None, 3) is None
    assert table.get(KEY).lease_owner is None


def test_acquire_on_a_missing_item_does_not_create_it(table):
    assert table.acquire(KEY, "w2", None, 0) is None
    assert table.acquire(KEY, "w2", "w1", 0) is None
    assert raw(table) is None


# -- heartbeat ------------------------------------------------------------------------------------------

def test_heartbeat_bumps_the_counter_and_writes_extras(table):
    assert table.create(lease(owner="w1", counter=7, extra={"stale": "x", "keep": 1}))
    assert table.heartbeat(KEY, "w1", 7, {"landedTo": SEQ56, "landedRows": 1200, "caughtUp": True, "rate": 0.5,
                                          "stale": None, "ttl": "2026"})
    after = table.get(KEY)
    assert after.lease_counter == 8
    assert after.extra == {"landedTo": SEQ56, "landedRows": 1200, "caughtUp": True, "rate": 0.5, "keep": 1,
                           "ttl": "2026"}
    assert raw(table)["landedTo"] == {"S": SEQ56} and raw(table)["caughtUp"] == {"BOOL": True}
    assert table.heartbeat(KEY, "w1", 8)
    assert table.get(KEY).lease_counter == 9


def test_heartbeat_writes_throughput_as_kcl_does_and_matches_the_rule(table):
    assert table.create(lease(owner="w1", counter=7, extra={"keep": 1}))
    before = table.get(KEY)
    assert table.heartbeat(KEY, "w1", 7, throughput_kbps=12.5)
    assert raw(table)["throughputKBps"] == {"N": "12.5"}
    assert table.get(KEY) == rules.heartbeat(before, "w1", 7, throughput_kbps=12.5)
    assert table.heartbeat(KEY, "w1", 8)  # a heartbeat without a measurement keeps the last one
    assert raw(table)["throughputKBps"] == {"N": "12.5"}
    with pytest.raises(ValueError, match="throughputKBps"):
        table.heartbeat(KEY, "w1", 9, throughput_kbps=float("nan"))
    assert table.get(KEY).lease_counter == 9  # nothing written


@pytest.mark.parametrize("state", ["other owner", "no owner", "ended", "missing", "same id, other counter"])
def test_heartbeat_fails_when_not_held_ended_or_missing(table, state):
    if state != "missing":
        owner = {"other owner": "w2", "no owner": None, "ended": "w1"}.get(state, "w1")
        cp = SHARD_END if state == "ended" else "100"
        counter = 9 if state == "same id, other counter" else 7
        assert table.create(lease(owner=owner, cp=cp, counter=counter))
    before = raw(table)
    assert table.heartbeat(KEY, "w1", 7, {"landedTo": "5"}) is False
    assert raw(table) == before


# -- checkpoint -----------------------------------------------------------------------------------------

CHECKPOINT_CASES = [
    # (current checkpoint, sub), (new sequence, sub), advances
    ((TRIM_HORIZON, 0), ("5", 0), True),
    ((LATEST, 0), (SEQ56, 0), True),
    ((AT_TIMESTAMP, 1_700_000_000_000), ("5", 0), True),  # that sub-sequence is a timestamp
    (("9", 0), ("10", 0), True),  # numeric order, not lexicographic
    (("10", 0), ("9", 0), False),
    (("99999", 3), (SEQ56, 0), True),  # 56 digits beat any shorter number
    ((SEQ56, 0), ("99999", 9), False),
    ((SEQ56, 0), (SEQ56_NEXT, 0), True),
    ((SEQ56_NEXT, 0), (SEQ56, 5), False),
    ((SEQ56, 1), (SEQ56, 2), True),  # same sequence: the sub-sequence decides
    ((SEQ56, 2), (SEQ56, 10), True),  # numerically
    ((SEQ56, 2), (SEQ56, 2), False),  # equal is not an advance
    ((SEQ56, 3), (SEQ56, 2), False),
    ((SHARD_END, 0), (SEQ56_NEXT, 0), False),  # SHARD_END is final
]


OURS = {rules.CLAIM_OWNER_ATTRIBUTE: "w1"}  # held by this protocol: its acquire wrote leaseClaimOwner


@pytest.mark.parametrize("current, new, advances", CHECKPOINT_CASES)
def test_checkpoint_moves_only_forward(table, current, new, advances):
    assert table.create(lease(cp=current[0], sub=current[1], owner="w1", switches=3, extra=OURS))
    assert table.checkpoint(KEY, Checkpoint(*new)) is advances
    after = table.get(KEY)
    if advances:
        assert after == lease(cp=new[0], sub=new[1], owner="w1", switches=0, extra=OURS)
    else:
        assert after == lease(cp=current[0], sub=current[1], owner="w1", switches=3, extra=OURS)


def test_checkpoint_needs_no_ownership_and_never_creates(table):
    assert table.create(lease(owner="someone-else", extra={rules.CLAIM_OWNER_ATTRIBUTE: "someone-else"}))
    assert table.checkpoint(KEY, Checkpoint("101")) is True
    assert table.checkpoint("shardId-missing", Checkpoint("5")) is False
    assert raw(table, "shardId-missing") is None


# -- end / release / delete ---------------------------------------------------------------------------

def test_ownerless_end_is_final_frees_the_lease_and_leaves_the_counter(table):
    assert table.create(lease(cp=SEQ56, sub=4, owner="w1", switches=2, extra={"keep": "me", **OURS}))
    assert table.end(KEY) is True
    ended = table.get(KEY)
    assert ended == lease(cp=SHARD_END, sub=4, owner=None, switches=0, extra={"keep": "me", **OURS})
    assert table.checkpoint(KEY, Checkpoint(SEQ56_NEXT)) is False
    assert table.heartbeat(KEY, "w1", 7) is False
    assert table.get(KEY) == ended


def test_stale_holder_cannot_end_a_lease_it_lost(table):
    assert table.create(lease(owner="w1", counter=9))  # taken back by a same-id incarnation: counter 9
    assert table.end(KEY, "w1", 7) is False
    assert table.get(KEY).checkpoint == Checkpoint("100")
    assert table.end(KEY, "w1", 9) is True
    assert (table.get(KEY).lease_counter, table.get(KEY).is_ended) == (10, True)


def test_end_on_a_missing_lease_does_not_create_it(table):
    assert table.end(KEY) is False
    assert raw(table) is None


def test_release_only_by_the_holder(table):
    assert table.create(lease(owner="w1", counter=9))
    assert table.release(KEY, "w2", 9) is False
    assert table.release(KEY, "w1", 8) is False  # a zombie of w1's id cannot free the new holder's lease
    assert table.get(KEY).lease_owner == "w1"
    assert table.release(KEY, "w1", 9) is True
    released = table.get(KEY)
    assert (released.lease_owner, released.lease_counter) == (None, 10)
    assert "leaseOwner" not in raw(table)
    assert table.release(KEY, "w1", 10) is False
    assert table.release("shardId-missing", "w1", 0) is False and raw(table, "shardId-missing") is None


def test_a_release_marked_unsettled_is_read_back_and_cleared_by_the_next_acquire(table):
    from kcl_pipeline.kcl.core.table.lease_rules import UNSETTLED_ATTRIBUTE

    assert table.create(lease(owner="w1", counter=9))
    assert table.release(KEY, "w1", 9, unsettled=True) is True
    released = table.get(KEY)
    assert released.lease_owner is None and released.extra.get(UNSETTLED_ATTRIBUTE) is True
    taken = table.acquire(KEY, "w2", None, 10)
    assert taken is not None and UNSETTLED_ATTRIBUTE not in taken.extra
    assert UNSETTLED_ATTRIBUTE not in raw(table)


def test_delete_is_conditional_on_the_observed_counter(table):
    assert table.create(lease(owner="w1", counter=7))
    assert table.delete(KEY, 6) is False
    assert table.get(KEY) is not None
    assert table.delete(KEY, 7) is True
    assert table.get(KEY) is None
    assert table.delete(KEY, 7) is False  # already gone


# == the pure rules and the real table agree ======================================================

STATES = {
    "missing": None,
    "free": lease(owner=None, counter=0, extra={"progress": "p"}),
    "null owner": lease(owner=None, counter=3),  # written with an explicit NULL leaseOwner below
    "owned by w1": lease(owner="w1", cp=SEQ56, sub=2, counter=5, switches=1, child_shard_ids=("c-1",),
                         extra={"pendingCheckpoint": "7", "progress": "p"}),
    "at LATEST": lease(owner="w1", cp=LATEST),
    "ended": lease(owner=None, cp=SHARD_END, sub=2),
    "ended, still owned": lease(owner="w1", cp=SHARD_END),
    # Written by another KCL implementation without checkpointSubSequenceNumber (removed below).
    "no sub-sequence": lease(owner="w1", cp=SEQ56, counter=5),
}

OPERATIONS = {
    "create": (lambda t, k: t.create(replace(lease(key=k, cp=TRIM_HORIZON, owner=None))),
               lambda x, k: rules.create(x, replace(lease(key=k, cp=TRIM_HORIZON, owner=None)))),
    "acquire w2 from nobody/0": (lambda t, k: t.acquire(k, "w2", None, 0),
                                 lambda x, k: rules.acquire(x, "w2", None, 0)),
    "acquire w2 from nobody/3": (lambda t, k: t.acquire(k, "w2", None, 3),
                                 lambda x, k: rules.acquire(x, "w2", None, 3)),
    "acquire w2 from w1/5": (lambda t, k: t.acquire(k, "w2", "w1", 5), lambda x, k: rules.acquire(x, "w2", "w1", 5)),
    "acquire w2 from w1/7": (lambda t, k: t.acquire(k, "w2", "w1", 7), lambda x, k: rules.acquire(x, "w2", "w1", 7)),
    "acquire w2 from w3/5": (lambda t, k: t.acquire(k, "w2", "w3", 5), lambda x, k: rules.acquire(x, "w2", "w3", 5)),
    "heartbeat w1/5": (lambda t, k: t.heartbeat(k, "w1", 5, {"landedTo": "9", "rows": 3, "caughtUp": False}),
                       lambda x, k: rules.heartbeat(x, "w1", 5, {"landedTo": "9", "rows": 3, "caughtUp": False})),
    "heartbeat w1/7": (lambda t, k: t.heartbeat(k, "w1", 7), lambda x, k: rules.heartbeat(x, "w1", 7)),
    "heartbeat w2/5": (lambda t, k: t.heartbeat(k, "w2", 5), lambda x, k: rules.heartbeat(x, "w2", 5)),
    "heartbeat w1/5 + SEQ56/1": (lambda t, k: t.heartbeat(k, "w1", 5, checkpoint=Checkpoint(SEQ56, 1)),
                                 lambda x, k: rules.heartbeat(x, "w1", 5, checkpoint=Checkpoint(SEQ56, 1))),
    "checkpoint 99999/0": (lambda t, k: t.checkpoint(k, Checkpoint("99999")),
                           lambda x, k: rules.checkpoint(x, Checkpoint("99999"))),
    "checkpoint SEQ56/2": (lambda t, k: t.checkpoint(k, Checkpoint(SEQ56, 2)),
                           lambda x, k: rules.checkpoint(x, Checkpoint(SEQ56, 2))),
    "checkpoint SEQ56/3": (lambda t, k: t.checkpoint(k, Checkpoint(SEQ56, 3)),
                           lambda x, k: rules.checkpoint(x, Checkpoint(SEQ56, 3))),
    "checkpoint SEQ56/1": (lambda t, k: t.checkpoint(k, Checkpoint(SEQ56, 1)),
                           lambda x, k: rules.checkpoint(x, Checkpoint(SEQ56, 1))),
    "end": (lambda t, k: t.end(k), lambda x, k: rules.end(x)),
    "end w1/5": (lambda t, k: t.end(k, "w1", 5), lambda x, k: rules.end(x, "w1", 5)),
    "end w1/6": (lambda t, k: t.end(k, "w1", 6), lambda x, k: rules.end(x, "w1", 6)),
    "release w1/5": (lambda t, k: t.release(k, "w1", 5), lambda x, k: rules.release(x, "w1", 5)),
    "release w1/7": (lambda t, k: t.release(k, "w1", 7), lambda x, k: rules.release(x, "w1", 7)),
    "release w2/5": (lambda t, k: t.release(k, "w2", 5), lambda x, k: rules.release(x, "w2", 5)),
    "delete/5": (lambda t, k: t.delete(k, 5), lambda x, k: None if not rules.delete(x, 5) else "deleted"),
    "delete/0": (lambda t, k: t.delete(k, 0), lambda x, k: None if not rules.delete(x, 0) else "deleted"),
}


def test_lease_rules_and_the_table_agree(plain_table):
    table = plain_table  # its states include an explicit NULL owner (see plain_table)
    mismatches = []
    for s, (state_name, state) in enumerate(STATES.items()):
        for o, (op_name, (on_table, on_rules)) in enumerate(OPERATIONS.items()):
            key = f"shardId-{s:03d}{o:03d}"
            before = replace(state, lease_key=key, extra=dict(state.extra)) if state else None
            if before is not None:
                item = lease_to_item(before)
                if state_name == "null owner":
                    item["leaseOwner"] = {"NULL": True}
                if state_name == "no sub-sequence":
                    del item["checkpointSubSequenceNumber"]
                put_raw(table, item)
            expected = on_rules(before, key)
            answer = on_table(table, key)
            after = table.get(key)
            passed = answer not in (None, False)
            if passed != (expected is not None):
                mismatches.append(f"{state_name} / {op_name}: table {'passed' if passed else 'failed'}, "
                                  f"rules {'passed' if expected is not None else 'failed'}")
            elif expected == "deleted":
                if after is not None:
                    mismatches.append(f"{state_name} / {op_name}: table kept {after}, rules deleted it")
            elif after != (expected if expected is not None else before):
                mismatches.append(f"{state_name} / {op_name}: table left {after}, rules {expected or before}")
            elif isinstance(answer, Lease) and answer != after:
                mismatches.append(f"{state_name} / {op_name}: acquire returned {answer}, table holds {after}")
    assert mismatches == []


# -- checkpoint riding on the heartbeat -------------------------------------------------------------------

@pytest.mark.parametrize("current, new, advances", CHECKPOINT_CASES)
def test_heartbeat_with_checkpoint_uses_both_conditions(table, current, new, advances):
    assert table.create(lease(cp=current[0], sub=current[1], owner="w1", counter=4))
    before = raw(table)
    assert table.heartbeat(KEY, "w1", 4, {"landedRows": 3}, checkpoint=Checkpoint(*new)) is advances
    after = table.get(KEY)
    if advances:
        assert after.lease_counter == 5 and after.checkpoint == Checkpoint(*new)
        assert after.owner_switches_since_checkpoint == 0 and after.extra["landedRows"] == 3
    else:
        assert raw(table) == before


def test_heartbeat_with_checkpoint_needs_ownership(table):
    assert table.create(lease(cp="100", owner="w2"))
    before = raw(table)
    assert table.heartbeat(KEY, "w1", 7, checkpoint=Checkpoint("200")) is False
    assert raw(table) == before


def test_heartbeat_with_a_sentinel_checkpoint_is_rejected(table):
    with pytest.raises(ValueError, match="sequence number"):
        table.heartbeat(KEY, "w1", 7, checkpoint=Checkpoint(TRIM_HORIZON))


# -- the leaseOwner index (KCL 3.x's LeaseOwnerToLeaseKeyIndex) ---------------------------------------------

def test_a_new_table_has_kcl3s_owner_index_and_owned_keys_reads_it(table):
    index = [i for i in table.client.describe_table(TableName=table.table_name)["Table"]["GlobalSecondaryIndexes"]
             if i["IndexName"] == "LeaseOwnerToLeaseKeyIndex"]
    assert index and index[0]["Projection"]["ProjectionType"] == "KEYS_ONLY"
    assert [(k["AttributeName"], k["KeyType"]) for k in index[0]["KeySchema"]] == [
        ("leaseOwner", "HASH"), ("leaseKey", "RANGE")]
    assert table.has_owner_index
    for i, owner in enumerate(["w1", "w2", "w1", None]):
        assert table.create(Lease(f"shardId-{i:012d}", Checkpoint(TRIM_HORIZON), owner, 1))
    assert sorted(table.owned_keys("w1")) == ["shardId-000000000000", "shardId-000000000002"]
    assert table.owned_keys("nobody") == []


def test_an_existing_table_without_the_index_is_detected_and_used_by_scans_only(any_dynamodb_client, unique_name):
    name = unique_name("noindex")
    any_dynamodb_client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST",
                                     AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                                     KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}])
    t = LeaseTable(name, any_dynamodb_client)
    assert t.ensure_table() is False
    assert not t.has_owner_index
    with pytest.raises(LeaseTableError, match="no ACTIVE LeaseOwnerToLeaseKeyIndex"):
        t.owned_keys("w1")


def test_a_lost_workers_flushed_checkpoint_never_moves_under_another_holder(table):
    """Found by the simulation: a worker that lost its lease flushed its processed checkpoint ownerless
    while a Java KCL peer, which had just taken the lease and read the older checkpoint, kept writing its
    own (fenced by its counter alone): the checkpoint went back. The flush now needs the lease free or
    still ours; the pipeline's ownerless commit needs it free or held by this protocol (KCL 3.5 item 6)."""
    table.create(Lease("held", Checkpoint("100"), "java-peer", 5))
    assert not table.checkpoint("held", Checkpoint("200"), unless_held_by_another="me")
    assert table.get("held").checkpoint == Checkpoint("100")
    assert not table.checkpoint("held", Checkpoint("200"))  # nor the pipeline's commit, under a Java holder
    table.create(Lease("free", Checkpoint("100"), None, 5))
    assert table.checkpoint("free", Checkpoint("200"), unless_held_by_another="me")
    table.create(Lease("mine", Checkpoint("100"), "me", 5))
    assert table.checkpoint("mine", Checkpoint("200"), unless_held_by_another="me")
