"""What `demo` and `local up` need outside Python, checked before any long work starts.

The npm emulators (kinesis-local, dynalite) ship as a manifest (package.json + package-lock.json, package
data); on first use they are installed with `npm ci` into a per-user cache directory named after the lock
file's hash, so an installed wheel works anywhere node/npm do and an upgrade with a new lock installs afresh.
A checkout's own node_modules (next to the kcl_pipeline package) is used when present.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

NODE_PACKAGES = ("kinesis-local", "dynalite")
NODE_MODULES_ENV = "KCL_PIPELINE_NODE_MODULES"
CACHE_ENV = "KCL_PIPELINE_CACHE_DIR"
MANIFEST_FILES = ("package.json", "package-lock.json")
JAVA_MIN = 17


class PrerequisiteMissing(RuntimeError):
    """A program the command needs (node, npm, Java 17+) is missing; the message says how to get it."""


@dataclass(frozen=True)
class Needs:
    node: bool = True  # the Kinesis and DynamoDB emulators
    java: bool = False  # Spark (the demo's transform)


def manifest_dir() -> Path:
    return Path(str(resources.files("kcl_pipeline.local") / "npm"))


def lock_digest() -> str:
    return hashlib.sha256((manifest_dir() / "package-lock.json").read_bytes()).hexdigest()[:16]


def cache_root(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kcl_pipeline"


def has_packages(node_modules: Path) -> bool:
    return all((node_modules / p / "package.json").is_file() for p in NODE_PACKAGES)


def checkout_node_modules(start: Path | None = None) -> Path | None:
    """A checkout's node_modules: beside the kcl_pipeline package directory, holding both emulators."""
    here = (start or Path(__file__)).resolve()
    for directory in here.parents:
        candidate = directory / "node_modules"
        if (directory / "kcl_pipeline").is_dir() and has_packages(candidate):
            return candidate
    return None


def cached_node_modules(env: dict[str, str] | None = None) -> Path:
    return cache_root(env) / f"npm-{lock_digest()}" / "node_modules"


def java_major(version_output: str) -> int | None:
    """The major version in `java -version` output ("17.0.15", "1.8.0_392" -> 8); None if unreadable."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check(needs: Needs, *, which: Callable[[str], str | None] = shutil.which,
          java_version: Callable[[], str] | None = None, node_modules_ready: bool = False) -> list[str]:
    """Problems, one sentence each (empty: ready). npm is needed only while the emulators are not installed."""
    problems = []
    if needs.node:
        if not which("node"):
            problems.append("node is not on PATH: install Node.js 18+ (e.g. apt-get install nodejs npm); "
                            "the Kinesis and DynamoDB emulators run on it")
        if not node_modules_ready and not which("npm"):
            problems.append("npm is not on PATH: install npm (e.g. apt-get install npm); it installs the "
                            "emulators once into the user cache")
    if needs.java:
        if not which("java"):
            problems.append(f"java is not on PATH: install Java {JAVA_MIN}+ (e.g. apt-get install "
                            f"openjdk-{JAVA_MIN}-jre-headless); Spark runs on it")
        else:
            major = java_major((java_version or _java_version)())
            if major is None or major < JAVA_MIN:
                problems.append(f"java is version {major or 'unknown'}; Spark needs Java {JAVA_MIN}+ "
                                f"(set JAVA_HOME or PATH to a Java {JAVA_MIN})")
    return problems


def _java_version() -> str:
    try:
        proc = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stderr + proc.stdout


def resolve_node_modules(env: dict[str, str] | None = None) -> Path | None:
    """Installed emulators: KCL_PIPELINE_NODE_MODULES, a checkout's node_modules, the user cache; or None."""
    env = os.environ if env is None else env
    override = env.get(NODE_MODULES_ENV)
    if override:
        return Path(override).expanduser().resolve()
    found = checkout_node_modules()
    if found is not None:
        return found
    cached = cached_node_modules(env)
    return cached if has_packages(cached) else None


def install_into_cache(env: dict[str, str] | None = None, *, npm: str = "npm", out=None,
                       extra_args: Sequence[str] = ()) -> Path:
    """`npm ci` the packaged manifest into the user cache (atomically: a failed install leaves nothing)."""
    out = out or sys.stderr
    target = cached_node_modules(env).parent
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"installing the local emulators ({', '.join(NODE_PACKAGES)}) into {target} with npm ci "
          f"(first use only, about a minute) …", file=out, flush=True)
    staging = Path(tempfile.mkdtemp(prefix=".npm-", dir=target.parent))
    try:
        for name in MANIFEST_FILES:
            shutil.copyfile(manifest_dir() / name, staging / name)
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error", *extra_args],
                              cwd=staging, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise PrerequisiteMissing(f"npm ci of the emulators failed (exit {proc.returncode}): {tail}")
        try:
            staging.rename(target)
        except OSError:
            if not has_packages(target / "node_modules"):  # not a concurrent install that won the race
                raise
        return target / "node_modules"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_ready(needs: Needs, *, out=None) -> Path | None:
    """Check every prerequisite first (all problems at once), then install the emulators if needed.

    Returns the node_modules to use (None when node is not needed). Raises PrerequisiteMissing."""
    node_modules = resolve_node_modules() if needs.node else None
    problems = check(needs, node_modules_ready=node_modules is not None)
    override = os.environ.get(NODE_MODULES_ENV)
    if override and needs.node and not has_packages(Path(override).expanduser()):
        problems.append(f"{NODE_MODULES_ENV}={override} does not hold {' and '.join(NODE_PACKAGES)}")
    if problems:
        raise PrerequisiteMissing("; ".join(problems))
    if needs.node and node_modules is None:
        node_modules = install_into_cache(out=out)
    return node_modules
