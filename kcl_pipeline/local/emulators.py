"""The embedded AWS emulators: Kinesis, DynamoDB, S3 and CloudWatch over HTTP on 127.0.0.1.

One entry point for the README command, the CLI (`kcl-pipeline local up`) and the tests:

- Kinesis: kinesis-local (npm, the Scala.js build of kinesis-mock) — AWS-like sequence numbers, resharding
  with ChildShards, ListShards paging. Run through `node -r loopback.js` because it always binds 0.0.0.0.
- DynamoDB: dynalite (npm), in memory — the strictest about expressions.
- S3 and CloudWatch: one moto server, as a separate process (never in-process). The same server also
  answers DynamoDB, which the tests use as a second opinion on the lease table.

With `data_dir`, Kinesis and DynamoDB keep their state across a restart (the demo and `local up`): dynalite in a
LevelDB directory (each write on disk when it is answered), kinesis-local in one JSON file it rewrites whole every
`KINESIS_PERSIST_SECONDS` (not on exit) and loads when it starts; `stop` waits for a write finished after it was
asked, so what a stopped stack acknowledged is on disk. The file grows with every record (kinesis-local trims
nothing), and its rewrite and load cost CPU in proportion: the interval trades that against a stop's wait, and a
start allows the load time in proportion to the file (`KINESIS_LOAD_SECONDS_PER_MB`). moto keeps nothing (its S3
and CloudWatch are in memory): the demo's zones are directories, not moto buckets.

Every emulator is a child process in its own session, logs to a file under `log_dir`, is bound to
127.0.0.1 on a free port, is ready only once it has answered a real API call, and exits by itself when the
Python process that started it is gone.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import boto3
from botocore.config import Config

from kcl_pipeline.kcl.aws_settings import AwsSettings

from . import prerequisites
from .prerequisites import NODE_MODULES_ENV, NODE_PACKAGES  # the npm packages, pinned in local/npm/

SERVICES: tuple[str, ...] = ("kinesis", "dynamodb", "s3", "cloudwatch")
PARENT_PID_ENV = "KCL_PIPELINE_PARENT_PID"
LOOPBACK = "127.0.0.1"
DEFAULT_REGION = "us-east-1"

_LOOPBACK_JS = Path(__file__).with_name("loopback.js")
# kinesis-local's clock of the day follows the wall clock across a suspend (see the file).
_WALL_CLOCK_JS = Path(__file__).with_name("wall_clock.js")
# kinesis-local state transitions; "0ms" makes stream creation and resharding immediate.
_KINESIS_DURATIONS = (
    "CREATE_STREAM_DURATION", "DELETE_STREAM_DURATION", "SPLIT_SHARD_DURATION", "MERGE_SHARDS_DURATION",
    "UPDATE_SHARD_COUNT_DURATION", "UPDATE_STREAM_MODE_DURATION", "REGISTER_STREAM_CONSUMER_DURATION",
    "DEREGISTER_STREAM_CONSUMER_DURATION", "START_STREAM_ENCRYPTION_DURATION", "STOP_STREAM_ENCRYPTION_DURATION",
)
_PORT_IN_USE_MARKERS = ("EADDRINUSE", "Address already in use")
# Where a persistent stack's emulators keep their state, under its `data_dir`.
KINESIS_DATA = "kinesis"  # kinesis-local's directory: KINESIS_DATA_FILE in it
KINESIS_DATA_FILE = "kinesis-data.json"
DYNAMODB_DATA = "dynamodb"  # dynalite's LevelDB directory
# kinesis-local rewrites its whole state this often (and not on exit); a stop waits for the next write. Measured
# on 10,000 records (4.2 MB): each rewrite about 0.15 s of CPU, so every second would cost a sixth of a core.
KINESIS_PERSIST_SECONDS = 5
# Loading the kept state: 49 s for 4.2 MB on a two-core host at load 20; a start allows this much per MB on top.
KINESIS_LOAD_SECONDS_PER_MB = 15.0


class EmulatorError(RuntimeError):
    """An emulator could not be found, started or reached."""


class NodeModulesMissing(EmulatorError):
    """The npm emulators are not installed."""


@dataclass(frozen=True)
class Endpoints:
    """Where the running emulators answer (None: that service was not started)."""

    kinesis: str | None
    dynamodb: str | None
    s3: str | None
    cloudwatch: str | None
    region: str = DEFAULT_REGION
    # The moto server behind s3/cloudwatch; it answers DynamoDB too (a second opinion for tests).
    moto: str | None = None

    def endpoint_urls(self) -> dict[str, str]:
        urls = {"kinesis": self.kinesis, "dynamodb": self.dynamodb, "s3": self.s3, "cloudwatch": self.cloudwatch}
        return {service: url for service, url in urls.items() if url}

    def aws_settings(self) -> AwsSettings:
        return AwsSettings(region=self.region, endpoint_urls=self.endpoint_urls())

    def env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment variables pointing the AWS SDKs (and kcl/shells/aws.py) at these emulators; dummy credentials
        when `environ` (default: this process's environment) has none."""
        environ = os.environ if environ is None else environ
        env = {f"AWS_ENDPOINT_URL_{service.upper()}": url for service, url in self.endpoint_urls().items()}
        env["AWS_REGION"] = self.region
        env["AWS_DEFAULT_REGION"] = self.region
        # The emulators accept any credentials, but the SDKs refuse to sign without some.
        if not environ.get("AWS_ACCESS_KEY_ID"):
            env["AWS_ACCESS_KEY_ID"] = "test"
            env["AWS_SECRET_ACCESS_KEY"] = "test"
        return env

    def export_lines(self) -> list[str]:
        return [f"export {name}={value}" for name, value in self.env().items()]


