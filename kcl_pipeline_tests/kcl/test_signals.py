"""SIGTERM/SIGINT become a stop request without ever deadlocking the main thread (kcl/signals.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

# The main thread holds the stop event's lock when the signal lands, as it does inside Event.wait() between
# taking the lock and waiting: a handler that calls stop.set() there deadlocks for ever (a lease worker that
# never stopped after SIGTERM, its lease left owned).
SIGNAL_INSIDE_EVENT_WAIT = textwrap.dedent("""
    import os, signal, threading, time
    from kcl_pipeline.kcl.shells.signals import stop_on_signals
    stop = threading.Event()
    stop_on_signals(stop, lambda name: print("said", name, flush=True))
    with stop._cond:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(0.3)  # the handler runs in this thread, while it holds the lock
    print("stopped" if stop.wait(10) else "not stopped", flush=True)
""")


def _run(sig: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SIGNAL_INSIDE_EVENT_WAIT.format(sig=sig)], capture_output=True,
                          text=True, timeout=60)


def test_a_stop_signal_landing_inside_event_wait_stops_instead_of_deadlocking():
    for sig in ("SIGTERM", "SIGINT"):
        result = _run(sig)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [f"said {sig}", "stopped"]


def test_the_worker_and_the_consumer_stop_through_the_pipe_not_inside_a_handler():
    import inspect

    from kcl_pipeline.kcl.shells.fleet import consumer
    from kcl_pipeline.kcl.shells.workers import worker

    for module in (worker, consumer):
        source = inspect.getsource(module)
        assert "stop_on_signals(" in source and "signal.signal(" not in source, module.__name__
