"""aws.py's clients read botocore's data through one loader per process: parsed once, shared by every client
(and, under the forkserver, by every worker), while each client keeps its own session and credentials."""
from __future__ import annotations

import json

import botocore.awsrequest
import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.session
import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells import aws
from kcl_pipeline.kcl.shells.aws import boto3_session, client

SETTINGS = AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9")


def test_clients_share_botocore_data_and_keep_their_own_sessions(monkeypatch):
    client("kinesis", SETTINGS), client("dynamodb", SETTINGS)
    loader = aws._loader
    assert loader is not None
    read: list[str] = []
    real = loader.file_loader.load_file
    monkeypatch.setattr(loader.file_loader, "load_file", lambda path: read.append(path) or real(path))
    first, second = client("kinesis", SETTINGS), client("kinesis", SETTINGS)
    assert read == [], "a new client parsed botocore's data again (the endpoints alone are ~7 MB)"
    assert first._endpoint is not second._endpoint and first._request_signer is not second._request_signer
    for _ in range(5):
        boto3_session()
    assert len(loader.search_paths) == len(set(loader.search_paths)), "boto3's data path was added again"
    assert any(path.endswith("boto3/data") for path in loader.search_paths)


def test_s3_clients_keep_boto3s_transfer_methods():
    assert hasattr(client("s3", SETTINGS), "upload_fileobj")


# -- the forkserver's compacted data (aws.compact_loaded_data) -----------------------------------------------

WORKER_SERVICES = ("kinesis", "dynamodb", "cloudwatch", "s3")


def _loaded(services=WORKER_SERVICES, region: str = "eu-west-1") -> botocore.loaders.Loader:
    """A fresh loader holding what making each service's client (in `region`) loads."""
    loader = botocore.loaders.create_loader()
    core = botocore.session.Session()
    core.register_component("data_loader", loader)
    for service in services:
        core.create_client(service, region_name=region, aws_access_key_id="a", aws_secret_access_key="b")
    return loader


REGION_DATA = ("endpoints", "partitions")  # what botocore writes into: never compacted


def _documents(loader, region_data: bool = False) -> list:
    """Each parsed document the loader holds, once (a service model is cached under two keys): the region data
    alone, or all but it."""
    return list({id(d): d for k, v in loader._cache.items() if region_data == any(n in REGION_DATA for n in k)
                 for d in (v if isinstance(v, tuple) else (v,)) if isinstance(d, (dict, list))}.values())


def _reference_without_documentation(text: str) -> str:
    """The JSON text with every `documentation` / `documentationUrl` text emptied (a member of that name kept)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: "" if k in ("documentation", "documentationUrl") and isinstance(v, str) else strip(v)
                    for k, v in node.items()}
        return [strip(v) for v in node] if isinstance(node, list) else node
    return json.dumps(strip(json.loads(text)))


def _containers(node, seen=None) -> set[int]:
    seen = set() if seen is None else seen
    if isinstance(node, (dict, list)) and id(node) not in seen:
        seen.add(id(node))
        for child in (node.values() if isinstance(node, dict) else node):
            _containers(child, seen)
    return seen


def test_compacted_botocore_data_is_the_same_data_with_its_documentation_emptied():
    loader = _loaded()
    documents, region_data = _documents(loader), _documents(loader, region_data=True)
    before = [json.dumps(d) for d in documents]
    region_data_before = [json.dumps(d) for d in region_data]
    containers_before = len(_containers(documents))
    assert region_data and aws.compact_documents(loader._cache) == len(documents)
    for text, document in zip(before, documents, strict=True):
        assert json.dumps(document) == _reference_without_documentation(text)  # same keys, same order
    assert [json.dumps(d) for d in region_data] == region_data_before  # as loaded, documentation too
    assert any('"documentation"' in text for text in before)
    assert len(_containers(documents)) < containers_before / 2, "equal parts were not shared"


def test_compacting_keeps_a_member_named_documentation_and_key_order_and_types():
    cache = {("load_service_model", "x"): {
        "shapes": {"S": {"type": "structure", "documentation": "<p>shape</p>",
                         "members": {"documentation": {"shape": "T", "documentation": "<p>member</p>"}}}},
        "a": {"x": 1, "y": 2}, "b": {"y": 2, "x": 1}, "c": [1, True, 1.0, None], "d": [1, 1, True]}}
    aws.compact_documents(cache)
    document = cache[("load_service_model", "x")]
    assert document["shapes"]["S"] == {"type": "structure", "documentation": "",
                                       "members": {"documentation": {"shape": "T", "documentation": ""}}}
    assert list(document["b"]) == ["y", "x"] and document["a"] is not document["b"]  # XML member order counts
    assert [type(v) for v in document["c"]] == [int, bool, float, type(None)]
    assert [type(v) for v in document["d"]] == [int, int, bool]


def _sent(loader, calls, region: str = "eu-west-1", endpoint_url: str | None = None) -> list[tuple]:
    """What each call would send (method, URL, body, headers but the signature's and the clock's), from a client
    reading botocore's data through `loader`; nothing leaves the process."""
    core = botocore.session.Session()
    core.register_component("data_loader", loader)
    sent: list[tuple] = []

    def capture(request, **kwargs):
        unstable = ("Authorization", "X-Amz-Date", "User-Agent", "amz-sdk-invocation-id", "amz-sdk-request")
        headers = {k: v for k, v in request.headers.items() if k not in unstable}
        body = request.body.read() if hasattr(request.body, "read") else request.body
        sent.append((request.method, request.url, body, sorted(headers.items())))
        return botocore.awsrequest.AWSResponse(request.url, 400, {}, _NoBody())  # not retried

    for service, operation, params in calls:
        made = core.create_client(service, region_name=region, endpoint_url=endpoint_url, aws_access_key_id="a",
                                  aws_secret_access_key="b",
                                  config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}))
        made.meta.events.register("before-send", capture)
        try:
            getattr(made, operation)(**params)
        except botocore.exceptions.ClientError:
            pass
    return sent


