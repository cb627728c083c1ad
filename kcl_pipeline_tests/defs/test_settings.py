"""Settings from the environment, window partitions, the schedule's day, the cursor: table-driven, no I/O."""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest

from kcl_pipeline.defs.kinesis.partitions import window_cron, window_of, window_partitions
from kcl_pipeline.defs.kinesis.schedules import previous_day_keys
from kcl_pipeline.defs.kinesis.sensors import Cursor, CursorError
from kcl_pipeline.deployment.settings import PipelineSettings, check_window_minutes
from kcl_pipeline.kcl.config import ConfigError
from kcl_pipeline.windows.keys import partition_key

NOW = datetime(2026, 11, 22, 3, 17, 41, tzinfo=timezone.utc)


def env(**values: str) -> dict[str, str]:
    return {f"KCL_PIPELINE_{k}": v for k, v in values.items()}


def test_defaults():
    s = PipelineSettings.from_env(env(PARTITIONS_START="2026-11-15"), now=NOW)
    assert (s.stream, s.application, s.window_minutes, s.initial_position) == \
        ("kcl-pipeline-demo", "kcl-pipeline", 60, "TRIM_HORIZON")
    assert s.partitions_start == datetime(2026, 11, 15, tzinfo=timezone.utc)
    assert (s.create_zones, s.sensor_interval_seconds, s.keepalive_seconds) == (False, 20, 60.0)
    assert s.landing_uri.startswith("s3://") and s.spark_master == "local[*]" and s.worker_id is None
    assert s.landing_reader == "auto"
    assert PipelineSettings.from_env(env(PARTITIONS_START="2026-11-15", LANDING_READER="Native"),
                                     now=NOW).landing_reader == "native"


def test_demo_profile_and_overrides():
    s = PipelineSettings.from_env(env(PROFILE="demo"), now=NOW)
    assert (s.window_minutes, s.create_zones) == (2, True)
    assert s.partitions_start == datetime(2026, 11, 22, 3, 16, tzinfo=timezone.utc)  # the current 2-min window
    s = PipelineSettings.from_env(env(PROFILE="demo", WINDOW_MINUTES="5", CREATE_ZONES="no", STREAM="orders",
                                      PARTITIONS_START="2026-11-22T03:00:00Z", INITIAL_POSITION="at_timestamp",
                                      INITIAL_TIMESTAMP="2026-11-22T03:00:00Z", SPARK_CONF='{"spark.x": 1}',
                                      WORKER_ID="me", LANDING_URI="/data/zone"), now=NOW)
    assert (s.window_minutes, s.create_zones, s.stream, s.initial_position, s.worker_id) == \
        (5, False, "orders", "AT_TIMESTAMP", "me")
    assert s.partitions_start == datetime(2026, 11, 22, 3, tzinfo=timezone.utc)
    assert s.spark_conf == {"spark.x": "1"} and s.landing_uri == "/data/zone"


def test_the_partitions_start_is_required_outside_the_demo_and_never_moves_with_the_clock():
    with pytest.raises(ConfigError, match="KCL_PIPELINE_PARTITIONS_START is required"):
        PipelineSettings.from_env({}, now=NOW)
    fixed = env(PARTITIONS_START="2026-11-20T00:00:00Z")
    later = datetime(2026, 11, 29, 3, 17, tzinfo=timezone.utc)
    assert PipelineSettings.from_env(fixed, now=NOW).partitions_start == \
        PipelineSettings.from_env(fixed, now=later).partitions_start == datetime(2026, 11, 20, tzinfo=timezone.utc)


