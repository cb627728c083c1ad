"""A stop (SIGINT, SIGTERM: Ctrl-C on the demo or `dagster dev`) during a run ends it CANCELED, not failed, on a real
Dagster instance: `stop_cancels_run` in a step, and the pipeline's executor wherever the interrupt comes in.

The transform asset's own test (test_assets.py) sends the stop during a real Spark transform. Here: Dagster's
handlers as a step meets them, one installed inside the step as SparkContext installs its own, and a stop while
the run makes its resources (before any step: `execute_job` runs the job with its own executor, as a run worker
does; `execute_in_process` would put Dagster's plain in-process executor in its place)."""
from __future__ import annotations

import os
import signal

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    execute_job,
    job,
    op,
    reconstructable,
    resource,
)

from kcl_pipeline.defs.kinesis.definitions import build_definitions
from kcl_pipeline.defs.kinesis.stopping import stop_cancels_run, stop_cancels_run_executor
from kcl_pipeline.deployment.settings import PipelineSettings


def _run_status(body) -> DagsterRunStatus:
    @op
    def step(context):
        with stop_cancels_run(context):
            body()

    @job
    def stopped():
        step()

    with DagsterInstance.ephemeral() as instance:
        result = stopped.execute_in_process(instance=instance, raise_on_error=False)
        return instance.get_run_by_id(result.run_id).status


def test_a_stop_in_a_step_cancels_its_run():
    before = signal.getsignal(signal.SIGINT)
    assert _run_status(lambda: os.kill(os.getpid(), signal.SIGINT)) == DagsterRunStatus.CANCELED
    assert signal.getsignal(signal.SIGINT) is before


def test_a_sigterm_in_a_step_cancels_its_run():
    assert _run_status(lambda: os.kill(os.getpid(), signal.SIGTERM)) == DagsterRunStatus.CANCELED


def test_a_stop_met_by_the_spark_contexts_handler_still_cancels_the_run():
    """A run's first Spark session is made inside the step: SparkContext replaces the SIGINT handler with one that
    cancels the Spark jobs and raises KeyboardInterrupt, so the stop never reaches stop_cancels_run's handler."""
    def spark_like(_signum, _frame):
        raise KeyboardInterrupt()

    def body():
        signal.signal(signal.SIGINT, spark_like)
        os.kill(os.getpid(), signal.SIGINT)

    assert _run_status(body) == DagsterRunStatus.CANCELED


def test_a_step_that_fails_without_a_stop_still_fails_its_run():
    def body():
        raise ValueError("a real failure")

    assert _run_status(body) == DagsterRunStatus.FAILURE


# -- the executor: a stop outside any step's body ----------------------------------------------------------------

@resource
def stopped_while_made(_init_context):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the run worker makes its resources (a SparkSession, a client)
    return "made"


@op(required_resource_keys={"made"})
def unguarded_step(context) -> None:
    context.log.info("the step ran")


@job(executor_def=stop_cancels_run_executor, resource_defs={"made": stopped_while_made})
def stopped_before_its_step():
    unguarded_step()


@op
def step_stopped_outside_the_guard() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@job(executor_def=stop_cancels_run_executor)
def stopped_in_an_unguarded_step():
    step_stopped_outside_the_guard()


def _executed_status(made) -> DagsterRunStatus:
    with DagsterInstance.ephemeral() as instance:
        result = execute_job(reconstructable(made), instance=instance)
        return instance.get_run_by_id(result.run_id).status


def test_a_stop_while_the_run_makes_its_resources_cancels_it():
    """Before: a stop before the first step's body (the run worker loading the code, making its resources) failed
    the run: Dagster holds the interrupt and raises it as the step starts, outside any asset's body."""
    assert _executed_status(stopped_before_its_step) == DagsterRunStatus.CANCELED


def test_a_stop_in_any_step_of_the_pipelines_executor_cancels_the_run():
    assert _executed_status(stopped_in_an_unguarded_step) == DagsterRunStatus.CANCELED


def test_the_pipelines_jobs_run_on_the_executor_whose_runs_a_stop_cancels():
    settings = PipelineSettings.from_env({"KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
    definitions = build_definitions(settings)
    assert definitions.executor is stop_cancels_run_executor
