"""The one-command demo: emulators on loopback, a demo stream with a KPL producer, and `dagster dev`.

Everything the demo makes outlives a run in its state directory, so a second start goes on where the first
stopped: the Dagster home (runs, the sensor's cursor, and the first partition it was made with:
deployment/home.py), the emulators' state (EMULATORS_DIR: the stream and its records, the lease table and its
checkpoints; local/emulators.py) and the zones (ZONES_DIR: directories, which outlive any process, where moto's
S3 would keep nothing). The windows a stopped run left unfinished complete with their data.
A start on a kept home whose other parts are gone says once what the previous run's windows lost
(`lost_state`). `kcl-pipeline local reset` deletes all of it to start afresh.

`kcl-pipeline local up` runs the same thing but `dagster dev`: it writes the demo's environment (one source,
`demo_vars`) into `<state dir>/env.sh`, so that a person who sources it runs `dagster dev` at the repository root
(its workspace.yaml) as the demo would.

Beside the emulators both start a Spark Connect server on loopback (local/spark_connect.py) and point the
transform at it (KCL_PIPELINE_SPARK_MASTER=sc://…), with a cold local session as the fallback of a run that
finds it gone (KCL_PIPELINE_SPARK_FALLBACK_MASTER): every window run attaches to one warm JVM. Without the
[connect] client, with `--cold-spark`, or when the server does not start, runs start their own session.

Everything it starts it stops (Ctrl-C / SIGTERM): the producer thread, `dagster dev` (its whole process
group: webserver, daemon, code server and the sensor's lease workers), the Spark Connect server (by its PID,
its process group), then the emulators; env.sh is removed.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

from ..kcl.shells.aws import client
from ..kcl.shells.shards import StreamNotFound, wait_stream_active
from ..kcl.shells.signals import stop_on_signals
from .emulators import EmulatorStack, Endpoints
from .producer import produce
from .spark_connect import FALLBACK_MASTER, SparkConnectError, SparkConnectServer, unavailable

log = logging.getLogger(__name__)
# The workspace file ships inside the package, so the demo runs from an installed wheel too (a byte-identical
# copy of the repository root's workspace.yaml, which `dagster dev` at the root reads).
WORKSPACE_YAML = Path(__file__).resolve().parents[1] / "deploy" / "workspace.yaml"
# Two code servers sharing the fleet: the pipeline location and a fleet-member location.
TWO_HOSTS_WORKSPACE_YAML = WORKSPACE_YAML.with_name("workspace-two-hosts.yaml")
ENV_FILE = "env.sh"  # in the state directory: the demo's environment, for `source`
# In the state directory, kept across runs (deleted by `kcl-pipeline local reset`):
HOME_DIR = "dagster_home"  # DAGSTER_HOME
EMULATORS_DIR = "emulators"  # the emulators' state: EmulatorStack's data_dir
ZONES_DIR = "zones"  # the landing zone and the transform's output, as directories
LANDING_DIR, OUTPUT_DIR = "landing", "output"  # in ZONES_DIR


@dataclass(frozen=True)
class DemoOptions:
    state_dir: Path = Path(".kcl_local")
    host: str = "127.0.0.1"
    port: int = 3000
    stream: str = "kcl-pipeline-demo"
    shards: int = 4
    rate: float = 40.0  # user records per second
    aggregate: int = 10  # KPL: user records per aggregate (every other batch is sent plain)
    poison_every: int = 97
    window_minutes: int = 2
    sensor_interval_seconds: int = 10
    producer: bool = True
    dagster_storage: str = "sqlite"  # or "postgres" (DAGSTER_POSTGRES_URL)
    code_servers: int = 1  # 2: a fleet-member location beside the pipeline's (workspace-two-hosts.yaml)
    warm_spark: bool = True  # a Spark Connect server every window run attaches to (False: a session per run)

    @property
    def workspace(self) -> Path:
        return TWO_HOSTS_WORKSPACE_YAML if self.code_servers == 2 else WORKSPACE_YAML


def demo_vars(endpoints: Endpoints, options: DemoOptions, dagster_home: Path,
              partitions_start: datetime | None = None, *, environ: Mapping[str, str] | None = None,
              spark_remote: str | None = None) -> dict[str, str]:
    """What the demo sets on top of the environment, the one source of `kcl-pipeline demo`'s `dagster dev` and
    of the env file `local up` writes: the emulators' endpoints (and dummy credentials when none are set),
    DAGSTER_HOME, the demo profile, its stream and timings, the sensor hosting the lease workers; the partitions
    start at `partitions_start` (the window the stream was created in: the UI shows only windows that can exist);
    `spark_remote`: the Spark Connect server the transform attaches to, a cold local session its fallback.
    `environ`: the environment these go on top of (default: this process's), which decides the credentials."""
    start = {} if partitions_start is None else {"KCL_PIPELINE_PARTITIONS_START": partitions_start.isoformat()}
    spark = {} if spark_remote is None else {"KCL_PIPELINE_SPARK_MASTER": spark_remote,
                                             "KCL_PIPELINE_SPARK_FALLBACK_MASTER": FALLBACK_MASTER}
    zones = options.state_dir.resolve() / ZONES_DIR
    return {
        **endpoints.env(environ),
        "DAGSTER_HOME": str(dagster_home),
        "KCL_PIPELINE_PROFILE": "demo",
        "KCL_PIPELINE_STREAM": options.stream,
        "KCL_PIPELINE_WINDOW_MINUTES": str(options.window_minutes),
        **start,
        **spark,
        # Directories in the state directory: what a run landed and transformed is there for the next start.
        "KCL_PIPELINE_LANDING_URI": str(zones / LANDING_DIR),
        "KCL_PIPELINE_OUTPUT_URI": str(zones / OUTPUT_DIR),
        "KCL_PIPELINE_SENSOR_INTERVAL_SECONDS": str(options.sensor_interval_seconds),
        # The demo profile implies it; said here so that the env file shows it.
        "KCL_PIPELINE_HOST_WORKERS": "true",
        # Short timings so the demo shows hand-overs quickly; still 3 heartbeats per expiry.
        "KCL_PIPELINE_HEARTBEAT_SECONDS": "3",
        "KCL_PIPELINE_LEASE_EXPIRY_SECONDS": "10",
        "PYTHONUNBUFFERED": "1",
    }


def demo_env(endpoints: Endpoints, options: DemoOptions, dagster_home: Path,
             partitions_start: datetime | None = None) -> dict[str, str]:
    """The environment `dagster dev` runs with: this process's, with `demo_vars` over it."""
    return {**os.environ, **demo_vars(endpoints, options, dagster_home, partitions_start)}


def env_file_lines(variables: dict[str, str]) -> list[str]:
    """`export NAME=value` lines for `source` (values quoted for the shell only when they need it)."""
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


def write_env_file(path: Path, variables: dict[str, str]) -> None:
    """Written whole or not at all (a reader polling for the file never sees half of it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("\n".join(env_file_lines(variables)) + "\n")
    os.replace(partial, path)


def stream_start_window(kinesis, stream: str, window_minutes: int) -> datetime:
    """The start of the window the stream was created in: where the demo's partitions start."""
    from ..deployment.settings import window_start

    created = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamCreationTimestamp"]
    return window_start(created, window_minutes)


def ensure_stream(kinesis, stream: str, shards: int) -> bool:
    """The stream, created with `shards` unless it exists (kept by the emulators' state). True: created now."""
    try:
        wait_stream_active(kinesis, stream, timeout=30)
        return False
    except StreamNotFound:
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
        wait_stream_active(kinesis, stream, timeout=60)
        return True


def _producer_loop(kinesis, options: DemoOptions, stop: threading.Event) -> None:
    """Produces forever at `rate`, alternating KPL-aggregated and plain batches, with some poison payloads."""
    next_id, plain = 0, False
    batch = max(1, int(options.rate * 5))
    while not stop.is_set():
        try:
            produce(kinesis, options.stream, count=batch, rate=options.rate,
                    aggregate=1 if plain else options.aggregate, payload=None, poison_every=options.poison_every,
                    create_shards=None, first_id=next_id)
            next_id += batch
            plain = not plain
        except Exception as exc:  # keep the demo alive; say why it paused
            log.warning("demo producer: %s; retrying in 5 s", exc)
            stop.wait(5)


def start_dagster(env: dict[str, str], options: DemoOptions, log_path: Path) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("dagster")), "dev", "-w", str(options.workspace),
           "-h", options.host, "-p", str(options.port)]
    if not Path(cmd[0]).exists():
        cmd = [sys.executable, "-m", "dagster", "dev", *cmd[2:]]
    # Own process group: stopping it reaches the webserver, the daemon, the code server and its workers.
    # SIGINT/SIGTERM are restored to their defaults in the child (a backgrounded parent may ignore them).
    return subprocess.Popen(cmd, cwd=options.state_dir.resolve(), env=env, stdout=open(log_path, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_signals)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# Dagster's own services stop within a few seconds of their code server (webserver, daemon, a run cancelled).
DAGSTER_SHUTDOWN_SECONDS = 5.0


def dagster_stop_seconds() -> float:
    """How long a Ctrl-C'd `dagster dev` is given before what is left of its group is killed: its code server's
    own bound (its workers' release, then its forced exit) and Dagster's shutdown after it. A daemon whose main
    thread waits on a code server that is gone (a workspace refresh's gRPC retries, half a minute on a loaded
    host) would otherwise hold the stop past anything the README states; killed, it loses nothing (its state
    is in the instance's storage, and a run it had not launched yet stays queued for the next start)."""
    from ..deployment.fleet_hosting import EXIT_GRACE_SECONDS, STOP_SECONDS

    return STOP_SECONDS + EXIT_GRACE_SECONDS + DAGSTER_SHUTDOWN_SECONDS


def stop_process_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGINT to the process group (Ctrl-C, as a terminal sends it); what has not exited `grace` seconds later is
    killed, the group's other processes (a code server, its workers) included."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(grace)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            log.warning("dagster dev still running %.0f s after Ctrl-C: killing its process group (leases not "
                        "released expire by themselves)", grace)
    # Children that outlived the group leader (e.g. the code server) still carry the group id.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10.0)
    except subprocess.TimeoutExpired:
        pass


