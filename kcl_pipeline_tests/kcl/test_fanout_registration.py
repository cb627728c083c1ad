"""Enhanced fan-out's stream consumer: one per application, named after it, reused when it exists, registered
when it does not, waited for until ACTIVE; every refusal is a clear error or a wait, never a silent loop. And
the retrieval setting from every place it is read (ConsumerConfig, `consume --retrieval`, KCL_PIPELINE_RETRIEVAL)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.config import FANOUT, POLLING, ConfigError, ConsumerConfig
from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint
from kcl_pipeline.kcl.shells.aws import boto3_session
from kcl_pipeline.kcl.shells.read.fanout import (
    FanOutError,
    FanOutReader,
    StreamConsumer,
    consumer_name,
    deregister_consumer,
    ensure_consumer,
)
from kcl_pipeline.kcl.shells.read.reader import ShardReader
from kcl_pipeline.kcl.shells.read.retrieval import open_reader
from kcl_pipeline.kcl.shells.shards import StreamNotFound, wait_stream_active
from kcl_pipeline_tests.fanout_endpoint import FanOutEndpoint

STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"


def _error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"scripted {code}"}, "ResponseMetadata":
                        {"HTTPStatusCode": 400}}, operation)


class ScriptedKinesis:
    """Answers DescribeStreamConsumer and RegisterStreamConsumer from scripts: a status, None (not found), or an
    error code to raise. The last answer of a script repeats."""

    meta = SimpleNamespace(endpoint_url="http://scripted", region_name="us-east-1")

    def __init__(self, describe: list, register: list | None = None):
        self.describe, self.register = list(describe), list(register or ["CREATING"])
        self.registered = 0

    @staticmethod
    def _next(script: list):
        return script.pop(0) if len(script) > 1 else script[0]

    def describe_stream_consumer(self, StreamARN, ConsumerName):  # noqa: N803 - boto3's names
        answer = self._next(self.describe)
        if answer is None:
            raise _error("ResourceNotFoundException", "DescribeStreamConsumer")
        if answer.endswith("Exception"):
            raise _error(answer, "DescribeStreamConsumer")
        return {"ConsumerDescription": {"ConsumerName": ConsumerName, "ConsumerARN": f"{StreamARN}/consumer/"
                                        f"{ConsumerName}:1", "ConsumerStatus": answer, "StreamARN": StreamARN}}

    def register_stream_consumer(self, StreamARN, ConsumerName):  # noqa: N803
        answer = self._next(self.register)
        if answer.endswith("Exception"):
            raise _error(answer, "RegisterStreamConsumer")
        self.registered += 1
        return {"Consumer": {"ConsumerName": ConsumerName, "ConsumerARN": f"{StreamARN}/consumer/{ConsumerName}:2",
                             "ConsumerStatus": answer}}


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _ensure(kinesis, clock: Clock, **kwargs) -> StreamConsumer:
    return ensure_consumer(kinesis, STREAM_ARN, "app", sleep=clock.sleep, monotonic=clock.monotonic, **kwargs)


@pytest.mark.core
def test_the_consumer_is_named_after_the_application():
    assert consumer_name("orders-pipeline") == "orders-pipeline"
    with pytest.raises(FanOutError, match="1-128 characters"):
        consumer_name("a" * 129)


@pytest.mark.core
def test_an_active_consumer_is_reused_without_registering():
    kinesis, clock = ScriptedKinesis(["ACTIVE"]), Clock()
    consumer = _ensure(kinesis, clock)
    assert consumer.status == "ACTIVE" and consumer.name == "app" and kinesis.registered == 0 and clock.sleeps == []


@pytest.mark.core
def test_a_consumer_still_creating_is_waited_for_until_active():
    kinesis, clock = ScriptedKinesis([None, "CREATING", "CREATING", "ACTIVE"]), Clock()
    assert _ensure(kinesis, clock).status == "ACTIVE"
    assert kinesis.registered == 1 and clock.sleeps == [1.0, 1.0, 1.0]


@pytest.mark.core
def test_a_peer_registering_at_the_same_moment_is_waited_for_not_an_error():
    kinesis, clock = ScriptedKinesis([None, "CREATING", "ACTIVE"], register=["ResourceInUseException"]), Clock()
    assert _ensure(kinesis, clock).status == "ACTIVE"
    assert kinesis.registered == 0


@pytest.mark.core
def test_a_consumer_being_deleted_is_registered_again_once_gone():
    kinesis, clock = ScriptedKinesis(["DELETING", "DELETING", None, "ACTIVE"]), Clock()
    consumer = _ensure(kinesis, clock)
    assert consumer.status == "ACTIVE" and kinesis.registered == 1


@pytest.mark.core
def test_a_consumer_never_active_is_an_error_after_the_timeout_not_an_endless_wait():
    kinesis, clock = ScriptedKinesis(["CREATING"]), Clock()
    with pytest.raises(FanOutError, match="still CREATING after 10 s"):
        _ensure(kinesis, clock, timeout=10)
    assert 10 <= clock.now <= 11


@pytest.mark.core
@pytest.mark.parametrize("code", ["AccessDeniedException", "InvalidArgumentException"])
def test_a_registration_refused_otherwise_is_an_error_naming_the_consumer(code):
    kinesis, clock = ScriptedKinesis([None], register=[code]), Clock()
    with pytest.raises(FanOutError, match=f"RegisterStreamConsumer of stream consumer app on {STREAM_ARN}.*{code}"):
        _ensure(kinesis, clock)


@pytest.mark.core
def test_a_describe_refused_is_an_error_not_a_registration():
    kinesis, clock = ScriptedKinesis(["AccessDeniedException"]), Clock()
    with pytest.raises(FanOutError, match="DescribeStreamConsumer.*AccessDeniedException"):
        _ensure(kinesis, clock)
    assert kinesis.registered == 0


@pytest.mark.core
def test_a_stop_while_waiting_for_the_consumer_is_an_empty_poll_not_a_failure():
    kinesis = ScriptedKinesis(["CREATING"])
    now = [0.0]
    reader = FanOutReader(kinesis, STREAM_ARN, "shardId-000000000000", Checkpoint(TRIM_HORIZON), consumer="app",
                          sleep=lambda _s: None, monotonic=lambda: now[0])  # a stop cuts every sleep short
    batch = reader.poll()
    assert batch.records == [] and batch.millis_behind_latest is None and not batch.shard_ended
    assert reader.stats.subscriptions == 0


# -- against the endpoint (kinesis-local's consumers) ----------------------------------------------------

@pytest.fixture
def fanout(emulators):
    endpoint = FanOutEndpoint(emulators.kinesis).start()
    yield endpoint
    endpoint.stop()


@pytest.fixture
def stream_arn(kinesis_client, unique_name) -> str:
    name = unique_name("reg")
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    return wait_stream_active(kinesis_client, name)["StreamARN"]


def _once(url: str, region: str):
    return boto3_session().client("kinesis", endpoint_url=url, config=Config(
        region_name=region, retries={"mode": "standard", "total_max_attempts": 1}))


def test_one_consumer_per_application_registered_once_and_reused(emulators, fanout, kinesis_client, stream_arn):
    kinesis = _once(fanout.url, emulators.region)
    first = ensure_consumer(kinesis, stream_arn.rpartition("/")[2], consumer_name("orders-app"))
    again = ensure_consumer(kinesis, stream_arn, "orders-app")
    assert first.arn == again.arn and again.status == "ACTIVE" and first.name == "orders-app"
    assert fanout.counts["RegisterStreamConsumer"] == 1
    listed = kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"]
    assert [c["ConsumerName"] for c in listed] == ["orders-app"]
    assert deregister_consumer(kinesis, stream_arn, "orders-app") is True
    assert deregister_consumer(kinesis, stream_arn, "orders-app") is False


def test_too_many_consumers_is_an_error_naming_the_streams_consumers(emulators, fanout, kinesis_client, stream_arn):
    for other in ("etl", "audit"):
        kinesis_client.register_stream_consumer(StreamARN=stream_arn, ConsumerName=other)
    fanout.fail_operation("RegisterStreamConsumer", "LimitExceededException", times=None)
    with pytest.raises(FanOutError, match=r"at most 20 consumers \(this one has 2: (etl, audit|audit, etl)\)"):
        ensure_consumer(_once(fanout.url, emulators.region), stream_arn, "orders-app")


def test_a_missing_stream_is_stream_not_found_not_a_registration(emulators, fanout, unique_name):
    with pytest.raises(StreamNotFound, match="does not exist"):
        ensure_consumer(_once(fanout.url, emulators.region), unique_name("gone"), "orders-app")
    assert fanout.counts["RegisterStreamConsumer"] == 0


# -- the setting ------------------------------------------------------------------------------------------

@pytest.mark.core
def test_retrieval_defaults_to_polling_and_chooses_the_reader():
    polling = ConsumerConfig("s", "app")
    assert polling.retrieval == POLLING
    fanout = polling.with_(retrieval=FANOUT)
    start = Checkpoint(TRIM_HORIZON)
    assert isinstance(open_reader(polling, ScriptedKinesis(["ACTIVE"]), "s", "shardId-0", start, kpl_stats=None,
                                  sleep=lambda _s: None), ShardReader)
    reader = open_reader(fanout, ScriptedKinesis(["ACTIVE"]), "s", "shardId-0", start, kpl_stats=None,
                         sleep=lambda _s: None)
    assert isinstance(reader, FanOutReader) and reader.consumer_name == "app"
    assert reader.event_wait == fanout.idle_interval_seconds


@pytest.mark.core
@pytest.mark.parametrize("changes, message", [
    ({"retrieval": "push"}, "retrieval must be one of polling, fanout, got 'push'"),
    ({"retrieval": FANOUT, "application": "a" * 129}, "at most 128 characters: application"),
])
def test_a_bad_retrieval_setting_is_a_clear_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        ConsumerConfig(**{"stream": "s", "application": "app", **changes})


@pytest.mark.core
@pytest.mark.parametrize("args, env, expected", [
    ([], {}, POLLING),
    (["--retrieval", "fanout"], {}, FANOUT),
    ([], {"KCL_PIPELINE_RETRIEVAL": "fanout"}, FANOUT),
    (["--retrieval", "polling"], {"KCL_PIPELINE_RETRIEVAL": "fanout"}, POLLING),
])
def test_consume_reads_the_retrieval_from_its_flag_or_the_environment(captured_config, tmp_path, args, env, expected):
    result = CliRunner().invoke(main, ["consume", "--sink", f"jsonl:{tmp_path}", "--region", "eu-west-1", "--stream",
                                       "s", "--application", "a", *args], env=env)
    assert result.exit_code == 0, result.output
    assert captured_config[0].retrieval == expected


@pytest.mark.core
def test_consume_refuses_an_unknown_retrieval(tmp_path):
    result = CliRunner().invoke(main, ["consume", "--sink", f"jsonl:{tmp_path}", "--stream", "s", "--application",
                                       "a", "--retrieval", "push"])
    assert result.exit_code == 2 and "'push' is not one of 'polling', 'fanout'" in result.output


def test_the_deployments_retrieval_reaches_its_hosted_workers():
    pytest.importorskip("dagster")
    from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
    from kcl_pipeline.deployment.settings import PipelineSettings

    start = {"KCL_PIPELINE_PARTITIONS_START": "2026-11-15"}
    assert PipelineSettings.from_env(start).retrieval == POLLING
    settings = PipelineSettings.from_env({**start, "KCL_PIPELINE_RETRIEVAL": "FanOut"})
    config = KinesisConsumerResource.from_settings(settings).settings().consumer_config(AwsSettings(), "w", 20.0)
    assert config.retrieval == FANOUT
    with pytest.raises(ConfigError, match="KCL_PIPELINE_RETRIEVAL must be 'polling' or 'fanout', got 'push'"):
        PipelineSettings.from_env({**start, "KCL_PIPELINE_RETRIEVAL": "push"})
