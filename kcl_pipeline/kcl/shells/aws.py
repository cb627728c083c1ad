"""boto3 clients for the consumer, honouring explicit endpoints and the standard AWS_ENDPOINT_URL* variables.

Against real AWS nothing is needed but the usual credential chain and region. botocore's `standard`
retry mode handles throttling (ProvisionedThroughputExceeded, DynamoDB throttling) with jittered back-off.
"""
from __future__ import annotations

import base64
import json
import os
import threading
import weakref
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import botocore.utils
from botocore.config import Config

from ..aws_settings import AWS_CALL_LOG_ENV, AwsSettings, S3RequestSettings


def client(service: str, settings: AwsSettings | None = None, *, max_attempts: int | None = None,
           read_timeout: float = 20.0):
    settings = settings or AwsSettings()
    cfg = Config(
        region_name=settings.resolved_region(),
        retries={"mode": "standard", "max_attempts": max_attempts or settings.max_attempts},
        connect_timeout=5,
        read_timeout=read_timeout,
        max_pool_connections=20,
    )
    made = boto3_session().client(service, endpoint_url=settings.endpoint_for(service), config=cfg)
    if service == "dynamodb":
        decode_items_from_json(made)
    return instrument(made, settings.s3_requests() if service == "s3" else None)


# The operations whose responses carry a page of items (`Items`): the lease manager scans the whole lease table
# every cycle, and its CPU per cycle grows with the items it decodes.
ITEM_PAGES = ("Scan", "Query")
ITEMS_FROM_JSON_HOOK = "kcl-pipeline-items-from-json-{operation}"  # the unique id of each operation's hook


def decode_items_from_json(dynamodb_client: Any) -> Any:
    """Decode the `Items` of Scan and Query responses straight from the body's JSON, to what botocore's parser
    makes of them: botocore walks every attribute of every item through its shape model (~80 µs of CPU per
    lease item; the lease manager's scan is most of its CPU per cycle, growing with the leases), where the
    body's JSON already is DynamoDB's typed form and only binary values need decoding (`decode_attribute`: ~8 µs
    an item). The rest of the response (counts, LastEvaluatedKey, ConsumedCapacity, metadata) and every error
    response are botocore's as before. Hooked at `before-parse`, which hands the response to parse."""
    events = dynamodb_client.meta.events
    for operation in ITEM_PAGES:
        events.register(f"before-parse.dynamodb.{operation}", _items_from_json,
                        unique_id=ITEMS_FROM_JSON_HOOK.format(operation=operation))
    return dynamodb_client


def _items_from_json(response_dict: dict[str, Any], customized_response_dict: dict[str, Any] | None = None,
                     **_: Any) -> None:
    # A botocore that hands no `customized_response_dict` to this event parses the whole response itself.
    if customized_response_dict is None or response_dict.get("status_code") != 200 or not response_dict.get("body"):
        return
    try:
        body = json.loads(response_dict["body"])
    except ValueError:
        return  # botocore's parser says what is wrong with it
    items = body.pop("Items", None) if isinstance(body, dict) else None
    if not isinstance(items, list):
        return
    customized_response_dict["Items"] = [{name: decode_attribute(value) for name, value in item.items()}
                                         for item in items]
    response_dict["body"] = json.dumps(body).encode()  # what botocore still parses: the response without its items


# AttributeValue's members (botocore drops any other key, and a member whose value is null).
_ATTRIBUTE_MEMBERS = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})


def decode_attribute(value: dict[str, Any]) -> dict[str, Any]:
    """One attribute value as botocore's parser returns it: binaries (B, BS) as bytes, maps and lists decoded
    within, everything else as the JSON has it (numbers stay strings)."""
    decoded: dict[str, Any] = {}
    for kind, v in value.items():
        if v is None or kind not in _ATTRIBUTE_MEMBERS:
            continue
        if kind == "B":
            v = base64.b64decode(v)
        elif kind == "BS":
            v = [base64.b64decode(b) for b in v]
        elif kind == "M":
            v = {name: decode_attribute(element) for name, element in v.items()}
        elif kind == "L":
            v = [decode_attribute(element) for element in v]
        decoded[kind] = v
    return decoded


