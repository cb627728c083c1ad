"""A simulated DynamoDB that evaluates the real requests, and botocore-like clients that reach it through faults.

`SimDynamoDB` is the service: tables of items in DynamoDB's JSON form; every PutItem / UpdateItem /
DeleteItem is applied only if its ConditionExpression holds (aws/expressions.py evaluates the very strings
`LeaseTable` builds), with DynamoDB's validation (placeholders defined and used, the key never updated,
items under 400 KB). A wrong condition in lease_codec.py therefore misbehaves here as it would on AWS.

`SimDynamoDBClient` is one process's client: the methods `LeaseTable` calls, botocore's standard retry
mode (8 attempts, jittered exponential back-off capped at 20 s), and per-attempt faults drawn from a seeded
`NetworkFaults`: latency (with spikes), throttling, requests lost before they are applied, responses lost
after the write was applied (a reset is seen at once, a silent loss after the 20 s read timeout), and a
partition (nothing gets through). A lost response is retried like botocore does, so a conditional write can
be applied by one attempt and fail its condition on the next (ConditionalCheckFailed with RetryAttempts > 0),
or be applied twice. An attempt that timed out may also be applied *late* (`late_application`): DynamoDB
applies a request its client gave up on after the client's retry, and after other clients' writes, as
AWS's does. Virtual time spent in calls accumulates in `elapsed`, which the world turns into latency;
`applied_writes` counts the attempts the service applied while the call lasted, the ground truth against
which the consumer's reading of an ambiguous outcome is judged. Observers see every applied write with
the time its attempt was sent (`sent_at`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

from .expressions import (
    Context,
    ExpressionError,
    apply_update,
    check_placeholders,
    evaluate,
    parse_condition,
    parse_update,
)

MAX_ITEM_BYTES = 400 * 1024
ENDPOINT = "http://dynamodb.sim"

# (table, key, before, after, actor, sent_at): an applied write, and when its attempt was sent (true time)
WriteObserver = Callable[[str, str, "dict | None", "dict | None", Any, float], None]


class ResourceNotFoundException(ClientError):
    """botocore's modelled error class of the code (`client.exceptions.ResourceNotFoundException`)."""


class ResourceInUseException(ClientError):
    """botocore's modelled error class of the code."""


_MODELLED: dict[str, type[ClientError]] = {"ResourceNotFoundException": ResourceNotFoundException,
                                           "ResourceInUseException": ResourceInUseException}


class _Exceptions:
    """`client.exceptions`, as botocore's clients carry it."""

    ResourceNotFoundException = ResourceNotFoundException
    ResourceInUseException = ResourceInUseException
    ClientError = ClientError


def _client_error(code: str, message: str, operation: str, status: int = 400, retries: int = 0) -> ClientError:
    return _MODELLED.get(code, ClientError)({"Error": {"Code": code, "Message": message},
                                             "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": retries}},
                                            operation)


def _operation_name(method: str) -> str:
    return "".join(part.capitalize() for part in method.split("_"))


def item_size(item: Mapping[str, dict]) -> int:
    """DynamoDB's item size, closely enough: names plus values."""
    size = 0
    for name, attribute in item.items():
        size += len(name)
        (kind, value), = attribute.items()
        if kind in ("S", "N", "B"):
            size += len(value)
        elif kind in ("SS", "NS", "BS"):
            size += sum(len(v) for v in value)
        else:
            size += len(repr(value))
    return size


@dataclass
class SimTable:
    name: str
    hash_key: str
    items: dict[str, dict] = field(default_factory=dict)


