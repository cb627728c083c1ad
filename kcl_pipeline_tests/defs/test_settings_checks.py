"""Every setting is checked once, fully, before anything is written: each bad value found by an operator
(issue 30) is refused with one line naming the variable, and a property holds it for generated values."""
from __future__ import annotations

import posixpath
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kcl_pipeline.cli import main
from kcl_pipeline.deployment.settings import (
    KNOWN_VARIABLES,
    OTHER_VARIABLES,
    SETTINGS,
    PipelineSettings,
    _variables_model,
    check_variable_names,
)
from kcl_pipeline.deployment.streams import PipelineStream
from kcl_pipeline.kcl.config import ConfigError, check_stream
from kcl_pipeline.zone.layout import landing_directory

NOW = datetime(2026, 11, 22, 3, 17, 41, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[2]


def env(**values: str) -> dict[str, str]:
    return {"KCL_PIPELINE_PARTITIONS_START": "2026-11-15", **{f"KCL_PIPELINE_{k}": v for k, v in values.items()}}


def load(**values: str) -> PipelineSettings:
    return PipelineSettings.from_env(env(**values), now=NOW)


def test_a_misspelt_variable_is_refused_naming_the_closest_known_one():
    """KCL_PIPELINE_HOST_WORKER=true was ignored: the sensor stayed an observer."""
    with pytest.raises(ConfigError) as raised:
        load(HOST_WORKER="true")
    assert str(raised.value) == ("KCL_PIPELINE_HOST_WORKER is not a setting (did you mean "
                                 "KCL_PIPELINE_HOST_WORKERS?) (settings: docs/configuration.md)")
    with pytest.raises(ConfigError, match="KCL_PIPELINE_NONSENSE_ENTIRELY is not a setting \\(settings"):
        load(NONSENSE_ENTIRELY="1")
    with pytest.raises(ConfigError, match="kcl_pipeline_grace_second is not a setting .*KCL_PIPELINE_GRACE_SECONDS"):
        PipelineSettings.from_env({**env(), "kcl_pipeline_grace_second": "5"}, now=NOW)


def test_a_misspelt_variable_is_refused_without_pydantic_settings_and_when_blank_ignored():
    check_variable_names({"KCL_PIPELINE_TYPO": "  ", "OTHER": "x"})  # blank is unset, as for every variable
    with pytest.raises(ConfigError, match="KCL_PIPELINE_WINDOW_MINUTE is not a setting"):
        PipelineSettings.from_env({"KCL_PIPELINE_WINDOW_MINUTE": "5"}, for_partitions=False)


def test_the_known_settings_are_the_variables_model_fields():
    model, _source = _variables_model()
    assert set(SETTINGS) == set(model.model_fields)


def test_every_kcl_pipeline_variable_the_repository_names_is_known():
    """Variables the tests, CI, the demo and the docs set or name must never be refused as misspelt."""
    named = set()
    for path in REPO.rglob("*"):
        if ".git" in path.parts or ".venv" in path.parts or "node_modules" in path.parts or not path.is_file():
            continue
        if path.suffix not in (".py", ".md", ".sh", ".js", ".yaml", ".yml", ".toml", "") or path.name.startswith("."):
            continue
        named |= set(re.findall(r"KCL_PIPELINE_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    named -= {"KCL_PIPELINE_HOST_WORKER", "KCL_PIPELINE_NONSENSE_ENTIRELY", "KCL_PIPELINE_WINDOW_MINUTE",
              "KCL_PIPELINE_TYPO", "KCL_PIPELINE_RETRIVAL"}  # this file's and test_cli's misspellings
    assert named - set(KNOWN_VARIABLES) == set()
    assert set(OTHER_VARIABLES) <= named


@pytest.mark.parametrize("values,message", [
    ({"GRACE_SECONDS": "nan"}, "KCL_PIPELINE_GRACE_SECONDS must be a finite number, got nan"),
    ({"GRACE_SECONDS": "inf"}, "KCL_PIPELINE_GRACE_SECONDS must be a finite number, got inf"),
    ({"LANDING_URI": "ftp://host/landing"}, "KCL_PIPELINE_LANDING_URI must be s3://bucket/prefix, .*got 'ftp://"),
    ({"OUTPUT_URI": "ftp://host/output"}, "KCL_PIPELINE_OUTPUT_URI must be s3://bucket/prefix, .*got 'ftp://"),
    ({"LANDING_URI": "s3:///no-bucket"}, "KCL_PIPELINE_LANDING_URI must be"),
    ({"DECODER": "xml"}, "KCL_PIPELINE_DECODER must be one of json, json_spark, got 'xml'"),
    ({"SPARK_MASTER": "banana"}, "KCL_PIPELINE_SPARK_MASTER must be local, .* got 'banana'"),
    ({"SPARK_MASTER": "local[0]"}, "KCL_PIPELINE_SPARK_MASTER must be"),
    ({"SPARK_FALLBACK_MASTER": "local[*]"}, "KCL_PIPELINE_SPARK_FALLBACK_MASTER is the session a run starts when "
                                            "its Spark Connect server does not answer; it needs an sc:// "
                                            "KCL_PIPELINE_SPARK_MASTER, got 'local\\[\\*\\]'"),
    ({"SPARK_MASTER": "sc://a:15002", "SPARK_FALLBACK_MASTER": "sc://b:15002"},
     "KCL_PIPELINE_SPARK_FALLBACK_MASTER must be local, .*\\(a session the run starts itself\\), got 'sc://b:15002'"),
    ({"SPARK_MASTER": "sc://a:15002", "SPARK_FALLBACK_MASTER": "banana"}, "SPARK_FALLBACK_MASTER must be local"),
    ({"STREAM": "."}, "stream '.': a stream named '.' or '..' cannot be consumed here"),
    ({"STREAM": "orders,.."}, "stream '..': a stream named '.' or '..' cannot be consumed here"),
    ({"STREAM": "arn:aws:kinesis:eu-west-1:123456789012:stream/.."}, "a stream named '.' or '..'"),
    ({"PARTITIONS_START": "9999-12-31T23:00:00Z"}, "KCL_PIPELINE_PARTITIONS_START 9999-12-31T23:00:00\\+00:00 must "
                                                   "be from 1970-01-01 to before 9999-01-01"),
    ({"PARTITIONS_START": "9999-12-31T23:00:00-14:00"}, "PARTITIONS_START '9999-12-31T23:00:00-14:00' is out of "
                                                        "range in UTC"),
    ({"PARTITIONS_START": "0001-01-01T00:00:00+14:00"}, "is out of range in UTC"),
    ({"INITIAL_POSITION": "AT_TIMESTAMP", "INITIAL_TIMESTAMP": "9999-12-31T23:59:59-14:00"},
     "'9999-12-31T23:59:59-14:00' is out of range in UTC"),
    ({"INITIAL_POSITION": "AT_TIMESTAMP", "INITIAL_TIMESTAMP": "1960-01-01T00:00:00Z"}, "is before 1970-01-01 UTC"),
    ({"S3_EXPECTED_BUCKET_OWNER": "12345"}, "KCL_PIPELINE_S3_EXPECTED_BUCKET_OWNER must be a 12-digit AWS account "
                                            "id, got '12345'"),
    ({"S3_SSE_KMS_KEY_ID": "my key"}, "KCL_PIPELINE_S3_SSE_KMS_KEY_ID must be a KMS key id, .* got 'my key'"),
])
def test_a_bad_value_the_docs_say_stops_the_code_location_does(values, message):
    with pytest.raises(ConfigError, match=message):
        load(**values)


def test_the_s3_request_variables_load():
    """Read by every process's AwsSettings rather than PipelineSettings, they are known names, checked at load."""
    assert load(S3_EXPECTED_BUCKET_OWNER="111122223333", S3_SSE_KMS_KEY_ID="alias/zone").window_minutes == 60


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local[*,3]", "local[2,4]",
                                    "local-cluster[2,1,1024]", "yarn", "spark://h1:7077,h2:7077",
                                    "k8s://https://api:443", "sc://connect:15002"])
