"""The package as users get it: a wheel installed into a fresh venv, outside the repository.

- The core alone (no dagster, pyspark or moto) installs on every supported Python and runs a consumer.
- The wheel's `kcl-pipeline demo` serves the Dagster UI from a directory that is not a checkout.
- The deployment files the wheel ships (kcl_pipeline/deploy/) are the repository root's, byte for byte.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kcl_pipeline.local.emulators import find_node_modules, free_port
from kcl_pipeline.local.producer import produce

REPO_ROOT = Path(__file__).resolve().parents[1]
PYENV = Path.home() / ".pyenv" / "versions"
HEAVY = ("dagster", "pyspark", "moto", "flask", "dagster-webserver", "dagster-aws")
# The top-level files a Dagster user finds at the root (the ones to edit) and their packaged copies.
DEPLOYMENT_FILES = ("workspace.yaml", "dagster.yaml")


def _differing_deployment_files(root: Path) -> list[str]:
    """The deployment files whose top-level and packaged copies differ (or one of which is missing)."""
    def content(path: Path) -> bytes | None:
        return path.read_bytes() if path.is_file() else None

    return [name for name in DEPLOYMENT_FILES
            if content(root / name) is None or content(root / name) != content(root / "kcl_pipeline" / "deploy" / name)]


@pytest.mark.core
def test_the_packaged_deployment_files_are_the_top_level_ones():
    """One source: `dagster dev` at the root reads workspace.yaml and (without DAGSTER_HOME) dagster.yaml there;
    the demo and `local up` use the packaged copies. Edit the top-level file, then copy it over."""
    differing = _differing_deployment_files(REPO_ROOT)
    assert differing == [], " and ".join(f"{name} differs from kcl_pipeline/deploy/{name}: "
                                         f"cp {name} kcl_pipeline/deploy/{name}" for name in differing)
    from kcl_pipeline.deployment.home import DAGSTER_YAML
    from kcl_pipeline.local.demo import WORKSPACE_YAML

    assert (DAGSTER_YAML, WORKSPACE_YAML) == (REPO_ROOT / "kcl_pipeline" / "deploy" / "dagster.yaml",
                                              REPO_ROOT / "kcl_pipeline" / "deploy" / "workspace.yaml")


@pytest.mark.core
@pytest.mark.parametrize("changed", ["top-level", "packaged", "missing"])
@pytest.mark.parametrize("name", DEPLOYMENT_FILES)
def test_the_comparison_fails_when_one_copy_changes_alone(tmp_path, name, changed):
    (tmp_path / "kcl_pipeline" / "deploy").mkdir(parents=True)
    for each in DEPLOYMENT_FILES:
        shutil.copyfile(REPO_ROOT / each, tmp_path / each)
        shutil.copyfile(REPO_ROOT / each, tmp_path / "kcl_pipeline" / "deploy" / each)
    assert _differing_deployment_files(tmp_path) == []
    one = tmp_path / name if changed != "packaged" else tmp_path / "kcl_pipeline" / "deploy" / name
    if changed == "missing":
        one.unlink()
    else:
        one.write_bytes(one.read_bytes().replace(b"enabled: false", b"enabled: true").replace(b"# ", b"#  ", 1))
    assert _differing_deployment_files(tmp_path) == [name]


def _python(version: str) -> str | None:
    """An interpreter of `version` (pyenv's, else on PATH)."""
    candidates = sorted(PYENV.glob(f"{version}.*/bin/python{version}")) if PYENV.is_dir() else []
    if candidates:
        return str(candidates[-1])
    return shutil.which(f"python{version}")


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy: setuptools leaves build/ and *.egg-info next to the sources it builds.
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(REPO_ROOT, src, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns("node_modules", ".venv", ".git", "__pycache__", ".kcl_local",
                                                  "*.egg-info", "build", "dist", "kcl_pipeline_tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, timeout=600, env=CLEAN_ENV)
    (path,) = out.glob("kcl_pipeline-*.whl")
    return path


# Child processes see the installed wheel only: no PYTHONPATH pointing at a checkout.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _venv(python: str, where: Path) -> Path:
    subprocess.run([python, "-m", "venv", str(where)], check=True, timeout=300, env=CLEAN_ENV)
    return where / "bin"


@pytest.mark.slow
@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_core_installs_alone_and_consumes(version, wheel, tmp_path, emulators, kinesis_client, unique_name):
    python = _python(version)
    if python is None:
        pytest.skip(f"Python {version} is not installed")
    bin_dir = _venv(python, tmp_path / "venv")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(wheel)], check=True, timeout=900, cwd=tmp_path,
                   env=CLEAN_ENV)
    installed = json.loads(subprocess.run([str(bin_dir / "pip"), "list", "--format", "json"], check=True,
                                          capture_output=True, text=True, env=CLEAN_ENV).stdout)
    names = {p["name"].lower() for p in installed}
    assert names.isdisjoint(HEAVY), names & set(HEAVY)
    assert {"boto3", "protobuf", "pyarrow", "click", "kcl_pipeline"} <= {n.replace("-", "_") for n in names}

    cli = str(bin_dir / "kcl-pipeline")
    env = {**os.environ, **emulators.env()}
    env.pop("PYTHONPATH", None)  # the installed wheel, not the checkout
    version_out = subprocess.run([cli, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert version_out.returncode == 0 and "kcl-pipeline, version" in version_out.stdout
    help_out = subprocess.run([cli, "consume", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert help_out.returncode == 0 and "--properties" in help_out.stdout

    stream = unique_name("core")
    produce(kinesis_client, stream, 20, aggregate=5, create_shards=1)  # KPL: the protobuf runtime in use
    out = tmp_path / "out"
    consumer = subprocess.Popen([cli, "consume", "--stream", stream, "--application", unique_name("core-app"),
                                 "--sink", f"jsonl:{out}", "--cycle-seconds", "1"],
                                env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: sum(len(f.read_text().splitlines()) for f in out.glob("*.jsonl")) >= 20
              if out.exists() else False, 120, "20 records consumed by the core install")
    finally:
        consumer.send_signal(signal.SIGTERM)
        output = consumer.communicate(timeout=120)[0].decode()
    assert consumer.returncode == 0, output


@pytest.mark.slow
def test_installed_wheel_runs_the_demo_far_enough_to_serve_the_ui(wheel, tmp_path):
    """The wheel, installed outside the repository, serves the Dagster UI (dependencies: this venv's)."""
    bin_dir = _venv(sys.executable, tmp_path / "venv")
    site = next((tmp_path / "venv" / "lib").glob("python3.*/site-packages"))
    # This venv's dependencies, as a plain path: its .pth files (and so the checkout's editable install) stay out.
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   timeout=300, env=CLEAN_ENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT_URL", "KCL_PIPELINE_"))}
    env.pop("PYTHONPATH", None)
    # No npm install in a test: the emulators the test session itself runs (a checkout's or the user cache's).
    env["KCL_PIPELINE_NODE_MODULES"] = str(find_node_modules().resolve())
    where = subprocess.run([str(bin_dir / "python"), "-c", "import kcl_pipeline; print(kcl_pipeline.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert str(site) in where, where  # the wheel, not the checkout
    port = free_port()
    demo = subprocess.Popen([str(bin_dir / "kcl-pipeline"), "demo", "--port", str(port), "--no-producer",
                             "--state-dir", str(tmp_path / "state")], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def ui_up():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as resp:
                return resp.status == 200 and "dagster_webserver_version" in resp.read().decode()
        except OSError:
            return demo.poll() is not None and pytest.fail(demo.stdout.read().decode())

    try:
        _wait(ui_up, 300, "the demo's Dagster UI")
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            output = demo.communicate(timeout=120)[0].decode()
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            output = demo.communicate()[0].decode()
    assert demo.returncode == 0, output
