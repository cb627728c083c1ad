"""The simulator's DynamoDB expressions (kcl_pipeline/sim/aws/expressions.py) against moto's evaluator: random items,
random condition and update expressions, the same answers.

The reference is moto's server over HTTP on 127.0.0.1 (the test session's, kcl_pipeline/local/moto_process.py),
not its in-process parser classes: the server is moto's public contract, DynamoDB's own API, where the parser
and comparison classes are internals moto reorganises between releases; a request there goes the whole way a
client's does (placeholders, reserved words, ConditionalCheckFailed against ValidationException); and this
project runs moto as a separate process, never in-process. moto is a reference here only: the simulation never
runs it (the last test holds that).

A condition is sent as a conditional PutItem of the item itself (true: written, false: ConditionalCheckFailed),
an update as an UpdateItem without a condition (the item after it, or ValidationException); the simulator
evaluates the same strings against the same item. Each draw uses a fresh key, so an absent item is absent.

Where moto's evaluator is not DynamoDB's, the draws stay out, so a failure here is a difference that matters:
ordering (<, <=, >, >=, BETWEEN) across types and size() of a type without a size (moto answers HTTP 500);
equality of a boolean with a number, or of NULL with a missing attribute (moto compares Python values: True == 1);
SET copying an attribute that a later ADD or DELETE of the same update changes (moto's copy shares the value:
DynamoDB reads every operand from the item as it was); conditions and updates in one request (moto checks an
update's operand types before the condition). Nor are there redundant parentheses or BETWEEN bounds in
descending order: DynamoDB refuses both (ValidationException), which the simulator does not check.
"""
from __future__ import annotations

import ast
import random
from decimal import Decimal
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.sim.aws.expressions import (
    Context,
    ExpressionError,
    apply_update,
    check_placeholders,
    evaluate,
    parse_condition,
    parse_update,
)

KEY = "leaseKey"
ATTRIBUTES = ("leaseOwner", "leaseCounter", "checkpoint", "parents")
STRINGS = ("", "a", "ab", "b", "w-1", "w-2")
NUMBERS = ("0", "1", "2", "10", "-1", "1.5", "100")
TYPES = ("S", "N", "SS", "NS", "L", "BOOL", "NULL")
SIZED = ("S", "SS", "NS", "L")
TYPE_NAMES = ("S", "N", "B", "SS", "NS", "BS", "L", "M", "BOOL", "NULL")
DRAWS = 200  # per seed: conditions and updates each


def random_value(rng: random.Random, kind: str | None = None) -> dict:
    kind = kind or rng.choice(TYPES)
    if kind == "S":
        return {"S": rng.choice(STRINGS)}
    if kind == "N":
        return {"N": rng.choice(NUMBERS)}
    if kind == "SS":
        return {"SS": sorted(rng.sample(["a", "b", "c"], rng.randint(1, 3)))}
    if kind == "NS":
        return {"NS": sorted(rng.sample(["1", "2", "10"], rng.randint(1, 3)))}
    if kind == "L":
        return {"L": [random_value(rng, rng.choice(["S", "N"])) for _ in range(rng.randint(0, 3))]}
    if kind == "BOOL":
        return {"BOOL": rng.random() < 0.5}
    return {"NULL": True}


def random_item(rng: random.Random, key: str) -> dict:
    item = {KEY: {"S": key}}
    for name in ATTRIBUTES:
        if rng.random() < 0.7:
            item[name] = random_value(rng)
    return item


def _ordered(value: dict):
    (kind, text), = value.items()
    return Decimal(text) if kind == "N" else text