# One bad value each: the message names the variable, the value given and what was expected.
@pytest.mark.parametrize("values,message", [
    (env(PROFILE="prod"), "KCL_PIPELINE_PROFILE must be 'default' or 'demo', got 'prod'"),
    (env(WINDOW_MINUTES="two"), "KCL_PIPELINE_WINDOW_MINUTES must be a whole number, got 'two'"),
    (env(WINDOW_MINUTES="1.5"), "KCL_PIPELINE_WINDOW_MINUTES must be a whole number, got '1.5'"),
    (env(CREATE_ZONES="maybe"),
     "KCL_PIPELINE_CREATE_ZONES must be true or false \\(or 1/0, yes/no, on/off\\), got 'maybe'"),
    (env(HOST_WORKERS="2"), "KCL_PIPELINE_HOST_WORKERS must be true or false .*, got '2'"),
    (env(SENSOR_INTERVAL_SECONDS="20s"), "KCL_PIPELINE_SENSOR_INTERVAL_SECONDS must be a whole number, got '20s'"),
    (env(HEARTBEAT_SECONDS="fast"), "KCL_PIPELINE_HEARTBEAT_SECONDS must be a number, got 'fast'"),
    (env(LEASE_EXPIRY_SECONDS="10 s"), "KCL_PIPELINE_LEASE_EXPIRY_SECONDS must be a number, got '10 s'"),
    (env(MAX_LEASES="all"), "KCL_PIPELINE_MAX_LEASES must be a whole number, got 'all'"),
    (env(GRACE_SECONDS="none"), "KCL_PIPELINE_GRACE_SECONDS must be a number, got 'none'"),
    (env(INITIAL_POSITION="EARLIEST"),
     "KCL_PIPELINE_INITIAL_POSITION must be 'TRIM_HORIZON', 'LATEST' or 'AT_TIMESTAMP', got 'EARLIEST'"),
    (env(METRICS_NAMING="java"), "KCL_PIPELINE_METRICS_NAMING must be 'pipeline' or 'kcl', got 'java'"),
    (env(LANDING_READER="s3a"),
     "KCL_PIPELINE_LANDING_READER must be 'auto', 'native' or 'datasource', got 's3a'"),
    (env(SPARK_CONF="[1]"), "KCL_PIPELINE_SPARK_CONF must be a JSON object, got '\\[1\\]'"),
    (env(SPARK_CONF="{"), "KCL_PIPELINE_SPARK_CONF must be a JSON object \\(not JSON: EOF while parsing .*\\), "
                          "got '{'"),
    (env(PARTITIONS_START="yesterday"), "KCL_PIPELINE_PARTITIONS_START 'yesterday' is not an ISO 8601"),
    (env(STREAM="a,,b"), "KCL_PIPELINE_STREAM 'a,,b' has an empty name"),
    # cross-field and range checks, after the types
    (env(WINDOW_MINUTES="7"), "WINDOW_MINUTES must divide an hour"),
    (env(WINDOW_MINUTES="90"), "WINDOW_MINUTES must divide an hour"),
    (env(WINDOW_MINUTES="300"), "WINDOW_MINUTES must divide an hour"),
    (env(PARTITIONS_START="2026-11-22T03:30:00Z"), "not on a 60-minute window boundary"),
    (env(WINDOW_MINUTES="1", PARTITIONS_START="2026-01-01"), "exceed Dagster's 100000 per asset"),
    (env(INITIAL_POSITION="AT_TIMESTAMP"), "AT_TIMESTAMP needs --timestamp"),
    (env(SENSOR_INTERVAL_SECONDS="2"), "SENSOR_INTERVAL_SECONDS must be >= 5"),
    (env(HEARTBEAT_SECONDS="20"), "at least twice heartbeat_seconds"),
    (env(STREAM="bad name!"), "stream 'bad name!' must be"),
    (env(GRACE_SECONDS="-1"), "GRACE_SECONDS must be >= 0"),
])
def test_bad_settings_say_what_is_wrong(values, message):
    with pytest.raises(ConfigError, match=message):
        PipelineSettings.from_env({**env(PARTITIONS_START="2026-11-15"), **values}, now=NOW)


def test_every_bad_value_is_reported_at_once():
    with pytest.raises(ConfigError) as raised:
        PipelineSettings.from_env(env(PARTITIONS_START="2026-11-15", WINDOW_MINUTES="x", CREATE_ZONES="z"), now=NOW)
    assert str(raised.value) == ("KCL_PIPELINE_WINDOW_MINUTES must be a whole number, got 'x'; "
                                 "KCL_PIPELINE_CREATE_ZONES must be true or false (or 1/0, yes/no, on/off), got 'z'")