def _cancel_runs_the_stop_ended(home: Path) -> None:
    """The runs whose worker went with `dagster dev`'s group are canceled (instance/stopped.py), each said."""
    from ..instance.stopped import cancel_runs_the_stop_ended

    try:
        lines = cancel_runs_the_stop_ended(home)
    except Exception as exc:  # noqa: BLE001 - the stop goes on; run monitoring fails such a run at the next start
        print(f"the runs dagster left in flight could not be canceled ({exc!r}): run monitoring fails them at the "
              f"next start, and they are retried", file=sys.stderr, flush=True)
        return
    for line in lines:
        print(line, flush=True)


@dataclass(frozen=True)
class Started:
    """What `run_demo` / `run_local_up` started, handed to their `ready` callback once everything is up."""

    endpoints: Endpoints
    env_file: Path
    emulator_pids: dict[str, int]
    url: str | None  # the Dagster UI (the demo); None for `local up`
    spark_connect_pid: int | None = None  # the warm Spark Connect server (None: runs start their own session)


def run_demo(options: DemoOptions, *, ready: Callable[[Started], None] | None = None,
             stop: threading.Event | None = None) -> int:
    """Run the whole demo until SIGINT/SIGTERM (or `stop`); returns an exit code."""
    return _run(options, serve=True, ready=ready, stop=stop)


