"""Dagster's default run launcher, with the health check run monitoring needs to end a run whose worker is gone.

dagster.yaml names it (`run_launcher: module: kcl_pipeline.instance.run_launcher`). It launches and terminates
runs exactly as Dagster's DefaultRunLauncher does (in a process of the code location's server); what it adds is
`check_run_worker_health`, so that the daemon's run monitoring fails a STARTED run whose worker is gone (run_worker.py
says how that is told) instead of leaving it STARTED for good with every later window run queued behind it. The
failed run is then retried by the daemon (`run_retries`), and its window transformed.
"""
from __future__ import annotations

import json
from typing import Any

from dagster import DagsterEventType, DagsterInstance, DefaultRunLauncher
from dagster._core.errors import DagsterUserCodeUnreachableError  # not re-exported
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus  # not re-exported
from dagster._core.storage.dagster_run import DagsterRun  # not re-exported
from dagster._core.storage.tags import GRPC_INFO_TAG  # not re-exported
from dagster._grpc.client import DagsterGrpcClient  # not re-exported
from dagster._grpc.types import CanCancelExecutionRequest, CanCancelExecutionResult  # not re-exported
from dagster._serdes import deserialize_value  # not re-exported

from .run_worker import (
    STARTED_PROCESS_PREFIX,
    ServerAnswer,
    WorkerSight,
    is_this_host,
    process_alive,
    worker_health,
)

# A code server that answers at all answers this question at once; one that does not is given this long.
SERVER_TIMEOUT_SECONDS = 10


class HealthCheckedRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose run workers run monitoring can check (the module docstring)."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        health = worker_health(look_at_worker(self._instance, run))
        if health.gone:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's worker is gone: {health.reason}")
        return CheckRunHealthResult(WorkerStatus.RUNNING, health.reason)


def look_at_worker(instance: DagsterInstance, run: DagsterRun) -> WorkerSight:
    """What can be seen of a run's worker: its code server's answer, and its process when it is on this host."""
    info = _grpc_info(run)
    if info is None:
        return WorkerSight("(none recorded)", ServerAnswer.NO_ANSWER, None, None)
    server = f"{info.get('host')}:{info['port']}" if info.get("port") else str(info.get("socket"))
    answer = _ask_server(run, info)
    started = None
    if answer is not ServerAnswer.RUNS_IT and is_this_host(info.get("host"), via_socket=bool(info.get("socket"))):
        started = run_worker_started(instance, run.run_id)
    if started is None:
        return WorkerSight(server, answer, None, None)
    pid, at = started
    return WorkerSight(server, answer, pid, process_alive(pid, at))


def run_worker_started(instance: DagsterInstance, run_id: str) -> tuple[int, float] | None:
    """(pid, when) of the run worker's "Started process for run (pid: N)" event; None when it has none."""
    for record in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        event = record.dagster_event
        if event is None or not (event.message or "").startswith(STARTED_PROCESS_PREFIX):
            continue
        pid: Any = event.engine_event_data.metadata.get("pid")
        try:
            return int(getattr(pid, "value", pid)), record.timestamp
        except (TypeError, ValueError):
            return None
    return None


def _grpc_info(run: DagsterRun) -> dict[str, Any] | None:
    raw = run.tags.get(GRPC_INFO_TAG)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _ask_server(run: DagsterRun, info: dict[str, Any]) -> ServerAnswer:
    client = DagsterGrpcClient(port=info.get("port"), socket=info.get("socket"), host=info.get("host") or "localhost",
                               use_ssl=bool(info.get("use_ssl", False)))
    try:
        result = deserialize_value(client.can_cancel_execution(CanCancelExecutionRequest(run_id=run.run_id),
                                                               timeout=SERVER_TIMEOUT_SECONDS),
                                   CanCancelExecutionResult)
    except DagsterUserCodeUnreachableError:
        return ServerAnswer.NO_ANSWER
    return ServerAnswer.RUNS_IT if result.can_cancel else ServerAnswer.DOES_NOT_RUN_IT
