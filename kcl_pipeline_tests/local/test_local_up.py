"""`kcl-pipeline local up` / `local down`: the demo without `dagster dev`, and its environment file for a person's
`dagster dev` at the repository root (README: `local up`, `source .kcl_local/env.sh`, `dagster dev`)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.local.demo import (
    ENV_FILE,
    DemoOptions,
    Started,
    demo_env,
    demo_vars,
    env_file_lines,
    run_local_up,
    write_env_file,
)
from kcl_pipeline.local.emulators import Endpoints, free_port
from kcl_pipeline.transform.connect import probe
from kcl_pipeline_tests.kcl.fleet_support import wait_until
from kcl_pipeline_tests.local.support import REPO_ROOT, env_file, graphql_or_none
from kcl_pipeline_tests.process_tree import alive

ENDPOINTS = Endpoints(kinesis="http://127.0.0.1:1", dynamodb="http://127.0.0.1:2", s3="http://127.0.0.1:3",
                      cloudwatch="http://127.0.0.1:3")
START = datetime(2026, 11, 25, 10, 6, tzinfo=timezone.utc)




# -- the environment: one source for the demo and the env file -------------------------------------------------

def test_the_env_file_holds_what_the_demo_sets(tmp_path):
    options = DemoOptions(state_dir=tmp_path, stream="orders", window_minutes=5, sensor_interval_seconds=7)
    variables = demo_vars(ENDPOINTS, options, tmp_path / "home", START, environ={})
    assert variables == {
        "AWS_ENDPOINT_URL_KINESIS": "http://127.0.0.1:1", "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:2",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:3", "AWS_ENDPOINT_URL_CLOUDWATCH": "http://127.0.0.1:3",
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "DAGSTER_HOME": str(tmp_path / "home"),
        "KCL_PIPELINE_PROFILE": "demo", "KCL_PIPELINE_STREAM": "orders", "KCL_PIPELINE_WINDOW_MINUTES": "5",
        "KCL_PIPELINE_PARTITIONS_START": "2026-11-25T10:06:00+00:00",
        # directories in the state directory: a restart finds what the previous run landed and transformed
        "KCL_PIPELINE_LANDING_URI": str(tmp_path / "zones" / "landing"),
        "KCL_PIPELINE_OUTPUT_URI": str(tmp_path / "zones" / "output"),
        "KCL_PIPELINE_SENSOR_INTERVAL_SECONDS": "7", "KCL_PIPELINE_HOST_WORKERS": "true",
        "KCL_PIPELINE_HEARTBEAT_SECONDS": "3", "KCL_PIPELINE_LEASE_EXPIRY_SECONDS": "10", "PYTHONUNBUFFERED": "1",
    }
    # The demo's `dagster dev` runs with exactly these over the caller's environment (credentials: the caller's).
    env = demo_env(ENDPOINTS, options, tmp_path / "home", START)
    credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    assert {k: env[k] for k in variables if k not in credentials} == \
        {k: v for k, v in variables.items() if k not in credentials}


def test_a_warm_spark_points_the_transform_at_its_server_with_a_cold_fallback(tmp_path):
    variables = demo_vars(ENDPOINTS, DemoOptions(state_dir=tmp_path), tmp_path, START, environ={},
                          spark_remote="sc://127.0.0.1:15002")
    assert variables["KCL_PIPELINE_SPARK_MASTER"] == "sc://127.0.0.1:15002"
    assert variables["KCL_PIPELINE_SPARK_FALLBACK_MASTER"] == "local[*]"
    pytest.importorskip("pydantic_settings", reason="the code location's settings need the [dagster] extra")
    settings = PipelineSettings.from_env(variables)  # the code location loads what env.sh sets
    assert (settings.spark_master, settings.spark_fallback_master) == ("sc://127.0.0.1:15002", "local[*]")


def test_the_demo_values_win_over_a_stale_environment(tmp_path):
    """A shell that sourced an earlier env file still has its partitions start and endpoints: the new run's win."""
    stale = {"KCL_PIPELINE_PARTITIONS_START": "2026-01-01", "AWS_ENDPOINT_URL_KINESIS": "http://127.0.0.1:9",
             "AWS_ACCESS_KEY_ID": "mine"}
    variables = demo_vars(ENDPOINTS, DemoOptions(state_dir=tmp_path), tmp_path, START, environ=stale)
    assert variables["KCL_PIPELINE_PARTITIONS_START"] == START.isoformat()
    assert variables["AWS_ENDPOINT_URL_KINESIS"] == "http://127.0.0.1:1"
    assert "AWS_ACCESS_KEY_ID" not in variables  # never overrides the user's credentials


