"""The stall time and the health file are checked like every other setting, in the one configuration, and the
command line offers them (kcl/config.py, cli.py, deployment/settings.py)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.config import ConfigError, ConsumerConfig, consumer_default
from kcl_pipeline.kcl.core.fleet.retry import STALL_SECONDS


def config(**values) -> ConsumerConfig:
    return ConsumerConfig(stream="orders", application="app", **values)


def test_the_stall_time_defaults_to_five_minutes_and_zero_means_never():
    assert consumer_default("stall_seconds") == STALL_SECONDS == 300.0
    assert config(stall_seconds=0.0).stall_seconds == 0.0
    assert config().health_file is None


@pytest.mark.parametrize("value, message", [
    (float("nan"), "stall_seconds must be a finite number"), (float("inf"), "stall_seconds must be a finite number"),
    (-1.0, "stall_seconds must be >= 0"),
])
def test_a_stall_time_no_clock_can_reach_is_refused(value, message):
    with pytest.raises(ConfigError, match=message):
        config(stall_seconds=value)


@pytest.mark.parametrize("path", ["", "  ", "/var/run/"])
def test_a_health_file_that_names_no_file_is_refused(path):
    with pytest.raises(ConfigError, match="health_file must name a file"):
        config(health_file=path)


def test_consume_offers_both_in_its_help():
    result = CliRunner().invoke(main, ["consume", "--help"])
    assert result.exit_code == 0 and "--stall-seconds" in result.output and "--health-file" in result.output


@pytest.mark.parametrize("args, message", [
    (["--stall-seconds", "nan"], "stall_seconds must be a finite number"),
    (["--stall-seconds", "-5"], "stall_seconds must be >= 0"),
    (["--health-file", "/no/such/directory/healthy"], "its directory does not exist"),
])
def test_consume_refuses_a_bad_value_in_one_line_before_anything_starts(args, message, tmp_path):
    result = CliRunner().invoke(main, ["consume", "--stream", "s", "--application", "a", "--sink",
                                       f"jsonl:{tmp_path / 'out'}", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_the_dagster_setting_is_checked_like_the_others():
    pytest.importorskip("pydantic_settings")
    from kcl_pipeline.deployment.settings import PipelineSettings

    base = {"KCL_PIPELINE_PARTITIONS_START": "2026-11-15"}
    now = datetime(2026, 11, 22, tzinfo=timezone.utc)
    assert PipelineSettings.from_env({**base, "KCL_PIPELINE_STALL_SECONDS": "90"}, now=now).stall_seconds == 90.0
    for bad, message in (("nan", "KCL_PIPELINE_STALL_SECONDS must be a finite number"),
                         ("-1", "stall_seconds must be >= 0")):
        with pytest.raises(ConfigError, match=message):
            PipelineSettings.from_env({**base, "KCL_PIPELINE_STALL_SECONDS": bad}, now=now)