def find_node_modules(start: Path | None = None, *, install: bool = True) -> Path:
    """The node_modules holding kinesis-local and dynalite.

    KCL_PIPELINE_NODE_MODULES wins; then a checkout's node_modules beside the kcl_pipeline package; then the
    user cache, where the packaged manifest is `npm ci`-installed on first use (unless install=False).
    """
    override = os.environ.get(NODE_MODULES_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        missing = [p for p in NODE_PACKAGES if not (path / p / "package.json").is_file()]
        if missing:
            raise NodeModulesMissing(
                f"{NODE_MODULES_ENV}={override} does not hold {', '.join(missing)}: unset it (the emulators "
                f"install into the user cache on first use) or point it at a node_modules holding them")
        return path
    found = prerequisites.checkout_node_modules(start)
    if found is not None:
        return found
    cached = prerequisites.cached_node_modules()
    if prerequisites.has_packages(cached):
        return cached
    if not install:
        raise NodeModulesMissing(f"the local emulators are not installed in {cached}")
    problems = prerequisites.check(prerequisites.Needs(node=True))
    if problems:
        raise NodeModulesMissing("; ".join(problems))
    try:
        return prerequisites.install_into_cache()
    except prerequisites.PrerequisiteMissing as exc:
        raise NodeModulesMissing(str(exc)) from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


@dataclass
class _Child:
    name: str  # "kinesis", "dynamodb" or "moto"
    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(self.command)}\n".encode())
            log.flush()
            # Own session: a terminal's Ctrl-C reaches only us, and we stop the children in order.
            self.popen = subprocess.Popen(
                self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _probe_client(service: str, url: str, region: str):
    session = boto3.session.Session(aws_access_key_id="test", aws_secret_access_key="test", region_name=region)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=1, read_timeout=2)
    return session.client(service, endpoint_url=url, config=config)


