"""End to end: the README's one command (`kcl-pipeline demo`) on the emulators, as a user would run it.

`dagster dev` runs the webserver, the daemon and the code server as separate processes; the sensor hosts
the lease workers. The test produces 8,000 records (KPL and plain, some poison) into a 4-shard stream,
splits a shard midway, SIGKILLs a lease worker and reloads the code location while records flow, and
then checks that every window is landed, transformed and checkpointed; that the output is the good
records exactly once and the poison ones are quarantined; that the checkpoints are the last materialised
records; that the audit and the asset checks pass; and that a backfill of a past window reproduces it.
A browser (Debian's Chromium through Playwright) then finds the materialised partitions in the UI.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kcl_pipeline.kcl.aws import AwsSettings, client
from kcl_pipeline.kcl.lease_table import LeaseTable
from kcl_pipeline.kcl.shards import list_shards, wait_stream_active
from kcl_pipeline.landing.layout import MINUTE_MS
from kcl_pipeline.landing.store import open_store
from kcl_pipeline.landing.verify import list_batches, read_batches
from kcl_pipeline.local.dagster_client import graphql
from kcl_pipeline.local.producer import produce
from kcl_pipeline.transform.job import read_output
from kcl_pipeline.transform.storage import S3Options

pytestmark = [pytest.mark.slow]

STREAM, APP = "kcl-pipeline-demo", "kcl-pipeline"
LANDING, OUTPUT = "s3://kcl-pipeline/landing", "s3://kcl-pipeline/output"
WINDOW_MS = MINUTE_MS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:  # the stack is still starting
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


class Stack:
    def __init__(self, state: Path, port: int):
        self.state, self.port = state, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def start(self) -> None:
        cmd = [sys.executable, "-m", "kcl_pipeline.cli", "demo", "--no-producer", "--port", str(self.port),
               "--state-dir", str(self.state), "--window-minutes", "1", "--shards", "4"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.state.parent / "demo.out", "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        env_sh = self.state / "env.sh"
        _wait(env_sh.exists, 60, "the emulators", 0.5)
        for line in env_sh.read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            self.env[key] = value
        _wait(lambda: urllib.request.urlopen(f"{self.url}/server_info", timeout=5).status == 200, 180,
              "the Dagster webserver")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def aws(self) -> AwsSettings:
        return AwsSettings(region=self.env.get("AWS_REGION"), endpoint_urls={
            s: self.env[f"AWS_ENDPOINT_URL_{s.upper()}"] for s in ("kinesis", "dynamodb", "s3", "cloudwatch")})

    def instance(self):
        from dagster import DagsterInstance

        return DagsterInstance.from_config(str(self.state / "dagster_home"))

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env, "KCL_PIPELINE_PROFILE": "demo", "KCL_PIPELINE_WINDOW_MINUTES": "1"}
        return subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", *args], env=env, capture_output=True,
                              text=True, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("e2e") / "state"
    s = Stack(state, _free_port())
    try:
        s.start()
        yield s
    finally:
        s.stop()
        log = state / "logs" / "dagster.log"
        if log.exists():
            keep = Path(os.environ.get("KCL_E2E_LOG", "/tmp/kcl_e2e_dagster.log"))
            keep.write_text(log.read_text())
            print(f"dagster log kept at {keep}")


def _worker_pids() -> list[int]:
    """The sensor's lease workers: multiprocessing spawn children of the Dagster code server."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        pid, ppid, args = line.strip().split(None, 2)
        procs[int(pid)] = (int(ppid), args)
    return [pid for pid, (ppid, args) in procs.items()
            if "spawn_main" in args and "dagster" in procs.get(ppid, (0, ""))[1]]


def _materialised(instance, asset: str) -> set[str]:
    from dagster import AssetKey

    return set(instance.get_materialized_partitions(AssetKey(asset)))


def _key(ms: int) -> str:
    from kcl_pipeline.defs.kinesis.partitions import partition_key

    return partition_key(ms)


def _output_ids(aws, windows) -> tuple[list[int], list[bytes]]:
    s3 = S3Options.from_aws_settings(aws, env_credentials=True)
    good, quarantined = [], []
    for w in windows:
        out = read_output(None, OUTPUT, w, s3=s3)
        good += [json.loads(p)["id"] for p in out.transformed.column("payload").to_pylist()]
        quarantined += out.quarantine.column("data").to_pylist()
    return good, quarantined


