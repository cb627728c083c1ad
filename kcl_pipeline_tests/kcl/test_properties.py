"""`consume --properties FILE`: a kclpy / Java KCL properties file, as kclpy ships it, configures the consumer."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.config import ConfigError
from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST
from kcl_pipeline.kcl.properties import IGNORED, MAPPED, import_properties, parse_properties

# kclpy's samples/sample.properties: its keys and values as shipped (comments shortened), KCL 3.x keys commented.
KCLPY_SAMPLE = """\
# The script the MultiLangDaemon runs and talks to over STDIN and STDOUT.
executableName = sample_kclpy_app.py

# streamArn takes precedence over streamName if both are set
streamArn = arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample
streamName = kclpysample

# Names the application and its DynamoDB lease table.
applicationName = PythonKCLSample

AwsCredentialsProvider = DefaultCredentialsProvider

processingLanguage = python/3.8

initialPositionInStream = TRIM_HORIZON

#initialPositionInStreamExtended = 1636609142

regionName = us-east-1

#failoverTimeMillis = 10000
#workerId =
#shardSyncIntervalMillis = 60000
#maxRecords = 10000
#idleTimeBetweenReadsInMillis = 1000
#callProcessRecordsEvenForEmptyRecordList = false
#parentShardPollIntervalMillis = 10000
#cleanupLeasesUponShardCompletion = true
#taskBackoffTimeMillis = 500
#metricsBufferTimeMillis = 10000
#metricsMaxQueueSize = 10000
#validateSequenceNumberBeforeCheckpointing = true
#maxActiveThreads = 0

################### KclV3 configurations ###################
# clientVersionConfig =
# leaseAssignmentIntervalMillis = 20000
"""


def _uncommented(text: str) -> str:
    """The sample with its KCL 2.x options switched on (workerId given a value)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") and "=" in line and not line.startswith("# "):
            line = line[1:]
            if line.startswith("workerId"):
                line = "workerId = host-7"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
def captured(monkeypatch):
    seen = []
    monkeypatch.setattr("kcl_pipeline.kcl.shells.consumer.run_consumer", lambda config, spec: seen.append(config) or 0)
    return seen


def _consume(tmp_path, text, *flags):
    path = tmp_path / "sample.properties"
    path.write_text(text)
    return CliRunner().invoke(main, ["consume", "--properties", str(path), "--sink", f"jsonl:{tmp_path}/out",
                                     *flags])


def test_kclpy_sample_as_shipped_configures_the_consumer(tmp_path, captured):
    result = _consume(tmp_path, KCLPY_SAMPLE)
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert config.stream == "arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample"  # the ARN wins
    assert config.stream_name == "kclpysample"
    assert config.application == "PythonKCLSample" and config.lease_table == "PythonKCLSample"
    assert config.aws.region == "us-east-1"
    assert config.initial_position.kind == "TRIM_HORIZON"
    assert config.metrics_namespace == "PythonKCLSample"  # Java KCL's default namespace: the application
    assert "executableName" in result.output and "processingLanguage" in result.output  # reported as ignored


def test_every_supported_key_of_the_sample_is_mapped(tmp_path, captured):
    result = _consume(tmp_path, _uncommented(KCLPY_SAMPLE))
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert config.lease_expiry_seconds == 10.0 and config.heartbeat_seconds == pytest.approx(10.0 / 3)
    assert config.worker_id == "host-7"
    assert config.cycle_seconds == 60.0
    assert config.max_records_per_call == 10000
    assert config.polling_interval_seconds == 1.0
    assert config.metrics_interval_seconds == 10.0
    assert config.initial_position.kind == AT_TIMESTAMP
    assert config.initial_position.timestamp_ms == 1636609142 * 1000


def test_java_kcl_names_map_to_their_fields():
    imported = import_properties({"streamName": "s", "applicationName": "a", "tableName": "leases",
                                  "maxLeasesForWorker": "5", "maxLeasesToStealAtOneTime": "2",
                                  "workerIdentifier": "w1", "initialPositionInStream": "LATEST",
                                  "metricsLevel": "NONE"})
    assert imported.settings == {"stream": "s", "application": "a", "table_name": "leases", "max_leases": 5,
                                 "leases_to_acquire": 2, "worker_id": "w1",
                                 "initial_position": imported.settings["initial_position"],
                                 "metrics_namespace": None, "metrics_naming": "kcl"}
    assert imported.settings["initial_position"].kind == LATEST
    assert set(MAPPED) | IGNORED  # the tables exist; every mapped key was exercised above


def test_flags_override_the_properties_file(tmp_path, captured):
    result = _consume(tmp_path, KCLPY_SAMPLE, "--application", "other", "--region", "eu-west-1",
                      "--initial-position", "LATEST", "--metrics-namespace", "Dash")
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert (config.application, config.aws.region, config.initial_position.kind, config.metrics_namespace) == \
        ("other", "eu-west-1", "LATEST", "Dash")


def test_unknown_key_is_rejected_by_name_exit_2(tmp_path, captured):
    result = _consume(tmp_path, KCLPY_SAMPLE + "failoverTimeMilis = 20000\nclientVersionConfig = 3x\n")
    assert result.exit_code == 2
    assert "unknown properties clientVersionConfig, failoverTimeMilis" in result.output
    assert "failoverTimeMillis" in result.output  # the supported names are listed
    assert captured == []


@pytest.mark.parametrize("text, message", [
    ("streamName = a\nstreamName = b\n", "streamName is set twice"),
    ("streamName\n", "expected `key = value`"),
    ("streamName = a \\\n", "ends inside a continued line"),
])
def test_malformed_properties_name_the_line(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_properties(text, "f.properties")


@pytest.mark.parametrize("entries, message", [
    ({"failoverTimeMillis": "ten"}, "failoverTimeMillis must be a whole number"),
    ({"maxRecords": "0"}, "maxRecords must be > 0"),
    ({"AwsCredentialsProvider": "ProfileCredentialsProvider"}, "only the default provider chain"),
    ({"initialPositionInStream": "AT_TIMESTAMP"}, "needs initialPositionInStreamExtended"),
    ({"metricsLevel": "LOUD"}, "metricsLevel must be"),
])
def test_bad_values_are_clear_errors(entries, message):
    with pytest.raises(ConfigError, match=message):
        import_properties(entries)


def test_continuations_and_colons_follow_java_syntax():
    assert parse_properties("! comment\nstreamName: a\\\n  b\n") == {"streamName": "ab"}


def test_missing_file_and_missing_stream_are_exit_2(tmp_path, captured):
    result = CliRunner().invoke(main, ["consume", "--properties", str(tmp_path / "nope"), "--sink", "jsonl:/x"])
    assert result.exit_code == 2 and "cannot read properties file" in result.output
    result = _consume(tmp_path, "applicationName = a\n")
    assert result.exit_code == 2 and "--stream is required" in result.output


def test_the_worker_metrics_period_is_a_flag_and_a_negative_one_is_refused(tmp_path, captured):
    result = _consume(tmp_path, KCLPY_SAMPLE, "--worker-metrics-period-seconds", "2")
    assert result.exit_code == 0, result.output
    assert captured[0].worker_metrics_period_seconds == 2.0
    result = _consume(tmp_path, KCLPY_SAMPLE, "--worker-metrics-period-seconds", "-1")
    assert result.exit_code == 2 and "worker_metrics_period_seconds must be >= 0" in result.output
