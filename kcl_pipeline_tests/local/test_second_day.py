"""The second day, as a new user has it, in one clone: `kcl-pipeline demo`, stopped with Ctrl-C in the middle of a
window; then the README's Dagster way on the same state directory: `kcl-pipeline local up`, `source
.kcl_local/env.sh`, `dagster dev` at the repository root.

The home made by the demo keeps its first partition, so the second start has the same partitions: every window of
both runs (those the demo left unfinished, those between the two runs, the second run's first) is transformed and
checkpointed, the Runs page (read through Dagster's GraphQL API) shows no failed run (the demo is stopped while a
window's run runs: that run is canceled, and its window transformed by the second start), and each stop returns
within the bound the README states. The state directory keeps the emulators' state and the zones: the second start
has the demo's stream (the one its partitions started with), and the output holds every window's commit, the
demo's too.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcl_pipeline.deployment.fleet_hosting import STOP_SECONDS
from kcl_pipeline.local.demo import ENV_FILE, dagster_stop_seconds
from kcl_pipeline.local.emulators import free_port
from kcl_pipeline.windows.keys import partition_key
from kcl_pipeline.windows.manifest import commit_key
from kcl_pipeline_tests.kcl.fleet_support import wait_until
from kcl_pipeline_tests.local.support import (
    REPO_ROOT,
    clean_environ,
    env_file,
    graphql_or_none,
    group_alive,
    kill_all,
    materialised,
    start_logged,
    stop_group,
)

pytestmark = [pytest.mark.slow, pytest.mark.beside]

# Two-minute windows: a window's run takes about a minute on a busy two-core machine, so the stop soon finds one
# in flight.
WINDOW_MS = 120_000
# A stop returns within the workers' release bound and Dagster's own shutdown (a few seconds) with margin for a
# busy two-core machine.
STOP_BOUND_SECONDS = STOP_SECONDS + 20
# The demo stops `dagster dev` within its bound (killing what is left), then the Spark Connect server, the
# producer and the emulators (kinesis-local waits for its next write, up to 5 s).
DEMO_STOP_BOUND_SECONDS = dagster_stop_seconds() + 15
# `dagster dev` watches its code server every 5 s and restarts one that exited; a code server that exited on the
# Ctrl-C before `dagster dev` began its own shutdown is started again (a race inside dagster dev: CI met it under
# load). The new one hosts no worker (no sensor ticks any more) and exits by itself once its heartbeats stop:
# Dagster's 45-s heartbeat timeout, after its start.
RESTARTED_CODE_SERVER_SECONDS = 45 + 20
RUNS = """{ runsOrError { __typename ... on Runs { results { runId status jobName
  tags { key value } } } } }"""


def _runs(url: str) -> list[dict]:
    data = graphql_or_none(url, RUNS)
    return [] if data is None else data["runsOrError"]["results"]


def _what_the_stack_shows(home: Path, url: str, state: Path, logs: Path) -> str:
    """What a failed wait needs to be understood from CI's output alone: each asset's materialised windows, every
    run with its window and status, the sensor's and the runs' lines of `dagster dev`, the Spark server's tail."""
    lines = [f"{asset}: {sorted(materialised(home, asset))}"
             for asset in ("transformed_records", "kinesis_checkpoints")]
    for run in _runs(url):
        tags = {t["key"]: t["value"] for t in run["tags"]}
        lines.append(f"run {run['runId'][:8]} {tags.get('dagster/partition', '-')} {run['status']}")
    dagster = (logs / "dagster.out").read_text(errors="replace").splitlines()
    told = [line for line in dagster if (" - kinesis_consumer - " in line and " cycle: " not in line)
            or "RUN_" in line or "ERROR" in line or "Error" in line]
    lines += ["-- dagster dev (sensor, runs, errors):", *told[-60:]]
    spark_log = state / "logs" / "spark-connect.log"
    if spark_log.is_file():
        lines += ["-- spark-connect.log:", *spark_log.read_text(errors="replace").splitlines()[-20:]]
    return "\n".join(lines)


def _done(home: Path, windows: list[str]) -> bool:
    return all(set(windows) <= materialised(home, asset) for asset in ("transformed_records", "kinesis_checkpoints"))


