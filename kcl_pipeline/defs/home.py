"""DAGSTER_HOME for the local default: a directory holding the project's dagster.yaml (Dagster reads it there)."""
from __future__ import annotations

import shutil
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGSTER_YAML = PROJECT_ROOT / "dagster.yaml"
WORKSPACE_YAML = PROJECT_ROOT / "workspace.yaml"


def prepare_dagster_home(home: str | Path, source: Path = DAGSTER_YAML) -> Path:
    """Create `home` (if needed) and copy the project's dagster.yaml into it; returns the absolute path.

    Run `dagster dev -w workspace.yaml` with DAGSTER_HOME set to it (SQLite storage lands under it)."""
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: run from a checkout of kcl_pipeline (it holds dagster.yaml)")
    path = Path(home).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path / "dagster.yaml")
    return path