def test_a_demo_window_that_tiles_nothing_is_refused_before_the_current_window_is_computed():
    with pytest.raises(ConfigError, match="WINDOW_MINUTES must divide an hour .* got 0"):
        PipelineSettings.from_env(env(PROFILE="demo", WINDOW_MINUTES="0"), now=NOW)


def test_blank_variables_are_unset_and_values_are_read_trimmed():
    s = PipelineSettings.from_env(env(PARTITIONS_START=" 2026-11-15 ", WINDOW_MINUTES="  ", CREATE_ZONES="",
                                      STREAM=" orders , clicks ", MAX_LEASES=" 7 ", PROFILE=" "), now=NOW)
    assert (s.window_minutes, s.create_zones, s.streams, s.max_leases) == (60, False, ("orders", "clicks"), 7)


def test_choices_and_booleans_are_read_in_any_case():
    s = PipelineSettings.from_env(env(PROFILE="Demo", INITIAL_POSITION="latest", METRICS_NAMING="KCL",
                                      LANDING_READER="DataSource", CREATE_ZONES="Off", HOST_WORKERS="0"), now=NOW)
    assert (s.initial_position, s.metrics_naming, s.landing_reader, s.create_zones, s.host_workers) == \
        ("LATEST", "kcl", "datasource", False, False)
    assert s.window_minutes == 2  # the demo's default, the other two overridden


def test_variables_other_parts_of_the_project_read_are_known_and_not_refused():
    s = PipelineSettings.from_env(env(PARTITIONS_START="2026-11-15", NODE_MODULES="/x", PARENT_PID="1"), now=NOW)
    assert s.window_minutes == 60


@pytest.mark.parametrize("minutes,ok", [(1, True), (2, True), (7, False), (15, True), (30, True), (45, False),
                                        (60, True), (120, True), (180, True), (300, False), (720, True),
                                        (1440, True), (0, False)])
def test_window_minutes(minutes, ok):
    if ok:
        check_window_minutes(minutes)
    else:
        with pytest.raises(ConfigError):
            check_window_minutes(minutes)


@pytest.mark.parametrize("minutes,cron", [(1, "* * * * *"), (2, "*/2 * * * *"), (60, "0 * * * *"),
                                          (180, "0 */3 * * *"), (1440, "0 0 * * *")])
def test_window_cron(minutes, cron):
    assert window_cron(minutes) == cron


@pytest.mark.parametrize("minutes", [2, 15, 60, 180])
def test_partitions_are_epoch_aligned_windows(minutes):
    s = PipelineSettings.from_env(env(WINDOW_MINUTES=str(minutes), PARTITIONS_START="2026-11-21"), now=NOW)
    pd = window_partitions(s)
    keys = pd.get_partition_keys(current_time=NOW)
    assert len(keys) == s.partition_count(NOW)
    for key in (keys[0], keys[len(keys) // 2], keys[-1]):
        t0, t1 = window_of(pd, key)
        assert t1 - t0 == s.window_ms and t0 % s.window_ms == 0
        assert partition_key(t0) == key
    assert window_of(pd, keys[-1])[1] <= NOW.timestamp() * 1000  # only windows that have ended


@pytest.mark.parametrize("minutes", [2, 60, 180])
def test_the_backfill_names_windows_by_the_pipelines_own_partition_keys(minutes):
    """The CLI's backfill asks the webserver for keys: a format of its own would name partitions that do not exist."""
    from kcl_pipeline.local.dagster_client import window_keys

    s = PipelineSettings.from_env(env(WINDOW_MINUTES=str(minutes), PARTITIONS_START="2026-11-21"), now=NOW)
    keys = window_partitions(s).get_partition_keys(current_time=NOW)[3:9]
    start, end = window_of(window_partitions(s), keys[0])[0], window_of(window_partitions(s), keys[-1])[1]
    assert window_keys(start, end, s.window_ms) == keys


def test_the_backfill_names_its_windows_without_dagster_installed():
    result = _run_python("import sys; sys.modules['dagster'] = None\n"
                         "from kcl_pipeline.local.dagster_client import window_keys\n"
                         "print(window_keys(0, 3 * 3_600_000, 3_600_000))\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['1970-01-01-00:00', '1970-01-01-01:00', '1970-01-01-02:00']"


@pytest.mark.parametrize("scheduled,window,start,expected", [
    (datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc), 60, "2026-11-01", ("2026-11-21-00:00", "2026-11-21-23:00")),
    (datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc), 2, "2026-11-01", ("2026-11-21-00:00", "2026-11-21-23:58")),
    (datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc), 60, "2026-11-21T06:00", ("2026-11-21-06:00",
                                                                                 "2026-11-21-23:00")),
    (datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc), 60, "2026-11-22", None),
])
def test_previous_day_keys(scheduled, window, start, expected):
    start_ms = int(datetime.fromisoformat(start).replace(tzinfo=timezone.utc).timestamp() * 1000)
    assert previous_day_keys(scheduled, window * 60_000, start_ms) == expected