def test_spark_masters_spark_accepts_load(master):
    assert load(SPARK_MASTER=master).spark_master == master


def test_a_spark_connect_master_loads_with_a_cold_fallback():
    settings = load(SPARK_MASTER="sc://connect:15002", SPARK_FALLBACK_MASTER="local[*]")
    assert (settings.spark_master, settings.spark_fallback_master) == ("sc://connect:15002", "local[*]")


@pytest.mark.parametrize("uri", ["s3://bucket", "s3://bucket/prefix", "/data/zone", "relative/zone",
                                 "file:///data/zone", "memory://tests"])
def test_zone_uris_load(uri):
    assert load(LANDING_URI=uri, OUTPUT_URI=uri).landing_uri == uri


# The float settings a variable sets, and the generated values none of them may take.
FLOAT_SETTINGS = ("GRACE_SECONDS", "HEARTBEAT_SECONDS", "LEASE_EXPIRY_SECONDS")
NON_FINITE = st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "-Infinity", "1e400"])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FLOAT_SETTINGS), value=NON_FINITE)
def test_no_float_setting_is_non_finite(name, value):
    with pytest.raises(ConfigError, match=f"KCL_PIPELINE_{name} must be a finite number"):
        load(**{name: value})


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(("GRACE_SECONDS", "HEARTBEAT_SECONDS", "LEASE_EXPIRY_SECONDS", "MAX_LEASES",
                             "SENSOR_INTERVAL_SECONDS")),
       value=st.integers(max_value=-1))
