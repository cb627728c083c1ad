"""Spark settings that look secret never reach what Dagster serves: the repository snapshot the webserver reads
(resource config, job snapshots and their config defaults, asset descriptions and metadata)."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from dagster import build_resources
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster_shared.serdes import serialize_value

from kcl_pipeline.defs import build_definitions
from kcl_pipeline.defs.kinesis.resources import SparkResource
from kcl_pipeline.deployment.redaction import looks_secret
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.kcl.config import ConfigError

NOW = datetime(2026, 11, 22, 3, 17, tzinfo=timezone.utc)
SPARK_CONF = json.dumps({"fs.s3a.secret.key": "SUPERSECRET", "spark.executor.memory": "2g",
                         "spark.authenticate.secret": "ALSOSECRET"})


@pytest.fixture
def env(monkeypatch):
    values = {"KCL_PIPELINE_PROFILE": "demo", "KCL_PIPELINE_PARTITIONS_START": "2026-11-21",
              "KCL_PIPELINE_SPARK_CONF": SPARK_CONF}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def test_the_repository_snapshot_shows_no_secret_spark_setting(env):
    defs = build_definitions(PipelineSettings.from_env(env, now=NOW))
    served = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
    assert "SUPERSECRET" not in served and "ALSOSECRET" not in served
    assert "spark.executor.memory" in served and "fs.s3a.secret.key" in served  # the rest is shown, the key too


def test_the_session_gets_the_secret_spark_settings_at_run_time(env, monkeypatch):
    import dagster_pyspark.resources

    seen = {}
    monkeypatch.setattr(dagster_pyspark.resources, "spark_session_from_config", lambda conf: seen.update(conf))
    pyspark = build_definitions(PipelineSettings.from_env(env, now=NOW)).resources["pyspark"]
    assert isinstance(pyspark, SparkResource)
    with build_resources({"pyspark": pyspark}):
        pass
    assert seen["fs.s3a.secret.key"] == "SUPERSECRET" and seen["spark.authenticate.secret"] == "ALSOSECRET"
    assert seen["spark.executor.memory"] == "2g"


def test_a_code_location_error_does_not_repeat_a_bad_spark_conf_naming_a_secret():
    with pytest.raises(ConfigError) as refused:
        PipelineSettings.from_env({"KCL_PIPELINE_PARTITIONS_START": "2026-11-21",
                                   "KCL_PIPELINE_SPARK_CONF": '{"fs.s3a.secret.key": "SUPERSECRET"'}, now=NOW)
    assert "SUPERSECRET" not in str(refused.value)
    assert "KCL_PIPELINE_SPARK_CONF must be a JSON object (not JSON: " in str(refused.value)


def test_secret_spark_settings_built_in_code_are_refused_rather_than_shown(monkeypatch):
    monkeypatch.delenv("KCL_PIPELINE_SPARK_CONF", raising=False)
    settings = PipelineSettings(partitions_start=NOW.replace(hour=0, minute=0), spark_conf={"a.password": "pw"})
    with pytest.raises(ConfigError, match=r"\['a.password'\] look secret: give them in KCL_PIPELINE_SPARK_CONF"):
        build_definitions(settings)


@pytest.mark.parametrize("name,secret", [
    ("fs.s3a.secret.key", True), ("fs.s3a.access.key", True), ("spark.ssl.keyPassword", True),
    ("fs.s3a.session.token", True), ("spark.hadoop.google.cloud.auth.service.account.json.credential", True),
    ("s3_aws_access_key_id", True), ("spark.executor.memory", False), ("spark.io.encryption.keySizeBits", False),
])
def test_the_redaction_rule(name, secret):
    assert looks_secret(name) is secret
