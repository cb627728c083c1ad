"""Fixtures shared by the consumer's tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def captured_config(monkeypatch):
    """consume's ConsumerConfig, captured instead of running the consumer (a unit test of the CLI surface)."""
    seen = []

    def fake_run(config, spec):
        seen.append(config)
        return 0

    monkeypatch.setattr("kcl_pipeline.kcl.shells.fleet.consumer.run_consumer", fake_run)
    return seen
