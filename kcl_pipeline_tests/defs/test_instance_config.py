"""The shipped Dagster instance (dagster.yaml at the root, kcl_pipeline/deploy/dagster.yaml in the package) against
what kills runs in real life, and what a new user meets first."""
from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import DagsterInstance
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.monitoring import concurrency as slot_monitor

from kcl_pipeline.defs.kinesis.sensors import WINDOW_JOB
from kcl_pipeline.deployment.home import POSTGRES_URL_ENV, prepare_dagster_home

SPARK_POOL = "spark"
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_instance_opens_the_ui_without_the_first_visit_dialog_or_telemetry(tmp_path):
    """Tried as a new user would, the demo's UI opened behind Dagster's "Join the Dagster community" dialog: the
    UI shows it while the instance's `nux` is enabled (GraphQL shouldShowNux) and nobody has dismissed it yet."""
    home = prepare_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        assert not instance.nux_enabled
        assert not instance.telemetry_enabled
        assert instance.run_monitoring_enabled


def test_dagster_dev_at_the_root_without_dagster_home_reads_the_root_file(tmp_path):
    """What `dagster dev` does at the repository root with DAGSTER_HOME unset (dagster/_cli/utils.py): the
    instance's configuration from the working directory's dagster.yaml, its storage in a temporary directory."""
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path), config_dir=str(REPO_ROOT))) as instance:
        assert not instance.nux_enabled
        assert not instance.telemetry_enabled
        assert instance.run_monitoring_enabled
        assert instance.run_coordinator.__class__.__name__ == "QueuedRunCoordinator"
    assert (tmp_path / "history").is_dir()  # SQLite under the temporary directory, nothing beside the file


def test_the_postgres_instance_also_opens_without_the_dialog(tmp_path, monkeypatch):
    monkeypatch.setenv(POSTGRES_URL_ENV, "postgresql+psycopg2://user:password@127.0.0.1:1/dagster")
    home = prepare_dagster_home(tmp_path / "home", storage="postgres")
    config, _ = dagster_instance_config(str(home))  # validated against Dagster's schema; connects to nothing
    assert config["nux"] == {"enabled": False} and config["telemetry"] == {"enabled": False}
    assert "postgres" in config["storage"]


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
def test_an_unknown_instance_key_is_refused(tmp_path, monkeypatch, storage):
    """The schema check the two tests above rely on: a misspelt key (`nux` as `nuxx`) is an error, not ignored."""
    from dagster._core.errors import DagsterInvalidConfigError

    monkeypatch.setenv(POSTGRES_URL_ENV, "postgresql+psycopg2://user:password@127.0.0.1:1/dagster")
    home = prepare_dagster_home(tmp_path / "home", storage=storage)
    (home / "dagster.yaml").write_text((home / "dagster.yaml").read_text().replace("\nnux:", "\nnuxx:"))
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(str(home))


def test_a_run_killed_from_outside_does_not_hold_the_spark_slot_for_ever(tmp_path, monkeypatch):
    """A window run whose worker was SIGKILLed (say, by the OOM killer) mid-transform never frees the one
    `spark` pool slot its step claimed; without the instance freeing it, every later window run waited in
    the queue for ever (found by the chaos test)."""
    home = prepare_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        assert storage.supports_global_concurrency_limits
        storage.set_concurrency_slots(SPARK_POOL, 1)
        run = create_run_for_test(instance, job_name=WINDOW_JOB, status=DagsterRunStatus.STARTED)
        assert storage.claim_concurrency_slot(SPARK_POOL, run.run_id, "transformed_records").is_claimed
        instance.report_run_failed(run, "Run execution process was terminated by signal 9 (SIGKILL)")

        # The monitoring daemon's pass over pool slots, a few minutes later.
        later = slot_monitor.get_current_datetime() + timedelta(minutes=5)
        monkeypatch.setattr(slot_monitor, "get_current_datetime", lambda: later)
        list(slot_monitor.execute_concurrency_slots_iteration(SimpleNamespace(instance=instance),
                                                              logging.getLogger("test")))
        assert storage.get_concurrency_info(SPARK_POOL).claimed_slots == []
        assert instance.run_monitoring_enabled  # the daemon runs that pass only when monitoring is on


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
def test_a_requested_window_run_leaves_the_queue_within_a_second(tmp_path, monkeypatch, storage):
    """The daemon's run queue is on every window's critical path: at Dagster's default it looked every 5 s, so a
    run the sensor requested waited up to 5 s before it started."""
    monkeypatch.setenv(POSTGRES_URL_ENV, "postgresql+psycopg2://user:password@127.0.0.1:1/dagster")
    home = prepare_dagster_home(tmp_path / "home", storage=storage)
    config, _ = dagster_instance_config(str(home))  # validated against Dagster's schema; connects to nothing
    assert config["run_coordinator"]["config"]["dequeue_interval_seconds"] == 1
    if storage == "sqlite":
        with DagsterInstance.from_config(str(home)) as instance:
            assert instance.run_coordinator.dequeue_interval_seconds == 1