def run_local_up(options: DemoOptions, *, ready: Callable[[Started], None] | None = None,
                 stop: threading.Event | None = None) -> int:
    """`kcl-pipeline local up`: the demo but `dagster dev` (emulators, the demo stream and its producer unless
    options.producer is off, DAGSTER_HOME), and the demo's environment in <state dir>/env.sh for a person's
    `dagster dev` at the repository root. Runs until SIGINT/SIGTERM (or `stop`); returns an exit code."""
    return _run(options, serve=False, ready=ready, stop=stop)


def _start_spark_connect(options: DemoOptions, log_dir: Path, env: dict[str, str]) -> SparkConnectServer | None:
    """The warm Spark Connect server, started (not yet ready); None, said in one line, when there is none."""
    if not options.warm_spark:
        print("spark       a cold local session per run (--cold-spark)", flush=True)
        return None
    missing = unavailable()
    if missing:
        print(f"spark       a cold local session per run: {missing}", flush=True)
        return None
    server = SparkConnectServer(log_dir, env=env)
    try:
        server.start()
    except (SparkConnectError, OSError) as exc:
        print(f"spark       a cold local session per run: the Spark Connect server did not start: {exc}", flush=True)
        return None
    return server


def _spark_connect_ready(server: SparkConnectServer | None, stop: threading.Event) -> SparkConnectServer | None:
    """The server once it listens; None, stopped and said in one line, when it does not come up."""
    if server is None:
        return None
    try:
        server.wait_ready(stop=stop)
    except SparkConnectError as exc:
        server.stop()
        if not stop.is_set():
            print(f"spark       a cold local session per run: {exc}", flush=True)
        return None
    print(f"spark       {server.url} (Spark Connect, pid {server.pid}, log {server.log_path}); a run that finds "
          f"it gone starts a cold {FALLBACK_MASTER} session", flush=True)
    return server


