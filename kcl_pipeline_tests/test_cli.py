"""The command line as a person uses it: --help everywhere, one clear line and exit 2 on bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main

COMMANDS = [[], ["consume"], ["produce"], ["leases"], ["local"], ["local", "up"], ["local", "down"],
            ["landing", "migrate"]]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "main")
def test_every_command_has_help(args):
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def _run(args, env_extra=None, timeout=120):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _one_error_line(proc):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:") or "Error" in line]
    assert lines, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_bad_flags_exit_2():
    err = _one_error_line(_run(["consume", "--stream", "s", "--application", "a"]))
    assert "--sink" in err and "--landing" in err
    err = _one_error_line(_run(["consume", "--stream", "s", "--application", "a", "--sink", "csv:/tmp/x"]))
    assert "jsonl:DIR" in err
    err = _one_error_line(_run(["consume", "--stream", "s", "--application", "a", "--sink", "jsonl:/tmp/x",
                                "--initial-position", "AT_TIMESTAMP"]))
    assert "--timestamp" in err
    err = _one_error_line(_run(["consume", "--stream", "s", "--application", "a", "--sink", "jsonl:/tmp/x",
                                "--heartbeat-seconds", "5", "--lease-expiry-seconds", "6"]))
    assert "lease_expiry_seconds" in err
    err = _one_error_line(_run(["consume", "--stream", "bad name!", "--application", "a", "--sink", "jsonl:/x"]))
    assert "stream" in err
    _one_error_line(_run(["consume", "--max-leases", "many"]))


def test_unreachable_endpoint_is_one_clear_line(tmp_path):
    proc = _run(["leases", "--application", "a", "--endpoint-url", "http://127.0.0.1:9"],
                {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "eu-west-1"})
    err = _one_error_line(proc)
    assert "127.0.0.1:9" in err


@pytest.mark.emulator
def test_missing_stream_and_table(emulators, tmp_path):
    env = emulators.env()
    err = _one_error_line(_run(["consume", "--stream", "no-such-stream", "--application", "cliapp",
                                "--sink", f"jsonl:{tmp_path}"], env))
    assert "no-such-stream" in err and "does not exist" in err
    err = _one_error_line(_run(["leases", "--application", "no-such-table"], env))
    assert "no-such-table" in err


@pytest.mark.emulator
def test_produce_then_leases_json(emulators, unique_name, tmp_path, dynamodb_client):
    env = emulators.env()
    stream = unique_name("cli")
    proc = _run(["produce", "--stream", stream, "--count", "50", "--aggregate", "5", "--create-shards", "2"], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["user_records"] == 50
    from kcl_pipeline.kcl.core.model import Checkpoint, Lease
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    app = unique_name("cliapp")
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    table.create(Lease("shardId-000000000000", Checkpoint("12345", 2), lease_owner="w1", lease_counter=3))
    proc = _run(["leases", "--application", app, "--json"], env)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip())
    assert row["leaseKey"] == "shardId-000000000000" and row["checkpoint"] == "12345"
    assert row["checkpointSubSequenceNumber"] == 2 and row["leaseOwner"] == "w1"
    proc = _run(["leases", "--application", app], env)
    assert "shardId-000000000000" in proc.stdout and "12345/2" in proc.stdout
    # A multi-stream key is longer than the column was: the owner column stays aligned under its header.
    multi = "123456789012:a-rather-long-stream-name:1700000000:shardId-000000000001"
    table.create(Lease(multi, Checkpoint("TRIM_HORIZON"), lease_owner="w2", lease_counter=1))
    header, *rows = _run(["leases", "--application", app], env).stdout.splitlines()
    assert any(row.startswith(multi + " ") for row in rows)
    assert {row.index(" w") + 1 for row in rows} == {header.index("owner")}


@pytest.mark.emulator
def test_produce_reports_progress_on_stderr_and_keeps_stdout_for_the_report(emulators, unique_name):
    env = emulators.env()
    stream = unique_name("progress")
    proc = _run(["produce", "--stream", stream, "--count", "1200", "--create-shards", "1", "--progress"], env)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"producing to {stream}: ")]
    assert 2 <= len(lines) <= 11 and lines[-1] == f"producing to {stream}: 1200/1200 (100%)"
    assert json.loads(proc.stdout)["user_records"] == 1200  # stdout: the report alone
    quiet = _run(["produce", "--stream", stream, "--count", "10"], env)  # stderr is no terminal: no progress
    assert quiet.returncode == 0 and "producing to" not in quiet.stderr


def test_progress_outside_a_terminal_is_one_line_per_tenth(capsys):
    from kcl_pipeline.cli import Progress

    with Progress("work", True) as bar:
        for done in range(0, 1001, 7):
            bar.update(done, 1000)
        bar.update(1000, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "work: 0/1000 (0%)" and lines[-1] == "work: 1000/1000 (100%)" and len(lines) == 11
    with Progress("work", False) as bar:
        bar.update(5, 10)
    assert capsys.readouterr().err == ""