class SimDynamoDB:
    """The service. `observers` see every applied write: (table, key, before, after, actor, sent_at)."""

    def __init__(self) -> None:
        self.tables: dict[str, SimTable] = {}
        self.observers: list[WriteObserver] = []
        self.applied = 0
        self._sent_at = 0.0  # the attempt being applied was sent then
        # A mutation's rewrite of a request before it is evaluated (judge/mutations.py); None in normal runs.
        self.rewrite: Callable[[str, dict, Any], dict] | None = None

    # -- dispatch ----------------------------------------------------------------------------------------
    def execute(self, method: str, request: Mapping[str, Any], actor: Any = None,
                sent_at: float = 0.0) -> dict:
        """One request (its attempt sent at `sent_at`); raises ClientError as DynamoDB would answer it."""
        handler = getattr(self, "_" + method, None)
        if handler is None:
            raise NotImplementedError(f"the simulated DynamoDB has no {method}")
        if self.rewrite is not None:
            request = self.rewrite(method, dict(request), actor)
        self._sent_at = sent_at
        try:
            return handler(request, actor)
        except ExpressionError as exc:
            raise _client_error("ValidationException", str(exc), _operation_name(method)) from None

    def _table(self, request: Mapping[str, Any], method: str) -> SimTable:
        table = self.tables.get(request.get("TableName", ""))
        if table is None:
            raise _client_error("ResourceNotFoundException", "Requested resource not found", _operation_name(method))
        return table

    def _key(self, table: SimTable, key: Mapping[str, dict], method: str) -> str:
        if set(key) != {table.hash_key} or "S" not in key[table.hash_key]:
            raise _client_error("ValidationException", "The provided key element does not match the schema",
                                _operation_name(method))
        return key[table.hash_key]["S"]

    def _condition(self, request: Mapping[str, Any], item: dict | None, method: str, update=None) -> bool:
        text = request.get("ConditionExpression")
        parsed = [parse_condition(text)] if text else []
        if update is not None:
            parsed.append(update)
        check_placeholders(parsed, request.get("ExpressionAttributeNames"), request.get("ExpressionAttributeValues"))
        if not text:
            return True
        ctx = Context(item, request.get("ExpressionAttributeNames") or {},
                      request.get("ExpressionAttributeValues") or {})
        return evaluate(parsed[0].tree, ctx)

    def _write(self, table: SimTable, key: str, after: dict | None, actor: Any) -> None:
        before = table.items.get(key)
        if after is None:
            table.items.pop(key, None)
        else:
            table.items[key] = after
        self.applied += 1
        for observe in self.observers:
            observe(table.name, key, before, after, actor, self._sent_at)

    # -- control plane -------------------------------------------------------------------------------------
    def _create_table(self, request, actor):
        name = request["TableName"]
        if name in self.tables:
            raise _client_error("ResourceInUseException", f"Table already exists: {name}", "CreateTable")
        hash_key = next(k["AttributeName"] for k in request["KeySchema"] if k["KeyType"] == "HASH")
        self.tables[name] = SimTable(name, hash_key)
        return {"TableDescription": self._description(self.tables[name])}

    def _describe_table(self, request, actor):
        return {"Table": self._description(self._table(request, "describe_table"))}

    def _description(self, table: SimTable) -> dict:
        return {"TableName": table.name, "TableStatus": "ACTIVE", "ItemCount": len(table.items),
                "KeySchema": [{"AttributeName": table.hash_key, "KeyType": "HASH"}],
                "AttributeDefinitions": [{"AttributeName": table.hash_key, "AttributeType": "S"}],
                "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"}}

    # -- data plane ----------------------------------------------------------------------------------------
    def _get_item(self, request, actor):
        table = self._table(request, "get_item")
        item = table.items.get(self._key(table, request["Key"], "get_item"))
        return {"Item": dict(item)} if item is not None else {}

    def _scan(self, request, actor):
        table = self._table(request, "scan")
        keys = sorted(table.items)
        start = request.get("ExclusiveStartKey")
        if start:
            after = start[table.hash_key]["S"]
            keys = [k for k in keys if k > after]
        limit = request.get("Limit")
        page = keys[:limit] if limit else keys
        response: dict[str, Any] = {"Items": [dict(table.items[k]) for k in page], "Count": len(page),
                                    "ScannedCount": len(page)}
        if limit and len(page) == limit:
            response["LastEvaluatedKey"] = {table.hash_key: {"S": page[-1]}}
        return response

    def _put_item(self, request, actor):
        table = self._table(request, "put_item")
        item = request["Item"]
        key = self._key(table, {table.hash_key: item.get(table.hash_key, {})}, "put_item")
        if item_size(item) > MAX_ITEM_BYTES:
            raise _client_error("ValidationException", "Item size has exceeded the maximum allowed size", "PutItem")
        if not self._condition(request, table.items.get(key), "put_item"):
            raise _client_error("ConditionalCheckFailedException", "The conditional request failed", "PutItem")
        self._write(table, key, {name: dict(value) for name, value in item.items()}, actor)
        return {}

    def _update_item(self, request, actor):
        table = self._table(request, "update_item")
        key = self._key(table, request["Key"], "update_item")
        update = parse_update(request["UpdateExpression"])
        current = table.items.get(key)
        if not self._condition(request, current, "update_item", update):
            raise _client_error("ConditionalCheckFailedException", "The conditional request failed", "UpdateItem")
        names = request.get("ExpressionAttributeNames") or {}
        for actions in update.tree.values():
            for token, _ in actions:
                if (names.get(token, token)) == table.hash_key:
                    raise _client_error("ValidationException", f"One or more parameter values were invalid: Cannot "
                                        f"update attribute {table.hash_key}. This attribute is part of the key",
                                        "UpdateItem")
        base = current if current is not None else dict(request["Key"])  # UpdateItem upserts
        after = apply_update(update.tree, Context(base, names, request.get("ExpressionAttributeValues") or {}))
        if item_size(after) > MAX_ITEM_BYTES:
            raise _client_error("ValidationException", "Item size to update has exceeded the maximum allowed size",
                                "UpdateItem")
        self._write(table, key, after, actor)
        returns = request.get("ReturnValues", "NONE")
        return {"Attributes": dict(after)} if returns == "ALL_NEW" else {}

    def _delete_item(self, request, actor):
        table = self._table(request, "delete_item")
        key = self._key(table, request["Key"], "delete_item")
        current = table.items.get(key)
        if not self._condition(request, current, "delete_item"):
            raise _client_error("ConditionalCheckFailedException", "The conditional request failed", "DeleteItem")
        if current is not None:
            self._write(table, key, None, actor)
        return {}