class _NoBody:
    def stream(self, **kwargs):
        return iter(())

    def read(self, *args):
        return b""


CALLS = [
    ("s3", "put_object", {"Bucket": "landing", "Key": "a/b.parquet", "Body": b"x", "IfNoneMatch": "*"}),
    ("s3", "list_objects_v2", {"Bucket": "landing", "Prefix": "a/", "StartAfter": "a/0"}),
    ("s3", "get_object", {"Bucket": "landing", "Key": "a/b.parquet", "Range": "bytes=-64"}),
    ("dynamodb", "update_item", {"TableName": "t", "Key": {"leaseKey": {"S": "k"}},
                                 "UpdateExpression": "SET leaseCounter = :c",
                                 "ConditionExpression": "leaseCounter = :p",
                                 "ExpressionAttributeValues": {":c": {"N": "2"}, ":p": {"N": "1"}}}),
    ("kinesis", "get_records", {"ShardIterator": "it", "Limit": 100}),
    ("cloudwatch", "put_metric_data", {"Namespace": "n", "MetricData": [
        {"MetricName": "m", "Value": 1.0, "Unit": "Count", "Dimensions": [{"Name": "d", "Value": "v"}]}]}),
]


def test_clients_of_compacted_data_send_what_clients_of_botocores_data_send():
    compacted = _loaded()
    aws.compact_documents(compacted._cache)
    expected = _sent(_loaded(), CALLS)
    assert len(expected) == len(CALLS)
    assert _sent(compacted, CALLS) == expected


@pytest.mark.parametrize("region, endpoint_url", [("eu-west-1", None), ("ap-southeast-2", None),
                                                  ("eu-west-1", "http://127.0.0.1:4567"),
                                                  ("us-east-1", "http://127.0.0.1:4567")])
def test_workers_in_any_region_send_what_botocore_sends_after_the_forkserver_compacted_its_us_east_1_data(
        region, endpoint_url):
    """The forkserver warms its data with us-east-1 clients and compacts it; a worker forked from it then makes
    its clients in its own region. botocore writes into its endpoints and partitions data as it resolves a
    region (it merges a region's defaults into the region's entry): shared with equal parts elsewhere (an empty
    `{}` is everywhere, a rule set's `headers` among them), the write reached the DynamoDB rule set, and every
    worker outside the warm-up's path failed its first lease-table write with KeyError: 'service'."""
    compacted = _loaded(region="us-east-1")
    aws.compact_documents(compacted._cache)
    expected = _sent(_loaded(region="us-east-1"), CALLS, region, endpoint_url)
    assert len(expected) == len(CALLS)
    assert _sent(compacted, CALLS, region, endpoint_url) == expected
