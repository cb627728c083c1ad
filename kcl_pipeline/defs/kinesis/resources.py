"""Resources: where AWS is, the consumer's configuration, S3 and Spark.

Endpoints left empty resolve at call time through the SDK's own chain (AWS_ENDPOINT_URL_<SERVICE>,
AWS_REGION, credentials), so the same definitions run on the emulators and on AWS.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from dagster import ConfigurableResource, InitResourceContext
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import PrivateAttr

from ...kcl.aws import AwsSettings
from ...kcl.config import ConsumerConfig, InitialPosition
from ...kcl.worker import ProcessorSpec
from .settings import PipelineSettings

SPARK_RUN_TAG = "kcl_pipeline/spark"  # dagster.yaml limits runs with this tag (one SparkSession at a time)
SPARK_POOL = "spark"  # and the Spark step's pool (one slot): covers runs launched without the tag


class AwsResource(ConfigurableResource):
    """AWS region and endpoints shared by Kinesis, DynamoDB and CloudWatch (and S3 for the landing zone)."""

    region: Optional[str] = None
    endpoint_url: Optional[str] = None
    kinesis_endpoint_url: Optional[str] = None
    dynamodb_endpoint_url: Optional[str] = None
    cloudwatch_endpoint_url: Optional[str] = None
    s3_endpoint_url: Optional[str] = None

    def settings(self) -> AwsSettings:
        per_service = {"kinesis": self.kinesis_endpoint_url, "dynamodb": self.dynamodb_endpoint_url,
                       "cloudwatch": self.cloudwatch_endpoint_url, "s3": self.s3_endpoint_url}
        return AwsSettings(region=self.region, endpoint_url=self.endpoint_url,
                           endpoint_urls={k: v for k, v in per_service.items() if v})


class KinesisConsumerResource(ConfigurableResource):
    """The consumer this Dagster deployment hosts: stream, application (= lease table), windows, zones, leases."""

    stream: str
    application: str
    initial_position: str = "TRIM_HORIZON"
    initial_timestamp: Optional[str] = None
    window_minutes: int = 60
    landing_uri: str
    output_uri: str
    create_zones: bool = False
    worker_id: Optional[str] = None
    heartbeat_seconds: float = 10.0
    lease_expiry_seconds: float = 30.0
    max_leases: int = 64
    leases_to_acquire: int = 1
    grace_seconds: float = 10.0
    metrics_namespace: Optional[str] = None
    decoder: str = "json"
    # Bounds of one sensor tick (a tick must return well inside Dagster's 60 s).
    max_windows_per_tick: int = 12
    tick_budget_seconds: float = 30.0
    # A reported window not materialised this long after its end is STALLED (sensor status, metric); a window
    # whose run failed for good is requested again up to max_window_requests times in all. The same 300 s as
    # the audit's default transform grace.
    overdue_seconds: float = 300.0
    max_window_requests: int = 3

    @classmethod
    def from_settings(cls, settings: PipelineSettings) -> "KinesisConsumerResource":
        return cls(stream=settings.stream, application=settings.application,
                   initial_position=settings.initial_position, initial_timestamp=settings.initial_timestamp,
                   window_minutes=settings.window_minutes, landing_uri=settings.landing_uri,
                   output_uri=settings.output_uri, create_zones=settings.create_zones, worker_id=settings.worker_id,
                   heartbeat_seconds=settings.heartbeat_seconds, lease_expiry_seconds=settings.lease_expiry_seconds,
                   max_leases=settings.max_leases, grace_seconds=settings.grace_seconds,
                   metrics_namespace=settings.metrics_namespace, decoder=settings.decoder)

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    def consumer_config(self, aws: AwsSettings, worker_id: str, cycle_seconds: float) -> ConsumerConfig:
        # Children read as soon as their parent's last record has LANDED (the sink's last heartbeat says so):
        # reading order needs the parent landed, not checkpointed. Waiting for SHARD_END (committed only after
        # the window holding the parent's last record has materialised) would stall the split behind any
        # failed or slow transform.
        from ...landing.progress import A_SHARD_END

        return ConsumerConfig(
            stream=self.stream, application=self.application, worker_id=worker_id,
            initial_position=InitialPosition.parse(self.initial_position, self.initial_timestamp),
            leases_to_acquire=self.leases_to_acquire, max_leases=self.max_leases,
            heartbeat_seconds=self.heartbeat_seconds, lease_expiry_seconds=self.lease_expiry_seconds,
            cycle_seconds=cycle_seconds, metrics_namespace=self.metrics_namespace, aws=aws,
            parent_drained_attribute=A_SHARD_END)

    def processor_spec(self, aws: AwsSettings) -> ProcessorSpec:
        """The landing sink in pipeline mode: it never checkpoints (kinesis_checkpoints does)."""
        from ...landing.sink import landing_spec

        return landing_spec(self.landing_uri, self.stream, aws=aws, standalone=False, create_zone=self.create_zones)


class SparkResource(PySparkResource):
    """dagster-pyspark's PySparkResource that also stops, at teardown, the session it started.

    A session that already existed when the resource was set up (a test's shared session, a notebook's)
    is left running: it belongs to whoever started it.
    """

    stop_at_teardown: bool = True
    _started_here: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from pyspark import SparkContext

        existed = SparkContext._active_spark_context is not None
        super().setup_for_execution(context)
        self._started_here = not existed

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session = self.spark_session
        if self.stop_at_teardown and self._started_here and session is not None:
            session.stop()


def spark_config(settings: PipelineSettings, python: str = sys.executable) -> dict[str, Any]:
    from ...transform.job import spark_session_conf

    return {"spark.master": settings.spark_master, "spark.app.name": "kcl-pipeline",
            "spark.ui.enabled": "false", **spark_session_conf(python), **dict(settings.spark_conf)}


def build_resources(settings: PipelineSettings) -> dict[str, Any]:
    return {
        "aws": AwsResource(),
        "s3": S3Resource(),
        "pyspark": SparkResource(spark_config=spark_config(settings)),
        "consumer": KinesisConsumerResource.from_settings(settings),
    }
