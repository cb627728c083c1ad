"""The run's AWS keys reach the transform's Spark options only when asked: by the setting, or, unset, when S3
is at an explicit endpoint (the emulators, an S3-compatible store). Materialises one empty window of a
directory zone on the shared SparkSession and looks at the S3 options the transform was given."""
from __future__ import annotations

from datetime import datetime

import pytest
from dagster import AssetKey, DagsterInstance, TimeWindowPartitionsDefinition, materialize

import kcl_pipeline.transform.job
from kcl_pipeline.defs.kinesis.assets import build_assets
from kcl_pipeline.defs.kinesis.resources import AwsResource, KinesisConsumerResource, SparkResource, spark_config
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.windows.keys import PARTITION_FMT

pytestmark = pytest.mark.slow
W = 60_000
KEYS = {"AWS_ACCESS_KEY_ID": "AKIDRUNKEY", "AWS_SECRET_ACCESS_KEY": "RUNSECRET", "AWS_SESSION_TOKEN": "RUNTOKEN"}


@pytest.mark.parametrize("s3_endpoint,asked,pinned", [
    (None, None, False),                    # AWS: the executors' own credential chain
    ("http://127.0.0.1:9", None, True),     # an explicit endpoint (the emulators): its keys travel
    ("http://127.0.0.1:9", False, False),   # ... unless the setting says no
    (None, True, True),                     # ... or pinned on AWS because the setting says so
])
def test_the_runs_aws_keys_reach_spark_only_when_asked(spark, tmp_path, monkeypatch, s3_endpoint, asked, pinned):
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    if s3_endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    given = []
    transform_window = kcl_pipeline.transform.job.transform_window

    def seen(*args, **kwargs):
        given.append(kwargs["s3_options"])
        return transform_window(*args, **kwargs)

    monkeypatch.setattr(kcl_pipeline.transform.job, "transform_window", seen)
    (tmp_path / "zone").mkdir()
    partitions = TimeWindowPartitionsDefinition(start=datetime(2026, 11, 15), fmt=PARTITION_FMT,
                                                cron_schedule="* * * * *", timezone="UTC")
    _, transformed, _ = build_assets(partitions, W)
    settings = PipelineSettings.from_env({"KCL_PIPELINE_WINDOW_MINUTES": "1",
                                          "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
    resources = {
        "consumer": KinesisConsumerResource(stream="creds", application="creds-app", window_minutes=1,
                                            landing_uri=str(tmp_path / "zone"), output_uri=str(tmp_path / "out")),
        "aws": AwsResource(region="us-east-1"),
        "pyspark": SparkResource(spark_config=spark_config(settings), aws_credentials=asked),
    }
    result = materialize([transformed], resources=resources, instance=DagsterInstance.ephemeral(),
                         partition_key="2026-11-15-00:00", selection=[AssetKey("transformed_records")])
    assert result.success
    (options,) = given
    carried = {options.aws_access_key_id, options.aws_secret_access_key, options.aws_session_token}
    assert carried == ({"AKIDRUNKEY", "RUNSECRET", "RUNTOKEN"} if pinned else {None})
    assert not pinned or "s3_aws_session_token" in options.to_options()