# A real API call per service: listening is not enough (node and moto accept connections before serving).
_PROBES: dict[str, Callable] = {
    "kinesis": lambda c: c.list_streams(Limit=1),
    "dynamodb": lambda c: c.list_tables(Limit=1),
    "s3": lambda c: c.list_buckets(),
    "cloudwatch": lambda c: c.list_metrics(Namespace="kcl_pipeline/probe"),
}


class EmulatorStack:
    """Starts and stops the local emulators. Use as a context manager or call start() / stop()."""

    def __init__(
        self,
        log_dir: str | os.PathLike,
        *,
        services: Iterable[str] = SERVICES,
        fast_resharding: bool = True,
        region: str = DEFAULT_REGION,
        ports: Mapping[str, int] | None = None,
        kinesis_log_level: str = "WARN",
        shard_limit: int = 1000,
        startup_timeout: float = 60.0,
        stop_grace: float = 2.0,
        data_dir: str | os.PathLike | None = None,
    ) -> None:
        self.services = tuple(dict.fromkeys(services))
        unknown = [s for s in self.services if s not in SERVICES]
        if unknown:
            raise ValueError(f"unknown emulator services {unknown}; known: {', '.join(SERVICES)}")
        if not self.services:
            raise ValueError("no emulator services requested")
        self.log_dir = Path(log_dir)
        self.fast_resharding = fast_resharding
        self.region = region
        self.ports = dict(ports or {})  # "kinesis" / "dynamodb" / "moto" → fixed port (else a free one)
        self.kinesis_log_level = kinesis_log_level
        self.shard_limit = shard_limit
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        # None: every emulator in memory (the tests); else Kinesis and DynamoDB keep their state in it.
        self.data_dir = None if data_dir is None else Path(data_dir).resolve()
        self._children: list[_Child] = []
        self.endpoints: Endpoints | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> Endpoints:
        if self.endpoints is not None:
            return self.endpoints
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.data_dir is not None:
            for name in (KINESIS_DATA, DYNAMODB_DATA):
                (self.data_dir / name).mkdir(parents=True, exist_ok=True)
        needs_node = "kinesis" in self.services or "dynamodb" in self.services
        node_modules = find_node_modules() if needs_node else None
        node = shutil.which("node") if needs_node else None
        if needs_node and not node:
            raise EmulatorError("node (>= 20) is not on PATH; it runs the Kinesis and DynamoDB emulators")
        children = []
        if "kinesis" in self.services:
            children.append(self._kinesis_child(node, node_modules))
        if "dynamodb" in self.services:
            children.append(self._dynalite_child(node, node_modules))
        if "s3" in self.services or "cloudwatch" in self.services:
            children.append(self._moto_child())
        self._children = children
        try:
            for child in children:
                child.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        by_name = {c.name: c.url for c in children}
        moto = by_name.get("moto")
        self.endpoints = Endpoints(
            kinesis=by_name.get("kinesis"),
            dynamodb=by_name.get("dynamodb"),
            s3=moto if "s3" in self.services else None,
            cloudwatch=moto if "cloudwatch" in self.services else None,
            region=self.region,
            moto=moto,
        )
        return self.endpoints

    def stop(self) -> None:
        """SIGTERM every emulator, SIGKILL what is left after a short grace, reap them all."""
        running = [c for c in self._children if c.popen is not None and c.popen.poll() is None]
        if self.data_dir is not None and any(c.name == "kinesis" for c in running):
            self._wait_kinesis_written()
        for child in running:
            _signal_group(child.popen, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        for child in running:
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in running:
            # Each child leads its own session: kill the group so nothing it spawned survives.
            _signal_group(child.popen, signal.SIGKILL)
            child.popen.wait()
        self.endpoints = None

    def _wait_kinesis_written(self) -> None:
        """Until kinesis-local finished writing its state after now (it writes on a timer only: what it acknowledged
        last is on disk after the next write), at most two intervals. A write begun before the last acknowledged call
        and ended after now would miss that call: the window is one write's duration (milliseconds for a demo's
        stream), and the demo stops its producer seconds before its emulators."""
        assert self.data_dir is not None
        state = self.data_dir / KINESIS_DATA / KINESIS_DATA_FILE
        asked = time.time()
        deadline = time.monotonic() + 2 * KINESIS_PERSIST_SECONDS + 1
        while time.monotonic() < deadline:
            try:
                if state.stat().st_mtime > asked:
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.1)

    def _kinesis_load_seconds(self) -> float:
        """The extra time a start allows kinesis-local to load its kept state."""
        if self.data_dir is None:
            return 0.0
        try:
            size = (self.data_dir / KINESIS_DATA / KINESIS_DATA_FILE).stat().st_size
        except FileNotFoundError:
            return 0.0
        return KINESIS_LOAD_SECONDS_PER_MB * size / 1e6

    def pids(self) -> dict[str, int]:
        return {c.name: c.popen.pid for c in self._children if c.popen is not None}

    def exited(self) -> dict[str, int]:
        """Emulators that have exited, with their exit codes."""
        return {c.name: c.popen.returncode for c in self._children
                if c.popen is not None and c.popen.poll() is not None}

    def log_paths(self) -> dict[str, Path]:
        return {c.name: c.log_path for c in self._children}

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the children ----------------------------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[PARENT_PID_ENV] = str(os.getpid())
        env["AWS_REGION"] = self.region
        env["AWS_DEFAULT_REGION"] = self.region
        return env

    def _port(self, name: str) -> int:
        return self.ports.get(name) or free_port()

    def _kinesis_child(self, node: str, node_modules: Path) -> _Child:
        package = node_modules / "kinesis-local"
        port = self._port("kinesis")
        env = self._base_env()
        env.update({
            "KINESIS_MOCK_PLAIN_PORT": str(port),
            "KINESIS_MOCK_TLS_PORT": str(free_port()),  # unused (HTTP only), but it always opens one
            "KINESIS_MOCK_CERT_PATH": str(package / "server.json"),  # or it crashes outside its directory
            "SHARD_LIMIT": str(self.shard_limit),  # account-wide and closed shards count: 50 is too few
            "LOG_LEVEL": self.kinesis_log_level,
        })
        if self.fast_resharding:
            env.update({name: "0ms" for name in _KINESIS_DURATIONS})
        if self.data_dir is not None:
            env.update({
                "SHOULD_PERSIST_DATA": "true",
                "LOAD_DATA_IF_EXISTS": "true",
                "PERSIST_PATH": str(self.data_dir / KINESIS_DATA),
                "PERSIST_FILE_NAME": KINESIS_DATA_FILE,
                "PERSIST_INTERVAL": f"{KINESIS_PERSIST_SECONDS}s",
            })
        command = [node, "-r", str(_LOOPBACK_JS), "-r", str(_WALL_CLOCK_JS), str(package / "main.js")]
        return _Child("kinesis", command, env, self.log_dir / "kinesis-local.log", port)

    def _dynalite_child(self, node: str, node_modules: Path) -> _Child:
        port = self._port("dynamodb")
        command = [node, "-r", str(_LOOPBACK_JS), str(node_modules / "dynalite" / "cli.js"),
                   "--host", LOOPBACK, "--port", str(port)]
        if self.fast_resharding:
            command += ["--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]
        if self.data_dir is not None:
            command += ["--path", str(self.data_dir / DYNAMODB_DATA)]
        return _Child("dynamodb", command, self._base_env(), self.log_dir / "dynalite.log", port)

    def _moto_child(self) -> _Child:
        port = self._port("moto")
        command = [sys.executable, "-m", "kcl_pipeline.local.moto_process", "-H", LOOPBACK, "-p", str(port)]
        return _Child("moto", command, self._base_env(), self.log_dir / "moto.log", port)

    def _probes(self, child: _Child) -> list[str]:
        if child.name == "moto":
            return [s for s in ("s3", "cloudwatch") if s in self.services]
        return [child.name]

    def _wait_ready(self) -> None:
        pending = {(child.name, service): child for child in self._children for service in self._probes(child)}
        clients = {key: _probe_client(key[1], child.url, self.region) for key, child in pending.items()}
        restarts = 0
        timeout = self.startup_timeout + self._kinesis_load_seconds()
        deadline = time.monotonic() + timeout
        last_error: dict[tuple[str, str], str] = {}
        while pending:
            for key, child in list(pending.items()):
                if child.popen.poll() is not None:
                    # A free port can be taken between choosing and binding it: retry on a new one.
                    tail = child.log_tail()
                    if restarts < 3 and child.name not in self.ports and any(m in tail for m in _PORT_IN_USE_MARKERS):
                        restarts += 1
                        self._rebind(child)
                        clients.update({k: _probe_client(k[1], child.url, self.region)
                                        for k, c in pending.items() if c is child})
                        continue
                    raise EmulatorError(
                        f"the {child.name} emulator exited with code {child.popen.returncode} while starting "
                        f"(log {child.log_path}):\n{tail}"
                    )
                try:
                    _PROBES[key[1]](clients[key])
                except Exception as exc:  # not serving yet
                    last_error[key] = f"{type(exc).__name__}: {exc}"
                else:
                    del pending[key]
            if not pending:
                break
            if time.monotonic() > deadline:
                waiting = "; ".join(f"{svc} at {c.url} ({last_error.get((n, svc), 'no answer')}, log {c.log_path})"
                                    for (n, svc), c in pending.items())
                raise EmulatorError(f"emulators not ready after {timeout:.0f}s: {waiting}")
            time.sleep(0.1)

    def _rebind(self, child: _Child) -> None:
        new_port = free_port()
        child.command = [str(new_port) if part == str(child.port) else part for part in child.command]
        if child.name == "kinesis":
            child.env["KINESIS_MOCK_PLAIN_PORT"] = str(new_port)
            child.env["KINESIS_MOCK_TLS_PORT"] = str(free_port())
        child.port = new_port
        child.start()


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group is gone and its id reused: fall back to the process itself
        try:
            popen.send_signal(sig)
        except ProcessLookupError:
            pass


DEFAULT_LOG_DIR = Path(".kcl_local") / "logs"


def run_stack_foreground(
    log_dir: str | os.PathLike = DEFAULT_LOG_DIR,
    *,
    services: Iterable[str] = SERVICES,
    fast_resharding: bool = True,
    region: str = DEFAULT_REGION,
    ports: Mapping[str, int] | None = None,
    env_file: str | os.PathLike | None = None,
    out=None,
) -> int:
    """Start the emulators, print their endpoints and `export` lines, run until Ctrl-C / SIGTERM, stop.

    `env_file` (optional) receives the export lines, for `source` in another shell. Returns an exit code.
    """
    out = out or sys.stdout
    stopping = {"signal": None}

    def _on_signal(signum, _frame):
        stopping["signal"] = signum

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = EmulatorStack(log_dir, services=services, fast_resharding=fast_resharding, region=region, ports=ports)
    try:
        endpoints = stack.start()
        for service, url in endpoints.endpoint_urls().items():
            print(f"{service:<11} {url}", file=out)
        print(f"logs        {Path(log_dir).resolve()}", file=out)
        print("", file=out)
        for line in endpoints.export_lines():
            print(line, file=out)
        if env_file:
            Path(env_file).write_text("\n".join(endpoints.export_lines()) + "\n")
            print(f"# written to {env_file}", file=out)
        print("# Ctrl-C stops the emulators", file=out, flush=True)
        while stopping["signal"] is None:
            exited = stack.exited()
            if exited:
                for name, code in exited.items():
                    print(f"the {name} emulator exited with code {code}; log {stack.log_paths()[name]}",
                          file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
