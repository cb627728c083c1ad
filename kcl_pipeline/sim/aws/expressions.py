"""DynamoDB condition and update expressions: parsed once, evaluated against items in DynamoDB's JSON form.

The subset a lease table needs, with DynamoDB's semantics (as dynalite implements them):

    condition  := disjunct (OR disjunct)*            NOT binds tighter than AND, AND tighter than OR
    disjunct   := conjunct (AND conjunct)*
    conjunct   := NOT conjunct | ( condition ) | function | operand comparator operand
                | operand IN ( operand, ... ) | operand BETWEEN operand AND operand
    function   := attribute_exists(path) | attribute_not_exists(path) | attribute_type(path, :t)
                | begins_with(path, operand) | contains(path, operand)
    operand    := path | :value | size(path)
    update     := (SET path = value (, path = value)* | REMOVE path (, path)* | ADD path :v (, ...)*
                   | DELETE path :set (, ...)*)+
    value      := operand [(+|-) operand] | if_not_exists(path, operand)

A comparison with a missing attribute is false, except `<>`, which is true; operands of different types
are never equal and never ordered; numbers compare as numbers, strings by their code points. Placeholders
(`#name`, `:value`) must all be defined and all be used, as DynamoDB demands (ValidationException).
Document paths are top-level names: the lease table has no nested attributes.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping

_TOKEN = re.compile(r"\s*(?:(?P<op><>|<=|>=|[=<>(),+\-])|(?P<word>[#:]?[A-Za-z_][A-Za-z0-9_]*))")
_KEYWORDS = {"AND", "OR", "NOT", "IN", "BETWEEN", "SET", "REMOVE", "ADD", "DELETE"}


class ExpressionError(ValueError):
    """The expression is malformed or uses a placeholder wrongly (DynamoDB answers ValidationException)."""


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"Invalid expression: syntax error near {text[pos:pos + 20]!r}")
        out.append(m.group("op") or m.group("word"))
        pos = m.end()
    return out


# -- parsed forms (tuples: cheap to build, cached per expression string) --------------------------------
# operand: ("path", name) | ("value", ":v") | ("size", name)
# condition: ("and", a, b) | ("or", a, b) | ("not", a) | ("cmp", op, x, y) | ("in", x, [ys]) |
#            ("between", x, lo, hi) | ("fn", name, x, y|None)


@dataclass(frozen=True)
class Parsed:
    tree: Any
    names: frozenset[str]   # "#x" placeholders used
    values: frozenset[str]  # ":x" placeholders used


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.i = 0
        self.names: set[str] = set()
        self.values: set[str] = set()

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.upper() != expected):
            raise ExpressionError(f"Invalid expression: expected {expected or 'a token'}, got {token!r}")
        self.i += 1
        return token

    def done(self) -> None:
        if self.peek() is not None:
            raise ExpressionError(f"Invalid expression: unexpected {self.peek()!r}")

    def path(self) -> str:
        token = self.take()
        if token.startswith(":") or token in "(),=<>+-" or token.upper() in _KEYWORDS:
            raise ExpressionError(f"Invalid expression: expected an attribute name, got {token!r}")
        if token.startswith("#"):
            self.names.add(token)
        return token

    def operand(self):
        token = self.peek()
        if token is None:
            raise ExpressionError("Invalid expression: unexpected end")
        if token.startswith(":"):
            self.i += 1
            self.values.add(token)
            return ("value", token)
        if token == "size":
            self.i += 1
            self.take("(")
            name = self.path()
            self.take(")")
            return ("size", name)
        return ("path", self.path())

    # conditions
    def condition(self):
        left = self.conjunction()
        while self.peek() is not None and self.peek().upper() == "OR":
            self.i += 1
            left = ("or", left, self.conjunction())
        return left

    def conjunction(self):
        left = self.unary()
        while self.peek() is not None and self.peek().upper() == "AND":
            self.i += 1
            left = ("and", left, self.unary())
        return left

    def unary(self):
        token = self.peek()
        if token is not None and token.upper() == "NOT":
            self.i += 1
            return ("not", self.unary())
        if token == "(":
            self.i += 1
            inner = self.condition()
            self.take(")")
            return inner
        if token in ("attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains"):
            self.i += 1
            self.take("(")
            name = self.path()
            other = None
            if token in ("attribute_type", "begins_with", "contains"):
                self.take(",")
                other = self.operand()
            self.take(")")
            return ("fn", token, name, other)
        left = self.operand()
        op = self.take()
        if op in ("=", "<>", "<", "<=", ">", ">="):
            return ("cmp", op, left, self.operand())
        if op.upper() == "IN":
            self.take("(")
            options = [self.operand()]
            while self.peek() == ",":
                self.i += 1
                options.append(self.operand())
            self.take(")")
            return ("in", left, options)
        if op.upper() == "BETWEEN":
            low = self.operand()
            self.take("AND")
            return ("between", left, low, self.operand())
        raise ExpressionError(f"Invalid expression: unexpected {op!r}")

    # updates
    def update(self):
        clauses: dict[str, list] = {}
        while self.peek() is not None:
            kind = self.take().upper()
            if kind not in ("SET", "REMOVE", "ADD", "DELETE") or kind in clauses:
                raise ExpressionError(f"Invalid UpdateExpression: unexpected or repeated clause {kind}")
            actions = clauses.setdefault(kind, [])
            while True:
                name = self.path()
                if kind == "SET":
                    self.take("=")
                    actions.append((name, self.value()))
                elif kind == "REMOVE":
                    actions.append((name, None))
                else:
                    actions.append((name, self.operand()))
                if self.peek() != ",":
                    break
                self.i += 1
        if not clauses:
            raise ExpressionError("Invalid UpdateExpression: empty")
        return clauses

    def value(self):
        if self.peek() == "if_not_exists":
            self.i += 1
            self.take("(")
            name = self.path()
            self.take(",")
            fallback = self.operand()
            self.take(")")
            return ("if_not_exists", name, fallback)
        left = self.operand()
        if self.peek() in ("+", "-"):
            op = self.take()
            return (op, left, self.operand())
        return left


@functools.lru_cache(maxsize=4096)
def parse_condition(text: str) -> Parsed:
    p = _Parser(text)
    tree = p.condition()
    p.done()
    return Parsed(tree, frozenset(p.names), frozenset(p.values))


@functools.lru_cache(maxsize=4096)
def parse_update(text: str) -> Parsed:
    p = _Parser(text)
    clauses = p.update()
    p.done()
    return Parsed(clauses, frozenset(p.names), frozenset(p.values))


# -- evaluation -----------------------------------------------------------------------------------------

class Context:
    """An expression's placeholders and the item it is evaluated against."""

    __slots__ = ("item", "names", "values")

    def __init__(self, item: Mapping[str, dict] | None, names: Mapping[str, str], values: Mapping[str, dict]):
        self.item = item or {}
        self.names = names
        self.values = values

    def name(self, token: str) -> str:
        return self.names[token] if token.startswith("#") else token

    def operand(self, node) -> dict | None:
        kind, arg = node
        if kind == "value":
            return self.values[arg]
        attribute = self.item.get(self.name(arg))
        if kind == "path":
            return attribute
        return _size(attribute)


