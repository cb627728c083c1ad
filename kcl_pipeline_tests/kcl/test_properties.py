"""`consume --properties FILE`: a kclpy / Java KCL properties file, as kclpy ships it, configures the consumer;
its syntax is read as Java's `Properties.load` reads it."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcl_pipeline.cli import main
from kcl_pipeline.kcl.config import ConfigError
from kcl_pipeline.kcl.core.model import AT_TIMESTAMP, LATEST
from kcl_pipeline.kcl.properties import IGNORED, MAPPED, import_properties, parse_properties, read_properties_file

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
    monkeypatch.setattr("kcl_pipeline.kcl.shells.fleet.consumer.run_consumer",
                        lambda config, spec: seen.append(config) or 0)
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
    ("streamName = a\nstreamName = b\n", "f.properties:2: streamName is set twice \\(first on line 1\\)"),
    # the line count goes by physical lines: continuations, comments and blank lines included
    ("# c\nworkerId = a\\\n  b\n\nstreamName = a\nstreamName = b\n",
     "f.properties:6: streamName is set twice \\(first on line 5\\)"),
    ("a = 1\r\nstreamName: a\rstreamName b\n", "f.properties:3: streamName is set twice \\(first on line 2\\)"),
    ("streamName = a\nworkerId = h\\u00g6\n", "f.properties:2: malformed \\\\uXXXX escape '\\\\\\\\u00g6'"),
])
def test_a_key_set_twice_or_a_malformed_escape_names_the_line(text, message):
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


# Java's Properties.load on each file (checked against Java itself below, when a JDK is on PATH).
JAVA_SYNTAX = {
    "whitespace_separator": (b"streamName kclpysample\napplicationName\tapp\nregionName\fus-east-1\n",
                             {"streamName": "kclpysample", "applicationName": "app", "regionName": "us-east-1"}),
    "colon_equals_and_a_second_separator": (b"streamName:s\napplicationName   =   app\nworkerId = = w\n",
                                            {"streamName": "s", "applicationName": "app", "workerId": "= w"}),
    "unicode_escape": (b"workerId = h\\u00f6st-\\u0031\n", {"workerId": "h\u00f6st-1"}),
    "surrogate_pair_escape": (b"workerId = \\ud83d\\ude00\n", {"workerId": "\U0001F600"}),
    "escaped_backslash": (b"workerId = a\\\\b\n", {"workerId": "a\\b"}),
    "escaped_separators_in_keys": (b"a\\=b = c\nd\\:e:f\ng\\ h i\n", {"a=b": "c", "d:e": "f", "g h": "i"}),
    "odd_backslashes_continue_the_line": (b"workerId = a\\\\\\\n    b\nstreamName = s\n",
                                          {"workerId": "a\\b", "streamName": "s"}),
    "even_backslashes_end_the_line": (b"workerId = a\\\\\nstreamName = s\n",
                                      {"workerId": "a\\", "streamName": "s"}),
    "backslash_then_spaces_is_no_continuation": (b"workerId = a\\  \nstreamName = s\n",
                                                 {"workerId": "a  ", "streamName": "s"}),
    "key_alone_has_the_empty_value": (b"workerId\nstreamName=\n", {"workerId": "", "streamName": ""}),
    "trailing_whitespace_is_kept": (b"workerId = w  \n", {"workerId": "w  "}),
    "comment_lines_never_continue": (b"  # c \\\nstreamName = s\n! c\n", {"streamName": "s"}),
    "continuation_at_the_end_of_the_file": (b"streamName = s\\", {"streamName": "s"}),
    "an_empty_line_ends_a_continued_entry": (b"workerId = a\\\n\n b\n", {"workerId": "a", "b": ""}),
    "a_continued_line_may_start_with_a_hash": (b"workerId = a\\\n  #b\n", {"workerId": "a#b"}),
    "a_blank_line_may_be_continued": (b"  \\\n  streamName = s\n", {"streamName": "s"}),
    "control_and_unknown_escapes": (b"workerId = a\\tb\\nc\\qd\n", {"workerId": "a\tb\ncqd"}),
    "crlf_and_lone_cr_line_ends": (b"streamName = s\r\napplicationName = a\rworkerId = w\n",
                                   {"streamName": "s", "applicationName": "a", "workerId": "w"}),
    "bytes_are_iso_8859_1": (b"workerId = caf\xe9\n", {"workerId": "caf\u00e9"}),
}


@pytest.mark.parametrize("name", sorted(JAVA_SYNTAX))
def test_java_syntax_is_read_as_java_reads_it(name):
    text, expected = JAVA_SYNTAX[name]
    assert parse_properties(text) == expected


# kclpy's sample as Java's Properties.load reads it.
KCLPY_SAMPLE_ENTRIES = {
    "executableName": "sample_kclpy_app.py", "streamArn": "arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample",
    "streamName": "kclpysample", "applicationName": "PythonKCLSample",
    "AwsCredentialsProvider": "DefaultCredentialsProvider", "processingLanguage": "python/3.8",
    "initialPositionInStream": "TRIM_HORIZON", "regionName": "us-east-1",
}


def test_the_sample_file_is_read_as_java_reads_it():
    assert parse_properties(KCLPY_SAMPLE.encode()) == KCLPY_SAMPLE_ENTRIES


_LOAD_PROPERTIES_JAVA = """\
import java.io.FileInputStream;
import java.io.InputStream;
import java.util.Properties;
import java.util.TreeMap;

