"""A loopback Kinesis endpoint that serves SubscribeToShard (enhanced fan-out) from kinesis-local.

kinesis-local registers, describes, lists and deregisters stream consumers, but its SubscribeToShard answer
opens with a SubscribeToShardEvent instead of the `initial-response` event botocore requires, so botocore
refuses it ("First event was not of type initial-response"). No other emulator here serves SubscribeToShard.
This endpoint stands in front of kinesis-local:

* SubscribeToShard is served here, over HTTP/1.1 with a chunked `application/vnd.amazon.eventstream` body of
  real event-stream messages (prelude: total length, headers length, prelude CRC32; string headers; JSON
  payload; message CRC32): first the `initial-response` event, then SubscribeToShardEvent events carrying the
  Records exactly as kinesis-local's GetRecords JSON gives them (SequenceNumber, ApproximateArrivalTimestamp,
  Data, PartitionKey, EncryptionType), ContinuationSequenceNumber, MillisBehindLatest and, at a shard's end,
  ChildShards (with a null continuation, as Kinesis sends it). The records are read from kinesis-local with
  GetShardIterator / GetRecords every `poll_interval` seconds; an empty event goes out every
  `heartbeat_seconds` while the shard is idle.
* A subscription ends cleanly after `subscription_seconds` (Kinesis: 5 minutes), or after
  `events_per_subscription` events that carried records (deterministic resubscriptions for tests).
* A second subscription of the same consumer and shard within `in_use_seconds` of the first is refused with
  ResourceInUseException; later, it takes over and the first ends with a ResourceInUseException event.
* Every other call (the consumer calls included) is proxied to kinesis-local unchanged, unless a scripted
  error answers it (`fail_operation`).
* `faults`: scripted failures of the next subscriptions (after a given number of events: an exception event, a
  connection dropped or reset), consumed one per subscription, in order.

Continuation sequence numbers: a subscription always serves AFTER_SEQUENCE_NUMBER of a position C it resolves
first (TRIM_HORIZON: the shard's starting sequence number; LATEST: the shard's last record; AT_SEQUENCE_NUMBER
and AT_TIMESTAMP: the last record before them, found by reading the shard from its start), and every event
carries C as it moves, so resubscribing AFTER_SEQUENCE_NUMBER of any continuation loses and repeats nothing.

    endpoint = FanOutEndpoint(emulators.kinesis).start()
    ... point the Kinesis client (AWS_ENDPOINT_URL_KINESIS) at endpoint.url ...
    endpoint.stop()
"""
from __future__ import annotations

import binascii
import http.client
import json
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

TARGET_PREFIX = "Kinesis_20131202."
JSON_CONTENT_TYPE = "application/x-amz-json-1.1"
EVENT_STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
_STRING_HEADER = 7  # the event-stream header value type of a UTF-8 string


# -- the event-stream encoding ------------------------------------------------------------------------------