# The request parameters a call is authorised by: what it acts on (an IAM policy's Resource and Condition are
# matched against them) and the S3 ones that bring KMS into it or fence the bucket's owner. Nothing else of a
# request (bodies, items, values) is ever recorded.
_RECORDED_PARAMETERS = ("TableName", "IndexName", "StreamName", "StreamARN", "ConsumerARN", "ConsumerName",
                        "Bucket", "Key", "Prefix", "Namespace", "SSEKMSKeyId", "ExpectedBucketOwner")


_S3_REQUESTS: weakref.WeakKeyDictionary[Any, S3RequestSettings] = weakref.WeakKeyDictionary()


def s3_requests_of(aws_client: Any) -> S3RequestSettings:
    """What `instrument` made this S3 client's requests carry (for error messages that name it)."""
    try:
        return _S3_REQUESTS.get(aws_client) or S3RequestSettings()
    except TypeError:  # not weak-referenceable: a test's stand-in
        return S3RequestSettings()


def instrument(aws_client: Any, s3: S3RequestSettings | None = None) -> Any:
    """Every AWS client of the package passes here, those made elsewhere (dagster-aws's S3 resource) too: an S3
    client's requests get what `s3` asks (SSE-KMS, ExpectedBucketOwner), and with KCL_PIPELINE_AWS_CALL_LOG set
    every call is appended to that file. Hooked at botocore's `before-parameter-build`, which sees each API call
    once (a retry is not another call), with its parameters before they are validated and serialised."""
    events = aws_client.meta.events
    service = aws_client.meta.service_model.service_name
    if s3:
        _S3_REQUESTS[aws_client] = s3

        def add_s3_parameters(params: dict[str, Any], model: Any, **_: Any) -> None:
            accepted = set(model.input_shape.members) if model.input_shape is not None else set()
            for name, value in s3.parameters(accepted).items():
                params.setdefault(name, value)

        events.register(f"before-parameter-build.{aws_client.meta.service_model.service_id.hyphenize()}",
                        add_s3_parameters, unique_id="kcl-pipeline-s3-parameters")
    log_path = os.environ.get(AWS_CALL_LOG_ENV, "").strip()
    if log_path:
        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            resource = {k: params[k] for k in _RECORDED_PARAMETERS if isinstance(params.get(k), str)}
            deleted = params.get("Delete", {}).get("Objects") if model.name == "DeleteObjects" else None
            if deleted:
                resource["Keys"] = [o.get("Key") for o in deleted]
            line = json.dumps({"call": f"{service}:{model.name}", "pid": os.getpid(),
                               "region": aws_client.meta.region_name, **resource}) + "\n"
            # One write of one line to a file opened for appending: lines of concurrent processes never mix.
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

        # Registered last, so it records the parameters as sent (the S3 ones added).
        events.register_last(f"before-parameter-build.{aws_client.meta.service_model.service_id.hyphenize()}",
                             record, unique_id="kcl-pipeline-call-log")
    return aws_client


# botocore's data (the endpoints of every service, ~7 MB of Python objects once parsed, and each service's
# model) is read through a session's loader, and a fresh session reads it all again: two clients made two
# copies. Every session of this process reads through one loader instead (read-only data; credentials,
# clients and connections stay per session). A lease worker forked from a preloaded server inherits the
# server's loader, its data already parsed and shared (worker_processes.py).
_LOADER_LOCK = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def parse_timestamp(value: Any) -> datetime:
    """botocore's timestamp parsing, without dateutil for the two forms of XML services (S3, CloudWatch): ISO 8601
    in bodies (`2024-05-01T12:00:00.000Z`, every object of an S3 listing) and RFC 7231 in headers (`Wed, 01 May
    2024 12:00:00 GMT`, every S3 read). botocore's parser (dateutil) costs ~60 µs of CPU a timestamp, a tenth of
    the client's CPU in the lineage audit's listings and reads; these take 1–5 µs. Both come back
    timezone-aware, the same instants botocore's parser gives; any other form (epoch seconds in JSON services,
    offsets) is botocore's."""
    if isinstance(value, str):
        try:
            if value.endswith("Z") and value[10:11] == "T":
                return datetime.fromisoformat(value)
            if value.endswith(" GMT"):
                return parsedate_to_datetime(value)
        except (ValueError, TypeError, IndexError):
            pass  # botocore's parser says what is wrong with it
    return botocore.utils.parse_timestamp(value)


