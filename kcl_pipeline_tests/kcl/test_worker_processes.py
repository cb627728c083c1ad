"""How lease workers start: forked from a preloaded server (the default) or spawned, and what holds under both:
parent death, the keep-alive, fresh randomness per process; and the fall back to spawn when the server fails."""
from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.config import WORKER_START_METHOD_ENV, ConfigError, ConsumerConfig
from kcl_pipeline.kcl.shells.workers import worker_processes as wp
from kcl_pipeline.kcl.shells.workers.memory import process_name
from kcl_pipeline.kcl.shells.workers.worker_processes import (
    PRELOAD,
    SERVER_PROCESS_NAME,
    WARM_UP_MODULE,
    StartMethod,
    WorkerProcesses,
    WorkerStartError,
    preload_modules,
)

REPO = Path(__file__).resolve().parents[2]
METHODS = ["forkserver", "spawn"]


# -- targets run in the child processes (importable by name, as a worker's target is) ------------------------

def _report_state(results) -> None:
    """What a fresh worker process finds: which heavy modules are there already, its gc, its randomness."""
    results.put({"pid": os.getpid(), "ppid": os.getppid(), "frozen": gc.get_freeze_count(),
                 "modules": sorted(m for m in (*PRELOAD, WARM_UP_MODULE) if m in sys.modules),
                 "arrow_pool": _arrow_pool(),
                 "uuid": uuid.uuid4().hex, "random": random.random(), "worker_id": ConsumerConfig("s", "a").worker_id})


def _arrow_pool() -> str | None:
    """The Arrow memory pool this process would allocate from (None: pyarrow not loaded; not loaded here)."""
    return sys.modules["pyarrow"].default_memory_pool().backend_name if "pyarrow" in sys.modules else None


def _echo_keepalive(keepalive, results) -> None:
    deadline = time.monotonic() + 60
    while keepalive.value != 42.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    results.put(keepalive.value)


def _report_environ(results, names) -> None:
    results.put({name: os.environ.get(name) for name in names})


def _watch_parent(out: str) -> None:
    """As a worker starts (worker_main) and tests its parent (worker.py `_should_stop`): it changed since."""
    wp.detach_from_server()
    first = os.getppid()
    # Written whole, then renamed: the test polls for the name and reads it at once.
    staged = Path(out + ".started.tmp")
    staged.write_text(json.dumps({"pid": os.getpid(), "ppid": first}))
    staged.rename(out + ".started")
    deadline = time.monotonic() + 120
    while os.getppid() == first and time.monotonic() < deadline:
        time.sleep(0.05)
    staged = Path(out + ".tmp")
    staged.write_text("parent gone" if os.getppid() != first else "still there")
    staged.rename(out)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


# -- the preload list and the configuration -------------------------------------------------------------------

def test_the_preload_list_holds_the_heavy_modules_the_processor_and_the_warm_up_last():
    modules = preload_modules("my.processors:Factory")
    assert modules[:len(PRELOAD)] == list(PRELOAD)
    assert {"boto3", "botocore", "pyarrow", "kcl_pipeline.kcl.shells.workers.worker",
            "kcl_pipeline.zone.sink"} <= set(PRELOAD)
    assert modules[-2:] == ["my.processors", WARM_UP_MODULE]
    assert preload_modules("kcl_pipeline.zone.sink:LandingProcessor") == [*PRELOAD, WARM_UP_MODULE]
    assert preload_modules(None) == [*PRELOAD, WARM_UP_MODULE]


def test_the_start_method_defaults_to_forkserver_and_the_environment_sets_another(monkeypatch):
    monkeypatch.delenv(WORKER_START_METHOD_ENV, raising=False)
    assert ConsumerConfig("s", "a").worker_start_method == "forkserver"
    monkeypatch.setenv(WORKER_START_METHOD_ENV, "Spawn")
    assert ConsumerConfig("s", "a").worker_start_method == "spawn"
    assert ConsumerConfig("s", "a", worker_start_method="forkserver").worker_start_method == "forkserver"
    monkeypatch.setenv(WORKER_START_METHOD_ENV, "fork")
    with pytest.raises(ConfigError, match=f"worker_start_method must be one of forkserver, spawn, got 'fork'.*"
                                          f"{WORKER_START_METHOD_ENV}"):
        ConsumerConfig("s", "a")


