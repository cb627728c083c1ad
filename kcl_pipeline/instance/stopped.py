"""After a stop: the runs whose worker the stop ended are canceled, not left STARTED.

The demo stops `dagster dev` with a bound, then kills what is left of its process group: a run worker still
busy then (a transform that did not notice the Ctrl-C in time) dies with its code server, and nobody ends its
run. Run monitoring would fail it at the next start; but it was stopped on purpose, as a Ctrl-C during a run
cancels it (defs/kinesis/stopping.py): the stop cancels it too, and the sensor requests its window again.
"""
from __future__ import annotations

from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import PARTITION_NAME_TAG  # not re-exported

from .run_launcher import look_at_worker
from .run_worker import worker_health

IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def cancel_runs_the_stop_ended(home: Path) -> list[str]:
    """Cancel the in-flight runs of the Dagster home `home` whose worker is gone; one line for each."""
    lines = []
    with DagsterInstance.from_config(str(home)) as instance:
        for run in instance.get_runs(RunsFilter(statuses=IN_FLIGHT)):
            health = worker_health(look_at_worker(instance, run))
            if not health.gone:
                continue
            instance.report_run_canceled(run, message=(
                f"the stop ended the run's worker before it could end the run ({health.reason}): canceled; the "
                f"sensor requests its window again"))
            window = run.tags.get(PARTITION_NAME_TAG)
            lines.append(f"run {run.run_id}{f' of window {window}' if window else ''} canceled: the stop ended "
                         f"its worker before it could end the run")
    return lines