# Keys of botocore's data whose text only its documentation reads (docstrings, `help()`). botocore requires some
# to be present (a client context parameter's), so they are kept, emptied.
_DOCUMENTATION_KEYS = frozenset({"documentation", "documentationUrl"})


def compact_loaded_data() -> int:
    """Shrink, in place, what this process's loader has parsed, for a server whose forked workers all map it
    (worker_processes.warm_up): documentation texts become empty, and equal parts of the data become one object
    (the rule sets and models of the services repeat the same few parts). botocore reads the service models and
    rule sets and never writes to them, so sharing their equal parts changes nothing it computes; the region
    data (`_WRITTEN_BY_BOTOCORE`) it writes into as it resolves a region, so that is left as loaded. Called after
    each document is loaded, the space it frees is reused by the next one. Returns the number of documents
    walked."""
    with _LOADER_LOCK:
        return compact_documents(_loader._cache) if _loader is not None else 0  # botocore's instance cache


# The documents botocore writes into after loading them: the endpoints (a region's defaults are merged into its
# entry as a client resolves that region) and the partitions (a partition's outputs get its name). Shared with
# equal parts elsewhere (an empty `{}` is in every document), such a write reaches every document that shares the
# part: after a us-east-1 warm-up, a client in another region found the endpoint defaults in the DynamoDB rule
# set's `headers` and failed every call (KeyError: 'service'). They are left out of the compaction.
_WRITTEN_BY_BOTOCORE = frozenset({"endpoints", "partitions"})


def compact_documents(cache: dict[Any, Any]) -> int:
    """compact_loaded_data over a loader's cache: its values are botocore's parsed documents, or (document,
    path) pairs (`load_data_with_path`); its keys name the document (`("load_data_with_path", "endpoints")`)."""
    memo: dict[tuple[Any, ...], Any] = {}
    # A service model is cached twice (as loaded, and as loaded with its path): walk each document once.
    documents = list({id(d): d for k, v in cache.items() if _WRITTEN_BY_BOTOCORE.isdisjoint(_names(k))
                      for d in (v if isinstance(v, tuple) else (v,)) if isinstance(d, (dict, list))}.values())
    for document in documents:
        _share_equal_parts(document, memo)
    return len(documents)


def _names(key: Any) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def _share_equal_parts(node: Any, memo: dict[tuple[Any, ...], Any]) -> Any:
    """Hash-consing, in place: each container's children are replaced by the first equal one seen, so equal
    containers have identical children and are found by their children's identities; documentation texts are
    emptied on the way. (A member named "documentation" is a definition, not a text: it is kept.)"""
    if isinstance(node, dict):
        for k, v in node.items():
            node[k] = "" if k in _DOCUMENTATION_KEYS and isinstance(v, str) else _share_equal_parts(v, memo)
        key: tuple[Any, ...] = ("dict", *((k, id(v)) for k, v in node.items()))
    elif isinstance(node, list):
        node[:] = [_share_equal_parts(v, memo) for v in node]
        key = ("list", *(id(v) for v in node))
    else:
        key = (type(node), node)  # str, int, float, bool, None: by value (True is not 1)
    # A key names only objects the memo keeps alive (its values' children), so an id is never reused meanwhile.
    return memo.setdefault(key, node)


def boto3_session() -> boto3.session.Session:
    """A new boto3 session (its own credentials) reading botocore's data through this process's one loader."""
    global _loader
    with _LOADER_LOCK:
        core = botocore.session.Session()
        if _loader is None:
            _loader = botocore.loaders.create_loader(core.get_config_variable("data_path"))
        core.register_component("data_loader", _loader)
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        made = boto3.session.Session(botocore_session=core)
        # boto3 appends its data directory to the loader of every session it makes: keep it once.
        _loader.search_paths[:] = dict.fromkeys(_loader.search_paths)
        return made