@pytest.mark.parametrize("args, env, expected", [
    ([], {}, "forkserver"),
    (["--worker-start-method", "spawn"], {}, "spawn"),
    ([], {WORKER_START_METHOD_ENV: "spawn"}, "spawn"),
    (["--worker-start-method", "forkserver"], {WORKER_START_METHOD_ENV: "spawn"}, "forkserver"),
])
def test_consume_takes_the_start_method_from_its_flag_or_the_environment(captured_config, tmp_path, monkeypatch,
                                                                         args, env, expected):
    monkeypatch.delenv(WORKER_START_METHOD_ENV, raising=False)
    result = CliRunner().invoke(main, ["consume", "--sink", f"jsonl:{tmp_path}", "--region", "eu-west-1", "--stream",
                                       "s", "--application", "a", *args], env=env)
    assert result.exit_code == 0, result.output
    assert captured_config[0].worker_start_method == expected


@pytest.mark.parametrize("args, env", [(["--worker-start-method", "fork"], {}),
                                       ([], {WORKER_START_METHOD_ENV: "fork"})])
def test_consume_refuses_an_unknown_start_method_naming_where_it_came_from(tmp_path, args, env):
    result = CliRunner().invoke(main, ["consume", "--sink", f"jsonl:{tmp_path}", "--stream", "s", "--application",
                                       "a", *args], env=env)
    assert result.exit_code == 2 and "'fork' is not one of 'forkserver', 'spawn'" in result.output
    if env:
        assert WORKER_START_METHOD_ENV in result.output


def test_prefetch_bytes_is_bounded_by_what_get_records_can_return():
    assert ConsumerConfig("s", "a").prefetch_bytes == 2 * 1024 * 1024
    for bad in (1024, 10 * 1024 * 1024 + 1):
        with pytest.raises(ConfigError, match="prefetch_bytes must be in 65536..10485760"):
            ConsumerConfig("s", "a", prefetch_bytes=bad)


def test_an_unknown_start_method_is_refused():
    with pytest.raises(ValueError, match="one of forkserver, spawn, got 'fork'"):
        WorkerProcesses("fork")


# -- both methods ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_workers_start_preloaded_or_fresh_with_their_own_randomness(method):
    procs = WorkerProcesses(method, preload_modules(None))
    assert procs.start_method is None  # nothing started before the first worker
    ctx = procs.context()
    assert ctx.get_start_method() == method
    assert procs.start_method == StartMethod(method, method, method == "forkserver")
    assert wp.readied_start_method() == procs.start_method  # what the sensor's observation reports
    results = procs.ipc_context.Queue()
    children = [ctx.Process(target=_report_state, args=(results,), daemon=True) for _ in range(2)]
    for child in children:
        child.start()
    states = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    baseline_frozen = _fresh_interpreter_freeze_count()
    if method == "forkserver":
        for state in states:
            assert state["modules"] == sorted((*PRELOAD, WARM_UP_MODULE)), "not forked from the preloaded server"
            assert state["frozen"] > baseline_frozen, "the server's heap was not frozen"
            # Arrow's default pool (mimalloc) keeps a flushed batch's buffers: a worker's peak grew by ~6 MiB.
            assert state["arrow_pool"] == "system", "forked workers allocate Arrow buffers from mimalloc"
            assert state["ppid"] != os.getpid(), "a worker's parent is the server"
        assert states[0]["ppid"] == states[1]["ppid"]
        assert process_name(states[0]["ppid"]) == SERVER_PROCESS_NAME
    else:
        assert all(state["ppid"] == os.getpid() and WARM_UP_MODULE not in state["modules"]
                   and state["frozen"] == baseline_frozen for state in states)
    for key in ("uuid", "random", "worker_id"):
        assert states[0][key] != states[1][key], f"two workers drew the same {key}"


def _fresh_interpreter_freeze_count() -> int:
    """What a new interpreter reports before anything runs (not 0 on every build: pyenv's 3.12.1 freezes 375)."""
    out = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_freeze_count())"],
                         check=True, capture_output=True, text=True).stdout
    return int(out)