@pytest.mark.parametrize("text,cursor", [
    (None, Cursor()),
    ("", Cursor()),
    ('{"v": 1, "worker_id": "w", "next_window_ms": 120000, "observed_at_ms": null}', Cursor("w", 120000)),
    # a multi-stream deployment: each stream's windows under its prefix
    ('{"v": 1, "worker_id": "w", "streams": {"orders": {"v": 1, "next_window_ms": 60000, "outstanding": {"0": 2}},'
     ' "clicks": {"v": 1, "next_window_ms": null}}}',
     Cursor("w", streams={"orders": Cursor(next_window_ms=60000, outstanding={0: 2}), "clicks": Cursor()})),
])
def test_cursor_round_trip(text, cursor):
    assert Cursor.parse(text) == cursor
    assert Cursor.parse(cursor.to_json()) == cursor


@pytest.mark.parametrize("text", ["not json", "[1]", '{"v": 2}', '{"v": 1, "next_window_ms": "soon"}',
                                  '{"v": 1, "worker_id": 5}', '{"v": 1, "next_window_ms": true}',
                                  '{"v": 1, "streams": [1]}', '{"v": 1, "streams": {"a": {"next_window_ms": "x"}}}'])
def test_a_foreign_cursor_is_a_clear_error(text):
    with pytest.raises(CursorError, match="clear the cursor"):
        Cursor.parse(text)


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_without_pydantic_settings_a_set_variable_is_a_clear_error_and_the_module_still_loads():
    """A core install has no pydantic-settings: the CLI's audit names the extra rather than a traceback."""
    result = _run_python(
        "import sys; sys.modules['pydantic_settings'] = None\n"
        "from kcl_pipeline.deployment.settings import PipelineSettings, check_window_minutes\n"
        "check_window_minutes(60)\n"
        "from kcl_pipeline.kcl.config import ConfigError\n"
        "try:\n"
        "    PipelineSettings.from_env({'KCL_PIPELINE_STREAM': 'orders'}, for_partitions=False)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("reading the KCL_PIPELINE_* variables needs pydantic-settings: "
                                     "pip install 'kcl_pipeline[dagster]' (or pydantic-settings alone)")


def test_a_core_install_without_pydantic_settings_reads_the_defaults_when_no_variable_is_set():
    """`kcl-pipeline audit` / `backfill` with every flag given must not need the [dagster] extra."""
    result = _run_python(
        "import sys; sys.modules['pydantic_settings'] = None; sys.modules['pydantic'] = None\n"
        "from kcl_pipeline.deployment.settings import PipelineSettings\n"
        "s = PipelineSettings.from_env({'KCL_PIPELINE_STREAM': '  ', 'HOME': '/x'}, for_partitions=False)\n"
        "print(s.window_minutes == PipelineSettings.window_minutes)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_the_deployment_settings_and_stream_names_are_readable_without_dagster_installed():
    """The CLI's audit and verify read the deployment's settings on a core install (no Dagster)."""
    code = ("import sys; sys.modules['dagster'] = None\n"
            "from kcl_pipeline.deployment.settings import PipelineSettings\n"
            "from kcl_pipeline.deployment.streams import PipelineStream\n"
            "s = PipelineSettings.from_env({'KCL_PIPELINE_STREAM': 'a,b-c'}, for_partitions=False)\n"
            "print(s.streams, PipelineStream(s.streams[1]).output_uri('s3://x/out'))\n")
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "('a', 'b-c') s3://x/out/b-c"