def reset_state(state_dir: Path) -> list[str]:
    """Delete what the state directory keeps across runs: the Dagster home (a fresh one, with a new first partition,
    is made on the next start), the emulators' state and the zones. Returns what was deleted, a line each
    (empty: there was nothing)."""
    from ..deployment.home import PARTITIONS_FILE, HomeMismatch, read_home_partitions

    state = state_dir.resolve()
    deleted = []
    home = state / HOME_DIR
    if home.exists():
        try:
            partitions = read_home_partitions(home)
            made = "" if partitions is None else (f", and its first partition {partitions.start.isoformat()} "
                                                  f"({partitions.window_minutes}-minute windows)")
        except HomeMismatch:  # unreadable: deleted all the same
            made = f", and {PARTITIONS_FILE}"
        shutil.rmtree(home)
        deleted.append(f"deleted {home}: Dagster's runs, asset history and the sensors' cursors{made}")
    for directory, held in ((EMULATORS_DIR, "the emulators' stream with its records, and the lease table with its "
                                            "checkpoints"),
                            (ZONES_DIR, "the landing zone's batches and the transform's output")):
        path = state / directory
        if path.exists():
            shutil.rmtree(path)
            deleted.append(f"deleted {path}: {held}")
    return deleted


@dataclass(frozen=True)
class KeptState:
    """Which parts of a state directory a previous run left (looked at before the emulators start)."""

    stream: bool  # kinesis-local's state file
    lease_table: bool  # dynalite's LevelDB directory holds data
    zones: bool  # the zones' directory


def kept_state(state_dir: Path) -> KeptState:
    from .emulators import DYNAMODB_DATA, KINESIS_DATA, KINESIS_DATA_FILE

    emulators = state_dir / EMULATORS_DIR
    leveldb = emulators / DYNAMODB_DATA
    return KeptState(stream=(emulators / KINESIS_DATA / KINESIS_DATA_FILE).is_file(),
                     lease_table=(leveldb / "CURRENT").is_file(),  # LevelDB's: the database exists
                     zones=(state_dir / ZONES_DIR).is_dir())


def lost_state(kept_partitions_start: datetime | None, kept: KeptState, now: datetime,
               window_minutes: int) -> str | None:
    """What a start on a kept Dagster home cannot find of the previous run (None: nothing is missing, or the home
    is new and there was no previous run): one line naming the parts and the windows that lose what they held.

    The home's windows (from its first partition to the current one) are the previous run's: without its stream
    they lose the records not yet checkpointed, without its lease table the checkpoints (the consumer starts the
    stream again), without the zones what was landed and transformed. Pure: the caller looks at the files."""
    if kept_partitions_start is None:
        return None
    missing = [name for name, present in (("stream", kept.stream), ("lease table", kept.lease_table),
                                          ("zones", kept.zones)) if not present]
    if not missing:
        return None
    from ..deployment.settings import window_start

    current = window_start(now, window_minutes)
    parts = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
    plural = len(missing) > 1 or missing == ["zones"]
    return (f"the previous run's {parts} {'are' if plural else 'is'} not kept: windows "
            f"{kept_partitions_start.isoformat()}..{current.isoformat()} lose what {'they' if plural else 'it'} held "
            f"(`kcl-pipeline local reset` starts afresh)")


