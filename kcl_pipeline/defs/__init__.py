"""Dagster wiring only: the logic lives in kcl/, landing/ and transform/.

`build_definitions` is imported on first use, so the deployment's settings (kinesis/settings.py, plain
Python) stay readable from a core install without Dagster (the CLI's audit and verify defaults)."""
from __future__ import annotations

from typing import Any

__all__ = ["build_definitions", "build_member_definitions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .kinesis import definitions

        return getattr(definitions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
