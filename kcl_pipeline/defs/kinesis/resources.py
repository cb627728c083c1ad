"""Resources: where AWS is, the consumer's configuration, S3 and Spark.

Endpoints left empty resolve at call time through the SDK's own chain (AWS_ENDPOINT_URL_<SERVICE>,
AWS_REGION, credentials), so the same definitions run on the emulators and on AWS.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import MISSING, Field, fields
from typing import Any, Callable, Mapping, Optional, TypeVar, get_type_hints

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import Field as ConfigField
from pydantic import PrivateAttr, create_model

from ...deployment.consumer import ConsumerSettings
from ...deployment.redaction import redacted, secret_part
from ...deployment.settings import PREFIX, PipelineSettings
from ...kcl.aws_settings import AwsSettings
from ...kcl.config import ConfigError

# Text settings shown in the UI as the variable that set them (EnvVar); numbers stay values (validated at load).
ENV_TEXT_FIELDS = ("stream", "application", "table_name", "landing_uri", "output_uri", "worker_id",
                   "metrics_namespace", "decoder")

SPARK_RUN_TAG = "kcl_pipeline/spark"  # dagster.yaml limits runs with this tag (one SparkSession at a time)
SPARK_POOL = "spark"  # and the Spark step's pool (one slot): covers runs launched without the tag

T = TypeVar("T")


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


def _config_fields(kind: type) -> dict[str, Any]:
    """A plain dataclass's fields as Dagster configuration fields: (type, default), tuples as lists."""
    hints = get_type_hints(kind)

    def config_type(hint: Any) -> Any:
        return list[str] if hint == tuple[str, ...] else hint

    def default(f: Field) -> Any:
        return ... if f.default is MISSING else list(f.default) if isinstance(f.default, tuple) else f.default

    return {f.name: (config_type(hints[f.name]), default(f)) for f in fields(kind)}


# The resource's configuration is ConsumerSettings' fields, each declared there once.
_ConsumerFields = create_model("_ConsumerFields", __base__=ConfigurableResource, **_config_fields(ConsumerSettings))


class KinesisConsumerResource(_ConsumerFields):  # type: ignore[misc,valid-type]
    """The consumer this Dagster deployment hosts: ConsumerSettings (deployment/consumer.py) as Dagster
    configuration. Code reads it as the plain settings (`settings()`)."""

    @classmethod
    def from_settings(cls, settings: ConsumerSettings,
                      env: Mapping[str, str] | None = None) -> "KinesisConsumerResource":
        """With `env` (the code location's environment), text fields set by a KCL_PIPELINE_* variable are
        EnvVar references: the UI shows the variable's name, and Dagster reads it at run time."""
        values = {f.name: _config_value(getattr(settings, f.name)) for f in fields(ConsumerSettings)}
        if env:
            values.update({name: EnvVar(PREFIX + name.upper()) for name in ENV_TEXT_FIELDS
                           if (env.get(PREFIX + name.upper()) or "").strip() == (getattr(settings, name) or "")
                           and getattr(settings, name)})
        return cls(**values)

    def settings(self) -> ConsumerSettings:
        """The consumer's settings (EnvVar fields resolved: call it where the resource is set up)."""
        return ConsumerSettings(**{f.name: _plain_value(getattr(self, f.name)) for f in fields(ConsumerSettings)})


