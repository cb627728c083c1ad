"""Resources: where AWS is, the consumer's configuration, S3 and Spark.

Endpoints left empty resolve at call time through the SDK's own chain (AWS_ENDPOINT_URL_<SERVICE>,
AWS_REGION, credentials), so the same definitions run on the emulators and on AWS.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import PrivateAttr

from ...kcl.config import ConsumerConfig, InitialPosition, consumer_default
from ...kcl.core.model import Checkpoint
from ...kcl.core.streams import stream_name
from ...kcl.shells.aws import AwsSettings
from ...kcl.shells.worker import ProcessorSpec
from ...landing.backfill import BackfillPace
from ...landing.progress import A_SHARD_END as SHARD_END_LANDED
from .settings import PREFIX, PipelineSettings

# Text settings shown in the UI as the variable that set them (EnvVar); numbers stay values (validated at load).
ENV_TEXT_FIELDS = ("stream", "application", "table_name", "landing_uri", "output_uri", "worker_id",
                   "metrics_namespace", "decoder")

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

    # Defaults of the consumer's own settings are ConsumerConfig's; the pipeline's are PipelineSettings'.
    stream: str
    # A multi-stream application's other streams (one lease table; one set of assets per stream).
    more_streams: list[str] = []
    application: str
    table_name: Optional[str] = consumer_default("table_name")
    initial_position: str = PipelineSettings.initial_position
    initial_timestamp: Optional[str] = None
    window_minutes: int = PipelineSettings.window_minutes
    landing_uri: str
    output_uri: str
    create_zones: bool = PipelineSettings.create_zones
    worker_id: Optional[str] = None
    heartbeat_seconds: float = consumer_default("heartbeat_seconds")
    lease_expiry_seconds: float = consumer_default("lease_expiry_seconds")
    max_leases: int = consumer_default("max_leases")
    leases_to_acquire: int = consumer_default("leases_to_acquire")
    grace_seconds: float = PipelineSettings.grace_seconds
    metrics_namespace: Optional[str] = consumer_default("metrics_namespace")
    metrics_naming: str = consumer_default("metrics_naming")
    # polling or fanout (KCL_PIPELINE_RETRIEVAL): how the hosted lease workers read their shards.
    retrieval: str = consumer_default("retrieval")
    decoder: str = PipelineSettings.decoder
    landing_reader: str = PipelineSettings.landing_reader
    # True: the sensor runs this deployment's lease manager and its workers; False: an observer (reports
    # windows and requests runs; the fleet is `kcl-pipeline consume --checkpoint-by dagster` members elsewhere).
    host_workers: bool = True
    # Bounds of one sensor tick (a tick must return well inside Dagster's 60 s).
    max_windows_per_tick: int = 12
    tick_budget_seconds: float = 30.0
    # A reported window not materialised this long after its end is STALLED (sensor status, metric); a window
    # whose run failed for good is requested again up to max_window_requests times in all. The same 300 s as
    # the audit's default transform grace.
    overdue_seconds: float = 300.0
    max_window_requests: int = 3
    # A backfill's reads (landed_records in a run): shards at once, its share of each shard's 5 GetRecords/s,
    # and a deadline after which the run fails (what it landed stays; a retry goes on without duplicates).
    backfill_parallelism: int = BackfillPace.parallelism
    backfill_reads_per_second: float = BackfillPace.reads_per_second
    backfill_deadline_seconds: float = 3600.0

    @classmethod
    def from_settings(cls, settings: PipelineSettings,
                      env: Mapping[str, str] | None = None) -> "KinesisConsumerResource":
        """With `env` (the code location's environment), text fields set by a KCL_PIPELINE_* variable are
        EnvVar references: the UI shows the variable's name, and Dagster reads it at run time."""
        resource = cls._from_values(settings)
        if not env:
            return resource
        refs = {name: EnvVar(PREFIX + name.upper()) for name in ENV_TEXT_FIELDS
                if (env.get(PREFIX + name.upper()) or "").strip() == (getattr(settings, name) or "")
                and getattr(settings, name)}
        return cls(**{**resource.model_dump(), **refs}) if refs else resource

    @classmethod
    def _from_values(cls, settings: PipelineSettings) -> "KinesisConsumerResource":
        return cls(stream=settings.stream, more_streams=list(settings.more_streams),
                   application=settings.application, table_name=settings.table_name,
                   initial_position=settings.initial_position, initial_timestamp=settings.initial_timestamp,
                   window_minutes=settings.window_minutes, landing_uri=settings.landing_uri,
                   output_uri=settings.output_uri, create_zones=settings.create_zones,
                   host_workers=settings.host_workers, worker_id=settings.worker_id,
                   heartbeat_seconds=settings.heartbeat_seconds, lease_expiry_seconds=settings.lease_expiry_seconds,
                   max_leases=settings.max_leases, grace_seconds=settings.grace_seconds,
                   metrics_namespace=settings.metrics_namespace, metrics_naming=settings.metrics_naming,
                   retrieval=settings.retrieval,
                   decoder=settings.decoder, landing_reader=settings.landing_reader)

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    @property
    def grace_ms(self) -> int:
        return int(self.grace_seconds * 1000)

    @property
    def overdue_ms(self) -> int:
        return int(self.overdue_seconds * 1000)

    def initial_checkpoint(self) -> Checkpoint:
        """Where a new lease starts (a child's, created when the checkpoint plan ends its parent)."""
        return InitialPosition.parse(self.initial_position, self.initial_timestamp).checkpoint()

    @property
    def lease_table(self) -> str:
        """The lease table: table_name, else the application's name (Java KCL's rule)."""
        return self.table_name or self.application

    def backfill_pace(self) -> BackfillPace:
        return BackfillPace(parallelism=self.backfill_parallelism, reads_per_second=self.backfill_reads_per_second)

    def consumer_config(self, aws: AwsSettings, worker_id: str, cycle_seconds: float) -> ConsumerConfig:
        return ConsumerConfig(
            stream=self.stream, application=self.application, table_name=self.table_name, worker_id=worker_id,
            initial_position=InitialPosition.parse(self.initial_position, self.initial_timestamp),
            leases_to_acquire=self.leases_to_acquire, max_leases=self.max_leases,
            heartbeat_seconds=self.heartbeat_seconds, lease_expiry_seconds=self.lease_expiry_seconds,
            cycle_seconds=cycle_seconds, metrics_namespace=self.metrics_namespace,
            metrics_naming=self.metrics_naming, retrieval=self.retrieval, aws=aws,
            # Children are read once the parent's last record has LANDED (the sink's heartbeat says so), not
            # once SHARD_END is committed after the transform: a failed or late window run must not stop
            # a resharded stream. SHARD_END itself still waits for materialisation.
            parent_drained_attribute=SHARD_END_LANDED, more_streams=tuple(self.more_streams))

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream, *self.more_streams)

    def processor_spec(self, aws: AwsSettings) -> ProcessorSpec:
        """The landing sink in pipeline mode: it never checkpoints (kinesis_checkpoints does)."""
        from ...landing.sink import landing_spec

        return landing_spec(self.landing_uri, stream_name(self.stream), aws=aws, standalone=False,
                            create_zone=self.create_zones)


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

    if settings.spark_master.startswith("sc://"):  # Spark Connect: the server's context; session settings only
        return {"spark.remote": settings.spark_master,
                **{k: v for k, v in {**spark_session_conf(None), **dict(settings.spark_conf)}.items()
                   if k.startswith("spark.sql.")}}
    return {"spark.master": settings.spark_master, "spark.app.name": "kcl-pipeline",
            "spark.ui.enabled": "false",
            # the interpreter is pinned only for a local session (a cluster's executors bring their own)
            **spark_session_conf(python if settings.spark_master.startswith("local") else None),
            **dict(settings.spark_conf)}


def build_resources(settings: PipelineSettings, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "aws": AwsResource(),
        "s3": S3Resource(),
        "pyspark": SparkResource(spark_config=spark_config(settings)),
        "consumer": KinesisConsumerResource.from_settings(settings, env if env is not None else os.environ),
    }
