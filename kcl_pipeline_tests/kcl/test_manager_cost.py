"""The lease manager's cost per cycle in what it controls (issue 32): requests per cycle flat in the leases, and the
scan's items decoded without botocore's per-attribute walk (most of the manager's CPU per cycle grew with it).
Counted here, never timed; the figures are benchmarks/bench_manager_cost.py's, which runs here briefly too."""
from __future__ import annotations

import base64
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import boto3
import botocore.parsers
import pytest
from botocore.config import Config

from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.shells.aws import client, decode_attribute
from kcl_pipeline.kcl.shells.lease_table import LeaseTable

pytestmark = pytest.mark.emulator

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_manager_cost.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_manager_cost", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def botocores_client(endpoint_url: str, region: str):
    """A plain boto3 client: botocore's own parser for every response."""
    return boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test").client(
        "dynamodb", endpoint_url=endpoint_url, region_name=region, config=Config(retries={"mode": "standard"}))


EVERY_TYPE = {
    "leaseKey": {"S": "shardId-000000000001"}, "sort": {"N": "1"}, "n": {"N": "-12.5e3"}, "b": {"B": b"\x00\xffbin"},
    "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2.5"]}, "bs": {"BS": [b"\x01", b"\x02\x03"]},
    "m": {"M": {"inner": {"B": b"\x04"}, "deeper": {"M": {"l": {"L": [{"S": "x"}, {"B": b"\x05"}, {"NULL": True}]}}}}},
    "l": {"L": [{"N": "7"}, {"BOOL": False}, {"M": {}}, {"L": []}]}, "null": {"NULL": True}, "yes": {"BOOL": True},
    "unicode": {"S": "é ✓ \u2028"},
}


def test_scan_and_query_items_are_what_botocores_parser_makes(any_dynamodb_client, unique_name):
    """Every attribute type, binaries nested in maps and lists, a page boundary (LastEvaluatedKey): the package's
    clients decode Scan and Query pages from the body's JSON, and must give exactly botocore's result."""
    ours = any_dynamodb_client
    theirs = botocores_client(ours.meta.endpoint_url, ours.meta.region_name)
    table = unique_name("items")
    ours.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                      AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"},
                                            {"AttributeName": "sort", "AttributeType": "N"}],
                      KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"},
                                 {"AttributeName": "sort", "KeyType": "RANGE"}])
    try:
        theirs.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 0.2})
        ours.put_item(TableName=table, Item=EVERY_TYPE)
        ours.put_item(TableName=table, Item={**EVERY_TYPE, "sort": {"N": "2"}, "b": {"B": b""}})
        requests = [("scan", {"TableName": table, "ConsistentRead": True}),
                    ("scan", {"TableName": table, "Limit": 1, "ReturnConsumedCapacity": "TOTAL"}),
                    ("query", {"TableName": table, "KeyConditionExpression": "leaseKey = :k",
                               "ExpressionAttributeValues": {":k": {"S": "shardId-000000000001"}}, "Limit": 1})]
        for operation, request in requests:
            mine, botocores = (getattr(c, operation)(**request) for c in (ours, theirs))
            for response in (mine, botocores):
                response.pop("ResponseMetadata")
            assert mine == botocores, (operation, request)
            assert mine["Items"] and all(isinstance(item["b"]["B"], bytes) for item in mine["Items"])
        assert mine.get("LastEvaluatedKey") == {"leaseKey": {"S": "shardId-000000000001"}, "sort": {"N": "1"}}
    finally:
        ours.delete_table(TableName=table)


def test_decode_attribute_drops_what_botocore_drops():
    """Members botocore's AttributeValue shape does not have, and null members, are not in its result either."""
    assert decode_attribute({"S": "x", "Z": "unknown", "N": None}) == {"S": "x"}
    assert decode_attribute({"B": base64.b64encode(b"\x00").decode()}) == {"B": b"\x00"}


def test_a_bad_request_is_botocores_error_still(dynamodb_client, unique_name):
    """An error response is left to botocore's parser: the same modelled exception, with its message."""
    with pytest.raises(dynamodb_client.exceptions.ResourceNotFoundException):
        dynamodb_client.scan(TableName=unique_name("absent"))


def lease_table_of(dynamodb_client, name: str, leases: int) -> LeaseTable:
    table = LeaseTable(name, dynamodb_client)
    table.ensure_table()
    for i in range(leases):
        table.create(Lease(f"shardId-{i:012d}", Checkpoint("49590338271490256608559692538361571095921575989136588898"),
                           "consumer-1", 17 + i, parent_shard_ids=(f"shardId-{i + 5000:012d}",)))
    return table


def test_scan_cpu_does_not_walk_each_lease_through_botocores_shape_model(aws_settings, unique_name, monkeypatch):
    """The manager's CPU per cycle grew 2.8x from 8 to 64 leases (5.8 -> 16.2 ms), most of it botocore walking every
    attribute of every scanned lease through its shape model. Its parser's work per scan is now the same at 8 and
    at 64 leases: the items come from the body's JSON."""
    ddb = client("dynamodb", aws_settings)
    walked = Counter()
    parse_shape = botocore.parsers.ResponseParser._parse_shape

    def counting(self, shape, node):
        walked["shapes"] += 1
        return parse_shape(self, shape, node)

    work = {}
    for leases in (8, 64):
        table = lease_table_of(ddb, unique_name("cost"), leases)
        try:
            walked.clear()
            with monkeypatch.context() as patch:
                patch.setattr(botocore.parsers.ResponseParser, "_parse_shape", counting)
                scanned = table.scan()
            assert len(scanned) == leases and not scanned.skipped
            work[leases] = walked["shapes"]
        finally:
            ddb.delete_table(TableName=table.table_name)
    assert work[64] == work[8], work


def test_the_benchmark_runs_and_the_manager_makes_one_scan_and_one_listing_a_cycle(bench, aws_settings, tmp_path):
    """bench_manager_cost.py's measurement, briefly: the shipped manager holding 8 leases, 2 measured cycles and 2 of
    the peer's, every request of its clients counted from the call log."""
    result, peer = bench.measure(aws_settings, 8, 2, tmp_path, peer=True)
    assert len(result.cycles) == len(peer.cycles) == 2 and peer.items_by == "botocore"
    for cycle in result.cycles + peer.cycles:
        # At most the once-a-minute coordinator-state look (DescribeTable of KCL 3.x's table) besides the two reads.
        assert {op: n for op, n in cycle.requests.items() if op != "dynamodb:DescribeTable"} == {
            "dynamodb:Scan": 1, "kinesis:ListShards": 1}, cycle.requests
        assert cycle.requests["dynamodb:DescribeTable"] <= 1
        assert cycle.cpu_s > 0
    assert len(result.item_bytes) == 8 and min(result.item_bytes) > 0
    header, row, *rest = bench.report([result], [peer])
    assert "dynamodb:Scan" in header and row.split()[0] == "8"
    assert any("with botocore decoding the scan's items (the peer)" in line for line in rest)


@pytest.mark.slow
def test_requests_per_cycle_are_the_same_at_4_and_at_48_leases(bench, aws_settings, tmp_path):
    """Nothing the manager asks per cycle is per lease (a GetItem or a DescribeStream per lease would show here):
    the same requests by operation at 4 and at 48 leases (one page of the scan and of the listing at both)."""
    small, large = (bench.measure(aws_settings, n, 3, tmp_path)[0] for n in (4, 48))
    assert small.requests_per_cycle() == large.requests_per_cycle()
    assert large.requests_per_cycle()["dynamodb:Scan"] == 1 and large.requests_per_cycle()["kinesis:ListShards"] == 1
