"""One source of configuration: ConsumerConfig's defaults reach settings, resources and the CLI unchanged;
stream ARNs, the lease table's name and the region follow AWS's conventions."""
from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.config import JAVA_COMPATIBLE_TIMINGS, ConfigError, ConsumerConfig, consumer_default
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.zone.layout import minute_prefix

ARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"

_SHARED = {  # PipelineSettings / KinesisConsumerResource field -> ConsumerConfig field
    "heartbeat_seconds": "heartbeat_seconds", "lease_expiry_seconds": "lease_expiry_seconds",
    "max_leases": "max_leases", "table_name": "table_name", "metrics_naming": "metrics_naming",
}

# The partitions' start is required outside the demo profile.
START = {"KCL_PIPELINE_PARTITIONS_START": "2026-11-15"}


def _defs():
    """The Dagster layer (absent from a core install: those tests are skipped there)."""
    pytest.importorskip("dagster")
    from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
    from kcl_pipeline.deployment.settings import PipelineSettings

    return PipelineSettings, KinesisConsumerResource


def test_settings_and_resource_defaults_are_consumer_config_defaults():
    PipelineSettings, KinesisConsumerResource = _defs()
    base = ConsumerConfig("s", "a")
    from_env = PipelineSettings.from_env(START)
    resource = KinesisConsumerResource(stream="s", application="a", landing_uri="/l", output_uri="/o")
    for ours, theirs in _SHARED.items():
        assert getattr(PipelineSettings(partitions_start=from_env.partitions_start), ours) == \
            getattr(base, theirs), ours
        assert getattr(from_env, ours) == getattr(base, theirs), ours
        assert getattr(resource, ours) == getattr(base, theirs), ours
    assert from_env.sensor_interval_seconds == base.cycle_seconds
    assert from_env.initial_position == base.initial_position.kind
    assert resource.leases_to_acquire == base.leases_to_acquire


def test_consumer_default_names_an_unknown_field():
    with pytest.raises(KeyError, match="no field 'heartbeat'"):
        consumer_default("heartbeat")


def test_stream_arn_is_accepted_as_the_stream():
    config = ConsumerConfig(ARN, "app")
    assert config.stream == ARN and config.stream_name == "orders"


def test_stream_arn_is_accepted_by_the_dagster_settings():
    PipelineSettings, _ = _defs()
    start = PipelineSettings.from_env(START).partitions_start
    assert PipelineSettings(stream=ARN, partitions_start=start).stream == ARN


def test_a_stream_named_by_its_arn_lands_under_its_identity_and_one_named_by_its_name_under_the_name():
    """Two streams named alike in other accounts or regions never share a directory (docs/landing.md)."""
    assert minute_prefix(ARN, 0) == "orders@eu-west-1@123456789012/dt=1970-01-01/hh=00/mm=00/"
    assert minute_prefix("orders", 0) == "orders/dt=1970-01-01/hh=00/mm=00/"


@pytest.mark.parametrize("bad", ["arn:aws:kinesis:eu-west-1:123:stream/orders",
                                 "arn:aws:sqs:eu-west-1:123456789012:orders", "bad name!"])
def test_malformed_stream_is_a_clear_error(bad):
    with pytest.raises(ConfigError, match="stream"):
        ConsumerConfig(bad, "app")


def test_table_name_names_the_lease_table_and_defaults_to_the_application():
    assert ConsumerConfig("s", "app").lease_table == "app"
    assert ConsumerConfig("s", "app", table_name="leases-prod").lease_table == "leases-prod"
    with pytest.raises(ConfigError, match="table_name"):
        ConsumerConfig("s", "app", table_name="x")


def test_table_name_setting_reaches_the_resource():
    PipelineSettings, KinesisConsumerResource = _defs()
    settings = PipelineSettings.from_env({**START, "KCL_PIPELINE_TABLE_NAME": "leases-prod"})
    assert KinesisConsumerResource.from_settings(settings).settings().lease_table == "leases-prod"


def _consume(args, tmp_path):
    return CliRunner().invoke(main, ["consume", "--sink", f"jsonl:{tmp_path}", "--region", "eu-west-1", *args])


def test_java_compatible_flag_is_the_config_java_compatible_timings(captured_config, tmp_path):
    result = _consume(["--stream", "s", "--application", "a", "--java-compatible"], tmp_path)
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    assert config == ConsumerConfig("s", "a", worker_id=config.worker_id, aws=config.aws).java_compatible()
    assert {k: getattr(config, k) for k in JAVA_COMPATIBLE_TIMINGS} == JAVA_COMPATIBLE_TIMINGS


