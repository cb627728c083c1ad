"""The demo's stop of `dagster dev` is bounded: Ctrl-C to its process group, then what is left is killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kcl_pipeline.deployment.fleet_hosting import EXIT_GRACE_SECONDS, STOP_SECONDS
from kcl_pipeline.local.demo import dagster_stop_seconds, stop_process_group

# A leader that ignores Ctrl-C and a child of its group that does too (a daemon stuck in its shutdown, a code
# server's worker): each prints its pid, then sleeps.
STUCK = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(600)"], stdout=sys.stdout)
time.sleep(600)
"""
# A leader that stops on Ctrl-C. Its handler is installed outright: Python leaves SIGINT ignored in a process started
# with it ignored (a CI lane run in the background by a non-interactive shell), as `dagster dev` never is
# (demo.py restores the default in the child).
POLITE = ("import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
          "try:\n    print('ready', flush=True); time.sleep(600)\nexcept KeyboardInterrupt:\n    pass\n")


def _group(script: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_dagster_dev_that_ignores_ctrl_c_is_killed_with_its_whole_group_after_the_grace():
    proc = _group(STUCK)
    try:
        stop_process_group(proc, grace=0.5)
        assert proc.returncode == -signal.SIGKILL
        for _ in range(50):  # the child, killed with the group, is reaped by init
            if not _group_alive(proc.pid):
                break
            time.sleep(0.1)
        assert not _group_alive(proc.pid)
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_dagster_dev_that_stops_on_ctrl_c_is_not_killed():
    proc = _group(POLITE)
    stop_process_group(proc, grace=30.0)
    assert proc.returncode == 0


def test_the_demo_gives_dagster_dev_its_code_servers_bound_and_a_few_seconds_more():
    assert STOP_SECONDS + EXIT_GRACE_SECONDS < dagster_stop_seconds() <= STOP_SECONDS + EXIT_GRACE_SECONDS + 10