def _size(attribute: dict | None) -> dict | None:
    if attribute is None:
        return None
    (kind, value), = attribute.items()
    if kind in ("S", "B", "SS", "NS", "BS", "L", "M"):
        return {"N": str(len(value))}
    return None


def _number(text: str) -> Decimal:
    return Decimal(text)


def _equal(a: dict, b: dict) -> bool:
    (ka, va), = a.items()
    (kb, vb), = b.items()
    if ka != kb:
        return False
    if ka == "N":
        return _number(va) == _number(vb)
    if ka in ("SS", "NS", "BS"):
        return sorted(va) == sorted(vb)
    return va == vb


def _order(a: dict, b: dict) -> int | None:
    """-1/0/1, or None when the two cannot be ordered (different or unordered types)."""
    (ka, va), = a.items()
    (kb, vb), = b.items()
    if ka != kb or ka not in ("N", "S", "B"):
        return None
    if ka == "N":
        x, y = _number(va), _number(vb)
    else:
        x, y = va, vb
    return (x > y) - (x < y)


def evaluate(node, ctx: Context) -> bool:
    kind = node[0]
    if kind == "and":
        return evaluate(node[1], ctx) and evaluate(node[2], ctx)
    if kind == "or":
        return evaluate(node[1], ctx) or evaluate(node[2], ctx)
    if kind == "not":
        return not evaluate(node[1], ctx)
    if kind == "cmp":
        op, a, b = node[1], ctx.operand(node[2]), ctx.operand(node[3])
        if op == "<>":
            return a is None or b is None or not _equal(a, b)
        if a is None or b is None:
            return False
        if op == "=":
            return _equal(a, b)
        order = _order(a, b)
        if order is None:
            return False
        return {"<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0}[op]
    if kind == "in":
        a = ctx.operand(node[1])
        return a is not None and any(_equal(a, o) for o in (ctx.operand(x) for x in node[2]) if o is not None)
    if kind == "between":
        a, low, high = ctx.operand(node[1]), ctx.operand(node[2]), ctx.operand(node[3])
        if a is None or low is None or high is None:
            return False
        lo, hi = _order(a, low), _order(a, high)
        return lo is not None and hi is not None and lo >= 0 and hi <= 0
    if kind == "fn":
        name, path, other = node[1], node[2], node[3]
        attribute = ctx.item.get(ctx.name(path))
        if name == "attribute_exists":
            return attribute is not None
        if name == "attribute_not_exists":
            return attribute is None
        if attribute is None:
            return False
        operand = ctx.operand(other)
        if name == "attribute_type":
            if operand is None or "S" not in operand:
                raise ExpressionError("Invalid ConditionExpression: attribute_type takes a string type name")
            return next(iter(attribute)) == operand["S"]
        (kind_a, value_a), = attribute.items()
        if operand is None:
            return False
        (kind_o, value_o), = operand.items()
        if name == "begins_with":
            return kind_a == kind_o and kind_a in ("S", "B") and value_a.startswith(value_o)
        # contains
        if kind_a == "S" and kind_o == "S":
            return value_o in value_a
        if kind_a in ("SS", "NS", "BS"):
            return kind_o == kind_a[0] and value_o in value_a
        if kind_a == "L":
            return any(_equal(v, operand) for v in value_a)
        return False
    raise ExpressionError(f"unknown condition node {kind}")


def apply_update(clauses, ctx: Context) -> dict[str, dict]:
    """The item after the update (a new dict; the original is not changed)."""
    item = dict(ctx.item)
    touched: set[str] = set()

    def target(token: str) -> str:
        name = ctx.name(token)
        if name in touched:
            raise ExpressionError(f"Invalid UpdateExpression: Two document paths overlap with each other; "
                                  f"must remove or rewrite one of these paths; path one: [{name}]")
        touched.add(name)
        return name

    for name_token, value in clauses.get("SET", ()):
        name = target(name_token)
        item[name] = _set_value(value, ctx)
    for name_token, _ in clauses.get("REMOVE", ()):
        item.pop(target(name_token), None)
    for name_token, operand in clauses.get("ADD", ()):
        name = target(name_token)
        delta = ctx.operand(operand)
        current = item.get(name)
        if "N" in delta:
            if current is not None and "N" not in current:
                raise ExpressionError("An operand in the update expression has an incorrect data type")
            base = _number(current["N"]) if current is not None else Decimal(0)
            item[name] = {"N": _format(base + _number(delta["N"]))}
        else:
            kind = next(iter(delta))
            if kind not in ("SS", "NS", "BS") or (current is not None and kind not in current):
                raise ExpressionError("An operand in the update expression has an incorrect data type")
            merged = set(current[kind]) if current is not None else set()
            merged.update(delta[kind])
            item[name] = {kind: sorted(merged)}
    for name_token, operand in clauses.get("DELETE", ()):
        name = target(name_token)
        delta = ctx.operand(operand)
        kind = next(iter(delta))
        current = item.get(name)
        if current is None:
            continue
        if kind not in current:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        left = set(current[kind]) - set(delta[kind])
        if left:
            item[name] = {kind: sorted(left)}
        else:
            item.pop(name)
    return item


def _set_value(value, ctx: Context) -> dict:
    kind = value[0]
    if kind == "if_not_exists":
        current = ctx.item.get(ctx.name(value[1]))
        return current if current is not None else ctx.operand(value[2])
    if kind in ("+", "-"):
        a, b = ctx.operand(value[1]), ctx.operand(value[2])
        if a is None or b is None:
            raise ExpressionError("The provided expression refers to an attribute that does not exist in the item")
        if "N" not in a or "N" not in b:
            raise ExpressionError("An operand in the update expression has an incorrect data type")
        result = _number(a["N"]) + _number(b["N"]) if kind == "+" else _number(a["N"]) - _number(b["N"])
        return {"N": _format(result)}
    result = ctx.operand(value)
    if result is None:
        raise ExpressionError("The provided expression refers to an attribute that does not exist in the item")
    return result


def _format(number: Decimal) -> str:
    return format(number.normalize(), "f") if number != number.to_integral_value() else str(int(number))


def check_placeholders(parsed: list[Parsed], names: Mapping[str, str] | None,
                       values: Mapping[str, dict] | None) -> None:
    """DynamoDB's rules: every placeholder used is defined, every one defined is used."""
    used_names = frozenset().union(*(p.names for p in parsed)) if parsed else frozenset()
    used_values = frozenset().union(*(p.values for p in parsed)) if parsed else frozenset()
    names, values = names or {}, values or {}
    for token in sorted(used_names - set(names)):
        raise ExpressionError(f"Invalid expression: An expression attribute name used in the document path is "
                              f"not defined; attribute name: {token}")
    for token in sorted(used_values - set(values)):
        raise ExpressionError(f"Invalid expression: An expression attribute value used in expression is not "
                              f"defined; attribute value: {token}")
    unused = sorted(set(names) - used_names)
    if unused:
        raise ExpressionError(f"Value provided in ExpressionAttributeNames unused in expressions: keys: "
                              f"{{{', '.join(unused)}}}")
    unused = sorted(set(values) - used_values)
    if unused:
        raise ExpressionError(f"Value provided in ExpressionAttributeValues unused in expressions: keys: "
                              f"{{{', '.join(unused)}}}")


__all__ = ["Context", "ExpressionError", "Parsed", "apply_update", "check_placeholders", "evaluate",
           "parse_condition", "parse_update"]
