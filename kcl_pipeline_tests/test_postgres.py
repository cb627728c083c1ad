"""Dagster on PostgreSQL: a real PostgreSQL (Debian's package) on loopback holds the instance's storage while
the demo runs sensor → landed_records → transformed_records → kinesis_checkpoints against it, with two code
servers (the pipeline location and a fleet-member location) sharing the fleet."""
from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kcl_pipeline.deployment.home import INSTANCE_FILES, POSTGRES_URL_ENV, prepare_dagster_home
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableError
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.local.emulators import free_port


def _pg_bindir() -> Path | None:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def test_postgres_instance_differs_from_the_default_only_in_storage():
    """One instance configuration: the production file is the local one plus PostgreSQL storage."""
    import yaml

    local = yaml.safe_load(INSTANCE_FILES["sqlite"].read_text())
    production = yaml.safe_load(INSTANCE_FILES["postgres"].read_text())
    assert production.pop("storage") == {"postgres": {"postgres_url": {"env": POSTGRES_URL_ENV}}}
    assert production == local


def test_dagster_home_command_writes_the_chosen_instance(tmp_path):
    from click.testing import CliRunner

    from kcl_pipeline.cli import main

    result = CliRunner().invoke(main, ["dagster-home", str(tmp_path / "home"), "--storage", "postgres"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "home" / "dagster.yaml").read_text() == INSTANCE_FILES["postgres"].read_text()
    assert f"export DAGSTER_HOME={tmp_path / 'home'}" in result.output
    with pytest.raises(ValueError, match="sqlite, postgres"):
        prepare_dagster_home(tmp_path / "x", storage="mysql")


@pytest.fixture(scope="module")
def postgres():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (CI installs Debian's postgresql package)")
    if importlib.util.find_spec("dagster_postgres") is None:
        pytest.skip("dagster-postgres is not installed (the [postgres] extra)")
    as_postgres = []
    data_root = Path(tempfile.mkdtemp(prefix="kcl-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(data_root, user.pw_uid, user.pw_gid)
        os.chmod(data_root, 0o755)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data = data_root / "data"
    subprocess.run([*as_postgres, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "dagster",
                    "--no-sync"], check=True, capture_output=True, timeout=120)
    port = free_port()
    subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(data_root / "log"),
                    "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {data_root} -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*as_postgres, str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "dagster",
                    "dagster"], check=True, capture_output=True, timeout=60)
    try:
        yield f"postgresql+psycopg2://dagster@127.0.0.1:{port}/dagster"
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(data_root, ignore_errors=True)


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = value
    return out


@pytest.mark.slow
def test_two_code_servers_on_postgres_share_the_fleet_and_report_each_window_once(postgres, tmp_path):
    from collections import Counter

    from dagster import AssetKey, DagsterInstance, DagsterRunStatus, RunsFilter

    from kcl_pipeline.deployment.fleet_hosting import consumer_name

    state = tmp_path / "state"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT_URL", "KCL_PIPELINE_"))},
           POSTGRES_URL_ENV: postgres}
    demo = subprocess.Popen([sys.executable, "-m", "kcl_pipeline.cli", "demo", "--dagster-storage", "postgres",
                             "--port", str(free_port()), "--shards", "2", "--rate", "20", "--window-minutes", "1",
                             "--code-servers", "2", "--state-dir", str(state)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (state / "env.sh").exists() and time.monotonic() < deadline and demo.poll() is None:
            time.sleep(1)
        assert (state / "env.sh").exists(), "the demo did not start its emulators"
        endpoints = _env_file(state / "env.sh")
        aws = AwsSettings(region=endpoints["AWS_REGION"],
                          endpoint_urls={"dynamodb": endpoints["AWS_ENDPOINT_URL_DYNAMODB"]})
        table = LeaseTable("kcl-pipeline", client("dynamodb", aws))

        holders: set[str] = set()  # consumer names seen holding a lease: both code servers' members

        def checkpointed() -> bool:
            try:
                leases = table.scan()
            except LeaseTableError:
                return False
            holders.update(consumer_name(lease.lease_owner) for lease in leases if lease.lease_owner)
            return bool(leases) and all(not lease.checkpoint.is_sentinel for lease in leases)

        deadline = time.monotonic() + 420
        while not (checkpointed() and len(holders) == 2) and time.monotonic() < deadline:
            assert demo.poll() is None, "the demo exited"
            time.sleep(3)
        assert checkpointed(), "no window was checkpointed through the pipeline on PostgreSQL"
        assert len(holders) == 2 and sum("-member-" in name for name in holders) == 1, holders

        os.environ[POSTGRES_URL_ENV] = postgres
        try:
            instance = DagsterInstance.from_config(str(state / "dagster_home"))
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert instance.get_runs(RunsFilter(job_name="kinesis_window_job")), "runs are stored in PostgreSQL"
            # The checkpoints are the run's last step: the run itself finishes just after.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not instance.get_runs(
                    RunsFilter(job_name="kinesis_window_job", statuses=[DagsterRunStatus.SUCCESS])):
                time.sleep(2)
            assert instance.get_runs(RunsFilter(job_name="kinesis_window_job", statuses=[DagsterRunStatus.SUCCESS]))
            # Each window is reported once (only the pipeline location reports) and run once.
            landed = instance.fetch_materializations(AssetKey("landed_records"), limit=1000).records
            reports = Counter(record.asset_materialization.partition for record in landed)
            assert reports and max(reports.values()) == 1, reports
            runs = Counter(run.tags.get("dagster/partition")
                           for run in instance.get_runs(RunsFilter(job_name="kinesis_window_job")))
            assert max(runs.values()) == 1, runs
            instance.dispose()
        finally:
            os.environ.pop(POSTGRES_URL_ENV, None)
        assert not (state / "dagster_home" / "history").exists()  # nothing fell back to SQLite
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            output = demo.communicate(timeout=150)[0].decode()
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            output = demo.communicate()[0].decode()
    assert demo.returncode == 0, output[-3000:]