@pytest.mark.parametrize("method", METHODS)
def test_the_keepalive_value_reaches_a_worker_under_both_methods(method):
    procs = WorkerProcesses(method, preload_modules(None))
    keepalive = procs.ipc_context.Value("d", 0.0, lock=False)
    results = procs.ipc_context.Queue()
    child = procs.context().Process(target=_echo_keepalive, args=(keepalive, results), daemon=True)
    child.start()
    time.sleep(0.2)
    keepalive.value = 42.0
    assert results.get(timeout=120) == 42.0
    child.join(30)


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_runs_with_its_hosts_environment_as_of_its_start(method, monkeypatch):
    """The server's environment is the host's when the server started; a worker sees the host's of now."""
    procs = WorkerProcesses(method, preload_modules(None))
    ctx = procs.context()  # the server runs (in this test process, maybe since an earlier test)
    monkeypatch.setenv("KCL_TEST_SET_AFTER_THE_SERVER", "yes")
    monkeypatch.delenv("KCL_TEST_GONE", raising=False)
    results = procs.ipc_context.Queue()
    child = ctx.Process(target=_report_environ, args=(results, ["KCL_TEST_SET_AFTER_THE_SERVER", "KCL_TEST_GONE"]),
                        daemon=True)
    child.start()
    assert results.get(timeout=120) == {"KCL_TEST_SET_AFTER_THE_SERVER": "yes", "KCL_TEST_GONE": None}
    child.join(30)


HOST = """
import sys, time
from kcl_pipeline.kcl.shells.workers.worker_processes import WorkerProcesses, preload_modules
from kcl_pipeline_tests.kcl.test_worker_processes import _watch_parent

if __name__ == "__main__":
    ctx = WorkerProcesses(sys.argv[1], preload_modules(None)).context()
    ctx.Process(target=_watch_parent, args=(sys.argv[2],), daemon=True).start()
    time.sleep(600)
"""


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_sees_its_parent_die_when_its_host_is_killed(method, tmp_path):
    """SIGKILL of the host (no atexit, no terminate of daemonic children): under spawn the worker's parent is
    the host; under forkserver it is the server, which exits with the host, and the worker sees that."""
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(HOST))
    out = tmp_path / "watch"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    host = subprocess.Popen([sys.executable, str(script), method, str(out)], cwd=REPO, env=env)
    try:
        started = Path(str(out) + ".started")
        _wait_for(started.exists, 120, "the worker to start")
        worker = json.loads(started.read_text())
        if method == "forkserver":
            assert worker["ppid"] != host.pid and process_name(worker["ppid"]) == SERVER_PROCESS_NAME
        else:
            assert worker["ppid"] == host.pid
        host.send_signal(signal.SIGKILL)
        host.wait(30)
        _wait_for(out.exists, 60, "the worker to notice its parent died")
        assert out.read_text() == "parent gone"
        _wait_for(lambda: not os.path.exists(f"/proc/{worker['pid']}") or _zombie(worker["pid"]), 30,
                  "the worker to exit")
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


def test_a_killed_server_stops_its_workers_and_the_next_worker_starts_a_new_server(tmp_path):
    procs = WorkerProcesses("forkserver", preload_modules(None))
    ctx = procs.context()
    out = tmp_path / "watch"
    watcher = ctx.Process(target=_watch_parent, args=(str(out),), daemon=True)
    watcher.start()
    started = Path(str(out) + ".started")
    _wait_for(started.exists, 120, "the worker to start")
    server = json.loads(started.read_text())["ppid"]
    assert process_name(server) == SERVER_PROCESS_NAME
    os.kill(server, signal.SIGKILL)
    _wait_for(out.exists, 60, "the worker to notice its server died")
    assert out.read_text() == "parent gone"
    results = procs.ipc_context.Queue()
    child = ctx.Process(target=_report_state, args=(results,), daemon=True)
    child.start()
    state = results.get(timeout=120)
    assert state["ppid"] != server and process_name(state["ppid"]) == SERVER_PROCESS_NAME
    assert WARM_UP_MODULE in state["modules"], "the new server lacks the preloads"
    child.join(30)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# -- failures: the fall back to spawn ---------------------------------------------------------------------------

