"""`kcl-pipeline landing migrate` between two real consumers (kinesis-local + dynalite, `kcl-pipeline consume`
processes): a consumer configured by the stream's name lands into `<name>/`; the migration is refused while it
runs; once it stopped, the directory moves into `<name>@<region>@<account>/`; a consumer configured by the ARN
(the same application) resumes there and lands only the records produced since, each once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.shards import wait_stream_active
from kcl_pipeline.zone.chain import read_batches
from kcl_pipeline.zone.layout import landing_directory
from kcl_pipeline.zone.store import open_store
from kcl_pipeline_tests.landing.helpers import stop_consumer, wait_logged

pytestmark = [pytest.mark.emulator, pytest.mark.slow]


def _consume(env, stream: str, app: str, zone: str, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", stream, "--application", app,
           "--worker-id", f"{app}-w1", "--landing", zone, "--initial-position", "TRIM_HORIZON",
           "--heartbeat-seconds", "1", "--lease-expiry-seconds", "3", "--cycle-seconds", "1", "--batch-seconds", "0.5"]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def _ids(store, directory: str) -> list[int]:
    if directory not in store.list_dirs(""):
        return []
    return [json.loads(d)["id"] for d in read_batches(store, directory).column("data").to_pylist()]


def _cli(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", *args], env=env, capture_output=True,
                          text=True, timeout=180)


def _put(kinesis, name: str, ids: range) -> None:
    kinesis.put_records(StreamName=name, Records=[{"Data": json.dumps({"id": i}).encode(), "PartitionKey": f"k{i}"}
                                                  for i in ids])


def test_a_consumer_configured_by_the_arn_resumes_a_migrated_zone_landing_only_the_new_records(
        emulators, aws_settings, unique_name, tmp_path):
    kinesis = client("kinesis", aws_settings)
    name, app = unique_name("orders"), unique_name("app")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    arn = wait_stream_active(kinesis, name)["StreamARN"]
    _put(kinesis, name, range(50))
    zone = str(tmp_path / "zone")
    os.mkdir(zone)
    store = open_store(zone)
    env = {**os.environ, **emulators.env()}
    migrate = ["landing", "migrate", "--landing", zone, "--stream", name, "--stream-arn", arn, "--application", app,
               "--no-output"]

    by_name = _consume(env, name, app, zone, tmp_path / "by-name.log")
    try:
        wait_logged(lambda: len(_ids(store, name)) >= 50, 120, "the name-configured consumer's records",
              tmp_path / "by-name.log")
        landed = {k: store.get(k) for k in store.list_keys("")}
        refused = _cli(env, *migrate, "--watch-seconds", "4")  # its lease is renewed every second
    finally:
        stop_consumer(by_name)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "live leases" in refused.stderr and refused.stdout == ""
    assert {k: store.get(k) for k in store.list_keys("")} == landed

    dry = _cli(env, *migrate, "--watch-seconds", "1", "--dry-run")
    assert dry.returncode == 0 and "would copy" in dry.stdout, dry.stdout + dry.stderr
    assert store.list_dirs("") == [name]
    done = _cli(env, *migrate, "--watch-seconds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    directory = landing_directory(arn)
    assert store.list_dirs("") == [directory] and _ids(store, directory) == list(range(50))

    _put(kinesis, name, range(50, 100))
    by_arn = _consume(env, arn, app, zone, tmp_path / "by-arn.log")
    try:
        wait_logged(lambda: len(_ids(store, directory)) >= 100, 120, "the ARN-configured consumer's records",
              tmp_path / "by-arn.log")
        time.sleep(2)  # a record landed twice would show by now
    finally:
        stop_consumer(by_arn)
    assert _ids(store, directory) == list(range(100))
    verified = _cli(env, "landing", "verify", "--no-progress", "--landing", zone, "--deep", "--stream", arn)
    assert verified.returncode == 0 and verified.stdout.splitlines()[-1] == "OK: 100 rows", verified.stdout
    verified = _cli(env, "landing", "verify", "--no-progress", "--landing", zone, "--stream", arn,
                    "--application", app)
    assert verified.returncode == 0 and "lease table: 1 leases cross-checked" in verified.stdout, verified.stdout
