"""The shipped Dagster instance (kcl_pipeline/deploy/dagster.yaml) against what kills runs in real life."""
from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace

from dagster import DagsterInstance
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.monitoring import concurrency as slot_monitor

from kcl_pipeline.defs.home import prepare_dagster_home
from kcl_pipeline.defs.kinesis.sensors import WINDOW_JOB

SPARK_POOL = "spark"


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
