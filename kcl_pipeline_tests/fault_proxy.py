"""A fault-injecting HTTP proxy on loopback, in front of an AWS emulator (JSON protocols: DynamoDB, Kinesis).

The emulators answer every request faithfully; real networks do not. This proxy forwards each request to
the emulator and then, as its policy says, delivers the answer, drops it after the request was applied
(the client sees a connection reset: an *ambiguous* write), drops the request before forwarding it,
delays it, or refuses it as IAM does when a permission is removed (AccessDeniedException, nothing applied).
It counts requests per operation (X-Amz-Target), which the write-cost benchmark uses.

    proxy = FaultProxy("http://127.0.0.1:4567", policy=drop_responses(rate=0.05, seed=7)).start()
    ... point AWS_ENDPOINT_URL_DYNAMODB at proxy.url ...
    proxy.stop()

Policies are plain callables `(operation, body) -> Fault | None`, so a test can drop exactly the response
of the next UpdateItem, say, and nothing else.
"""
from __future__ import annotations

import enum
import http.client
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Collection
from urllib.parse import urlparse


class FaultKind(enum.Enum):
    DROP_RESPONSE = "drop_response"  # forwarded and applied; the client's connection is reset
    DROP_REQUEST = "drop_request"    # never forwarded; the client's connection is reset
    DELAY = "delay"                  # forwarded after `seconds`
    DENY = "deny"                    # never forwarded; answered 400 AccessDeniedException (a permission removed)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    seconds: float = 0.0


Policy = Callable[[str, bytes], "Fault | None"]


def no_faults(_operation: str, _body: bytes) -> Fault | None:
    return None


def drop_responses(rate: float, *, seed: int = 0, operations: Collection[str] | None = None) -> Policy:
    """Drop the response of a `rate` fraction of requests (of `operations`, or all), seeded."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def policy(operation: str, _body: bytes) -> Fault | None:
        if operations is not None and operation not in operations:
            return None
        with lock:
            hit = rng.random() < rate
        return Fault(FaultKind.DROP_RESPONSE) if hit else None

    return policy


class Switch:
    """One fault for every request (of `operations`, or all) while on: `proxy.policy = deny = Switch(Fault(DENY))`,
    then `deny.on = True` ... `deny.on = False`."""

    def __init__(self, fault: Fault, operations: Collection[str] | None = None):
        self.fault, self.operations, self.on = fault, operations, False

    def __call__(self, operation: str, _body: bytes) -> Fault | None:
        if not self.on or (self.operations is not None and operation not in self.operations):
            return None
        return self.fault


class Scripted:
    """Faults for the next matching requests, in order: `proxy.policy = Scripted(("UpdateItem", DROP_RESPONSE))`."""

    def __init__(self, *steps: tuple[str, Fault]):
        self._steps = list(steps)
        self._lock = threading.Lock()
        self.applied: list[tuple[str, Fault]] = []

    def __call__(self, operation: str, _body: bytes) -> Fault | None:
        with self._lock:
            if self._steps and self._steps[0][0] == operation:
                step = self._steps.pop(0)
                self.applied.append(step)
                return step[1]
        return None

    @property
    def done(self) -> bool:
        return not self._steps


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, policy: Policy = no_faults):
        self.upstream = urlparse(upstream)
        self.policy = policy
        self.counts: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.counting = True
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the client sees a reset connection, not a clean end of stream."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def do_POST(self):  # noqa: N802 - http.server's naming
        server: FaultProxy = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        operation = (self.headers.get("X-Amz-Target") or "").split(".")[-1]
        if server.counting:
            with server.lock:
                server.counts[operation] += 1
        fault = server.policy(operation, body)
        if fault is not None:
            with server.lock:
                server.faults[f"{operation}:{fault.kind.value}"] += 1
        if fault is not None and fault.kind is FaultKind.DROP_REQUEST:
            self.close_connection = True
            _reset(self.connection)
            return
        if fault is not None and fault.kind is FaultKind.DENY:
            self._deny(operation)
            return
        if fault is not None and fault.kind is FaultKind.DELAY:
            time.sleep(fault.seconds)
        conn = http.client.HTTPConnection(server.upstream.hostname, server.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            conn.request("POST", self.path, body, headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if fault is not None and fault.kind is FaultKind.DROP_RESPONSE:
            self.close_connection = True
            _reset(self.connection)
            return
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _deny(self, operation: str) -> None:
        """The answer of the JSON protocols' IAM refusal (not retried by botocore: an error, not a throttle)."""
        body = json.dumps({"__type": "com.amazon.coral.service#AccessDeniedException",
                           "message": f"User is not authorized to perform: {operation} (denied by the fault proxy)"})
        data = body.encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("x-amzn-RequestId", "fault-proxy-deny")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


__all__ = ["Fault", "FaultKind", "FaultProxy", "Scripted", "Switch", "drop_responses", "no_faults"]
