"""What the local deployment's end-to-end tests share: Dagster's GraphQL API read while a webserver may still be
starting, the stack's processes started and stopped as a terminal does, a Dagster home's materialisations."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from kcl_pipeline.local.dagster_client import DagsterApiError, graphql
from kcl_pipeline_tests.process_tree import descendants


def graphql_or_none(url: str, query: str) -> dict | None:
    """The answer, or None while the webserver is not serving yet."""
    try:
        return graphql(url, query, {})
    except DagsterApiError as exc:
        if str(exc).startswith("cannot reach"):
            return None
        raise


REPO_ROOT = Path(__file__).resolve().parents[2]


def env_file(path: Path) -> dict[str, str]:
    """What `source <path>` sets, on top of PATH alone."""
    out = subprocess.run(["bash", "-c", 'source "$0" && env -0', str(path)], env={"PATH": os.environ["PATH"]},
                         capture_output=True, check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if item)


def clean_environ() -> dict[str, str]:
    """This environment without the pipeline's, the endpoints' and Dagster's variables, as a new shell has it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("KCL_PIPELINE_", "AWS_ENDPOINT_URL", "DAGSTER_"))}


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_logged(procs: list[subprocess.Popen], cmd: list[str], log: Path, cwd: Path,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cmd` in a session of its own (a terminal's Ctrl-C reaches its whole group), output to `log`, added to
    `procs`; the environment is this one without the pipeline's, the endpoints' and Dagster's variables, as a new
    shell has it, unless `env` is given."""
    proc = subprocess.Popen(cmd, env=clean_environ() if env is None else env, cwd=cwd, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_default_signals)
    procs.append(proc)
    return proc


def group_alive(pgid: int) -> bool:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True).returncode == 0


def stop_group(proc: subprocess.Popen, bound: float) -> float:
    """Ctrl-C to the process group, as a terminal sends it; returns how long until no process of the group is
    left (killed and failed past `bound`)."""
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    while time.monotonic() - started < bound:
        proc.poll()  # the leader reaped: a zombie still counts for pgrep
        if not group_alive(proc.pid):
            break
        time.sleep(0.2)
    took = time.monotonic() - started
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"processes of group {proc.pid} still ran {bound:.0f}s after Ctrl-C")
    proc.wait(5)
    return took


def kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGKILL whatever of `procs` and their descendants is left (a demo killed here cannot stop its `dagster
    dev`, a session of its own: its descendants go too)."""
    for proc in procs:
        children = descendants(proc.pid)
        if proc.poll() is None or group_alive(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def materialised(home: Path, asset: str) -> set[str]:
    """The asset's materialised partitions in the Dagster home (none while its storage is being made)."""
    from dagster import AssetKey, DagsterInstance

    if not (home / "history").is_dir():
        return set()
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            return set(instance.get_materialized_partitions(AssetKey(asset)))
    except Exception:  # noqa: BLE001 - the webserver and daemon may be creating the storage this moment
        return set()