def encode_headers(headers: Mapping[str, str]) -> bytes:
    """Event-stream headers, all strings: name length (1 byte), name, type 7, value length (2 bytes), value."""
    out = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
        out += struct.pack(">B", len(raw_name)) + raw_name
        out += struct.pack(">BH", _STRING_HEADER, len(raw_value)) + raw_value
    return bytes(out)


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude (total length, headers length, CRC32 of those 8 bytes), headers,
    payload, and the CRC32 of everything before it."""
    raw_headers = encode_headers(headers)
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", binascii.crc32(body) & 0xFFFFFFFF)


def event_message(event_type: str, payload: Mapping[str, Any]) -> bytes:
    return encode_message({":message-type": "event", ":event-type": event_type, ":content-type": "application/json"},
                          json.dumps(payload, separators=(",", ":")).encode())


def exception_message(code: str, message: str) -> bytes:
    """A modelled exception inside the stream (botocore raises it as an EventStreamError with this code)."""
    return encode_message({":message-type": "exception", ":exception-type": code,
                           ":content-type": "application/json"}, json.dumps({"message": message}).encode())


# -- what tests script and observe ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SubscriptionFault:
    """What goes wrong in a subscription after `after_events` events (the initial response not counted):
    "exception" sends an exception event of `code` and ends the stream; "invalid-event" sends the next records in
    an event with neither a continuation nor child shards and ends the stream; "drop" closes the connection without
    ending the chunked body (the client reads what was sent, then the stream breaks); "reset" resets it (RST:
    the client may lose what it had not read yet, the initial response included)."""

    after_events: int
    kind: str = "exception"
    code: str = "InternalFailureException"


@dataclass
class Subscription:
    """One SubscribeToShard this endpoint served (for tests to look at)."""

    consumer_arn: str
    shard_id: str
    starting_position: dict
    started: float = field(default_factory=time.monotonic)
    events: int = 0
    record_events: int = 0
    records: int = 0
    ended: str = ""  # expired | limit | shard_end | fault:<kind> | taken_over | client_gone | stopped | error:<...>
    taken_over: bool = False

    @property
    def open(self) -> bool:
        return not self.ended


@dataclass
class _ScriptedError:
    code: str
    status: int
    message: str
    times: int | None  # None: every call


class _Refused(Exception):
    """A SubscribeToShard refused before its stream opens: answered as a plain JSON error."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status