def test_a_server_that_cannot_start_falls_back_to_spawn_and_says_why(monkeypatch, caplog):
    def refuse() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(wp, "start_server", refuse)
    procs = WorkerProcesses("forkserver", preload_modules(None))
    with caplog.at_level(logging.ERROR, logger=wp.__name__):
        ctx = procs.context()
    assert ctx.get_start_method() == "spawn"
    method = procs.start_method
    assert method.method == "spawn" and method.fell_back and not method.preloaded
    assert method.detail == "OSError: [Errno 24] Too many open files"
    assert method.as_metadata() == {"start_method": "spawn", "start_method_detail": method.detail}
    assert "lease workers start with spawn, not forkserver: OSError" in caplog.text
    assert "worker_start_method='spawn'" in caplog.text
    results = procs.ipc_context.Queue()  # and workers still start
    child = ctx.Process(target=_report_state, args=(results,), daemon=True)
    child.start()
    assert results.get(timeout=120)["ppid"] == os.getpid()
    child.join(30)


def test_a_probe_that_does_not_come_back_falls_back_to_spawn(monkeypatch, caplog):
    def lost(ctx, timeout):
        raise WorkerStartError(f"a probe process forked from the server did not finish within {timeout:.0f}s")

    monkeypatch.setattr(wp, "probe", lost)
    procs = WorkerProcesses("forkserver", preload_modules(None), probe_timeout=7)
    with caplog.at_level(logging.ERROR, logger=wp.__name__):
        assert procs.context().get_start_method() == "spawn"
    assert procs.start_method.detail == "WorkerStartError: a probe process forked from the server did not " \
                                        "finish within 7s"
    assert procs.context() is procs.context()  # readied once


def test_a_platform_without_forkserver_falls_back_to_spawn(monkeypatch):
    real = multiprocessing.get_context

    def no_forkserver(method=None):
        if method == "forkserver":
            raise ValueError("cannot find context for 'forkserver'")
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", no_forkserver)
    procs = WorkerProcesses("forkserver")
    assert procs.context().get_start_method() == "spawn"
    assert procs.start_method.detail == "this platform has no forkserver (cannot find context for 'forkserver')"


def test_a_server_without_the_preloads_is_used_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(wp, "start_server", lambda: None)
    monkeypatch.setattr(wp, "probe", lambda ctx, timeout: False)
    procs = WorkerProcesses("forkserver", preload_modules(None))
    with caplog.at_level(logging.WARNING, logger=wp.__name__):
        assert procs.context().get_start_method() == "forkserver"
    assert procs.start_method.method == "forkserver" and not procs.start_method.preloaded
    assert procs.start_method.as_metadata()["start_method"] == "forkserver (not preloaded)"
    assert "without the lease workers' preloads" in caplog.text


def test_the_probe_tells_a_server_without_preloads_and_one_that_never_answers():
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: the warm-up module is not there
    assert wp.probe(spawn, 120) is False
    with pytest.raises(WorkerStartError, match="did not finish within 0s"):
        wp.probe(spawn, 0.001)


def test_the_warm_up_never_raises_and_names_what_it_missed(monkeypatch):
    def broken() -> None:
        raise RuntimeError("no data")

    monkeypatch.setattr(wp, "_warm_botocore", broken)
    monkeypatch.setattr(wp, "_warm_pyarrow", lambda: None)
    monkeypatch.setattr(wp.gc, "freeze", lambda: None)  # not this test process's heap
    monkeypatch.setattr("kcl_pipeline.kcl.shells.workers.worker.name_process", lambda name: None)
    assert wp.warm_up() == ["botocore: RuntimeError: no data"]