# Two starts of the whole stack and their windows: about 7 minutes alone, over 10 on CI's shared two cores (the
# suite's 600 s timeout cut it there); its own waits bound each step.
@pytest.mark.timeout(1800)
def test_the_demo_then_local_up_and_dagster_dev_start_again_where_they_stopped(tmp_path):
    pytest.importorskip("dagster_webserver")
    state = tmp_path / "state"
    home = state / "dagster_home"
    clean = clean_environ()
    flags = ["--state-dir", str(state), "--window-minutes", str(WINDOW_MS // 60_000), "--shards", "1", "--rate", "5"]
    procs: list[subprocess.Popen] = []

    def start(cmd: list[str], log: str, cwd: Path) -> subprocess.Popen:
        return start_logged(procs, cmd, tmp_path / log, cwd)

    try:
        # -- the first day: the demo, stopped while a window's run runs ---------------------------------------------
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        demo = start([sys.executable, "-m", "kcl_pipeline.cli", "demo", "--port", str(port), *flags], "demo.out",
                     tmp_path)
        wait_until(lambda: (state / ENV_FILE).exists() or demo.poll() is not None, 180, "the demo's env file", 0.5)
        assert demo.poll() is None, (tmp_path / "demo.out").read_text()
        first = env_file(state / ENV_FILE)["KCL_PIPELINE_PARTITIONS_START"]
        wait_until(lambda: materialised(home, "kinesis_checkpoints"), 720, "the demo's first window checkpointed", 3)

        running: list[str] = []

        def a_run_started() -> bool:
            # The stop comes while a window's run runs (its transform, most of a window on a busy two-core machine):
            # the run ends canceled, not failed, and its window is requested again by the next start.
            running[:] = [r["runId"] for r in _runs(url) if r["status"] == "STARTED"]
            return bool(running)

        wait_until(a_run_started, 480, "a window's run in flight", 0.5)
        stopped_at = int(time.time() * 1000)
        demo_stop = stop_group(demo, DEMO_STOP_BOUND_SECONDS)
        assert demo.returncode == 0, (tmp_path / "demo.out").read_text()[-3000:]

        # -- the second day: `local up`, `source .kcl_local/env.sh`, `dagster dev` at the root ---------------------
        up = start([sys.executable, "-m", "kcl_pipeline.cli", "local", "up", *flags], "local-up.out", tmp_path)
        wait_until(lambda: (state / ENV_FILE).exists() or up.poll() is not None, 180, "local up's env file", 0.5)
        assert up.poll() is None, (tmp_path / "local-up.out").read_text()
        second_env = env_file(state / ENV_FILE)
        assert second_env["KCL_PIPELINE_PARTITIONS_START"] == first  # the home kept it
        up_out = (tmp_path / "local-up.out").read_text()
        assert "kept by this Dagster home" in up_out and "kept in " in up_out and "not kept" not in up_out, up_out
        restarted_at = int(time.time() * 1000)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        dagster = Path(sys.executable).with_name("dagster")
        dev = start(["bash", "-c", f"source {shlex.quote(str(state / ENV_FILE))} && exec {shlex.quote(str(dagster))} "
                                   f"dev -h 127.0.0.1 -p {port}"], "dagster.out", REPO_ROOT)
        # every window from the first partition to the second run's first: the demo's, the unfinished one it was
        # stopped in, those between the runs, and the second run's
        start_ms = int(_iso_ms(first))
        last = restarted_at - restarted_at % WINDOW_MS
        windows = [partition_key(w) for w in range(start_ms, last + WINDOW_MS, WINDOW_MS)]
        assert partition_key(stopped_at - stopped_at % WINDOW_MS) in windows
        try:
            # a failed run ends the wait: its window may be requested again, but the test fails on it anyway
            wait_until(lambda: _done(home, windows) or dev.poll() is not None
                       or any(r["status"] == "FAILURE" for r in _runs(url)), 720,
                       f"windows {windows[0]}..{windows[-1]}", 3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_what_the_stack_shows(home, url, state, tmp_path)}") from None
        assert dev.poll() is None, (tmp_path / "dagster.out").read_text()[-3000:]
        runs = _runs(url)
        failed = [r for r in runs if r["status"] == "FAILURE"]
        assert runs and not failed, f"{failed}\n{_what_the_stack_shows(home, url, state, tmp_path)}"
        # the run the Ctrl-C met: canceled (or done, had it finished within the stop), never failed
        assert {r["status"] for r in runs if r["runId"] in running} <= {"CANCELED", "SUCCESS"}, running
        # the output is the demo's too: the windows it transformed kept their commits across the restart
        output = Path(second_env["KCL_PIPELINE_OUTPUT_URI"])
        assert output.is_relative_to(state.resolve())
        missing = [w for w in range(start_ms, last + WINDOW_MS, WINDOW_MS) if not (output / commit_key(w)).is_file()]
        assert not missing, [partition_key(w) for w in missing]
        dev_stop = stop_group(dev, STOP_BOUND_SECONDS + RESTARTED_CODE_SERVER_SECONDS)
        down = subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "local", "down", "--state-dir", str(state)],
                              env=clean, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        up.wait(30)
        assert up.returncode == 0 and not group_alive(up.pid)
        print(f"stop after Ctrl-C: demo {demo_stop:.1f}s, dagster dev {dev_stop:.1f}s; windows {len(windows)}")
    finally:
        kill_all(procs)
        assert not list(REPO_ROOT.glob(".tmp_dagster_home_*"))


def _iso_ms(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp() * 1000