class Draw:
    """Random expressions over one item, with the placeholders they use."""

    def __init__(self, rng: random.Random, item: dict):
        self.rng, self.item = rng, item
        self.names: dict[str, str] = {}
        self.values: dict[str, dict] = {}

    def path(self, name: str) -> str:
        if self.rng.random() < 0.4:
            self.names[f"#{name}"] = name
            return f"#{name}"
        return name

    def value(self, kind: str | None = None) -> str:
        token = f":v{len(self.values)}"
        self.values[token] = random_value(self.rng, kind)
        return token

    def comparable(self, kind: str | None) -> str:
        """A value type moto's equality tells apart from an attribute of `kind` (None: missing)."""
        clash = {"BOOL": {"N"}, "N": {"BOOL"}, None: {"NULL"}}.get(kind, set())
        return self.rng.choice([t for t in TYPES if t not in clash])

    def either_side(self, left: str, op: str, right: str) -> str:
        return f"{left} {op} {right}" if self.rng.random() < 0.5 else f"{right} {op} {left}"

    def comparison(self) -> str:
        rng = self.rng
        name = rng.choice(ATTRIBUTES)
        kind = next(iter(self.item[name])) if name in self.item else None
        path = self.path(name)
        choice = rng.choice(["equal", "equal", "order", "order", "between", "in", "exists", "not_exists", "type",
                             "begins_with", "contains"])
        orderable = kind in (None, "N", "S")
        if choice == "equal" or (choice in ("order", "between") and not orderable and kind not in SIZED):
            if kind in SIZED and rng.random() < 0.3:
                return self.either_side(f"size({path})", rng.choice(["=", "<>"]), self.value(rng.choice("NNS")))
            return self.either_side(path, rng.choice(["=", "<>"]), self.value(self.comparable(kind)))
        if choice == "order":
            op = rng.choice(["<", "<=", ">", ">="])
            if not orderable or (kind in SIZED and rng.random() < 0.4):
                return self.either_side(f"size({path})", op, self.value("N"))
            return self.either_side(path, op, self.value(kind or rng.choice("NS")))
        if choice == "between":
            if not orderable:
                return f"size({path}) BETWEEN {self.bounds('N')}"
            return f"{path} BETWEEN {self.bounds(kind or rng.choice('NS'))}"
        if choice == "in":
            return f"{path} IN ({', '.join(self.value(self.comparable(kind)) for _ in range(rng.randint(1, 3)))})"
        if choice in ("exists", "not_exists"):
            return f"attribute_{choice}({path})"
        if choice == "type":
            token = f":v{len(self.values)}"
            self.values[token] = {"S": rng.choice(TYPE_NAMES)}
            return f"attribute_type({path}, {token})"
        if choice == "begins_with":
            return f"begins_with({path}, {self.value('S')})"
        return f"contains({path}, {self.value(rng.choice('SN'))})"

    def bounds(self, kind: str) -> str:
        low, high = sorted((random_value(self.rng, kind), random_value(self.rng, kind)), key=_ordered)
        first = len(self.values)
        self.values[f":v{first}"], self.values[f":v{first + 1}"] = low, high
        return f":v{first} AND :v{first + 1}"

    def condition(self, depth: int = 0) -> tuple[str, bool]:
        """The expression, and whether it is an AND/OR (parenthesised where it is an operand: never redundantly)."""
        r = self.rng.random()
        if depth < 3 and r < 0.35:
            op = self.rng.choice(["AND", "OR"])
            parts = [self.condition(depth + 1) for _ in range(2)]
            return f" {op} ".join(f"({text})" if compound else text for text, compound in parts), True
        if depth < 3 and r < 0.45:
            text, compound = self.condition(depth + 1)
            if text.startswith("NOT "):
                return text, compound
            return (f"NOT ({text})" if compound else f"NOT {text}"), False
        return self.comparison(), False

    def update(self) -> str:
        rng = self.rng
        targets = rng.sample(ATTRIBUTES, rng.randint(1, len(ATTRIBUTES)))
        kinds = {name: rng.choice(["SET", "SET", "REMOVE", "ADD", "DELETE"]) for name in targets}
        sources = [name for name in ATTRIBUTES if kinds.get(name) not in ("ADD", "DELETE")]
        clauses: dict[str, list[str]] = {}
        for name in targets:
            path, kind = self.path(name), kinds[name]
            if kind == "SET":
                r = rng.random()
                if r < 0.4:
                    value = self.value()
                elif r < 0.55:
                    value = self.path(rng.choice(sources))
                elif r < 0.8:
                    left = self.path(rng.choice(sources)) if rng.random() < 0.5 else self.value("N")
                    value = f"{left} {rng.choice('+-')} {self.value('N')}"
                else:
                    value = f"if_not_exists({self.path(rng.choice(sources))}, {self.value()})"
                clauses.setdefault("SET", []).append(f"{path} = {value}")
            elif kind == "REMOVE":
                clauses.setdefault("REMOVE", []).append(path)
            elif kind == "ADD":
                clauses.setdefault("ADD", []).append(f"{path} {self.value(rng.choice(['N', 'SS', 'NS']))}")
            else:
                clauses.setdefault("DELETE", []).append(f"{path} {self.value(rng.choice(['SS', 'NS']))}")
        order = list(clauses.items())
        rng.shuffle(order)
        return " ".join(f"{clause} {', '.join(actions)}" for clause, actions in order)