# -- the lease manager, for real: both methods deliver, and stop cleanly ------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_a_manager_works_its_leases_with_workers_of_either_method(method, emulators, kinesis_client, dynamodb_client,
                                                                  unique_name, tmp_path):
    from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable
    from kcl_pipeline.kcl.shells.shards import wait_stream_active
    from kcl_pipeline.kcl.shells.workers.memory import measure
    from kcl_pipeline.kcl.shells.workers.worker import ProcessorSpec

    stream, app = unique_name("sm"), unique_name("smapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    wait_stream_active(kinesis_client, stream)
    kinesis_client.put_records(StreamName=stream, Records=[
        {"Data": f"r{i}".encode(), "PartitionKey": f"k{i}"} for i in range(40)])
    config = ConsumerConfig(stream=stream, application=app, worker_id="me", heartbeat_seconds=1.0,
                            lease_expiry_seconds=3.0, cycle_seconds=1.0, leases_to_acquire=2,
                            idle_interval_seconds=0.3, worker_start_method=method, aws=emulators.aws_settings())
    out = tmp_path / "out"
    manager = LeaseManager(config, ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink", {"directory": str(out)}),
                           keepalive_timeout=60)
    manager.start()
    try:
        def delivered() -> int:
            return sum(len(f.read_text().splitlines()) for f in out.glob("*.jsonl")) if out.exists() else 0

        def cycle_until_delivered() -> bool:
            manager.run_cycle()
            return delivered() == 40
        _wait_for(cycle_until_delivered, 120, "every record delivered")
        assert manager.worker_processes.start_method == StartMethod(method, method, method == "forkserver")
        pids = [proc.pid for proc in manager.workers.values()]
        assert len(pids) == 2 and all(process_name(pid) == "kcl-lease" for pid in pids)
        parents = {int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in pids}
        server = multiprocessing.forkserver._forkserver._forkserver_pid
        assert parents == ({os.getpid()} if method == "spawn" else {server})
        report = measure(pids)
        assert report.count == 2 and report.pss_max > 0
    finally:
        results = manager.shutdown(timeout=30)
    assert sorted(r.outcome for r in results) == ["shutdown", "shutdown"]
    table = LeaseTable(app, dynamodb_client)
    assert all(lease.lease_owner is None for lease in table.scan()), "a lease was left owned"


# -- giving freed heap back while caught up ---------------------------------------------------------------------------

def test_a_caught_up_worker_trims_its_heap_at_most_once_a_period():
    calls: list[int] = []
    trimmer = wp.HeapTrimmer(period=60.0, trim=lambda pad: calls.append(pad) or 1)
    assert trimmer.caught_up(100.0) and calls == [0]
    assert not trimmer.caught_up(159.0) and calls == [0]
    assert trimmer.caught_up(160.0) and calls == [0, 0]


def test_without_glibc_the_trimmer_does_nothing(monkeypatch):
    monkeypatch.setattr(wp, "_malloc_trim", lambda: None)
    assert not wp.HeapTrimmer().caught_up(0.0)


@pytest.mark.skipif(wp._malloc_trim() is None, reason="glibc's malloc_trim only")
def test_glibcs_trim_is_found_and_runs():
    assert wp.HeapTrimmer(trim=None).caught_up(0.0)


def test_the_worker_trims_when_a_poll_finds_the_shard_caught_up():
    import inspect

    from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker

    source = inspect.getsource(LeaseWorker._deliver)
    assert "if batch.millis_behind_latest == 0:" in source and "self.heap.caught_up(" in source


# -- a fixed mmap threshold: large transient blocks go back to the OS when freed ---------------------------------------

def test_pinning_the_mmap_threshold_sets_glibcs_option_to_128_kib():
    calls: list[tuple[int, int]] = []
    assert wp.pin_mmap_threshold(lambda option, value: calls.append((option, value)) or 1)
    assert calls == [(wp.M_MMAP_THRESHOLD, 128 * 1024)] and wp.M_MMAP_THRESHOLD == -3


def test_without_glibc_or_when_refused_the_threshold_stays_as_it_was(monkeypatch):
    assert not wp.pin_mmap_threshold(lambda option, value: 0)  # mallopt's refusal
    monkeypatch.setattr(wp, "_mallopt", lambda: None)
    assert not wp.pin_mmap_threshold()


@pytest.mark.skipif(wp._mallopt() is None, reason="glibc's mallopt only")
def test_glibcs_mallopt_is_found_and_takes_the_threshold():
    assert wp.pin_mmap_threshold()


def test_a_worker_pins_the_threshold_first_thing():
    import inspect

    from kcl_pipeline.kcl.shells.workers.worker import worker_main

    lines = [line.strip() for line in inspect.getsource(worker_main).splitlines()]
    body = [line for line in lines if line and not line.startswith(('"""', "def ", "results,", "log_level"))]
    assert body[:2] == ["detach_from_server()  # else a forked worker keeps its server, its parent, alive after the "
                        "host died", "pin_mmap_threshold()  # large transient blocks (responses, encoded batches) go "
                        "back to the OS when freed"]


@pytest.mark.parametrize("named, expected", [(None, "system"), ("mimalloc", "mimalloc")])
def test_the_servers_allocator_module_chooses_arrows_pool_unless_the_environment_named_one(named, expected):
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if named:
        env["ARROW_DEFAULT_MEMORY_POOL"] = named
    code = ("import kcl_pipeline.kcl.shells.workers.forkserver_allocator, pyarrow; "
            "print(pyarrow.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
