"""A long-lived Spark Connect server on 127.0.0.1 for the demo and `local up`: every window run attaches to its
warm JVM instead of starting a driver of its own.

pyspark's own `spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer` (what
`sbin/start-connect-server.sh` runs, in the foreground here so that it is a child stopped by its PID), with
gRPC, the driver and the block manager bound to loopback and the web UI off. Its Python workers run this
interpreter with this package importable: the transform's data sources and decoders run in them. No S3
settings: the transform's data sources carry the zone's endpoint and credentials in their options.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import prerequisites
from .emulators import LOOPBACK, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOG_FILE = "spark-connect.log"
FALLBACK_MASTER = "local[*]"  # what the demo's runs start when the server does not answer
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding kcl_pipeline/


class SparkConnectError(RuntimeError):
    """The Spark Connect server could not be found or started."""


def unavailable() -> str | None:
    """Why this host cannot run the warm path (None: it can): the server needs pyspark (its spark-submit and
    Connect jar) and Java 17, the runs need pyspark's Connect client (the [connect] extra)."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (the [dagster] extra)"
    if importlib.util.find_spec("grpc") is None or importlib.util.find_spec("pandas") is None:
        return "the Spark Connect client is not installed (the [connect] extra)"
    problems = prerequisites.check(prerequisites.Needs(node=False, java=True))
    return problems[0] if problems else None


class SparkConnectServer:
    """Start it, wait until it accepts connections, stop it (SIGTERM, then SIGKILL, to its process group)."""

    def __init__(self, log_dir: str | os.PathLike, *, port: int | None = None, master: str = "local[*]",
                 driver_memory: str = "1g", env: dict[str, str] | None = None) -> None:
        self.log_path = Path(log_dir) / LOG_FILE
        self.port = port or free_port()
        self.master = master
        self.driver_memory = driver_memory
        self.extra_env = dict(env or {})
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def command(self) -> list[str]:
        spark_submit = _spark_home() / "bin" / "spark-submit"
        conf = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.host": LOOPBACK,
            "spark.ui.enabled": "false",
            "spark.driver.memory": self.driver_memory,
            "spark.sql.session.timeZone": "UTC",
            "spark.log.level": "WARN",  # INFO logs a line per client request: the log would grow with every run
        }
        args = [str(spark_submit), "--class", SERVER_CLASS, "--master", self.master, "--name", "kcl-pipeline-connect"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return [*args, "spark-internal"]

    def environment(self) -> dict[str, str]:
        # A checkout is put on the workers' path; an installed package is already on its interpreter's (and a
        # site-packages on PYTHONPATH would come before the standard library).
        checkout = "" if _PACKAGE_ROOT.name in ("site-packages", "dist-packages") else str(_PACKAGE_ROOT)
        path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, **self.extra_env, "SPARK_HOME": str(_spark_home()), "SPARK_LOCAL_IP": LOOPBACK,
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": path}

    def start(self) -> None:
        """Starts the server in its own session (a terminal's Ctrl-C reaches only its parent); returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(command, env=self.environment(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_term_with_parent if sys.platform == "linux" else None)

    def wait_ready(self, timeout: float = 180.0, stop: threading.Event | None = None) -> None:
        """Until the server accepts a connection on its port; SparkConnectError if it exits, takes longer, or
        `stop` is set first."""
        if self.popen is None:
            raise SparkConnectError("the Spark Connect server was not started")
        deadline = time.monotonic() + timeout
        while True:
            if stop is not None and stop.is_set():
                raise SparkConnectError("stopped before the Spark Connect server listened")
            if self.popen.poll() is not None:
                raise SparkConnectError(f"the Spark Connect server exited with code {self.popen.returncode} while "
                                        f"starting (log {self.log_path})")
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=1.0):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SparkConnectError(f"the Spark Connect server did not listen on {self.url} within "
                                        f"{timeout:.0f} s (log {self.log_path})")
            time.sleep(0.5)

    def exited(self) -> int | None:
        """Its exit code once it has exited (None: running, or never started)."""
        return None if self.popen is None else self.popen.poll()

    def terminate(self) -> None:
        """SIGTERM its process group and return (stop() then waits): it shuts down while other things stop."""
        if self.popen is not None and self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM its process group (the JVM and its Python workers), SIGKILL what is left after `grace`."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.terminate()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.popen.pid, signal.SIGKILL)  # Python workers that outlived the JVM
        self.popen.wait()

    def __enter__(self) -> "SparkConnectServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _spark_home() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkConnectError("pyspark is not installed: the Spark Connect server is pyspark's own")
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-submit").is_file():
        raise SparkConnectError(f"pyspark at {home} has no bin/spark-submit")
    return home


def _term_with_parent() -> None:
    """In the child before exec (kept across spark-submit's execs into the JVM): SIGTERM when the thread that
    started it dies, so a killed demo or `local up` leaves no JVM behind, as the emulators leave no node."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