# -- the network between a process and the service ----------------------------------------------------------

@dataclass
class NetworkFaults:
    """Per-attempt fault probabilities and latency of one process's path to DynamoDB (mutable: the world
    changes them while a fault lasts)."""

    latency: float = 0.008            # typical one-attempt round trip, seconds
    spike_probability: float = 0.01   # a slow attempt (GC, congestion): up to `spike` seconds
    spike: float = 1.5
    throttle: float = 0.0
    lost_request: float = 0.0         # never reached the service
    lost_response: float = 0.0        # applied, but the answer never came back
    silent_loss: float = 0.2          # of lost responses, those noticed only at the read timeout (else a reset)
    late_application: float = 0.0     # of timed-out attempts, those DynamoDB applies later (after the retry)
    partitioned: bool = False
    slow: float = 1.0                 # latency multiplier (a congested path)
    connect_timeout: float = 5.0      # kcl/shells/aws.py's client setting
    healthy_since: float = 0.0        # when the last fault on this path healed (the world sets it)
    # Outcomes forced on the next attempts, in order ("ok", "throttle", "lost_request", "lost_response",
    # "timeout"): a test's or a fault's exact script, before the probabilities apply again.
    forced: list[str] = field(default_factory=list)

    def healthy(self) -> bool:
        """No fault that delays requests for long is in effect (background noise aside)."""
        return (not self.partitioned and self.slow <= 1.0 and not self.forced and self.throttle <= 0.02
                and self.lost_request <= 0.02 and (self.lost_response <= 0.02 and self.silent_loss == 0.0
                                                   or self.lost_response == 0.0))

    def draw(self, rng: random.Random) -> str:
        if self.forced:
            return self.forced.pop(0)
        x = rng.random()
        if x < self.throttle:
            return "throttle"
        x -= self.throttle
        if x < self.lost_request:
            return "lost_request"
        x -= self.lost_request
        if x < self.lost_response:
            return "timeout" if rng.random() < self.silent_loss else "lost_response"
        return "ok"


