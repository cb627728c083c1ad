"""The Dagster settings surface: hosting workers is opt-in; text settings show as EnvVar in the UI."""
from __future__ import annotations

from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
from kcl_pipeline.deployment.settings import PipelineSettings

START = {"KCL_PIPELINE_PARTITIONS_START": "2026-01-01"}  # required outside the demo profile


def test_hosting_workers_is_opt_in_outside_the_demo():
    assert PipelineSettings.from_env(START).host_workers is False
    assert PipelineSettings.from_env({**START, "KCL_PIPELINE_HOST_WORKERS": "true"}).host_workers is True
    assert PipelineSettings.from_env({"KCL_PIPELINE_PROFILE": "demo"}).host_workers is True
    settings = PipelineSettings.from_env(START)
    assert KinesisConsumerResource.from_settings(settings).host_workers is False


def test_text_settings_from_the_environment_are_envvar_fields(monkeypatch):
    """The UI shows KCL_PIPELINE_STREAM, not the stream's name baked in; Dagster resolves it at run time."""
    from dagster import EnvVar, build_resources

    from kcl_pipeline.defs.kinesis.resources import build_resources as pipeline_resources

    env = {**START, "KCL_PIPELINE_STREAM": "orders", "KCL_PIPELINE_LANDING_URI": "s3://lake/landing"}
    settings = PipelineSettings.from_env(env)
    consumer = pipeline_resources(settings, env)["consumer"]
    fields = consumer.model_dump()
    assert fields["stream"] == EnvVar("KCL_PIPELINE_STREAM")
    assert fields["landing_uri"] == EnvVar("KCL_PIPELINE_LANDING_URI")
    assert fields["application"] == "kcl-pipeline"  # not set by a variable: a plain value
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with build_resources({"consumer": consumer}) as resources:
        assert resources.consumer.stream == "orders" and resources.consumer.landing_uri == "s3://lake/landing"


def test_transformed_records_has_a_freshness_policy_of_whole_windows():
    from datetime import timedelta

    from kcl_pipeline.defs.kinesis.assets import transformed_freshness

    policy = transformed_freshness(60 * 60_000)
    assert policy.fail_window.to_timedelta() == timedelta(hours=3, minutes=10)
    assert policy.warn_window.to_timedelta() == timedelta(hours=2, minutes=10)
    from dagster import TimeWindowPartitionsDefinition

    from kcl_pipeline.defs.kinesis.assets import build_assets

    partitions = TimeWindowPartitionsDefinition(start="2026-01-01-00:00", fmt="%Y-%m-%d-%H:%M",
                                                cron_schedule="0 * * * *")
    _, transformed, _ = build_assets(partitions, 60 * 60_000)
    assert next(iter(transformed.specs)).freshness_policy == policy