def _run(options: DemoOptions, *, serve: bool, ready: Callable[[Started], None] | None,
         stop: threading.Event | None) -> int:
    from ..deployment.home import home_partitions, initialise_storage, prepare_dagster_home, read_home_partitions

    stop = stop or threading.Event()
    logging.getLogger("kcl_pipeline.local.producer").setLevel(logging.WARNING)  # one line per batch is noise here
    if threading.current_thread() is threading.main_thread():
        stop_on_signals(stop)
    state = options.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    env_file = state / ENV_FILE
    env_file.unlink(missing_ok=True)  # a stale one (a killed run's) names endpoints that are gone
    # another window length: refused before starting
    previous = read_home_partitions(state / HOME_DIR, options.window_minutes)
    kept = kept_state(state)  # before the emulators make their directories
    caller_env = dict(os.environ)  # before the emulators' endpoints and credentials go into it
    stack = EmulatorStack(state / "logs", data_dir=state / EMULATORS_DIR)
    dagster = None
    producer = None
    spark: SparkConnectServer | None = None
    try:
        endpoints = stack.start()
        # This process talks to the emulators too (stream, producer): their endpoints and dummy credentials.
        # (env() adds dummy credentials only when none are set.)
        os.environ.update(endpoints.env())
        for name, url in endpoints.endpoint_urls().items():
            print(f"{name:<11} {url}", flush=True)
        spark = _start_spark_connect(options, state / "logs", endpoints.env(caller_env))  # starts while we go on
        kinesis = client("kinesis", endpoints.aws_settings())
        if ensure_stream(kinesis, options.stream, options.shards):
            print(f"stream      {options.stream} ({options.shards} shards)", flush=True)
        else:
            open_shards = kinesis.describe_stream_summary(StreamName=options.stream)[
                "StreamDescriptionSummary"]["OpenShardCount"]
            print(f"stream      {options.stream} ({open_shards} shards, kept in {state / EMULATORS_DIR} with its "
                  f"records and the lease table)", flush=True)
        if options.producer:
            producer = threading.Thread(target=_producer_loop, args=(kinesis, options, stop), daemon=True,
                                        name="demo-producer")
            producer.start()
            print(f"producer    {options.rate:g} records/s, KPL aggregates of {options.aggregate} "
                  f"alternating with plain records, every {options.poison_every}th payload poison", flush=True)
        home = prepare_dagster_home(state / HOME_DIR, storage=options.dagster_storage)
        partitions = home_partitions(home, options.window_minutes,
                                     stream_start_window(kinesis, options.stream, options.window_minutes))
        print(f"partitions  {options.window_minutes}-minute windows from {partitions.start.isoformat()} "
              + ("(kept by this Dagster home: `kcl-pipeline local reset` starts afresh)" if partitions.kept
                 else "(this new Dagster home keeps them)"), flush=True)
        spark = _spark_connect_ready(spark, stop)
        if stop.is_set():  # Ctrl-C while the server started
            return 0
        lost = lost_state(None if previous is None else previous.start, kept, datetime.now(timezone.utc),
                          options.window_minutes)
        if lost:
            print(f"warning     {lost}", file=sys.stderr, flush=True)
        variables = demo_vars(endpoints, options, home, partitions.start, environ=caller_env,
                              spark_remote=spark.url if spark else None)
        failure = initialise_storage({**caller_env, **variables})
        if failure:
            print(f"the Dagster home {home} could not be initialised: {failure}", file=sys.stderr)
            return 1
        write_env_file(env_file, variables)
        url = None
        if serve:
            dagster = start_dagster({**caller_env, **variables}, options, state / "logs" / "dagster.log")
            url = f"http://{options.host}:{options.port}"
            print(f"dagster     {url}  (log {state / 'logs' / 'dagster.log'}; starting, ~20 s)", flush=True)
            print("Ctrl-C stops everything.", flush=True)
        else:
            print(f"dagster     DAGSTER_HOME={home} (the project's dagster.yaml)", flush=True)
            print(f"env file    {env_file}", flush=True)
            print(f"next        in another shell, at the repository root: source {shlex.quote(str(env_file))} "
                  f"&& dagster dev", flush=True)
            print("Ctrl-C (or `kcl-pipeline local down`) stops everything.", flush=True)
        if ready:
            ready(Started(endpoints, env_file, stack.pids(), url, spark.pid if spark else None))
        while not stop.is_set():
            if dagster is not None and dagster.poll() is not None:
                print(f"dagster dev exited with code {dagster.returncode}; see {state / 'logs' / 'dagster.log'}",
                      file=sys.stderr)
                return 1
            exited = stack.exited()
            if exited:
                for name, code in exited.items():
                    print(f"the {name} emulator exited with code {code}; log {stack.log_paths()[name]}",
                          file=sys.stderr)
                return 1
            if spark is not None and spark.exited() is not None:
                # not fatal: every run from now on falls back to a cold session (one WARNING each)
                print(f"the Spark Connect server exited with code {spark.exited()}; runs start cold local "
                      f"sessions from now on (log {spark.log_path})", file=sys.stderr, flush=True)
                spark.stop()
                spark = None
            stop.wait(0.5)
        return 0
    finally:
        stop.set()
        env_file.unlink(missing_ok=True)
        if dagster is not None:
            print("stopping dagster …", flush=True)
            stop_process_group(dagster, dagster_stop_seconds())
            _cancel_runs_the_stop_ended(state / HOME_DIR)
        if spark is not None:
            print("stopping the Spark Connect server …", flush=True)
            spark.terminate()  # its JVM shuts down while the producer and the emulators stop
        if producer is not None:
            producer.join(10)
        print("stopping the emulators …", flush=True)
        stack.stop()
        if spark is not None:
            spark.stop()
