"""demo / local up check node, npm and Java 17 before any long work, and install the emulators on first use."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.local import prerequisites
from kcl_pipeline.local.prerequisites import Needs, check, java_major


@pytest.mark.parametrize("output, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17), ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21), ("no java here", None),
])
def test_java_major_reads_java_version_output(output, major):
    assert java_major(output) == major


def test_everything_missing_is_reported_at_once():
    problems = check(Needs(node=True, java=True), which=lambda name: None)
    assert [p.split(" ")[0] for p in problems] == ["node", "npm", "java"]


def test_old_java_is_refused():
    problems = check(Needs(node=False, java=True), which=lambda name: "/usr/bin/" + name,
                     java_version=lambda: 'openjdk version "11.0.2"')
    assert problems == ["java is version 11; Spark needs Java 17+ (set JAVA_HOME or PATH to a Java 17)"]


def test_npm_is_not_needed_once_the_emulators_are_installed():
    assert check(Needs(node=True), which=lambda name: None if name == "npm" else "/x", node_modules_ready=True) == []


def test_demo_without_node_or_java_exits_2_before_starting_anything(tmp_path, monkeypatch):
    pytest.importorskip("dagster")  # without the extras, the demo stops earlier (next test)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    state = tmp_path / "state"
    result = CliRunner().invoke(main, ["demo", "--state-dir", str(state)])
    assert result.exit_code == 2, result.output
    assert "node is not on PATH" in result.output and "java is not on PATH" in result.output
    assert not state.exists()  # nothing was started


def test_local_up_without_node_exits_2(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    result = CliRunner().invoke(main, ["local", "up", "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 2 and "node is not on PATH" in result.output
    assert "java" not in result.output  # the emulators alone do not need Java


def test_the_manifest_ships_inside_the_package():
    manifest = prerequisites.manifest_dir()
    assert all((manifest / name).is_file() for name in prerequisites.MANIFEST_FILES)
    assert len(prerequisites.lock_digest()) == 16


def test_cache_follows_xdg_and_the_override(tmp_path):
    assert prerequisites.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "kcl_pipeline"
    assert prerequisites.cache_root({"KCL_PIPELINE_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"


def test_a_failed_npm_install_leaves_no_half_installed_cache(tmp_path):
    fake_npm = tmp_path / "npm"
    fake_npm.write_text("#!/bin/sh\necho 'npm ERR! network unreachable' >&2\nexit 1\n")
    fake_npm.chmod(0o755)
    env = {"KCL_PIPELINE_CACHE_DIR": str(tmp_path / "cache")}
    with pytest.raises(prerequisites.PrerequisiteMissing, match="npm ci of the emulators failed.*network"):
        prerequisites.install_into_cache(env, npm=str(fake_npm))
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is a prerequisite of the local emulators")
def test_first_use_installs_the_emulators_into_the_user_cache(tmp_path):
    env = {"KCL_PIPELINE_CACHE_DIR": str(tmp_path / "cache")}
    node_modules = prerequisites.install_into_cache(env, extra_args=["--prefer-offline"])
    assert prerequisites.has_packages(node_modules)
    assert node_modules == prerequisites.cached_node_modules(env)


def test_demo_without_its_extras_names_them_exit_2(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("dagster", "moto") else
                        real(name, *a))
    result = CliRunner().invoke(main, ["demo", "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 2
    assert "needs the dagster, local extra: pip install 'kcl_pipeline[dagster,local]'" in result.output
