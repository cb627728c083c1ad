"""A run whose worker is gone is ended, not left STARTED for good (kcl_pipeline/instance/).

The second-day test met it on CI: the demo's bounded stop killed `dagster dev`'s process group while a window's
run was transforming; its worker died with its code server, nobody ended the run, and at the next start it stayed
STARTED while every later window's run waiting behind its Spark slot. Run monitoring (the daemon's real pass,
`monitor_started_run`) now fails such a run through the launcher's health check, and the demo's stop cancels it.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.events import EngineEventData
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from kcl_pipeline.defs.kinesis.sensors import WINDOW_JOB
from kcl_pipeline.deployment.home import prepare_dagster_home
from kcl_pipeline.instance.run_launcher import HealthCheckedRunLauncher, look_at_worker
from kcl_pipeline.instance.run_worker import (
    STARTED_PROCESS_PREFIX,
    ServerAnswer,
    WorkerSight,
    process_alive,
    worker_health,
)
from kcl_pipeline.instance.stopped import cancel_runs_the_stop_ended
from kcl_pipeline.local.emulators import free_port
from kcl_pipeline_tests.kcl.fleet_support import wait_until

LOG = logging.getLogger("test")


# -- the decision ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, pid_alive, gone", [
    (ServerAnswer.RUNS_IT, None, False),
    (ServerAnswer.RUNS_IT, False, False),  # the server's word wins (it is asked first; no pid is read then)
    (ServerAnswer.NO_ANSWER, True, False),
    (ServerAnswer.DOES_NOT_RUN_IT, True, False),  # a server restarted at the same address; the worker lives on
    (ServerAnswer.NO_ANSWER, False, True),
    (ServerAnswer.DOES_NOT_RUN_IT, False, True),
    # a proxy answering for the server it reloaded to, or another host's server that may be restarting: the
    # worker cannot be seen, and a live run is never failed on a guess
    (ServerAnswer.DOES_NOT_RUN_IT, None, False),
    (ServerAnswer.NO_ANSWER, None, False),
])
def test_worker_health_decision(answer, pid_alive, gone):
    health = worker_health(WorkerSight("localhost:4000", answer, 123 if pid_alive is not None else None, pid_alive))
    assert health.gone is gone
    assert "localhost:4000" in health.reason and answer.value in health.reason


def test_a_reused_pid_is_not_the_run_worker():
    """A process that started after the worker's "Started process" event has the worker's pid by reuse."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(proc.pid, started_by=time.time())
        assert not process_alive(proc.pid, started_by=time.time() - 3600)
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid, started_by=time.time())


# -- the instance -------------------------------------------------------------------------------------------------

def _started_run(instance: DagsterInstance, server: dict, worker_pid: int | None):
    run = create_run_for_test(instance, job_name=WINDOW_JOB, status=DagsterRunStatus.STARTED,
                              tags={GRPC_INFO_TAG: json.dumps(server), "dagster/partition": "2026-12-03-09:10"})
    if worker_pid is not None:
        instance.report_engine_event(f"{STARTED_PROCESS_PREFIX} (pid: {worker_pid}).", run,
                                     EngineEventData.in_process(worker_pid))
    return run


def _exited_process() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _monitor(instance: DagsterInstance, run_id: str) -> DagsterRunStatus:
    record = instance.get_run_records(RunsFilter(run_ids=[run_id]))[0]
    if record.dagster_run.status == DagsterRunStatus.STARTED:
        monitor_started_run(instance, None, record, LOG)  # type: ignore[arg-type]  # a workspace only to resume
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def test_a_run_whose_worker_went_with_its_code_server_is_failed_by_run_monitoring_not_left_started(tmp_path):
    home = prepare_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_launcher, HealthCheckedRunLauncher)
        gone = _started_run(instance, {"host": "localhost", "port": free_port()}, _exited_process())
        assert _monitor(instance, gone.run_id) == DagsterRunStatus.FAILURE
        failure = instance.all_logs(gone.run_id)[-1].dagster_event
        assert failure is not None and "the run's worker is gone" in (failure.message or "")
        assert "has exited without ending the run" in failure.message


def test_a_run_whose_worker_still_runs_is_left_running(tmp_path):
    home = prepare_dagster_home(tmp_path / "home")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            alive = _started_run(instance, {"host": "127.0.0.1", "port": free_port()}, worker.pid)
            assert _monitor(instance, alive.run_id) == DagsterRunStatus.STARTED
            # a server on another address (127.0.0.2 stands for another host) that does not answer: its worker
            # cannot be seen, so it is not failed
            remote = _started_run(instance, {"host": "127.0.0.2", "port": free_port()}, None)
            assert look_at_worker(instance, remote).answer is ServerAnswer.NO_ANSWER
            assert _monitor(instance, remote.run_id) == DagsterRunStatus.STARTED
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.slow
def test_a_code_server_that_answers_but_does_not_run_the_run_is_judged_by_the_workers_process(tmp_path):
    """A real code server (`dagster api grpc`) that answers and does not run the run (restarted since, or a proxy
    answering for the server it reloaded to): the run's worker process decides, and without one it stays."""
    home = prepare_dagster_home(tmp_path / "home")
    module = tmp_path / "nothing.py"
    module.write_text("from dagster import Definitions\ndefs = Definitions()\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dagster", "api", "grpc", "--python-file", str(module),
                               "--host", "127.0.0.1", "--port", str(port)],
                              env={**os.environ, "DAGSTER_HOME": str(home)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            gone = _started_run(instance, {"host": "127.0.0.1", "port": port}, _exited_process())
            unseen = _started_run(instance, {"host": "127.0.0.1", "port": port}, None)
            wait_until(lambda: server.poll() is not None
                       or look_at_worker(instance, gone).answer is not ServerAnswer.NO_ANSWER, 120,
                       "the code server answering", 1)
            assert look_at_worker(instance, gone).answer is ServerAnswer.DOES_NOT_RUN_IT
            assert _monitor(instance, gone.run_id) == DagsterRunStatus.FAILURE
            assert _monitor(instance, unseen.run_id) == DagsterRunStatus.STARTED
    finally:
        server.kill()
        server.wait()


def test_the_demos_stop_cancels_the_runs_whose_worker_it_ended_and_no_other(tmp_path):
    home = prepare_dagster_home(tmp_path / "home")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            ended = _started_run(instance, {"host": "localhost", "port": free_port()}, _exited_process())
            alive = _started_run(instance, {"host": "localhost", "port": free_port()}, worker.pid)
            waiting = create_run_for_test(instance, job_name=WINDOW_JOB, status=DagsterRunStatus.NOT_STARTED)
        lines = cancel_runs_the_stop_ended(Path(home))
        assert lines == [f"run {ended.run_id} of window 2026-12-03-09:10 canceled: the stop ended its worker "
                         f"before it could end the run"]
        with DagsterInstance.from_config(str(home)) as instance:
            status = {run_id: instance.get_run_by_id(run_id).status  # type: ignore[union-attr]
                      for run_id in (ended.run_id, alive.run_id, waiting.run_id)}
        assert status == {ended.run_id: DagsterRunStatus.CANCELED, alive.run_id: DagsterRunStatus.STARTED,
                          waiting.run_id: DagsterRunStatus.NOT_STARTED}
    finally:
        worker.kill()
        worker.wait()
