"""The demo's warm Spark Connect server when it cannot serve: it never starts, never listens, or exits while the
demo runs. Each is one line and the demo goes on cold; none is a failed start. (The real server, transforming a
window, is in kcl_pipeline_tests/transform/test_cluster.py; local up starting and stopping it in test_local_up.py.)

A stand-in server here is a real process on loopback (a Python one-liner listening on the port): starting a JVM
adds nothing to what these tests hold."""
from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from kcl_pipeline.local import demo, spark_connect
from kcl_pipeline.local.demo import DemoOptions, Started, run_local_up
from kcl_pipeline.local.spark_connect import SparkConnectError, SparkConnectServer
from kcl_pipeline.transform.connect import probe
from kcl_pipeline_tests.kcl.fleet_support import wait_until
from kcl_pipeline_tests.process_tree import alive

LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(8); "
          "time.sleep(600)")


class StandIn(SparkConnectServer):
    """The demo's server class with another command: `listen` listens on the port, `exit` exits with code 3."""

    behaviour = "listen"

    def environment(self) -> dict[str, str]:
        return dict(os.environ)  # no SPARK_HOME: these run where pyspark is not installed too

    def command(self) -> list[str]:
        if self.behaviour == "exit":
            return [sys.executable, "-c", "import sys; print('no Java here'); sys.exit(3)"]
        return [sys.executable, "-c", LISTEN, str(self.port)]


def test_a_server_that_exits_while_starting_is_one_line_and_the_demo_goes_on_cold(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(StandIn, "behaviour", "exit")
    monkeypatch.setattr(demo, "SparkConnectServer", StandIn)
    monkeypatch.setattr(demo, "unavailable", lambda: None)
    server = demo._start_spark_connect(DemoOptions(state_dir=tmp_path), tmp_path, {})
    assert server is not None
    assert demo._spark_connect_ready(server, threading.Event()) is None
    out = capsys.readouterr().out
    assert out == (f"spark       a cold local session per run: the Spark Connect server exited with code 3 while "
                   f"starting (log {tmp_path / 'spark-connect.log'})\n")
    assert "no Java here" in (tmp_path / "spark-connect.log").read_text()  # its output is kept in its log


def test_a_server_that_does_not_listen_in_time_is_stopped(tmp_path):
    server = StandIn(tmp_path)
    server.command = lambda: [sys.executable, "-c", "import time; time.sleep(600)"]  # never listens
    server.start()
    try:
        with pytest.raises(SparkConnectError, match=f"did not listen on {server.url} within 1 s"):
            server.wait_ready(timeout=1)
    finally:
        server.stop()
    assert server.exited() == -signal.SIGTERM


def test_without_java_the_demo_starts_no_server_and_says_why(tmp_path, capsys, monkeypatch):
    pytest.importorskip("grpc", reason="without the [connect] client the line names that instead")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert demo._start_spark_connect(DemoOptions(state_dir=tmp_path), tmp_path, {}) is None
    out = capsys.readouterr().out
    assert out.startswith("spark       a cold local session per run: java is not on PATH")
    assert not (tmp_path / spark_connect.LOG_FILE).exists()


def test_cold_spark_starts_no_server(tmp_path, capsys):
    assert demo._start_spark_connect(DemoOptions(state_dir=tmp_path, warm_spark=False), tmp_path, {}) is None
    assert capsys.readouterr().out == "spark       a cold local session per run (--cold-spark)\n"


def test_a_server_that_exits_while_local_up_runs_is_reported_once_and_local_up_goes_on(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.setattr(demo, "SparkConnectServer", StandIn)
    monkeypatch.setattr(demo, "unavailable", lambda: None)
    started: list[Started] = []
    stop = threading.Event()
    result: dict[str, object] = {}
    options = DemoOptions(state_dir=tmp_path / "state", stream="warm-dies", shards=1, producer=False)
    thread = threading.Thread(target=lambda: result.update(code=run_local_up(options, ready=started.append,
                                                                              stop=stop)))
    thread.start()
    try:
        wait_until(lambda: started or result, 120, "local up")
        (up,) = started
        assert up.spark_connect_pid is not None
        (url,) = [line.split("=", 1)[1] for line in up.env_file.read_text().splitlines()
                  if line.startswith("export KCL_PIPELINE_SPARK_MASTER=")]
        assert probe(url) is None  # env.sh points at the server
        os.kill(up.spark_connect_pid, signal.SIGKILL)
        wait_until(lambda: "the Spark Connect server exited" in capsys.readouterr().err or None, 30,
                   "the line saying the server exited")
        assert thread.is_alive() and not result  # not fatal: later runs fall back
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 0}
    assert "the Spark Connect server exited" not in capsys.readouterr().err  # said once


PARENT = """
import sys, time
from pathlib import Path
from kcl_pipeline_tests.local.test_spark_connect_server import StandIn
server = StandIn(Path(sys.argv[1]))
server.start()
print(server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_killed_demo_leaves_no_server_behind(tmp_path):
    """`kill -9` of the demo or `local up`: the server is not their child any more, and must not run on for ever."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        server_pid = int(parent.stdout.readline())
        assert alive(server_pid)
        parent.kill()
        parent.wait()
        wait_until(lambda: not alive(server_pid), 30, "the orphaned server to exit")
    finally:
        parent.kill()
        parent.wait()
        if alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
