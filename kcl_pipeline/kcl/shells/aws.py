"""boto3 clients for the consumer, honouring explicit endpoints and the standard AWS_ENDPOINT_URL* variables.

Against real AWS nothing is needed but the usual credential chain and region. botocore's `standard`
retry mode handles throttling (ProvisionedThroughputExceeded, DynamoDB throttling) with jittered back-off.
"""
from __future__ import annotations

import threading
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import botocore.utils
from botocore.config import Config

from ..aws_settings import AwsSettings


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
    return boto3_session().client(service, endpoint_url=settings.endpoint_for(service), config=cfg)


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
    (the endpoints of every service repeat the same few region entries). botocore reads this data and never
    writes to it, so sharing equal parts changes nothing it computes. Called after each document is loaded, the
    space it frees is reused by the next one. Returns the number of documents walked."""
    with _LOADER_LOCK:
        return compact_documents(_loader._cache) if _loader is not None else 0  # botocore's instance cache


def compact_documents(cache: dict[Any, Any]) -> int:
    """compact_loaded_data over a loader's cache: its values are botocore's parsed documents, or (document,
    path) pairs (`load_data_with_path`, where the endpoints are)."""
    memo: dict[tuple[Any, ...], Any] = {}
    # A service model is cached twice (as loaded, and as loaded with its path): walk each document once.
    documents = list({id(d): d for v in cache.values() for d in (v if isinstance(v, tuple) else (v,))
                      if isinstance(d, (dict, list))}.values())
    for document in documents:
        _share_equal_parts(document, memo)
    return len(documents)


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
