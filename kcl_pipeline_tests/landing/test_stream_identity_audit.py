"""`kcl-pipeline audit` checks stream identity as `landing verify` does (zone/chain.py judges both): a batch of
another stream than its directory's, or than the stream expected, fails its window's chain check (`foreign:`),
and a directory whose footers name two streams fails the history (`mixed streams:`). Before, the audit passed
another stream's batches as this stream's rows."""
from __future__ import annotations

import pytest

from kcl_pipeline.audit.history import audit_history
from kcl_pipeline.audit.index import INDEX_FORMAT, AuditIndex, index_key
from kcl_pipeline.audit.stream import audit
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.zone.batch import encode_batch
from kcl_pipeline.zone.layout import MINUTE_MS, landing_directory

from .helpers import SHARD, T0, make_records

W = MINUTE_MS
A = "arn:aws:kinesis:us-east-1:111111111111:stream/orders"
B = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
B_OTHER_REGION = "arn:aws:kinesis:us-east-1:222222222222:stream/orders"
TRIM = Checkpoint("TRIM_HORIZON")


def _put(store, directory: str, arn: str | None, records, prev, prev_key: str | None = None) -> str:
    batch = encode_batch(directory, SHARD, records, prev, stream_arn=arn, prev_key=prev_key)
    assert store.put_if_absent(batch.key.key(), batch.body)
    return batch.key.key()


def _chain(store, directory: str, arns) -> None:
    """Consecutive batches of 10 records, the i-th of stream arns[i], in one minute."""
    records = make_records(10 * len(arns))
    prev, prev_key = TRIM, None
    for i, arn in enumerate(arns):
        part = records[10 * i:10 * (i + 1)]
        prev_key = _put(store, directory, arn, part, prev, prev_key)
        prev = part[-1].checkpoint


def _problems(report) -> list[str]:
    return [line for o in report.outcomes if not o.ok for line in (o.summary, *o.details)]


def test_the_audit_fails_a_directory_holding_batches_of_two_streams(local_zone, memory_zone):
    store, output = local_zone.store, memory_zone.store
    _chain(store, "orders", [A, B])
    report = audit_history(store, output, "orders", W, now_ms=T0)
    assert not report.ok
    mixed = [line for line in _problems(report) if line.startswith("mixed streams: orders holds batches of 2")]
    assert mixed and A in mixed[0] and B in mixed[0], report.lines()
    assert any("mixed streams: orders holds batches of 2 streams" in line for line in report.lines())
    # The next audit judges from its index (no footer read again): the streams are among the facts kept.
    again = audit_history(store, output, "orders", W, now_ms=T0)
    assert again.scopes[0].read_batches == 0 and not again.ok
    assert any(line.startswith("mixed streams:") for line in _problems(again))


def test_the_audit_fails_batches_of_another_stream_than_the_one_expected(local_zone, memory_zone):
    store, output = local_zone.store, memory_zone.store
    _chain(store, "orders", [A, A])
    assert audit(local_zone.uri, memory_zone.uri, "orders", W, store=store, output=output, now_ms=T0,
                 stream_arn=A).ok
    report = audit(local_zone.uri, memory_zone.uri, "orders", W, store=store, output=output, now_ms=T0,
                   stream_arn=B)
    assert not report.ok
    (chain,) = [o for o in report.outcomes if o.check == "chain" and not o.ok and not o.whole_history]
    foreign = [line for line in chain.details if "foreign: orders/" in line]
    assert len(foreign) == 2 and all(A in line and B in line for line in foreign), chain.details
    with pytest.raises(ValueError, match="not one"):
        audit(local_zone.uri, memory_zone.uri, "orders", W, store=store, output=output, now_ms=T0,
              stream_arn="orders")


def test_the_audit_of_one_window_fails_another_streams_batch_too(local_zone, memory_zone):
    store, output = local_zone.store, memory_zone.store
    _chain(store, "orders", [A, B])
    report = audit(local_zone.uri, memory_zone.uri, "orders", W, window=(T0, T0 + W), store=store, output=output,
                   now_ms=T0, stream_arn=A)
    (chain,) = [o for o in report.outcomes if o.check == "chain"]
    assert not chain.ok and "mixed streams: orders holds batches of 2 streams" in chain.summary
    assert any(line.startswith("  foreign: orders/") and B in line for line in chain.details), chain.details


def test_the_audit_fails_a_batch_whose_footer_is_not_its_identity_directorys_stream(local_zone, memory_zone):
    store, output = local_zone.store, memory_zone.store
    _chain(store, landing_directory(B), [B_OTHER_REGION])  # copied in from elsewhere
    report = audit(local_zone.uri, memory_zone.uri, B, W, store=store, output=output, now_ms=T0)
    assert not report.ok
    assert any("foreign: orders@eu-west-1@222222222222/" in line for line in _problems(report)), report.lines()


def test_an_index_without_the_batches_streams_is_read_anew(local_zone, memory_zone):
    """An index of the format before stream identity has no stream per batch: reused, it would pass a foreign
    batch. Its format is not this audit's, so every footer is read again."""
    store, output = local_zone.store, memory_zone.store
    _chain(store, "orders", [A, B])
    first = audit_history(store, output, "orders", W, now_ms=T0)
    index = AuditIndex.from_bytes(output.get(index_key("orders")), "index")
    assert {f.stream_arn for f in index.batches.values()} == {A, B}
    assert INDEX_FORMAT == 2 and first.scopes[0].read_batches == 2


def test_the_command_takes_the_stream_arn_and_fails_on_another_streams_batches(local_zone, tmp_path, emulators,
                                                                                dynamodb_client, unique_name):
    from click.testing import CliRunner

    from kcl_pipeline.cli import main
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    application = unique_name("audit")
    LeaseTable(application, dynamodb_client).ensure_table()  # empty: no checkpoint to compare

    _chain(local_zone.store, "orders", [A])
    (tmp_path / "out").mkdir()
    args = ["audit", "--landing", local_zone.uri, "--output", str(tmp_path / "out"), "--stream", "orders",
            "--window-minutes", "1", "--transform-grace", "1000000000", "--application", application]
    result = CliRunner(env=emulators.env()).invoke(main, [*args, "--stream-arn", B])
    assert result.exit_code == 1 and "foreign: orders/" in result.output and A in result.output, result.output
    result = CliRunner(env=emulators.env()).invoke(main, [*args, "--stream-arn", A])
    assert result.exit_code == 0, result.output
    result = CliRunner(env=emulators.env()).invoke(main, [*args, "--stream-arn", "orders"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