def test_the_env_file_is_valid_shell_for_any_value(tmp_path):
    variables = {"DAGSTER_HOME": str(tmp_path / "a dir with 'quotes' and $dollars"), "X": "plain:1/2,3+4"}
    path = tmp_path / ENV_FILE
    write_env_file(path, variables)
    assert env_file(path).items() >= variables.items()
    assert env_file_lines({"X": "plain:1/2,3+4"}) == ["export X=plain:1/2,3+4"]  # simple values stay unquoted
    assert [p.name for p in tmp_path.iterdir()] == [ENV_FILE]  # no partial file left


# -- local down ------------------------------------------------------------------------------------------------

def test_local_down_without_local_up_exits_2(tmp_path):
    result = CliRunner().invoke(main, ["local", "down", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and "no running `kcl-pipeline local up` found" in result.output


def test_local_down_of_a_local_up_that_died_exits_2_and_forgets_it(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "local.pid").write_text(str(gone.pid))
    result = CliRunner().invoke(main, ["local", "down", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and f"(pid {gone.pid}) is not running any more" in result.output
    assert not (tmp_path / "local.pid").exists()


def test_local_down_says_so_when_local_up_does_not_stop(tmp_path):
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        (tmp_path / "local.pid").write_text(str(stubborn.pid))
        result = CliRunner().invoke(main, ["local", "down", "--state-dir", str(tmp_path), "--wait-seconds", "0.5"])
        assert result.exit_code == 2
        assert f"(pid {stubborn.pid}) was asked to stop but is still running after 0.5 s" in result.output
    finally:
        stubborn.kill()
        stubborn.wait()


def test_local_up_refuses_bad_flags_before_starting_anything(tmp_path):
    state = tmp_path / "state"
    result = CliRunner().invoke(main, ["local", "up", "--state-dir", str(state), "--shards", "0"])
    assert result.exit_code == 2 and "--shards must be >= 1" in result.output
    assert not state.exists()


# -- local up on its own emulators -----------------------------------------------------------------------------

def _run_in_thread(options: DemoOptions):
    started: list[Started] = []
    stop = threading.Event()
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["code"] = run_local_up(options, ready=started.append, stop=stop)
        except BaseException as exc:  # reported by the test
            result["error"] = exc

    thread = threading.Thread(target=run, name="local-up")
    thread.start()
    return thread, stop, started, result


def test_local_up_creates_the_stream_feeds_it_and_writes_the_demo_environment(tmp_path):
    state = tmp_path / "state"
    options = DemoOptions(state_dir=state, stream="local-up-demo", shards=1, rate=20.0, warm_spark=False)
    thread, stop, started, result = _run_in_thread(options)
    try:
        wait_until(lambda: started or result, 120, "local up")
        assert not result, result
        (up,) = started
        assert up.url is None and up.env_file == state.resolve() / ENV_FILE
        env = env_file(up.env_file)
        assert env["KCL_PIPELINE_STREAM"] == "local-up-demo" and env["KCL_PIPELINE_PROFILE"] == "demo"
        assert env["KCL_PIPELINE_HOST_WORKERS"] == "true"
        assert "KCL_PIPELINE_SPARK_MASTER" not in env and up.spark_connect_pid is None  # cold: a session per run
        assert env["AWS_ENDPOINT_URL_KINESIS"] == up.endpoints.kinesis
        home = Path(env["DAGSTER_HOME"])
        assert home == state.resolve() / "dagster_home"
        assert (home / "dagster.yaml").read_bytes() == (REPO_ROOT / "dagster.yaml").read_bytes()
        if importlib.util.find_spec("dagster") is not None:
            _assert_storage_made_once(home)
        start = datetime.fromisoformat(env["KCL_PIPELINE_PARTITIONS_START"])
        assert int(start.timestamp()) % (options.window_minutes * 60) == 0
        assert 0 <= time.time() - start.timestamp() < options.window_minutes * 60 + 60

        kinesis = client("kinesis", up.endpoints.aws_settings())
        (shard,) = kinesis.list_shards(StreamName="local-up-demo")["Shards"]
        iterator = kinesis.get_shard_iterator(StreamName="local-up-demo", ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        wait_until(lambda: kinesis.get_records(ShardIterator=iterator)["Records"], 60, "the demo producer's records")
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 0}
    assert not up.env_file.exists()  # its endpoints are gone
    assert not any(alive(pid) for pid in up.emulator_pids.values())


@pytest.mark.slow
def test_local_up_starts_a_warm_spark_connect_server_env_sh_points_runs_at_and_stops_it_by_pid(tmp_path):
    pytest.importorskip("grpc", reason="the warm path needs pyspark's Spark Connect client ([connect])")
    state = tmp_path / "state"
    options = DemoOptions(state_dir=state, stream="local-up-warm", shards=1, producer=False)
    thread, stop, started, result = _run_in_thread(options)
    try:
        wait_until(lambda: started or result, 300, "local up with its Spark Connect server")
        assert not result, result
        (up,) = started
        env = env_file(up.env_file)
        remote = env["KCL_PIPELINE_SPARK_MASTER"]
        assert remote.startswith("sc://127.0.0.1:") and env["KCL_PIPELINE_SPARK_FALLBACK_MASTER"] == "local[*]"
        assert up.spark_connect_pid is not None and alive(up.spark_connect_pid)
        assert probe(remote) is None  # it answers where env.sh points
        log = state.resolve() / "logs" / "spark-connect.log"
        assert "SparkConnectServer" in log.read_text(errors="replace")
        # bound to loopback only: the gRPC port answers on 127.0.0.1 and on no other address of the host
        port = int(remote.rsplit(":", 1)[1])
        assert not [addr for addr in _listening_addresses(port) if addr != "127.0.0.1"]
    finally:
        stop.set()
        thread.join(120)
    assert result == {"code": 0}
    assert not alive(up.spark_connect_pid)
    assert probe(remote) is not None


def _listening_addresses(port: int) -> list[str]:
    """The IPv4 addresses a TCP socket listens on at `port` (from /proc/net/tcp)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_local_up_exits_1_when_an_emulator_dies(tmp_path, capsys):
    options = DemoOptions(state_dir=tmp_path / "state", stream="local-up-dies", shards=1, producer=False,
                          warm_spark=False)
    thread, stop, started, result = _run_in_thread(options)
    try:
        wait_until(lambda: started or result, 120, "local up")
        (up,) = started
        os.kill(up.emulator_pids["dynamodb"], signal.SIGKILL)
        thread.join(30)
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 1}
    assert "the dynamodb emulator exited with code -9" in capsys.readouterr().err
    assert not up.env_file.exists()
    assert not any(alive(pid) for pid in up.emulator_pids.values())


def test_local_up_whose_stream_is_refused_exits_2_and_stops_the_emulators(tmp_path):
    state = tmp_path / "state"
    result = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "local", "up", "--state-dir", str(state),
                             "--stream", "bad name!", "--no-producer"], capture_output=True, text=True, timeout=180,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: DescribeStreamSummary failed: InvalidArgumentException: Stream Name 'bad name!'" in result.stderr
    assert not (state / ENV_FILE).exists() and not (state / "local.pid").exists()
    assert "stopping the emulators" in result.stdout


# -- what a restart finds: the emulators' state and the zones --------------------------------------------------

def _records(kinesis, stream: str) -> list[str]:
    """Every record's sequence number, from TRIM_HORIZON of each shard."""
    found = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=1000)
            found += [r["SequenceNumber"] for r in page["Records"]]
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                break
            iterator = page.get("NextShardIterator")
    return found


def test_a_second_local_up_finds_the_first_ones_stream_records_and_checkpoints(tmp_path, capsys):
    """Before: each start had a new stream and lease table, so what the previous run had landed but not
    transformed was gone, and its checkpoints with it. Now the second start has the first one's stream with every
    record it held, the lease table with its checkpoints, and the same zones in the state directory."""
    from kcl_pipeline.kcl.core.model import Checkpoint, Lease
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    state = tmp_path / "state"
    options = DemoOptions(state_dir=state, stream="kept-demo", shards=1, rate=20.0)
    thread, stop, started, result = _run_in_thread(options)
    try:
        wait_until(lambda: started or result, 120, "the first local up")
        assert not result, result
        (first,) = started
        kinesis = client("kinesis", first.endpoints.aws_settings())
        wait_until(lambda: len(_records(kinesis, "kept-demo")) >= 20, 60, "the demo producer's records")
        table = LeaseTable("kcl-pipeline", client("dynamodb", first.endpoints.aws_settings()))
        table.ensure_table()
        checkpoint = Checkpoint(_records(kinesis, "kept-demo")[5])
        assert table.create(Lease("shardId-000000000000", checkpoint, lease_owner="yesterday"))
        zones = {k: env_file(first.env_file)[k] for k in ("KCL_PIPELINE_LANDING_URI", "KCL_PIPELINE_OUTPUT_URI")}
        landed = Path(zones["KCL_PIPELINE_LANDING_URI"]) / "a-batch"  # what the consumer lands (dagster dev's)
        landed.parent.mkdir(parents=True)
        landed.write_bytes(b"landed yesterday")
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 0}
    # read once stopped: the producer put nothing after the stack went down
    capsys.readouterr()

    thread, stop, started, result = _run_in_thread(DemoOptions(state_dir=state, stream="kept-demo", shards=4,
                                                               producer=False))
    try:
        wait_until(lambda: started or result, 120, "the second local up")
        assert not result, result
        (second,) = started
        kinesis = client("kinesis", second.endpoints.aws_settings())
        kept = _records(kinesis, "kept-demo")
        assert len(kept) >= 20 and len(kept) == len(set(kept))
        assert len(kinesis.list_shards(StreamName="kept-demo")["Shards"]) == 1  # the kept stream, not a new one
        table = LeaseTable("kcl-pipeline", client("dynamodb", second.endpoints.aws_settings()))
        assert [(lease.lease_key, lease.checkpoint, lease.lease_owner) for lease in table.scan()] == \
            [("shardId-000000000000", checkpoint, "yesterday")]
        env = env_file(second.env_file)
        assert {k: env[k] for k in zones} == zones and landed.read_bytes() == b"landed yesterday"
        assert Path(zones["KCL_PIPELINE_LANDING_URI"]).parent == state.resolve() / "zones"
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 0}
    out = capsys.readouterr()
    assert "(1 shards, kept in " in out.out and "not kept" not in out.err

    reset = CliRunner().invoke(main, ["local", "reset", "--state-dir", str(state)])
    assert reset.exit_code == 0, reset.output
    lines = reset.output.splitlines()
    assert lines[0].startswith(f"deleted {state.resolve() / 'dagster_home'}: Dagster's runs")
    assert lines[1:] == [
        f"deleted {state.resolve() / 'emulators'}: the emulators' stream with its records, and the lease table with "
        f"its checkpoints",
        f"deleted {state.resolve() / 'zones'}: the landing zone's batches and the transform's output",
    ]
    assert sorted(p.name for p in state.iterdir()) == ["logs"]


def test_a_start_on_a_kept_home_without_the_emulators_state_says_once_what_is_lost(tmp_path, capsys):
    """A home whose emulators' state and zones are gone (deleted by hand, or a state directory made when the
    emulators kept nothing): the windows it names lost what they held, and the start says so, once."""
    from kcl_pipeline.deployment.home import home_partitions

    state = tmp_path / "state"
    (state / "dagster_home").mkdir(parents=True)
    home_partitions(state / "dagster_home", 2, START)
    thread, stop, started, result = _run_in_thread(DemoOptions(state_dir=state, stream="lost-demo", shards=1,
                                                               producer=False))
    try:
        wait_until(lambda: started or result, 120, "local up")
        assert not result, result
    finally:
        stop.set()
        thread.join(60)
    assert result == {"code": 0}
    err = capsys.readouterr().err
    assert err.count("not kept") == 1
    assert "the previous run's stream, lease table and zones are not kept: windows 2026-11-25T10:06:00+00:00.." in err


def test_what_a_start_lost_names_the_missing_parts_and_the_home_s_windows():
    from kcl_pipeline.local.demo import KeptState, lost_state

    now = datetime(2026, 11, 26, 9, 3, 30, tzinfo=timezone.utc)
    everything = KeptState(stream=True, lease_table=True, zones=True)
    assert lost_state(START, everything, now, 2) is None
    assert lost_state(None, KeptState(False, False, False), now, 2) is None  # a new home: no previous run
    assert lost_state(START, KeptState(stream=True, lease_table=True, zones=False), now, 2) == (
        "the previous run's zones are not kept: windows 2026-11-25T10:06:00+00:00..2026-11-26T09:02:00+00:00 lose "
        "what they held (`kcl-pipeline local reset` starts afresh)")
    assert lost_state(START, KeptState(stream=False, lease_table=True, zones=True), now, 2).startswith(
        "the previous run's stream is not kept: windows ")
    assert lost_state(START, KeptState(stream=False, lease_table=True, zones=False), now, 2).startswith(
        "the previous run's stream and zones are not kept: windows ")


# -- the README's three lines ----------------------------------------------------------------------------------



LOCATIONS = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } ... on RepositoryLocation { name } } } } }
  shouldShowNux instance { info } }"""


@pytest.mark.slow
def test_local_up_then_dagster_dev_at_the_repository_root_serves_the_pipeline(tmp_path):
    """`kcl-pipeline local up` in one shell; `source .kcl_local/env.sh` and `dagster dev` at the root in another:
    the root's workspace.yaml loads the code location `kcl_pipeline`, on the instance local up prepared, and the
    UI opens without Dagster's first-visit dialog."""
    pytest.importorskip("dagster_webserver")
    state = tmp_path / "state"
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("KCL_PIPELINE_", "AWS_ENDPOINT_URL", "DAGSTER_"))}
    up = subprocess.Popen([sys.executable, "-m", "kcl_pipeline.cli", "local", "up", "--state-dir", str(state),
                           "--no-producer", "--shards", "2"], env=clean, cwd=tmp_path,
                          stdout=open(tmp_path / "local-up.out", "wb"), stderr=subprocess.STDOUT,
                          start_new_session=True)
    dev = None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dagster = Path(sys.executable).with_name("dagster")
    try:
        env_file = state / ENV_FILE
        wait_until(lambda: env_file.exists() or up.poll() is not None, 120, "local up's env file")
        assert up.poll() is None, (tmp_path / "local-up.out").read_text()
        # What a person types, at the repository root.
        dev = subprocess.Popen(
            ["bash", "-c", f"source {shlex.quote(str(env_file))} && exec {shlex.quote(str(dagster))} dev "
                           f"-h 127.0.0.1 -p {port}"],
            env=clean, cwd=REPO_ROOT, stdout=open(tmp_path / "dagster.out", "wb"), stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_default_signals)

        def loaded():
            data = graphql_or_none(url, LOCATIONS)
            if data is None:
                assert dev.poll() is None, (tmp_path / "dagster.out").read_text()
                return None
            entries = data["workspaceOrError"]["locationEntries"]
            return data if entries and all(e["loadStatus"] == "LOADED" for e in entries) else None

        data = wait_until(loaded, 300, "the code location", interval=2)
        (entry,) = data["workspaceOrError"]["locationEntries"]
        assert entry["name"] == "kcl_pipeline"
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry
        assert data["shouldShowNux"] is False
        assert f"base_dir: {(state / 'dagster_home').resolve()}" in data["instance"]["info"]
        _no_first_visit_dialog(url)
    finally:
        if dev is not None:
            _stop_group(dev)
        down = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "local", "down", "--state-dir", str(state)],
                              env=clean, capture_output=True, text=True, timeout=120)
        try:
            up.wait(60)  # it removed its pid file once everything it started had stopped: it is exiting
        except subprocess.TimeoutExpired:
            pass
        _stop_group(up)
    assert down.returncode == 0, down.stdout + down.stderr
    assert up.returncode == 0, (tmp_path / "local-up.out").read_text()
    assert not list(REPO_ROOT.glob(".tmp_dagster_home_*"))  # DAGSTER_HOME was set: nothing left at the root


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the process group (dagster dev: webserver, daemon, code server, lease workers), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:  # children that outlived the leader still carry the group id
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _no_first_visit_dialog(url: str) -> None:
    """Headless Chromium (Debian's package, as the end-to-end browser test) opens the UI as a new user: no
    "Join the Dagster community" dialog (the UI shows it a second after load when shouldShowNux)."""
    chromium = "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return
    if not Path(chromium).exists():
        return  # CI installs it (.ci/run); the GraphQL answer above is what the UI decides on
    with urllib.request.urlopen(f"{url}/server_info", timeout=10) as resp:
        assert resp.status == 200
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/assets", wait_until="networkidle", timeout=90_000)
            page.get_by_text("transformed_records").first.wait_for(timeout=60_000)
            page.wait_for_timeout(3_000)  # the dialog opens 1 s after the page decides to show it
            assert page.get_by_text("Join the Dagster community").count() == 0
            assert page.get_by_role("dialog").count() == 0
        finally:
            browser.close()


