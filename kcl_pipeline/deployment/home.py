"""DAGSTER_HOME for the local default: a directory holding the project's dagster.yaml (Dagster reads it there),
and, for a local home (`kcl-pipeline demo`, `local up`), the first partition it was made with (`home_partitions`).

The instance files ship inside the package (kcl_pipeline/deploy/), so an installed wheel has them too; the
repository root's dagster.yaml is the same file, byte for byte (a test compares them).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

DEPLOY_DIR = Path(__file__).resolve().parents[1] / "deploy"
DAGSTER_YAML = DEPLOY_DIR / "dagster.yaml"
# Storage -> instance file: SQLite under DAGSTER_HOME (one host), PostgreSQL (production, several hosts).
INSTANCE_FILES = {"sqlite": DAGSTER_YAML, "postgres": DEPLOY_DIR / "dagster-postgres.yaml"}
POSTGRES_URL_ENV = "DAGSTER_POSTGRES_URL"


def prepare_dagster_home(home: str | Path, source: Path | None = None, *, storage: str = "sqlite") -> Path:
    """Create `home` (if needed) and copy the project's dagster.yaml into it; returns the absolute path.

    Run `dagster dev` (at the repository root, or `-w kcl_pipeline/deploy/workspace.yaml`) with DAGSTER_HOME set
    to it (SQLite storage lands under it)."""
    if storage not in INSTANCE_FILES:
        raise ValueError(f"Dagster storage must be one of {', '.join(INSTANCE_FILES)}, got {storage!r}")
    source = source or INSTANCE_FILES[storage]
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: the kcl_pipeline install is incomplete (dagster.yaml is "
                                f"package data; reinstall it)")
    path = Path(home).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path / "dagster.yaml")
    return path


def initialise_storage(env: dict[str, str], timeout: float = 300.0) -> str | None:
    """Create (or migrate) the storage of the home `env`'s DAGSTER_HOME names, once, before `dagster dev` starts its
    processes; None when done, else why not (the command's last lines). On a fresh SQLite home the webserver, the
    daemon and the code server each create the schema as they start: on a loaded host two of them stamped it at
    once, the code server then failed to load (\"more than one head present\") and no sensor ever ticked."""
    if importlib.util.find_spec("dagster") is None:
        return None  # a core install: the `dagster dev` that will use the home runs from another environment
    try:
        done = subprocess.run([sys.executable, "-m", "dagster", "instance", "migrate"], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"`dagster instance migrate` did not finish within {timeout:.0f} s"
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return f"`dagster instance migrate` failed (exit {done.returncode}): {tail}"
    return None


# -- a local home's first partition, chosen once -----------------------------------------------------------------

PARTITIONS_FILE = "kcl_partitions.json"  # in a local DAGSTER_HOME: its partitions, written once when it is made


class HomeMismatch(ValueError):
    """A kept home's partitions differ from the ones asked for (another window length)."""


@dataclass(frozen=True)
class HomePartitions:
    """The partitions a local home was made with. Its runs, sensor cursor and asset history name those windows:
    a later start would orphan them (Dagster refuses a run of a partition before the first one), so a home
    keeps its first partition for its whole life, and `kcl-pipeline local reset` makes a fresh home."""

    start: datetime
    window_minutes: int
    kept: bool  # read from the home (a restart); False: chosen now, as the home was made

    def to_json(self) -> str:
        return json.dumps({"partitions_start": self.start.isoformat(), "window_minutes": self.window_minutes},
                          indent=2) + "\n"


def read_home_partitions(home: Path, window_minutes: int | None = None) -> HomePartitions | None:
    """The partitions the home was made with (None: a new home, or one made before homes kept them). A window
    length other than `window_minutes` (None: any) is refused: the home's runs name the other windows."""
    path = home / PARTITIONS_FILE
    try:
        data = json.loads(path.read_text())
        kept = HomePartitions(datetime.fromisoformat(data["partitions_start"]).astimezone(timezone.utc),
                              int(data["window_minutes"]), kept=True)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise HomeMismatch(f"{path} does not hold the home's partitions ({exc!r}); `kcl-pipeline local reset` "
                           f"makes a fresh home") from None
    if window_minutes is not None and kept.window_minutes != window_minutes:
        raise HomeMismatch(
            f"the Dagster home {home} holds {kept.window_minutes}-minute windows from {kept.start.isoformat()}; "
            f"--window-minutes {window_minutes} needs a fresh home: `kcl-pipeline local reset` (it deletes the "
            f"home's runs and sensor state), or --window-minutes {kept.window_minutes}")
    return kept


def home_partitions(home: Path, window_minutes: int, proposed_start: datetime) -> HomePartitions:
    """The home's partitions: those it was made with when it has them, else `proposed_start`, written into the
    home now, once (whole or not at all)."""
    kept = read_home_partitions(home, window_minutes)
    if kept is not None:
        return kept
    chosen = HomePartitions(proposed_start.astimezone(timezone.utc), window_minutes, kept=False)
    path = home / PARTITIONS_FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(chosen.to_json())
    os.replace(partial, path)
    return chosen