def test_no_negative_number_loads(name, value):
    with pytest.raises(ConfigError):
        load(**{name: str(value)})


@settings(max_examples=100, deadline=None)
@given(scheme=st.from_regex(r"[a-z][a-z0-9+.-]{1,8}", fullmatch=True).filter(lambda s: s not in ("s3", "file",
                                                                                                  "memory")),
       rest=st.from_regex(r"[a-z0-9/._-]{0,20}", fullmatch=True), variable=st.sampled_from(("LANDING", "OUTPUT")))
def test_no_zone_of_an_unknown_scheme_loads(scheme, rest, variable):
    with pytest.raises(ConfigError, match=f"KCL_PIPELINE_{variable}_URI must be"):
        load(**{f"{variable}_URI": f"{scheme}://{rest}"})


@settings(max_examples=200, deadline=None)
@given(name=st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True))
@example(name=".")
@example(name="..")
def test_no_accepted_stream_name_leaves_the_zone_or_the_output_root(name):
    """The streams '.' and '..' wrote commits and datasets into the parent of the output directory."""
    try:
        check_stream(name)
    except ConfigError:
        assert name in (".", "..")
        return
    root = "/zone/root"
    for path in (posixpath.join(root, landing_directory(name)),
                 posixpath.join(root, landing_directory(name, f"123456789012:{name}:1")),
                 PipelineStream(name).output_uri(root)):
        normal = posixpath.normpath(path)
        assert normal.startswith(root + "/") and normal != root, (name, path)


@pytest.mark.parametrize("extra", [["--batch-seconds", "-1"], ["--batch-seconds", "nan"], ["--batch-mb", "inf"],
                                   ["--batch-mb", "0"], ["--stream", ".."]])
def test_consume_checks_everything_before_it_creates_the_local_zone(tmp_path, extra):
    """The local landing directory was created before the batch settings were checked (and --batch-mb inf
    was a traceback)."""
    zone = tmp_path / "zone"
    result = CliRunner().invoke(main, ["consume", "--stream", "s1", "--application", "app", "--landing", str(zone),
                                       "--region", "eu-west-1", "--endpoint-url", "http://127.0.0.1:9", *extra])
    assert result.exit_code == 2, result.output
    assert not zone.exists()
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error: "), result.output
    assert isinstance(result.exception, SystemExit)


def test_consume_refuses_a_misspelt_variable():
    result = CliRunner().invoke(main, ["consume", "--stream", "s1", "--application", "app", "--sink", "jsonl:/x"],
                                env={"KCL_PIPELINE_RETRIVAL": "fanout"})
    assert result.exit_code == 2
    assert result.output == ("error: KCL_PIPELINE_RETRIVAL is not a setting (did you mean KCL_PIPELINE_RETRIEVAL?) "
                             "(settings: docs/configuration.md)\n")


def test_the_code_location_fails_to_load_with_the_same_line(tmp_path):
    from .test_definitions import validate

    result = validate(tmp_path, KCL_PIPELINE_PROFILE="demo", KCL_PIPELINE_HOST_WORKER="true")
    assert result.returncode != 0
    assert ("KCL_PIPELINE_HOST_WORKER is not a setting (did you mean KCL_PIPELINE_HOST_WORKERS?)"
            in result.stdout + result.stderr)
