"""stop_cancels_run on a real (ephemeral) Dagster instance: a stop inside an asset's step ends the run CANCELED.

The transform asset's own test (test_assets.py) sends the stop during a real Spark transform; these cover the
handlers a step meets: Dagster's, and one installed inside the block as SparkContext installs its own."""
from __future__ import annotations

import os
import signal

from dagster import DagsterInstance, DagsterRunStatus, job, op

from kcl_pipeline.defs.kinesis.stopping import stop_cancels_run


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