class SimDynamoDBClient:
    """What `LeaseTable` calls: put_item, update_item, get_item, scan, delete_item, describe_table, create_table."""

    class _Meta:
        region_name = "us-east-1"
        endpoint_url = ENDPOINT

    meta = _Meta()
    exceptions = _Exceptions()

    def __init__(self, service: SimDynamoDB, rng: random.Random, faults: NetworkFaults | None = None,
                 actor: Any = None, max_attempts: int = 8, read_timeout: float = 20.0,
                 now: Callable[[], float] | None = None,
                 later: Callable[[float, Callable[[], None]], None] | None = None):
        self.service = service
        self.max_attempts = max_attempts  # botocore's standard retry mode
        self.read_timeout = read_timeout
        self.rng = rng
        self.faults = faults or NetworkFaults()
        self.actor = actor          # who the service sees writing (the world's ground truth)
        self.elapsed = 0.0          # virtual seconds spent in calls since the world last reset it
        self.applied_writes = 0     # attempts the service applied while the call lasted (a duplicate counts twice)
        self.attempts = 0
        self.late_attempts = 0      # attempts the service applied after the call gave up on them
        self.now = now or (lambda: 0.0)
        self.later = later          # schedules the late application of a timed-out attempt (None: never late)
        self.sent_at: float | None = None  # when the call in progress was sent (set by its sender), else now()

    def put_item(self, **request):
        return self._call("put_item", request)

    def update_item(self, **request):
        return self._call("update_item", request)

    def delete_item(self, **request):
        return self._call("delete_item", request)

    def get_item(self, **request):
        return self._call("get_item", request)

    def scan(self, **request):
        return self._call("scan", request)

    def describe_table(self, **request):
        return self._call("describe_table", request)

    def create_table(self, **request):
        return self._call("create_table", request)

    def _latency(self) -> float:
        f, rng = self.faults, self.rng
        latency = f.latency * (0.5 + rng.random())
        if rng.random() < f.spike_probability:
            latency += rng.random() * f.spike
        return latency * f.slow

    def _call(self, method: str, request: dict) -> dict:
        f, rng = self.faults, self.rng
        operation = _operation_name(method)
        attempt = 0
        while True:
            attempt += 1
            self.attempts += 1
            retries = attempt - 1
            error: Exception
            if f.partitioned:
                self.elapsed += f.connect_timeout
                error = EndpointConnectionError(endpoint_url=ENDPOINT)
            else:
                outcome = f.draw(rng)
                latency = self._latency()
                if latency >= self.read_timeout:
                    # Slower than the client waits: it gives up at its read timeout, whatever the service did.
                    latency = 0.0
                    if outcome in ("ok", "lost_response"):
                        outcome = "timeout"
                    else:
                        self.elapsed += self.read_timeout
                self.elapsed += latency
                if outcome == "throttle":
                    error = _client_error("ProvisionedThroughputExceededException", "Rate of requests exceeds the "
                                          "allowed throughput", operation, retries=retries)
                elif outcome == "lost_request":
                    error = ConnectionClosedError(endpoint_url=ENDPOINT)
                elif outcome == "timeout" and self.later is not None and rng.random() < f.late_application:
                    # The request sits in DynamoDB and is applied after the client gave up: after its retry,
                    # and after other clients' writes.
                    self._apply_late(method, request, self.read_timeout * rng.uniform(0.1, 2.5))
                    self.elapsed += self.read_timeout
                    error = ReadTimeoutError(endpoint_url=ENDPOINT, error="Read timed out")
                else:
                    applied_before = self.service.applied
                    try:
                        response = self.service.execute(method, request, self.actor, self._sent())
                        failure = None
                    except ClientError as exc:
                        response, failure = None, exc
                    self.applied_writes += self.service.applied - applied_before
                    if outcome == "timeout":
                        self.elapsed += self.read_timeout
                        error = ReadTimeoutError(endpoint_url=ENDPOINT, error="Read timed out")
                    elif outcome == "lost_response":
                        error = ConnectionClosedError(endpoint_url=ENDPOINT)
                    elif failure is not None:
                        failure.response.setdefault("ResponseMetadata", {})["RetryAttempts"] = retries
                        raise failure
                    else:
                        response["ResponseMetadata"] = {"HTTPStatusCode": 200, "RetryAttempts": retries}
                        return response
            if attempt >= self.max_attempts:
                raise error
            # botocore's standard mode: full jitter, base 2, capped at 20 s.
            self.elapsed += min(rng.random() * 2 ** retries, 20.0)

    def _sent(self) -> float:
        return self.sent_at if self.sent_at is not None else self.now()

    def _apply_late(self, method: str, request: dict, delay: float) -> None:
        sent, later = self._sent(), self.later
        assert later is not None

        def apply() -> None:
            applied_before = self.service.applied
            try:
                self.service.execute(method, request, self.actor, sent)
            except ClientError:
                pass  # its condition failed by then: nobody is told, as nobody waits for it
            self.late_attempts += self.service.applied - applied_before
        later(delay, apply)


def retry_budget(max_attempts: int, read_timeout: float, connect_timeout: float = 5.0) -> float:
    """The longest a call can take when every attempt times out (botocore's back-off at its largest)."""
    return max_attempts * max(read_timeout, connect_timeout) + sum(min(2.0 ** i, 20.0) for i in range(max_attempts - 1))


__all__ = ["NetworkFaults", "ResourceInUseException", "ResourceNotFoundException", "retry_budget", "SimDynamoDB",
           "SimDynamoDBClient", "SimTable", "item_size"]