class FanOutEndpoint(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, *, subscription_seconds: float = 300.0,
                 events_per_subscription: int | None = None, records_per_event: int = 10000,
                 heartbeat_seconds: float = 1.0, poll_interval: float = 0.05, in_use_seconds: float = 5.0):
        self.upstream = urlparse(upstream)
        self.subscription_seconds = subscription_seconds
        self.events_per_subscription = events_per_subscription
        self.records_per_event = records_per_event
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_interval = poll_interval
        self.in_use_seconds = in_use_seconds
        self.faults: list[SubscriptionFault] = []
        self.subscriptions: list[Subscription] = []
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._errors: dict[str, _ScriptedError] = {}
        self._local = threading.local()
        self._thread: threading.Thread | None = None
        super().__init__(("127.0.0.1", 0), _Handler)

    # -- lifecycle ----------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> "FanOutEndpoint":
        self._thread = threading.Thread(target=self.serve_forever, name="fanout-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()

    # -- scripting ------------------------------------------------------------------------------------------
    def fail_operation(self, operation: str, code: str, *, status: int = 400, message: str = "",
                       times: int | None = 1) -> None:
        """Answer the next `times` calls of `operation` (None: every call until cleared) with a JSON error."""
        with self.lock:
            self._errors[operation] = _ScriptedError(code, status, message or f"scripted {code}", times)

    def clear_failures(self) -> None:
        with self.lock:
            self._errors.clear()

    def scripted_error(self, operation: str) -> _ScriptedError | None:
        with self.lock:
            error = self._errors.get(operation)
            if error is None:
                return None
            if error.times is not None:
                error.times -= 1
                if error.times <= 0:
                    del self._errors[operation]
            return error

    def take_fault(self) -> SubscriptionFault | None:
        with self.lock:
            return self.faults.pop(0) if self.faults else None

    def subscriptions_of(self, shard_id: str) -> list[Subscription]:
        with self.lock:
            return [s for s in self.subscriptions if s.shard_id == shard_id]

    # -- kinesis-local ------------------------------------------------------------------------------------
    def upstream_call(self, operation: str, body: bytes | Mapping[str, Any],
                      headers: Mapping[str, str] | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
        """One call to kinesis-local over this thread's connection (reconnecting once if it was closed)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in ("host", "connection", "content-length")}
        sent.setdefault("Content-Type", JSON_CONTENT_TYPE)
        sent["X-Amz-Target"] = TARGET_PREFIX + operation
        # kinesis-local does not check signatures; it reads the region (and account) from the credential scope.
        sent.setdefault("Authorization", "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/kinesis/aws4_request, "
                                         "SignedHeaders=host, Signature=0")
        sent.setdefault("X-Amz-Date", "20260101T000000Z")
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                                                     timeout=60)
            try:
                conn.request("POST", "/", raw, sent)
                response = conn.getresponse()
                return response.status, response.getheaders(), response.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def upstream_json(self, operation: str, body: Mapping[str, Any]) -> dict:
        status, _, data = self.upstream_call(operation, body)
        parsed = json.loads(data or b"{}")
        if status != 200:
            code = str(parsed.get("__type", f"HTTP{status}")).rpartition("#")[2]
            raise _Refused(code, parsed.get("message") or parsed.get("Message") or data.decode(errors="replace"),
                           status)
        return parsed


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FanOutEndpoint

    def log_message(self, *_):
        pass

    def do_POST(self):  # noqa: N802 - http.server's naming
        server = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        operation = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
        with server.lock:
            server.counts[operation] += 1
        error = server.scripted_error(operation)
        if error is not None:
            self._json_error(error.code, error.message, error.status)
            return
        if operation == "SubscribeToShard":
            self._subscribe(json.loads(body or b"{}"))
            return
        status, headers, data = server.upstream_call(operation, body, dict(self.headers.items()))
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json_error(self, code: str, message: str, status: int = 400) -> None:
        data = json.dumps({"__type": code, "message": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", JSON_CONTENT_TYPE)
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # -- SubscribeToShard -------------------------------------------------------------------------------------
    def _subscribe(self, request: dict) -> None:
        server = self.server
        try:
            sub, stream, continuation = self._open(request)
        except _Refused as exc:
            self._json_error(exc.code, str(exc), exc.status)
            return
        self.send_response(200)
        self.send_header("Content-Type", EVENT_STREAM_CONTENT_TYPE)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        fault = server.take_fault()
        try:
            self._chunk(event_message("initial-response", {}))
            sub.ended = _Stream(self, sub, stream, continuation, fault).serve()
        except (ConnectionError, OSError):
            sub.ended = sub.ended or "client_gone"
            self.close_connection = True
            return
        if sub.ended == "fault:reset":
            self.close_connection = True
            _reset(self.connection)
            return
        if sub.ended == "fault:drop":
            self.close_connection = True  # closed without the last chunk: the body ends short
            return
        self._chunk(b"")  # the last chunk: the subscription is over

    def _open(self, request: dict) -> tuple[Subscription, str, str]:
        server = self.server
        consumer_arn, shard_id = request.get("ConsumerARN", ""), request.get("ShardId", "")
        position = request.get("StartingPosition") or {}
        consumer = server.upstream_json("DescribeStreamConsumer", {"ConsumerARN": consumer_arn})
        description = consumer["ConsumerDescription"]
        if description["ConsumerStatus"] != "ACTIVE":
            raise _Refused("ResourceInUseException",
                           f"consumer {consumer_arn} is {description['ConsumerStatus']}, not ACTIVE")
        stream = description["StreamARN"].rpartition("/")[2]
        continuation = _Positions(server, stream, shard_id).resolve(position)
        sub = Subscription(consumer_arn, shard_id, dict(position))
        with server.lock:
            for other in server.subscriptions:
                if other.open and (other.consumer_arn, other.shard_id) == (consumer_arn, shard_id):
                    if sub.started - other.started < server.in_use_seconds:
                        raise _Refused("ResourceInUseException",
                                       f"another active subscription exists for consumer {consumer_arn} on shard "
                                       f"{shard_id}")
                    other.taken_over = True
            server.subscriptions.append(sub)
        return sub, stream, continuation

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class _Positions:
    """A starting position resolved to the sequence number it starts after (see the module's docstring)."""

    def __init__(self, server: FanOutEndpoint, stream: str, shard_id: str):
        self.server, self.stream, self.shard_id = server, stream, shard_id

    def resolve(self, position: Mapping[str, Any]) -> str:
        kind = position.get("Type")
        if kind == "AFTER_SEQUENCE_NUMBER":
            return str(position["SequenceNumber"])
        start = self._shard_start()
        if kind == "TRIM_HORIZON":
            return start
        if kind == "LATEST":
            return self._last_before(lambda record: True, start)
        if kind == "AT_SEQUENCE_NUMBER":
            target = int(position["SequenceNumber"])
            return self._last_before(lambda record: int(record["SequenceNumber"]) < target, start)
        if kind == "AT_TIMESTAMP":
            at = float(position["Timestamp"])
            return self._last_before(lambda record: float(record["ApproximateArrivalTimestamp"]) < at, start)
        raise _Refused("InvalidArgumentException", f"StartingPosition {position!r} is not valid")

    def _shard_start(self) -> str:
        listed = self.server.upstream_json("ListShards", {"StreamName": self.stream})
        for shard in listed.get("Shards", []):
            if shard["ShardId"] == self.shard_id:
                return shard["SequenceNumberRange"]["StartingSequenceNumber"]
        raise _Refused("ResourceNotFoundException", f"shard {self.shard_id} of stream {self.stream} not found")

    def _last_before(self, before: Callable[[Mapping[str, Any]], bool], start: str) -> str:
        """The last record's sequence number for which `before` holds (they are in order), else the start."""
        last = start
        iterator = self.server.upstream_json("GetShardIterator", {
            "StreamName": self.stream, "ShardId": self.shard_id, "ShardIteratorType": "TRIM_HORIZON"}).get(
            "ShardIterator")
        while iterator:
            page = self.server.upstream_json("GetRecords", {"ShardIterator": iterator, "Limit": 10000})
            for record in page.get("Records") or []:
                if not before(record):
                    return last
                last = record["SequenceNumber"]
            if not page.get("Records") and not page.get("MillisBehindLatest"):
                return last
            iterator = page.get("NextShardIterator")
        return last


class _Stream:
    """The events of one subscription, written to its handler's connection until it ends (returns why)."""

    def __init__(self, handler: _Handler, sub: Subscription, stream: str, continuation: str,
                 fault: SubscriptionFault | None):
        self.handler, self.server, self.sub = handler, handler.server, sub
        self.stream, self.continuation, self.fault = stream, continuation, fault
        self.iterator: str | None = None
        self.last_sent = float("-inf")  # the first event goes out at once, records or not
        self.consumer_checked = time.monotonic()

    def serve(self) -> str:
        server, sub = self.server, self.sub
        while True:
            if server.stopping.is_set():
                return "stopped"
            if sub.taken_over:
                self._send(exception_message("ResourceInUseException", "another subscription took over this one"))
                return "taken_over"
            if self.fault is not None and sub.events >= self.fault.after_events:
                if self.fault.kind == "exception":
                    self._send(exception_message(self.fault.code, f"scripted {self.fault.code}"))
                elif self.fault.kind == "invalid-event":
                    self._invalid_event()
                return f"fault:{self.fault.kind}"
            if time.monotonic() - sub.started >= server.subscription_seconds:
                return "expired"
            if server.events_per_subscription is not None and sub.record_events >= server.events_per_subscription:
                return "limit"
            if time.monotonic() - self.consumer_checked >= server.heartbeat_seconds and not self._consumer_exists():
                self._send(exception_message("ResourceNotFoundException", f"consumer {sub.consumer_arn} not found"))
                return "error:consumer_deleted"
            ended = self._step()
            if ended:
                return "shard_end"

    def _step(self) -> bool:
        """One GetRecords on kinesis-local; an event when it returned records, the shard ended, or a heartbeat
        is due. True at the shard's end."""
        server = self.server
        if self.iterator is None:
            self.iterator = self._iterator()
            if self.iterator is None:
                self._event([], None, 0, self._children())
                return True
        try:
            page = server.upstream_json("GetRecords", {"ShardIterator": self.iterator,
                                                       "Limit": server.records_per_event})
        except _Refused:  # an expired (or, on kinesis-local, any failing) iterator: take a fresh one
            self.iterator = None
            server.stopping.wait(server.poll_interval)
            return False
        records = page.get("Records") or []
        children = page.get("ChildShards") or []
        self.iterator = page.get("NextShardIterator")
        if records:
            self.continuation = records[-1]["SequenceNumber"]
        ended = not self.iterator or bool(children)
        if records or ended or time.monotonic() - self.last_sent >= server.heartbeat_seconds:
            self._event(records, None if ended else self.continuation, page.get("MillisBehindLatest", 0),
                        children if ended else None)
        if not records and not ended:
            server.stopping.wait(server.poll_interval)
        return ended

    def _iterator(self) -> str | None:
        return self.server.upstream_json("GetShardIterator", {
            "StreamName": self.stream, "ShardId": self.sub.shard_id, "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
            "StartingSequenceNumber": self.continuation}).get("ShardIterator")

    def _children(self) -> list[dict]:
        listed = self.server.upstream_json("ListShards", {"StreamName": self.stream}).get("Shards", [])
        return [{"ShardId": s["ShardId"], "ParentShards": [p for p in (s.get("ParentShardId"),
                                                                       s.get("AdjacentParentShardId")) if p],
                 "HashKeyRange": s["HashKeyRange"]}
                for s in listed if self.sub.shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))]

    def _consumer_exists(self) -> bool:
        self.consumer_checked = time.monotonic()
        try:
            self.server.upstream_json("DescribeStreamConsumer", {"ConsumerARN": self.sub.consumer_arn})
        except _Refused as exc:
            return exc.code != "ResourceNotFoundException"
        return True

    def _invalid_event(self) -> None:
        """The next records in an event with neither a continuation nor child shards (what Java KCL refuses), the
        subscription's continuation left where it was."""
        iterator = self.iterator or self._iterator()
        page = self.server.upstream_json("GetRecords", {"ShardIterator": iterator,
                                                        "Limit": self.server.records_per_event}) if iterator else {}
        self._event(page.get("Records") or [], None, 0, None)

    def _event(self, records: list, continuation: str | None, millis: int, children: list | None) -> None:
        payload = {"Records": records, "ContinuationSequenceNumber": continuation, "MillisBehindLatest": millis}
        if children is not None:
            payload["ChildShards"] = children
        self._send(event_message("SubscribeToShardEvent", payload))
        self.sub.events += 1
        if records:
            self.sub.record_events += 1
            self.sub.records += len(records)

    def _send(self, message: bytes) -> None:
        self.handler._chunk(message)
        self.last_sent = time.monotonic()


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the client sees a reset connection mid-stream."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


__all__ = ["FanOutEndpoint", "Subscription", "SubscriptionFault", "encode_message", "event_message",
           "exception_message"]


def main(argv: list[str] | None = None) -> None:
    """Serve the endpoint in its own process (the benchmark's: its own interpreter, so its work does not share a
    GIL with the consumer measured); prints its URL, serves until SIGTERM or SIGINT."""
    import argparse
    import signal

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--upstream", required=True, help="kinesis-local's URL")
    ap.add_argument("--poll-interval", type=float, default=0.05)
    ap.add_argument("--heartbeat-seconds", type=float, default=1.0)
    ap.add_argument("--subscription-seconds", type=float, default=300.0)
    ap.add_argument("--records-per-event", type=int, default=10000)
    args = ap.parse_args(argv)
    endpoint = FanOutEndpoint(args.upstream, poll_interval=args.poll_interval, heartbeat_seconds=args.heartbeat_seconds,
                              subscription_seconds=args.subscription_seconds, records_per_event=args.records_per_event)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    endpoint.start()
    print(endpoint.url, flush=True)
    done.wait()
    endpoint.stop()


if __name__ == "__main__":
    main()
