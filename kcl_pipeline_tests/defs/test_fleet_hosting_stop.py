"""A stopping code server is bounded (deployment/fleet_hosting.py): its hosted workers release within STOP_SECONDS
or are killed, and the process exits STOP_SECONDS + EXIT_GRACE_SECONDS after it began to, even with a sensor tick
still waiting on an endpoint that is gone (botocore's retries take a minute or more)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from kcl_pipeline.deployment import fleet_hosting as hosting

REPO_ROOT = Path(__file__).resolve().parents[2]


class _Manager:
    def __init__(self, hang: float = 0.0) -> None:
        self.timeouts: list[float] = []
        self.hang = hang

    def shutdown(self, timeout: float = 30.0) -> list:
        self.timeouts.append(timeout)
        time.sleep(self.hang)
        return []


def test_a_stopping_code_server_gives_its_workers_the_stop_bound_and_forgets_them(monkeypatch):
    manager = _Manager()
    monkeypatch.setattr(hosting, "_REGISTRY", {("s", "a", "kinesis_consumer"): hosting.HostedConsumer(manager, "w#1")})
    exits: list[int] = []
    hosting.stop_hosted(stop_seconds=3.0, exit_grace_seconds=60.0, exit=exits.append)
    assert len(manager.timeouts) == 1 and 2.5 < manager.timeouts[0] <= 3.0
    assert hosting._REGISTRY == {} and exits == []


def test_a_code_server_held_past_the_bound_is_exited_saying_so(monkeypatch, caplog):
    monkeypatch.setattr(hosting, "_REGISTRY", {("s", "a", "kinesis_consumer"): hosting.HostedConsumer(_Manager(), "w")})
    codes: list[int] = []
    exited = threading.Event()
    hosting.stop_hosted(stop_seconds=0.2, exit_grace_seconds=0.2, exit=lambda code: (codes.append(code), exited.set()))
    assert exited.wait(5) and codes == [1]
    assert "exiting now; leases not released expire by themselves" in caplog.text


def test_a_process_that_hosts_nothing_any_more_exits_unbounded_by_it(monkeypatch):
    monkeypatch.setattr(hosting, "_REGISTRY", {})
    codes: list[int] = []
    hosting.stop_hosted(stop_seconds=0.1, exit_grace_seconds=0.1, exit=codes.append)
    time.sleep(0.5)
    assert codes == []


def test_a_code_server_whose_tick_waits_on_a_gone_endpoint_still_exits_within_the_bound():
    """Before the bound, the interpreter's exit waited for every non-daemon thread: a sensor tick in botocore's
    retries against stopped emulators held `dagster dev`'s code server past its Ctrl-C for a minute or more."""
    script = textwrap.dedent("""
        import threading, time
        from kcl_pipeline.deployment import fleet_hosting as hosting
        hosting.STOP_SECONDS, hosting.EXIT_GRACE_SECONDS = 0.5, 0.5
        threading.Thread(target=time.sleep, args=(120,), name="a-tick").start()  # not a daemon, as a tick's thread
        class Manager:
            def shutdown(self, timeout):
                return []
        with hosting._REGISTRY_LOCK:
            hosting._REGISTRY[("s", "a", "kinesis_consumer")] = hosting.HostedConsumer(Manager(), "w#1")
            hosting._stop_when_exiting()
        print("ready", flush=True)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.stdout.strip() == "ready", done.stderr
    assert took < 20, f"exited after {took:.0f}s"
