from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from kcl_pipeline.transform.decoders import (
    REASON_BAD_KPL_AGGREGATE,
    REASON_INVALID_JSON,
    REASON_INVALID_UTF8,
    REASON_NOT_OBJECT,
    get_decoder,
    json_decoder,
    json_object_decoder,
    json_object_reason,
    json_object_reasons,
    json_spark_decoder,
    register_decoder,
)

# (payload, reason code of the "json" decoder or None)
CASES = [
    (b'{"a":1}', None),
    (b"{}", None),
    (b' \t{"a": [1, {"b": null}]}\r\n', None),
    (b'{"a":"caf\xc3\xa9"}', None),
    (b'{"a":"\\ud83d\\ude00"}', None),
    (b'{"n":123456789012345678901234567890123456789012345678901234567890}', None),
    (b"[1,2]", REASON_NOT_OBJECT),
    (b'"text"', REASON_NOT_OBJECT),
    (b"42", REASON_NOT_OBJECT),
    (b"true", REASON_NOT_OBJECT),
    (b"null", REASON_NOT_OBJECT),
    (b"", REASON_INVALID_JSON),
    (b'{"a":1', REASON_INVALID_JSON),
    (b'{"a":1} xyz', REASON_INVALID_JSON),
    (b'{"a":1}{"b":2}', REASON_INVALID_JSON),
    (b"{'a':1}", REASON_INVALID_JSON),
    (b"{a:1}", REASON_INVALID_JSON),
    (b'{"a":NaN}', REASON_INVALID_JSON),
    (b'{"a":-Infinity}', REASON_INVALID_JSON),
    (b'{"a":01}', REASON_INVALID_JSON),
    (b'{"a":1,}', REASON_INVALID_JSON),
    (b'{"a":"x\ty"}', REASON_INVALID_JSON),
    (b'\xef\xbb\xbf{"a":1}', REASON_INVALID_JSON),
    (b"[" * 100_000, REASON_INVALID_JSON),
    (b"\xff\xfe", REASON_INVALID_UTF8),
    (b'{"a":"\xff"}', REASON_INVALID_UTF8),
    (b'{"a":"\xc3"}', REASON_INVALID_UTF8),
]
# Where Spark's parser ("json_spark") decides differently, by design (documented in decoders.py).
SPARK_DIFFERS = {b'{"a":1} xyz': None, b'{"a":1}{"b":2}': None, b'{"a":1,"a":2}': REASON_INVALID_JSON,
                 b'{"a":"\\ud800"}': REASON_INVALID_JSON}


def code(reason: str | None) -> str | None:
    return None if reason is None else reason.split(":")[0]


@pytest.mark.parametrize("payload,expected", CASES, ids=[repr(c[0][:24]) for c in CASES])
def test_json_object_reason(payload, expected):
    assert code(json_object_reason(payload)) == expected


def test_reasons_say_what_is_wrong():
    assert json_object_reason(b"[1]") == "not_a_json_object: top-level value is an array"
    assert json_object_reason(b"\xff") == "invalid_utf8: invalid start byte at byte 0"
    assert "Extra data" in json_object_reason(b'{"a":1} x')
    assert "NaN is not a JSON number" in json_object_reason(b'{"a":NaN}')


def test_vectorised_reasons_match_per_record_on_both_paths():
    valid_utf8 = [p for p, _ in CASES if code(json_object_reason(p)) != REASON_INVALID_UTF8]
    for payloads in (valid_utf8, [p for p, _ in CASES]):  # fast path (one Arrow cast) and fallback
        got = json_object_reasons(pa.array(payloads + [None], pa.binary())).to_pylist()
        assert got == [json_object_reason(p) for p in payloads] + [None]