def _config_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _plain_value(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class SparkResource(PySparkResource):
    """dagster-pyspark's PySparkResource that also stops, at teardown, the session it started.

    A session that already existed when the resource was set up (a test's shared session, a notebook's)
    is left running: it belongs to whoever started it.
    """

    stop_at_teardown: bool = True
    secret_spark_conf: Optional[str] = ConfigField(default=None, description=(
        "A JSON object of Spark settings read when the run starts (KCL_PIPELINE_SPARK_CONF): the values of "
        "its settings whose names look secret replace their *** in spark_config."))
    aws_credentials: Optional[bool] = ConfigField(default=None, description=(
        "Pass the run's AWS keys to Spark in the transform's options: true, false, or unset: only when S3 "
        "is at an explicit endpoint (KCL_PIPELINE_SPARK_AWS_CREDENTIALS)."))
    fallback_spark_config: Optional[dict[str, Any]] = ConfigField(default=None, description=(
        "With a Spark Connect spark_config (spark.remote): the settings of the cold session a run starts "
        "when the server does not answer (KCL_PIPELINE_SPARK_FALLBACK_MASTER); unset, such a run fails."))
    _started_here: bool = PrivateAttr(default=False)
    _remote: bool = PrivateAttr(default=False)  # the session is a Spark Connect server's

    def session_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`config` (default: spark_config) with the secret settings' values in place of their `***`."""
        config = dict(self.spark_config if config is None else config)
        if not self.secret_spark_conf:
            return config
        given = secret_part({str(k): str(v) for k, v in json.loads(self.secret_spark_conf).items()})
        # only the names the config holds: a Spark Connect session takes its spark.sql.* settings alone
        return {**config, **{k: v for k, v in given.items() if k in config}}

    def chosen_config(self, context: InitResourceContext) -> dict[str, Any]:
        """The session's settings: spark_config, or, when its Spark Connect server does not answer, the
        fallback's (one WARNING in the run's log); no fallback: the run fails at once (transform/connect.py)."""
        from ...transform.connect import resolve_master

        remote = self.spark_config.get("spark.remote")
        if not remote:
            return self.session_config()
        fallback = self.fallback_spark_config or {}
        choice = resolve_master(str(remote), fallback.get("spark.master"))
        if choice.warning is None:
            return self.session_config()
        context.log.warning(choice.warning)
        return self.session_config(fallback)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._start(self.chosen_config(context))

    def _start(self, config: Mapping[str, Any]) -> None:
        import dagster_pyspark.resources
        from pyspark import SparkContext

        from ...transform.connect import RETRY_POLICY

        existed = SparkContext._active_spark_context is not None
        session = dagster_pyspark.resources.spark_session_from_config(dict(config))
        self._remote = bool(config.get("spark.remote"))
        if self._remote:
            from pyspark.sql.connect.client.retries import DefaultPolicy

            session.client.set_retry_policies([DefaultPolicy(**RETRY_POLICY)])
        self._spark_session = session
        self._started_here = not existed

    def run(self, log: Any, work: Callable[[Any], T]) -> T:
        """`work(session)`. When the session's Spark Connect server stops answering during it and a fallback is
        configured, `work` again in a cold fallback session (one WARNING in `log`; the rest of the run uses
        it): a window's transform replaces its partition and commits last, so a second try writes what the
        first would have. Any other error, or no fallback, is raised as it came."""
        from ...transform.connect import server_gone

        try:
            return work(self.spark_session)
        except Exception as exc:
            if not (self._remote and self.fallback_spark_config and server_gone(exc)):
                raise
            log.warning(f"the Spark Connect server {self.spark_config.get('spark.remote')} stopped answering "
                        f"during this run: it transforms again in a cold "
                        f"{self.fallback_spark_config.get('spark.master')} session "
                        f"(KCL_PIPELINE_SPARK_FALLBACK_MASTER)")
        # pyspark marks a process that built a Spark Connect session (SPARK_CONNECT_MODE_ENABLED), and a classic
        # builder in a marked process builds another Connect session: the mark goes with the dead server.
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        self._start(self.session_config(self.fallback_spark_config))
        return work(self.spark_session)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        session = self.spark_session
        if self.stop_at_teardown and self._started_here and session is not None:
            session.stop()


def spark_config(settings: PipelineSettings, python: str = sys.executable) -> dict[str, Any]:
    """The Spark settings the UI shows: secret-looking ones as `***` (deployment/redaction.py); the session
    gets their values from SparkResource.secret_spark_conf."""
    return redacted(_spark_config(settings, python))


def fallback_spark_config(settings: PipelineSettings, python: str = sys.executable) -> dict[str, Any] | None:
    """The cold session's settings for an sc:// master's runs whose server does not answer (None: no fallback
    configured), shown in the UI like spark_config."""
    if not settings.spark_fallback_master:
        return None
    return redacted(_spark_config(settings, python, settings.spark_fallback_master))


def _spark_config(settings: PipelineSettings, python: str, master: str | None = None) -> dict[str, Any]:
    from ...transform.connect import is_connect
    from ...transform.job import is_local_master, loopback_conf, spark_session_conf

    master = master or settings.spark_master
    if is_connect(master):  # Spark Connect: the server's context; session settings only
        return {"spark.remote": master,
                **{k: v for k, v in {**spark_session_conf(None), **dict(settings.spark_conf)}.items()
                   if k.startswith("spark.sql.")}}
    return {"spark.master": master, "spark.app.name": "kcl-pipeline",
            "spark.ui.enabled": "false",
            # the interpreter is pinned only for a local session (a cluster's executors bring their own)
            **spark_session_conf(python if is_local_master(master) else None),
            **loopback_conf(master),
            **dict(settings.spark_conf)}


def secret_spark_conf(settings: PipelineSettings, env: Mapping[str, str]) -> EnvVar | None:
    """KCL_PIPELINE_SPARK_CONF as an EnvVar when settings hold secret-looking Spark settings: Dagster reads
    it when the run starts and shows only the variable's name. Settings built in code with secrets have no
    variable to read them from at run time, and are refused rather than shown or dropped."""
    secrets = secret_part(settings.spark_conf)
    if not secrets:
        return None
    variable = PREFIX + "SPARK_CONF"
    try:
        given = {str(k): str(v) for k, v in json.loads(env.get(variable) or "{}").items()}
    except (ValueError, AttributeError):
        given = {}
    if secret_part(given) != secrets:
        raise ConfigError(f"the Spark settings {sorted(secrets)} look secret: give them in {variable}, which "
                          f"the run reads when it starts, so that Dagster never shows their values")
    return EnvVar(variable)


def build_resources(settings: PipelineSettings, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = env if env is not None else os.environ
    return {
        "aws": AwsResource(),
        "s3": S3Resource(),
        "pyspark": SparkResource(spark_config=spark_config(settings),
                                 fallback_spark_config=fallback_spark_config(settings),
                                 secret_spark_conf=secret_spark_conf(settings, env),
                                 aws_credentials=settings.spark_aws_credentials),
        "consumer": KinesisConsumerResource.from_settings(settings, env),
    }
