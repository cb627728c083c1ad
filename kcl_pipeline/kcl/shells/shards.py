"""Shard discovery: ListShards (paginated), the stream's ARN and status, and the errors they raise.

The order ListShards returns is kept: the lease planner relies on it (parents are listed before their
children). Errors name the stream, the region and the endpoint, because the usual cause of a missing
stream is a consumer pointed at the wrong account, region or emulator.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from ..core.model import Shard
from ..core.streams import (
    STREAM_ARN_RE,
    StreamScope,
    is_stream_identifier,
    pinned_scope,
    stream_identifier,
    stream_name,
)

log = logging.getLogger(__name__)


class KinesisError(Exception):
    """Base of the errors this package raises for Kinesis calls."""


class StreamNotFound(KinesisError):
    """The stream does not exist where the client looks for it."""


class KinesisUnavailable(KinesisError):
    """The Kinesis endpoint could not be reached or kept failing after botocore's retries."""


def where(kinesis: Any) -> str:
    """`region R (endpoint E)` of a client, for error messages."""
    endpoint = getattr(kinesis.meta, "endpoint_url", None) or "default AWS endpoint"
    return f"region {kinesis.meta.region_name} (endpoint {endpoint})"


def error_code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, (BotoConnectionError, HTTPClientError))


def unavailable(kinesis: Any, operation: str, exc: BaseException) -> KinesisUnavailable:
    attempts = ""
    if isinstance(exc, ClientError):
        retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts")
        attempts = f" after {int(retries) + 1} attempts" if retries is not None else ""
    return KinesisUnavailable(f"Kinesis {operation} failed in {where(kinesis)}{attempts}: {exc}")


def _call(kinesis: Any, stream: str, operation: str, fn: Callable[..., dict], **kwargs: Any) -> dict:
    """One API call with its failures translated into this module's errors."""
    try:
        return fn(**kwargs)
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise StreamNotFound(f"Kinesis stream {stream} does not exist in {where(kinesis)}") from exc
        if http_status(exc) >= 500:
            raise unavailable(kinesis, operation, exc) from exc
        raise
    except (BotoConnectionError, HTTPClientError) as exc:
        raise unavailable(kinesis, operation, exc) from exc


def _stream_kwargs(stream: str) -> dict[str, str]:
    # Names, ARNs and stream identifiers (<account>:<name>:<creationEpoch>: called by name) are accepted
    # everywhere a stream is named.
    if stream.startswith("arn:"):
        return {"StreamARN": stream}
    return {"StreamName": stream_name(stream)}


def list_shards(kinesis: Any, stream: str) -> list[Shard]:
    """Every shard of the stream (open and closed, within retention), in the API's order.

    The first page is asked by stream; later pages by NextToken only (the API rejects both together).
    """
    shards: list[Shard] = []
    kwargs: dict[str, Any] = _stream_kwargs(stream)
    while True:
        page = _call(kinesis, stream, "ListShards", kinesis.list_shards, **kwargs)
        shards.extend(Shard.from_api(item) for item in page.get("Shards", []))
        token = page.get("NextToken")
        if not token:
            return shards
        kwargs = {"NextToken": token}


def stream_scope(kinesis: Any, stream: str) -> StreamScope:
    """The stream as a multi-stream application names it (its identifier carries its creation time): the one
    the application configured (`<account>:<name>:<creationEpoch>`, as Java's applications do; no call), else
    from DescribeStreamSummary."""
    if is_stream_identifier(stream):
        return pinned_scope(stream)
    return StreamScope(stream, stream_identifier(describe_stream_summary(kinesis, stream)))


def list_application_shards(kinesis: Any, streams: Sequence[str], multi_stream: bool) -> list[Shard]:
    """Every shard of the application's streams, named by lease key (streams.py).

    Multi-stream: each stream is described before and after its listing, and its shards are kept only when
    both name the same stream (creation time): a stream deleted and re-created in between lists the new
    stream's shards, whose ids repeat the old ones, and they must never be taken for the old stream's. A
    stream that does not exist (deleted, or being re-created) lists nothing this time; its leases wait, and
    the other streams are consumed meanwhile."""
    if not multi_stream:
        return list_shards(kinesis, streams[0])
    shards: list[Shard] = []
    for stream in streams:
        try:
            before = stream_scope(kinesis, stream)
            listed = list_shards(kinesis, stream)
            after = stream_scope(kinesis, stream)
        except StreamNotFound as exc:
            log.warning("%s: its shards are not listed this cycle (its leases wait; a re-created stream starts "
                        "afresh under its new creation time)", exc)
            continue
        if after != before:
            log.warning("stream %s was re-created while it was listed (%s, then %s): listed again next cycle",
                        stream, before.identifier, after.identifier)
            continue
        shards.extend(before.shards(listed))
    return shards


def describe_stream_summary(kinesis: Any, stream: str) -> dict[str, Any]:
    resp = _call(kinesis, stream, "DescribeStreamSummary", kinesis.describe_stream_summary, **_stream_kwargs(stream))
    return resp["StreamDescriptionSummary"]


def stream_arn(kinesis: Any, stream: str) -> str:
    return describe_stream_summary(kinesis, stream)["StreamARN"]


def resolve_stream_arn(kinesis: Any, stream: str) -> str:
    """The ARN of the stream as configured: an ARN is its own (no call), a name is the stream of that name in the
    client's account and region (DescribeStreamSummary). The landing zone records it in every batch."""
    return stream if STREAM_ARN_RE.fullmatch(stream) else stream_arn(kinesis, stream)


def wait_stream_active(kinesis: Any, stream: str, timeout: float = 60.0, *, poll_interval: float = 0.25,
                       sleep: Callable[[float], None] = time.sleep,
                       monotonic: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Wait until the stream is ACTIVE (created or resharded); returns its summary.

    A stream that is DELETING, or that does not become ACTIVE within `timeout`, is an error.
    """
    deadline = monotonic() + timeout
    while True:
        summary = describe_stream_summary(kinesis, stream)
        status = summary.get("StreamStatus")
        if status == "ACTIVE":
            return summary
        if status == "DELETING":
            raise StreamNotFound(f"Kinesis stream {stream} is being deleted in {where(kinesis)}")
        remaining = deadline - monotonic()
        if remaining <= 0:
            raise KinesisError(
                f"Kinesis stream {stream} in {where(kinesis)} is still {status} after {timeout:g} s"
            )
        sleep(min(poll_interval, remaining))
