"""A stop while a run runs cancels it instead of failing it.

Ctrl-C on `kcl-pipeline demo` or on `dagster dev` (and the demo's own stop, which signals `dagster dev`'s process
group) reaches the run worker too: it is in the same process group. Dagster's handler then interrupts the step,
and a run interrupted without a termination request is recorded as failed ("Execution was interrupted
unexpectedly"): every stop during a window's transform left a failed run on the Runs page. Both parts below
mark the run CANCELING first, as a termination request from the UI does, so that Dagster records it CANCELED;
the sensor requests a canceled window's run again (windows/followup.py), and the window is transformed by the
next start.

- `stop_cancels_run_executor`, the pipeline's executor (Dagster's in-process one): an interrupt leaving the run's
  steps, wherever it came in: while the run worker loaded the code or made the resources (Dagster holds it until
  the first step starts), in a step, between steps.
- `stop_cancels_run`, around each asset's body: notes the signal itself, so that a step which a stop ends with
  another error (the Spark driver's connection closed under it) is canceled too.

Only the signal handler runs when the signal arrives, and it does no I/O: it notes the stop and hands on to the
handler it replaced (Dagster's, which raises the interrupt); the run is marked as the interrupt leaves the step.
An interrupt leaving the step counts as a stop too: a handler installed inside the block replaces this one
(SparkContext's, made by the run's first Spark session, cancels the Spark jobs and raises KeyboardInterrupt).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from dagster import executor, in_process_executor
from dagster._core.errors import DagsterExecutionInterruptedError  # raised by Dagster's handler; not re-exported
from dagster._core.executor.in_process import InProcessExecutor  # not re-exported

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTS = (KeyboardInterrupt, DagsterExecutionInterruptedError)


@contextmanager
def stop_cancels_run(context: Any) -> Iterator[None]:
    """Run the block so that SIGINT/SIGTERM arriving in it end the run as CANCELED (see the module docstring).

    `context`: the step's execution context (its `instance` and `dagster_run`). Outside the main thread no
    handler can be installed: the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stopped: list[int] = []

    def on_stop(signum: int, frame: Any) -> None:
        stopped.append(signum)
        prior = previous.get(signum)
        if callable(prior):
            prior(signum, frame)  # Dagster's: raises its interrupt inside the step
        raise KeyboardInterrupt  # the default action, or a handler that only noted it: the step stops here

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    try:
        yield
    except BaseException as exc:
        if stopped or isinstance(exc, INTERRUPTS):
            _mark_canceling(context, stopped[0] if stopped else signal.SIGINT)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopCancelsRunExecutor(InProcessExecutor):
    """Dagster's in-process executor; an interrupt leaving the run's steps marks the run CANCELING on its way."""

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[Any]:
        try:
            yield from super().execute(plan_context, execution_plan)
        except INTERRUPTS:
            _mark_canceling(plan_context, signal.SIGINT)
            raise


@executor(name="in_process", config_schema=in_process_executor.config_schema)
def stop_cancels_run_executor(init_context: Any) -> StopCancelsRunExecutor:
    """The in-process executor (its configuration too) whose runs a stop cancels instead of failing."""
    made = in_process_executor.executor_creation_fn(init_context)  # type: ignore[misc]  # it is set
    return StopCancelsRunExecutor(made.retries, made.step_dependency_config, made.marker_to_close)


def _mark_canceling(context: Any, signum: int) -> None:
    run = context.instance.get_run_by_id(context.dagster_run.run_id) or context.dagster_run
    if run.is_finished or run.status.value == "CANCELING":
        return
    try:
        context.instance.report_run_canceling(
            run, message=f"{signal.Signals(signum).name} (a stop: Ctrl-C on the demo or `dagster dev`) during "
                         f"the run: the run is canceled, and the sensor requests its window again")
    except Exception as exc:  # noqa: BLE001 - the storage gone with the stop: the interrupt goes on as Dagster's
        context.log.warning(f"the stop could not mark the run canceling ({exc!r}); Dagster records it as failed")