def test_a_second_local_up_on_a_running_state_dir_is_refused_and_leaves_the_first_ones_files(tmp_path):
    """A second `local up` on the same state directory would overwrite the running one's pid file and env.sh
    (its `local down` would then stop the wrong process, and a shell sourcing env.sh would point elsewhere)."""
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "local.pid").write_text(str(running.pid))
        (tmp_path / ENV_FILE).write_text("export MARK=first\n")
        result = CliRunner().invoke(main, ["local", "up", "--state-dir", str(tmp_path)])
        assert result.exit_code == 2
        assert f"`kcl-pipeline local up` is already running for {tmp_path} (pid {running.pid})" in result.output
        assert (tmp_path / "local.pid").read_text() == str(running.pid)
        assert (tmp_path / ENV_FILE).read_text() == "export MARK=first\n"
    finally:
        running.kill()
        running.wait()


# -- a home keeps its first partition; `local reset` starts afresh -------------------------------------------------

def test_a_home_keeps_the_first_partition_it_was_made_with(tmp_path):
    """The demo's windows were 19:54, 19:56; an hour later `local up` chose the current window, and the sensor
    re-executed the home's unfinished windows before it, each failing at launch. A home chooses once."""
    from kcl_pipeline.deployment.home import home_partitions

    made = home_partitions(tmp_path, 2, START)
    assert made.start == START and not made.kept
    later = home_partitions(tmp_path, 2, datetime(2026, 11, 25, 11, 2, tzinfo=timezone.utc))
    assert later.start == START and later.kept
    assert not list(tmp_path.glob("*.partial"))