def comparable_item(item: dict) -> dict:
    """Numbers by value, sets as sorted lists: how DynamoDB compares, not how each formats."""
    def plain(value: dict):
        (kind, data), = value.items()
        if kind == "N":
            return kind, Decimal(data)
        if kind == "NS":
            return kind, sorted(Decimal(n) for n in data)
        if kind == "SS":
            return kind, sorted(data)
        if kind == "L":
            return kind, [plain(v) for v in data]
        return kind, data

    return {name: plain(value) for name, value in item.items()}


def _request(names: dict, values: dict) -> dict:
    return {**({"ExpressionAttributeNames": names} if names else {}),
            **({"ExpressionAttributeValues": values} if values else {})}


def _moto_outcome(call, **request) -> tuple[str, dict | None]:
    try:
        return "applied", call(**request)
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code == "ConditionalCheckFailedException":
            return "condition false", None
        if code == "ValidationException":
            return "invalid", None
        raise  # anything else is moto failing on a draw it should answer: the generator must not reach it


@pytest.fixture(scope="module")
def moto_table(moto_settings):
    dynamodb = client("dynamodb", moto_settings, max_attempts=1)
    name = f"expressions-{random.getrandbits(32):08x}"
    dynamodb.create_table(TableName=name, KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                          BillingMode="PAY_PER_REQUEST")
    yield dynamodb, name
    dynamodb.delete_table(TableName=name)


@pytest.mark.parametrize("seed", [1, 2])
def test_conditions_agree_with_moto_on_random_items(moto_table, seed):
    dynamodb, table = moto_table
    rng = random.Random(seed)
    outcomes = set()
    for i in range(DRAWS):
        item = random_item(rng, f"condition-{seed}-{i}")
        present = rng.random() < 0.85
        draw = Draw(rng, item if present else {})
        condition, _ = draw.condition()
        parsed = parse_condition(condition)
        check_placeholders([parsed], draw.names, draw.values)
        ours = evaluate(parsed.tree, Context(item if present else None, draw.names, draw.values))
        if present:
            dynamodb.put_item(TableName=table, Item=item)
        theirs, _ = _moto_outcome(dynamodb.put_item, TableName=table, Item=item, ConditionExpression=condition,
                                  **_request(draw.names, draw.values))
        assert ("applied" if ours else "condition false") == theirs, \
            (condition, draw.names, draw.values, item if present else "absent")
        outcomes.add(theirs)
    assert outcomes == {"applied", "condition false"}  # the draws reach both answers


@pytest.mark.parametrize("seed", [1, 2])
def test_updates_agree_with_moto_on_random_items(moto_table, seed):
    dynamodb, table = moto_table
    rng = random.Random(seed)
    outcomes = set()
    for i in range(DRAWS):
        key = {KEY: {"S": f"update-{seed}-{i}"}}
        item = random_item(rng, key[KEY]["S"])
        present = rng.random() < 0.85
        draw = Draw(rng, item)
        update = draw.update()
        parsed = parse_update(update)
        check_placeholders([parsed], draw.names, draw.values)
        try:
            ours = "applied", comparable_item(apply_update(parsed.tree, Context(item if present else dict(key),
                                                                                draw.names, draw.values)))
        except ExpressionError:
            ours = "invalid", None
        if present:
            dynamodb.put_item(TableName=table, Item=item)
        theirs, response = _moto_outcome(dynamodb.update_item, TableName=table, Key=key, UpdateExpression=update,
                                         ReturnValues="ALL_NEW", **_request(draw.names, draw.values))
        after = comparable_item(response["Attributes"]) if response is not None else None
        assert ours == (theirs, after), (update, draw.names, draw.values, item if present else "absent")
        outcomes.add(theirs)
    assert outcomes == {"applied", "invalid"}


def test_the_simulation_never_runs_moto():
    """moto is the expressions' reference in this test only: no module of the simulator imports it."""
    simulator = Path(__file__).resolve().parents[2] / "kcl_pipeline" / "sim"
    offenders = []
    for path in sorted(simulator.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "moto"]
    assert offenders == []
