"""`--json` for landing verify and audit (one JSON object, exit code as in text mode); `--log-format json`."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.log_format import JsonFormatter

from .helpers import SHARD, STREAM
from .test_verify import landed  # noqa: F401  (fixture)


def _json(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def test_landing_verify_json_is_one_object(landed):  # noqa: F811
    uri, _, _ = landed
    result = CliRunner().invoke(main, ["landing", "verify", "--landing", uri, "--json"])
    assert result.exit_code == 0, result.output
    report = _json(result)
    assert report["ok"] is True and report["rows"] == 180
    shard = report["streams"][STREAM][SHARD]
    assert shard["rows"] == 90 and shard["gaps"] == [] and shard["last"]["sequence_number"]


def test_landing_verify_progress_goes_to_stderr_and_the_json_stays_one_object(landed):  # noqa: F811
    uri, _, _ = landed
    result = CliRunner().invoke(main, ["landing", "verify", "--landing", uri, "--json", "--progress"])
    assert result.exit_code == 0, result.output
    assert _json(result)["ok"] is True
    lines = result.stderr.splitlines()
    total = int(lines[-1].split("/")[1].split()[0])
    assert total > 0 and lines[-1] == f"batches verified: {total}/{total} (100%)"


def test_landing_verify_json_reports_a_broken_chain_with_exit_1(landed):  # noqa: F811
    uri, _, _ = landed
    victim = sorted(Path(uri).rglob("*.parquet"))[1]
    victim.write_bytes(b"not parquet")
    result = CliRunner().invoke(main, ["landing", "verify", "--landing", uri, "--json"])
    assert result.exit_code == 1
    report = _json(result)
    assert report["ok"] is False
    assert any(s["corrupt"] for shards in report["streams"].values() for s in shards.values())


def test_audit_json_lists_every_check(landed, tmp_path, emulators, dynamodb_client, unique_name):  # noqa: F811
    uri, _, _ = landed
    application = unique_name("audit")
    LeaseTable(application, dynamodb_client).ensure_table()  # empty: no checkpoint to compare
    result = CliRunner(env=emulators.env()).invoke(main, [
        "audit", "--landing", uri, "--output", str(tmp_path / "out"), "--stream", STREAM, "--window-minutes", "1",
        "--window", "2026-11-22T03:00/PT3M", "--application", application, "--json"])
    report = _json(result)
    assert result.exit_code == (0 if report["ok"] else 1)
    assert {o["check"] for o in report["outcomes"]} >= {"chain", "counts"}
    assert len({o["window_start_ms"] for o in report["outcomes"]}) == 3


def test_log_format_json_writes_json_lines(tmp_path):
    result = CliRunner().invoke(main, ["--log-format", "json", "landing", "verify", "--landing", str(tmp_path),
                                       "--json"])
    assert result.exit_code == 0, result.output
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler.formatter, JsonFormatter)
    record = logging.LogRecord("kcl_pipeline.x", logging.WARNING, __file__, 1, "lease %s lost", ("s-1",), None)
    entry = json.loads(handler.formatter.format(record))
    assert entry["level"] == "WARNING" and entry["message"] == "lease s-1 lost" and entry["logger"] == "kcl_pipeline.x"
    CliRunner().invoke(main, ["landing", "verify", "--landing", str(tmp_path)])  # back to text for later tests
    assert not isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)