def test_a_home_refuses_another_window_length_naming_local_reset(tmp_path):
    from kcl_pipeline.deployment.home import HomeMismatch, home_partitions

    home_partitions(tmp_path, 2, START)
    with pytest.raises(HomeMismatch, match=r"holds 2-minute windows from 2026-11-25T10:06:00\+00:00; "
                                           r"--window-minutes 1 needs a fresh home: `kcl-pipeline local reset`"):
        home_partitions(tmp_path, 1, START)


def test_a_home_whose_partitions_file_is_unreadable_names_local_reset(tmp_path):
    from kcl_pipeline.deployment.home import PARTITIONS_FILE, HomeMismatch, read_home_partitions

    (tmp_path / PARTITIONS_FILE).write_text("{not json")
    with pytest.raises(HomeMismatch, match="`kcl-pipeline local reset` makes a fresh home"):
        read_home_partitions(tmp_path, 2)


def test_local_reset_deletes_the_home_and_says_what_it_held(tmp_path):
    from kcl_pipeline.deployment.home import home_partitions

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "history").mkdir()
    home_partitions(home, 2, START)
    result = CliRunner().invoke(main, ["local", "reset", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"deleted {home.resolve()}: Dagster's runs, asset history and the sensors' cursors, and its first " \
           f"partition 2026-11-25T10:06:00+00:00 (2-minute windows)" in result.output
    assert not home.exists()
    again = CliRunner().invoke(main, ["local", "reset", "--state-dir", str(tmp_path)])
    assert again.exit_code == 0 and "nothing to reset" in again.output


def test_local_reset_is_refused_while_local_up_runs(tmp_path):
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "local.pid").write_text(str(running.pid))
        (tmp_path / "dagster_home").mkdir()
        result = CliRunner().invoke(main, ["local", "reset", "--state-dir", str(tmp_path)])
        assert result.exit_code == 2 and f"(pid {running.pid}) is running on {tmp_path}" in result.output
        assert (tmp_path / "dagster_home").exists()
    finally:
        running.kill()
        running.wait()


def test_local_up_on_a_home_of_another_window_length_is_refused_before_starting_anything(tmp_path):
    from kcl_pipeline.deployment.home import home_partitions

    home = tmp_path / "dagster_home"
    home.mkdir()
    home_partitions(home, 2, START)
    result = CliRunner().invoke(main, ["local", "up", "--state-dir", str(tmp_path), "--window-minutes", "1"])
    assert result.exit_code == 2 and "needs a fresh home: `kcl-pipeline local reset`" in result.output
    assert not (tmp_path / "logs").exists()  # no emulator started


def _assert_storage_made_once(home: Path) -> None:
    """The home's SQLite storage exists before any Dagster process starts, each database with one schema head:
    `dagster dev`'s webserver, daemon and code server, each creating it as it started, once left two heads on a
    loaded host and the code server failed to load ("more than one head present"): no sensor, no run."""
    import sqlite3
    databases = sorted(home.rglob("*.db"))
    assert {db.name for db in databases} >= {"runs.db", "index.db", "schedules.db"}, databases
    for db in databases:
        with sqlite3.connect(db) as connection:
            assert connection.execute("select count(*) from alembic_version").fetchone() == (1,), db


def test_a_home_whose_storage_cannot_be_made_is_one_clear_line(tmp_path):
    pytest.importorskip("dagster")
    from kcl_pipeline.deployment.home import initialise_storage, prepare_dagster_home

    home = prepare_dagster_home(tmp_path / "home")
    (home / "dagster.yaml").write_text("run_storage: [not, a, storage]\n")
    failure = initialise_storage({**os.environ, "DAGSTER_HOME": str(home)})
    assert failure and failure.startswith("`dagster instance migrate` failed (exit ")
    assert "\n" not in failure
    fresh = prepare_dagster_home(tmp_path / "fresh")
    assert initialise_storage({**os.environ, "DAGSTER_HOME": str(fresh)}) is None
    _assert_storage_made_once(fresh)
