"""Dagster wiring only: the logic lives in kcl/, landing/ and transform/.

`build_definitions` is imported on first use, so the deployment's settings (kinesis/settings.py, plain
Python) stay readable from a core install without Dagster (the CLI's audit and verify defaults)."""
from __future__ import annotations

from typing import Any

__all__ = ["build_definitions"]


def __getattr__(name: str) -> Any:
    if name == "build_definitions":
        from .kinesis.definitions import build_definitions

        return build_definitions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
