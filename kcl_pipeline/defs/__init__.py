"""Dagster wiring only: the logic lives in kcl/, landing/ and transform/."""
from __future__ import annotations

from .kinesis.definitions import build_definitions

__all__ = ["build_definitions"]