def test_pipeline_end_to_end(stack):
    aws = stack.aws()
    kinesis = client("kinesis", aws)
    wait_stream_active(kinesis, STREAM)
    produced, poison = [], []

    def put(n: int, first: int, aggregate: int):
        report = produce(kinesis, STREAM, count=n, rate=None, aggregate=aggregate, payload=None, poison_every=50,
                         create_shards=None, first_id=first)
        poison.extend(report.poison_ids)
        produced.extend(i for i in range(first, first + n) if i not in set(report.poison_ids))

    put(2000, 0, 10)
    put(2000, 2000, 1)
    instance = stack.instance()
    _wait(lambda: _materialised(instance, "landed_records"), 240, "the first landed window")

    # Chaos while records flow: SIGKILL a lease worker, reload the code location, split a shard.
    try:
        victims = _wait(_worker_pids, 60, "lease workers")
    except AssertionError:
        print(subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout)
        raise
    os.kill(victims[0], signal.SIGKILL)
    reload = graphql(stack.url, "mutation { reloadRepositoryLocation(repositoryLocationName: \"kcl_pipeline\")"
                                " { __typename } }", {})
    assert reload["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", reload
    parent = list_shards(kinesis, STREAM)[0]
    kinesis.split_shard(StreamName=STREAM, ShardToSplit=parent.shard_id,
                        NewStartingHashKey=str(int(parent.hash_key_range.ending_hash_key) // 2))
    wait_stream_active(kinesis, STREAM)
    put(2000, 4000, 10)
    put(2000, 6000, 1)
    assert len(produced) + len(poison) == 8000

    store = open_store(LANDING, aws)

    def windows_with_records() -> list[int]:
        return sorted({b.minute_ms - b.minute_ms % WINDOW_MS for b in list_batches(store, STREAM)})

    def all_landed() -> bool:
        ids = [json.loads(d)["id"] for d in read_batches(store, STREAM).column("data").to_pylist()
               if not d.endswith(b"tru")]
        return set(produced) <= set(ids)

    _wait(all_landed, 300, "every record landed", 5)
    windows = windows_with_records()

    def all_done() -> bool:
        keys = {_key(w) for w in windows}
        return keys <= _materialised(instance, "transformed_records") and \
            keys <= _materialised(instance, "kinesis_checkpoints")

    _wait(all_done, 420, "every window transformed and checkpointed", 5)

    # The output is the good records exactly once; the poison ones are quarantined.
    good, quarantined = _output_ids(aws, windows)
    assert sorted(good) == sorted(produced)
    assert len(quarantined) == len(poison)
    assert sorted(int(q.split(b":")[1].split(b",")[0]) for q in quarantined) == sorted(poison)

    # The checkpoints are the last materialised records (SHARD_END for the split parent).
    leases = {lease.lease_key: lease for lease in LeaseTable(APP, client("dynamodb", aws)).scan()}
    # Ended, or already cleaned up: a finished parent is deleted once both children's leases have started.
    children = [lease for lease in leases.values() if parent.shard_id in lease.parent_shard_ids]
    assert len(children) == 2
    if parent.shard_id in leases:
        assert leases[parent.shard_id].is_ended
    else:
        assert all(not child.checkpoint.is_starting_sentinel for child in children)
    for shard_id, lease in leases.items():
        batches = list_batches(store, STREAM, shard=shard_id)
        if lease.is_ended or not batches:
            continue
        assert lease.checkpoint == max(batches, key=lambda b: b.last.key()).last, shard_id

    # The lineage audit (CLI) and the asset checks pass.
    first, last = windows[0], windows[-1] + WINDOW_MS
    span = f"{_iso(first)}/{_iso(last)}"
    audit = stack.cli("audit", "--window", span)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    _assert_checks_passed(instance)

    # A backfill of one past window (AT_TIMESTAMP re-read) reproduces the same output, without duplicates.
    target = windows[1] if len(windows) > 2 else windows[0]
    before = sorted(_output_ids(aws, [target])[0])
    landed_before = read_batches(store, STREAM, target, target + WINDOW_MS).num_rows
    result = stack.cli("backfill", "--window", f"{_iso(target)}/PT1M", "--url", stack.url, "--window-minutes", "1",
                       "--timeout", "400")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(_output_ids(aws, [target])[0]) == before
    assert read_batches(store, STREAM, target, target + WINDOW_MS).num_rows == landed_before
    verify = stack.cli("landing", "verify", "--landing", LANDING, "--stream", STREAM)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M")


def _assert_checks_passed(instance) -> None:
    from dagster import AssetCheckKey, AssetKey

    seen = 0
    for asset, name in (("transformed_records", "rows_reconcile"),
                        ("kinesis_checkpoints", "checkpoint_within_materialised")):
        history = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(asset), name), limit=1000)
        for record in history:
            evaluation = record.event.dagster_event.event_specific_data if record.event else None
            if evaluation is not None and hasattr(evaluation, "passed"):
                assert evaluation.passed, (asset, name, evaluation)
                seen += 1
    assert seen > 0, "no asset check evaluation recorded"


def test_ui_shows_materialised_partitions(stack):
    """Headless Chromium (Debian's package) through Playwright: the partitions page of transformed_records."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = "/usr/bin/chromium"
    assert Path(chromium).exists(), "install Debian's chromium (apt-get install chromium): .ci/run does"
    expected = sorted(_materialised(stack.instance(), "transformed_records"))
    assert expected, "the end-to-end test materialises partitions first"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{stack.url}/assets/transformed_records?view=partitions", wait_until="networkidle",
                      timeout=90_000)
            skip = page.get_by_role("button", name="Skip")
            if skip.count():
                skip.first.click()
            page.get_by_text("Materialized (").first.wait_for(timeout=60_000)
            label = page.get_by_text("Materialized (").first.inner_text()
            assert int(label.split("(")[1].split(")")[0]) >= len(expected)
            page.get_by_text(expected[-1]).first.wait_for(timeout=30_000)
        finally:
            browser.close()