def test_cli_defaults_are_consumer_config_defaults(captured_config, tmp_path):
    result = _consume(["--stream", ARN, "--application", "a", "--table-name", "tbl"], tmp_path)
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    expected = ConsumerConfig(ARN, "a", table_name="tbl", worker_id=config.worker_id,
                              aws=AwsSettings(region="eu-west-1"))
    assert config == expected
    assert [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(expected, f.name)] == []


@pytest.fixture
def aws_profile(tmp_path, monkeypatch):
    cfg = tmp_path / "config"
    cfg.write_text("[profile analytics]\nregion = eu-west-3\n")
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_PROFILE", "analytics")
    return cfg


def test_region_comes_from_the_profile_not_a_us_east_1_fallback(aws_profile):
    assert AwsSettings().resolved_region() == "eu-west-3"
    assert client("kinesis", AwsSettings()).meta.region_name == "eu-west-3"
    assert AwsSettings().to_env()["AWS_REGION"] == "eu-west-3"


def test_aws_region_and_an_explicit_region_win_over_the_profile(aws_profile, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert AwsSettings().resolved_region() == "ap-south-1"
    assert AwsSettings(region="sa-east-1").resolved_region() == "sa-east-1"


def test_no_region_anywhere_is_one_clear_error_exit_2(tmp_path, monkeypatch):
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    assert AwsSettings().resolved_region() is None
    result = CliRunner().invoke(main, ["leases", "--application", "a", "--endpoint-url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "no AWS region" in result.output


def test_metrics_naming_reaches_the_consumer_from_the_environment():
    PipelineSettings, KinesisConsumerResource = _defs()
    settings = PipelineSettings.from_env({**START, "KCL_PIPELINE_METRICS_NAMING": "KCL"})
    resource = KinesisConsumerResource.from_settings(settings)
    assert resource.settings().consumer_config(AwsSettings(), "w", 20.0).metrics_naming == "kcl"
    with pytest.raises(ConfigError, match="KCL_PIPELINE_METRICS_NAMING must be 'pipeline' or 'kcl', got 'java'"):
        PipelineSettings.from_env({**START, "KCL_PIPELINE_METRICS_NAMING": "java"})


def test_leases_command_reads_the_named_table(emulators, dynamodb_client, unique_name):
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    table = unique_name("tbl")
    LeaseTable(table, dynamodb_client).ensure_table()
    result = CliRunner(env=emulators.env()).invoke(main, ["leases", "--application", "app", "--table-name", table])
    assert result.exit_code == 0, result.output
    assert f"lease table {table} is empty" in result.output


def test_stream_given_twice_makes_a_multi_stream_application(captured_config, tmp_path):
    result = _consume(["--stream", "orders", "--stream", ARN.replace("orders", "clicks"), "--application", "a"],
                      tmp_path)
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    assert config.streams == ("orders", ARN.replace("orders", "clicks")) and config.multi_stream


def test_landing_several_streams_for_dagster_makes_a_multi_stream_fleet_member(captured_config, tmp_path):
    result = CliRunner().invoke(main, ["consume", "--stream", "orders", "--stream", "clicks", "--application", "a",
                                       "--landing", str(tmp_path / "zone"), "--checkpoint-by", "dagster",
                                       "--region", "eu-west-1"])
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    assert config.streams == ("orders", "clicks") and config.multi_stream


@pytest.mark.parametrize("field_name", ["cycle_seconds", "heartbeat_seconds", "lease_expiry_seconds",
                                        "validity_margin_seconds", "polling_interval_seconds", "idle_interval_seconds",
                                        "list_shards_probability", "worker_metrics_period_seconds",
                                        "metrics_interval_seconds"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_is_refused_naming_the_setting(field_name, bad):
    """`--cycle-seconds nan` made the manager a busy loop (nan passes every `<= 0` check) and `inf` stopped it
    after one cycle; every float setting is checked for it now."""
    with pytest.raises(ConfigError, match=f"{field_name} must be a finite number"):
        ConsumerConfig(stream="orders", application="app", **{field_name: bad})


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-1e300"])
def test_an_initial_position_extended_out_of_range_is_one_clear_error_not_a_traceback(tmp_path, value):
    from kcl_pipeline.kcl.properties import read_properties_file

    path = tmp_path / "app.properties"
    path.write_text(f"streamName = orders\napplicationName = app\ninitialPositionInStreamExtended = {value}\n")
    with pytest.raises(ConfigError, match="initialPositionInStreamExtended must be epoch seconds"):
        read_properties_file(str(path))
