"""Payload decoders: the pluggable step that turns a record's bytes into output columns or a quarantine reason.

A decoder is a function `(data: Column[BINARY]) -> Column[STRUCT<payload: STRING, reason: STRING, ...>]`:
`reason` is NULL for a good record (it goes to the output with `payload` and every further struct field as
a top-level column) and a string for a record to quarantine (its raw `data` is kept beside the reason).
Being a column expression, a decoder cannot add or drop rows, which keeps the counts exact.

Registered names: "json" (the default: `json_decoder`) and "json_spark" (`json_spark_decoder`).
Reasons are "<code>: <detail>" with code one of REASON_CODES, so they group by `split(reason, ':')[0]`.

JSON rules ("json"): the payload must be UTF-8 (no BOM) holding one RFC 8259 JSON text whose top-level value
is an object; NaN/Infinity and trailing content are rejected; duplicate keys are allowed (RFC: SHOULD be
unique) and kept verbatim, since `payload` is the original text. It runs as a Spark Arrow UDF with Python's
json parser (one Arrow UTF-8 check per batch, then the C parser per record).
"json_spark" uses only Spark SQL (try_parse_json + schema_of_variant). Measured on local[2] over 1M records
(benchmarks/bench_transform.py) it is the slower of the two (~70-100k vs ~110-150k records/s end to end: it
builds a variant per record), and its rules differ: Spark's parser ignores content after the top-level value
(`{"a":1} xyz` passes) and rejects duplicate keys and lone surrogate escapes. Use it where Python workers
must not decode.
"""
from __future__ import annotations

import json
from typing import Callable, Union

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from ..kcl.records.kpl import MAGIC, bad_aggregate_reason
from .names import JSON, JSON_SPARK

REASON_INVALID_UTF8 = "invalid_utf8"
REASON_INVALID_JSON = "invalid_json"
REASON_NOT_OBJECT = "not_a_json_object"
# A record that starts with the KPL's magic but did not deaggregate (the consumer delivered it whole): its
# bytes are not UTF-8 from byte 0, and the KPL's reason says what is wrong with it.
REASON_BAD_KPL_AGGREGATE = "bad_kpl_aggregate"
# Spark SQL alone sees the magic (never valid UTF-8) but cannot verify an aggregate to say what is wrong with it.
_SPARK_BAD_KPL_REASON = (f"{REASON_BAD_KPL_AGGREGATE}: starts with the KPL's magic but was not deaggregated (the "
                         f"\"json\" decoder names the KPL's reason)")
REASON_CODES = (REASON_INVALID_UTF8, REASON_INVALID_JSON, REASON_NOT_OBJECT, REASON_BAD_KPL_AGGREGATE)

DecoderFn = Callable[[Column], Column]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)  # one instance: json.loads(**kw) builds one per call


def json_text_reason(text: str) -> str | None:
    """Why `text` is not a JSON object (None when it is)."""
    try:
        value = _JSON.decode(text)
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity
        return f"{REASON_INVALID_JSON}: {exc}"
    except RecursionError:
        return f"{REASON_INVALID_JSON}: nested too deeply to parse"
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return f"{REASON_NOT_OBJECT}: top-level value is {kind}"
    return None


def json_object_reason(data: bytes) -> str | None:
    """Why `data` is not a UTF-8 JSON object (None when it is). The rule of the "json" decoder."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        kpl = bad_aggregate_reason(data)
        if kpl is not None:
            return f"{REASON_BAD_KPL_AGGREGATE}: {kpl}"
        return f"{REASON_INVALID_UTF8}: {exc.reason} at byte {exc.start}"
    if text.startswith("\ufeff"):
        return f"{REASON_INVALID_JSON}: starts with a byte order mark"
    return json_text_reason(text)


def json_object_reasons(data: pa.Array) -> pa.Array:
    """The vectorised form: one reason (or null) per value of a binary Arrow array."""
    try:
        # Fast path: when the whole batch is valid UTF-8, Arrow validates it in one pass.
        texts = data.cast(pa.string()).to_pylist()
    except pa.ArrowInvalid:
        return pa.array([None if d is None else json_object_reason(d) for d in data.to_pylist()], pa.string())
    return pa.array(
        [None if t is None else (f"{REASON_INVALID_JSON}: starts with a byte order mark"
                                 if t.startswith("\ufeff") else json_text_reason(t)) for t in texts],
        pa.string(),
    )


def _json_reason_udf(data: Column) -> Column:
    # Made at each use, never at import: a UDF object is classic or Spark Connect by the session alive when
    # it is created, and this module is imported before any session exists.
    return F.arrow_udf(json_object_reasons, StringType())(data)


def _with_fields(payload: Column, reason: Column, schema: StructType | str | None) -> Column:
    extra: list[Column] = []
    if schema is not None:
        struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
        parsed = F.from_json(payload, struct)
        extra = [parsed[f.name].alias(f.name) for f in struct.fields]
    return F.struct(payload.alias("payload"), reason.alias("reason"), *extra)


def json_object_decoder(schema: StructType | str | None = None) -> DecoderFn:
    """The "json" decoder; with `schema` (StructType or DDL), also the named top-level keys as typed columns
    (from_json: a value of another type becomes NULL there; `payload` always holds the whole object)."""

    def decode(data: Column) -> Column:
        reason = _json_reason_udf(data)
        payload = F.when(reason.isNull(), data.cast("string"))
        return _with_fields(payload, reason, schema)

    return decode


def json_spark_decoder_with(schema: StructType | str | None = None) -> DecoderFn:
    """The "json_spark" decoder (Spark SQL only; see the module notes for how its rules differ)."""

    def decode(data: Column) -> Column:
        text = data.cast("string")
        variant = F.try_parse_json(text)
        reason = (
            F.when(F.substring(data, 1, len(MAGIC)) == F.lit(bytearray(MAGIC)), F.lit(_SPARK_BAD_KPL_REASON))
            .when(~F.is_valid_utf8(data), F.lit(f"{REASON_INVALID_UTF8}: not valid UTF-8"))
            .when(variant.isNull(), F.lit(f"{REASON_INVALID_JSON}: Spark cannot parse it"))
            .when(~F.schema_of_variant(variant).startswith("OBJECT"),
                  F.concat(F.lit(f"{REASON_NOT_OBJECT}: top-level value is "), F.schema_of_variant(variant)))
        )
        payload = F.when(reason.isNull(), text)
        return _with_fields(payload, reason, schema)

    return decode


json_decoder: DecoderFn = json_object_decoder()
json_spark_decoder: DecoderFn = json_spark_decoder_with()

_REGISTRY: dict[str, DecoderFn] = {JSON: json_decoder, JSON_SPARK: json_spark_decoder}


def register_decoder(name: str, decoder: DecoderFn) -> None:
    if not callable(decoder):
        raise TypeError(f"decoder {name!r} must be callable (data Column -> struct Column)")
    _REGISTRY[name] = decoder


def get_decoder(decoder: Union[str, DecoderFn]) -> DecoderFn:
    if callable(decoder):
        return decoder
    try:
        return _REGISTRY[decoder]
    except KeyError:
        raise ValueError(f"unknown decoder {decoder!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