def test_registry():
    assert get_decoder("json") is json_decoder
    assert get_decoder(json_spark_decoder) is json_spark_decoder
    with pytest.raises(ValueError, match="unknown decoder 'xml'; registered: .*json"):
        get_decoder("xml")
    with pytest.raises(TypeError, match="must be callable"):
        register_decoder("bad", "not a function")
    register_decoder("json_copy", json_decoder)
    assert get_decoder("json_copy") is json_decoder


def _decode(spark, decoder, payloads):
    df = spark.createDataFrame([(i, p) for i, p in enumerate(payloads)], "i INT, data BINARY")
    rows = df.select("i", decoder(F.col("data")).alias("d")).orderBy("i").collect()
    return [r["d"] for r in rows]


def test_json_decoder_in_spark(spark):
    payloads = [p for p, _ in CASES if len(p) < 1000]
    decoded = _decode(spark, json_decoder, payloads)
    for payload, d in zip(payloads, decoded, strict=True):
        assert code(d["reason"]) == dict(CASES)[payload], payload
        assert d["payload"] == (payload.decode() if d["reason"] is None else None)


def test_json_spark_decoder_agrees_except_where_documented(spark):
    payloads = [p for p, _ in CASES if len(p) < 1000] + list(SPARK_DIFFERS)
    expected = {**dict(CASES), **SPARK_DIFFERS}
    for payload, d in zip(payloads, _decode(spark, json_spark_decoder, payloads), strict=True):
        assert code(d["reason"]) == expected[payload], payload


def test_schema_adds_typed_top_level_fields(spark):
    decoder = json_object_decoder("user STRING, amount BIGINT")
    d = _decode(spark, decoder, [b'{"user":"ann","amount":3,"x":1}', b'{"amount":"three"}', b"[]"])
    assert [(r["user"], r["amount"], r["reason"] is None) for r in d] == [
        ("ann", 3, True), (None, None, True), (None, None, False)]


def test_every_decoder_the_settings_accept_is_registered():
    """KCL_PIPELINE_DECODER is checked against DECODERS without pyspark: each must be a registered decoder."""
    from kcl_pipeline.transform.names import DECODERS

    assert all(callable(get_decoder(name)) for name in DECODERS)


def test_a_bad_kpl_aggregate_is_quarantined_with_the_kpl_reason_not_as_invalid_utf8():
    """A bad aggregate delivered whole was quarantined as `invalid_utf8: … at byte 0` (issue 30 item 7)."""
    from kcl_pipeline.kcl.records.kpl import MAGIC, aggregate

    good = aggregate([("pk", None, b'{"a": 1}'), ("pk", None, b'{"b": 2}')])
    md5_mismatch = good[:-16] + b"\x00" * 16
    too_short = MAGIC + b"0123456789abcdef"
    assert json_object_reason(md5_mismatch) == "bad_kpl_aggregate: md5_mismatch"
    assert json_object_reason(too_short) == "bad_kpl_aggregate: too_short: 20 bytes"
    assert json_object_reasons(pa.array([md5_mismatch, b"\xff", b"{}"], pa.binary())).to_pylist() == \
        ["bad_kpl_aggregate: md5_mismatch", "invalid_utf8: invalid start byte at byte 0", None]


def test_a_bad_kpl_aggregate_is_quarantined_as_one_by_the_spark_decoder_too(spark):
    """json_spark quarantined a bad aggregate delivered whole as `invalid_utf8`, the bytes' symptom; it says
    what the record is (Spark SQL cannot check an aggregate: the "json" decoder names the KPL's reason)."""
    from kcl_pipeline.kcl.records.kpl import MAGIC, aggregate

    md5_mismatch = aggregate([("pk", None, b'{"a": 1}')])[:-16] + b"\x00" * 16
    decoded = _decode(spark, json_spark_decoder, [md5_mismatch, MAGIC + b"0123", b"\xff", b"{}"])
    assert [code(d["reason"]) for d in decoded] == [REASON_BAD_KPL_AGGREGATE, REASON_BAD_KPL_AGGREGATE,
                                                     REASON_INVALID_UTF8, None]
