"""DAGSTER_HOME for the local default: a directory holding the project's dagster.yaml (Dagster reads it there).

The instance files ship inside the package (kcl_pipeline/deploy/), so an installed wheel has them too; the
repository root's dagster.yaml is the same file, byte for byte (a test compares them).
"""
from __future__ import annotations

import shutil
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