public class LoadProperties {
    public static void main(String[] args) throws Exception {
        for (String path : args) {
            Properties properties = new Properties();
            try (InputStream in = new FileInputStream(path)) { properties.load(in); }
            StringBuilder out = new StringBuilder("{");
            for (var entry : new TreeMap<Object, Object>(properties).entrySet()) {
                if (out.length() > 1) out.append(", ");
                out.append(quote((String) entry.getKey())).append(": ").append(quote((String) entry.getValue()));
            }
            System.out.println(out.append("}"));
        }
    }

    static String quote(String text) {  // JSON, every UTF-16 unit escaped: nothing lost to a console encoding
        StringBuilder out = new StringBuilder("\\"");
        for (char c : text.toCharArray()) out.append(String.format("\\\\u%04x", (int) c));
        return out.append("\\"").toString();
    }
}
"""


def _java_reads(files: list[bytes], where: Path) -> list[dict[str, str]]:
    """What java.util.Properties.load(InputStream) — the MultiLangDaemon's reader — reads from each file."""
    (where / "LoadProperties.java").write_text(_LOAD_PROPERTIES_JAVA)
    paths = []
    for i, data in enumerate(files):
        (where / f"{i}.properties").write_bytes(data)
        paths.append(str(where / f"{i}.properties"))
    result = subprocess.run(["java", str(where / "LoadProperties.java"), *paths], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK on PATH (CI has Java 17)")
def test_the_listed_cases_and_the_sample_are_what_java_itself_reads(tmp_path):
    """The expectations above are Java's, not ours: the JDK's Properties.load reads each file."""
    cases = {name: JAVA_SYNTAX[name] for name in sorted(JAVA_SYNTAX)}
    cases["kclpy sample"] = (KCLPY_SAMPLE.encode(), KCLPY_SAMPLE_ENTRIES)
    read = _java_reads([text for text, _ in cases.values()], tmp_path)
    assert dict(zip(cases, read, strict=True)) == {name: expected for name, (_, expected) in cases.items()}


def test_a_java_syntax_file_configures_the_consumer(tmp_path, captured):
    text = (b"# Java's syntax throughout\n"
            b"streamName kclpysample\n"
            b"applicationName: Python\\u004bCL\\\n"
            b"    Sample\n"
            b"workerId = host\\=7\n"
            b"regionName = us-east-1   \n"  # trailing blanks: Java keeps them, the import trims them
            b"failoverTimeMillis 20000\n")
    path = tmp_path / "java.properties"
    path.write_bytes(text)
    result = CliRunner().invoke(main, ["consume", "--properties", str(path), "--sink", f"jsonl:{tmp_path}/out"])
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert (config.stream, config.application, config.worker_id, config.aws.region, config.lease_expiry_seconds) == \
        ("kclpysample", "PythonKCLSample", "host=7", "us-east-1", 20.0)


def test_a_key_alone_is_an_empty_value_and_refused_by_name(tmp_path, captured):
    result = _consume(tmp_path, "streamName\napplicationName = a\n")
    assert result.exit_code == 2 and "property streamName is empty" in result.output
    assert captured == []


def test_a_malformed_escape_in_the_file_is_exit_2_naming_the_file_and_line(tmp_path, captured):
    result = _consume(tmp_path, "streamName = s\napplicationName = \\u12\n")
    assert result.exit_code == 2 and "sample.properties:2: malformed \\uXXXX escape" in result.output
    assert captured == []


def test_the_file_is_read_as_iso_8859_1_as_java_reads_it(tmp_path):
    path = tmp_path / "latin1.properties"
    path.write_bytes(b"streamName = s\nworkerId = caf\xe9\n")
    assert read_properties_file(str(path)).settings["worker_id"] == "caf\u00e9"


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
