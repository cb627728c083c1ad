"""The Dagster project: definitions validate, the instance config loads, jobs/sensor/schedule are wired as meant."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    build_resources,
    build_schedule_context,
)

from kcl_pipeline.defs import build_definitions
from kcl_pipeline.defs.kinesis.resources import SPARK_POOL, SPARK_RUN_TAG, AwsResource, SparkResource, spark_config
from kcl_pipeline.deployment.home import prepare_dagster_home
from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.transform.connect import SparkUnreachable

DAGSTER = os.path.join(os.path.dirname(sys.executable), "dagster")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOW = datetime(2026, 11, 22, 3, 17, tzinfo=timezone.utc)


def validate(tmp_path, **extra_env: str) -> subprocess.CompletedProcess:
    home = prepare_dagster_home(tmp_path / "home")
    env = {**os.environ, "DAGSTER_HOME": str(home), **extra_env}
    return subprocess.run([DAGSTER, "definitions", "validate", "-m", "kcl_pipeline.definitions"],
                          capture_output=True, text=True, env=env, timeout=180, cwd=REPO_ROOT)


def test_definitions_validate(tmp_path):
    result = validate(tmp_path, KCL_PIPELINE_PROFILE="demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Validation successful for code location kcl_pipeline.definitions" in result.stdout + result.stderr


def test_the_two_host_workspace_loads_a_fleet_member_location_with_no_asset(tmp_path):
    from kcl_pipeline.defs import build_member_definitions
    from kcl_pipeline.local.demo import TWO_HOSTS_WORKSPACE_YAML

    home = prepare_dagster_home(tmp_path / "home")
    result = subprocess.run([DAGSTER, "definitions", "validate", "-w", str(TWO_HOSTS_WORKSPACE_YAML)],
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                            env={**os.environ, "DAGSTER_HOME": str(home), "KCL_PIPELINE_PROFILE": "demo"})
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "All code locations passed validation" in output, output
    assert "kcl_pipeline.fleet_member" in output
    member = build_member_definitions(PipelineSettings.from_env({"KCL_PIPELINE_PROFILE": "demo"}, now=NOW))
    # No asset (two locations defining the same assets is an invalid deployment) and no job: nothing reported.
    assert not list(member.assets or []) and not list(member.jobs or [])
    (sensor,) = member.sensors
    assert sensor.name == "kinesis_fleet_member" and sensor.default_status == DefaultSensorStatus.RUNNING
    assert sensor.required_resource_keys == {"consumer", "aws"}


def test_definitions_without_a_fixed_partitions_start_fail_to_load_with_a_clear_error(tmp_path):
    result = validate(tmp_path)
    assert result.returncode != 0
    assert "KCL_PIPELINE_PARTITIONS_START is required" in result.stdout + result.stderr


def test_definitions_validate_fails_on_a_bad_setting(tmp_path):
    result = validate(tmp_path, KCL_PIPELINE_WINDOW_MINUTES="7", KCL_PIPELINE_PARTITIONS_START="2026-11-15")
    assert result.returncode != 0
    assert "KCL_PIPELINE_WINDOW_MINUTES must divide an hour" in result.stdout + result.stderr


def test_the_instance_config(tmp_path):
    home = prepare_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        queue = instance.get_concurrency_config().run_queue_config  # what the run-queue daemon applies
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert {"key": SPARK_RUN_TAG, "limit": 1} in queue.tag_concurrency_limits and queue.max_concurrent_runs == 4
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert instance.get_settings("sensors")["use_threads"] is True
        assert instance.get_settings("backfills")["use_threads"] is True
        assert instance.get_settings("telemetry")["enabled"] is False
    assert (home / "history" / "runs.db").exists()  # SQLite, under DAGSTER_HOME


def test_a_window_run_lost_with_its_code_server_or_failed_once_is_retried(tmp_path):
    """Without these, a window run queued while the code server restarts fails for good
    (DagsterUserCodeUnreachableError), and a transform that fails once is never run again."""
    home = prepare_dagster_home(tmp_path / "home")
    with DagsterInstance.from_config(str(home)) as instance:
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_user_code_failure_retries >= 3 and queue.user_code_failure_retry_delay > 0
        assert instance.run_retries_enabled and instance.run_retries_max_retries >= 2


def test_prepare_dagster_home_needs_the_project_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="dagster.yaml"):
        prepare_dagster_home(tmp_path / "home", source=tmp_path / "missing.yaml")


@pytest.fixture(scope="module")
def defs():
    return build_definitions(PipelineSettings.from_env({"KCL_PIPELINE_PROFILE": "demo",
                                                       "KCL_PIPELINE_PARTITIONS_START": "2026-11-21"}, now=NOW))


def test_jobs_sensor_and_schedule(defs):
    window_job = defs.resolve_job_def("kinesis_window_job")
    assert set(window_job.asset_layer.selected_asset_keys) == {AssetKey("transformed_records"),
                                                               AssetKey("kinesis_checkpoints")}
    assert set(window_job.asset_layer.asset_graph.asset_check_keys) == {
        AssetCheckKey(AssetKey("landed_records"), "chain_unbroken"),
        AssetCheckKey(AssetKey("transformed_records"), "rows_reconcile"),
        AssetCheckKey(AssetKey("kinesis_checkpoints"), "checkpoint_within_materialised")}
    assert window_job.tags[SPARK_RUN_TAG] == "true"
    assert defs.resolve_assets_def("transformed_records").op.pool == SPARK_POOL  # UI-launched runs too
    backfill_job = defs.resolve_job_def("kinesis_backfill_job")
    assert set(backfill_job.asset_layer.selected_asset_keys) == {AssetKey("landed_records"),
                                                                 AssetKey("transformed_records")}
    # A backfill never commits checkpoints: neither the asset nor its check is in the job.
    assert set(backfill_job.asset_layer.asset_graph.asset_check_keys) == {
        AssetCheckKey(AssetKey("landed_records"), "chain_unbroken"),
        AssetCheckKey(AssetKey("transformed_records"), "rows_reconcile")}
    sensor = defs.resolve_sensor_def("kinesis_consumer")
    assert sensor.default_status == DefaultSensorStatus.RUNNING and sensor.minimum_interval_seconds == 20
    schedule = defs.resolve_schedule_def("backfill_previous_day")
    assert schedule.default_status == DefaultScheduleStatus.STOPPED


def test_a_backfill_does_not_hold_the_spark_run_slot_while_it_reads(defs):
    """A day's re-reads inside the single Spark run slot would hold every live window run in the queue:
    only the backfill's transform step waits, for the `spark` pool."""
    schedule = defs.resolve_schedule_def("backfill_previous_day")
    context = build_schedule_context(scheduled_execution_time=datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc))
    (request,) = schedule.evaluate_tick(context).run_requests
    backfill_job = defs.resolve_job_def("kinesis_backfill_job")
    assert SPARK_RUN_TAG not in request.tags and SPARK_RUN_TAG not in backfill_job.tags
    assert defs.resolve_assets_def("transformed_records").op.pool == SPARK_POOL
    assert defs.resolve_assets_def("landed_records").op.pool is None


def test_the_schedule_requests_yesterday_as_one_range_run(defs):
    schedule = defs.resolve_schedule_def("backfill_previous_day")
    context = build_schedule_context(scheduled_execution_time=datetime(2026, 11, 22, 1, 30, tzinfo=timezone.utc))
    (request,) = schedule.evaluate_tick(context).run_requests
    assert request.partition_key_range.start == "2026-11-21-00:00"
    assert request.partition_key_range.end == "2026-11-21-23:58"
    too_early = build_schedule_context(scheduled_execution_time=datetime(2026, 11, 21, 1, 30, tzinfo=timezone.utc))
    result = schedule.evaluate_tick(too_early)
    assert not result.run_requests and "precedes the first partition" in result.skip_message


def test_aws_resource_settings():
    assert AwsResource().settings().endpoint_urls == {}
    res = AwsResource(region="eu-west-1", endpoint_url="http://x", kinesis_endpoint_url="http://k")
    s = res.settings()
    assert (s.region, s.endpoint_for("kinesis"), s.endpoint_for("dynamodb")) == ("eu-west-1", "http://k", "http://x")


def test_spark_config_does_not_force_the_driver_python_on_a_cluster():
    s = PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": "spark://h:7077",
                                   "KCL_PIPELINE_PARTITIONS_START": "2026-11-15",
                                   "KCL_PIPELINE_SPARK_CONF": '{"spark.executor.memory": "2g"}'}, now=NOW)
    conf = spark_config(s)
    assert conf["spark.master"] == "spark://h:7077" and "spark.pyspark.python" not in conf
    assert conf["spark.executor.memory"] == "2g"
    local = spark_config(PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": "local[2]",
                                                    "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"}, now=NOW))
    assert local["spark.pyspark.python"] == sys.executable


def test_spark_config_for_spark_connect_names_the_remote_and_sends_only_session_settings():
    s = PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": "sc://h:15002",
                                   "KCL_PIPELINE_PARTITIONS_START": "2026-11-15",
                                   "KCL_PIPELINE_SPARK_CONF": '{"spark.executor.memory": "2g", '
                                                              '"spark.sql.shuffle.partitions": "64"}'}, now=NOW)
    conf = spark_config(s)
    assert conf["spark.remote"] == "sc://h:15002" and "spark.master" not in conf
    assert conf["spark.sql.shuffle.partitions"] == "64" and conf["spark.sql.session.timeZone"] == "UTC"
    assert all(k == "spark.remote" or k.startswith("spark.sql.") for k in conf)  # no context settings


class FakeSession:
    def __init__(self):
        self.stopped = False

    def stop(self):
        self.stopped = True


@pytest.mark.parametrize("existed,stop_at_teardown,stopped", [(False, True, True), (True, True, False),
                                                              (False, False, False)])
def test_spark_resource_stops_only_the_session_it_started(monkeypatch, existed, stop_at_teardown, stopped):
    import dagster_pyspark.resources
    from pyspark import SparkContext

    session = FakeSession()
    monkeypatch.setattr(dagster_pyspark.resources, "spark_session_from_config", lambda conf: session)
    monkeypatch.setattr(SparkContext, "_active_spark_context", object() if existed else None)
    with build_resources({"pyspark": SparkResource(spark_config={}, stop_at_teardown=stop_at_teardown)}) as r:
        assert r.pyspark.spark_session is session and not session.stopped
    assert session.stopped is stopped


def _unanswered_connect_url() -> str:
    """An sc:// URL on loopback where nothing listens (a port just freed)."""
    from kcl_pipeline.local.emulators import free_port

    return f"sc://127.0.0.1:{free_port()}"


def test_a_run_whose_spark_connect_server_is_gone_transforms_in_the_cold_fallback_with_one_warning(
        monkeypatch, capfd):
    import dagster_pyspark.resources

    from kcl_pipeline.defs.kinesis.resources import build_resources as pipeline_resources

    remote = _unanswered_connect_url()
    settings = PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": remote,
                                          "KCL_PIPELINE_SPARK_FALLBACK_MASTER": "local[2]",
                                          "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"}, now=NOW)
    resource = pipeline_resources(settings, env={})["pyspark"]
    assert resource.fallback_spark_config["spark.master"] == "local[2]"
    built = []
    monkeypatch.setattr(dagster_pyspark.resources, "spark_session_from_config",
                        lambda conf: built.append(conf) or FakeSession())
    with build_resources({"pyspark": resource}):
        pass
    (conf,) = built
    assert conf["spark.master"] == "local[2]" and "spark.remote" not in conf
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"  # the cold session's own settings, loopback included
    logged = capfd.readouterr().err  # the run's log (Dagster's console logger)
    warnings = [line for line in logged.splitlines() if "Spark Connect server" in line]
    assert len(warnings) == 1 and " - WARNING - " in warnings[0], logged
    assert f"the Spark Connect server {remote} is unreachable" in warnings[0]
    assert "cold local[2] session (KCL_PIPELINE_SPARK_FALLBACK_MASTER)" in warnings[0]


def test_a_run_whose_spark_connect_server_is_gone_without_a_fallback_fails_at_once_naming_the_setting(monkeypatch):
    import dagster_pyspark.resources

    remote = _unanswered_connect_url()
    monkeypatch.setattr(dagster_pyspark.resources, "spark_session_from_config",
                        lambda conf: pytest.fail("no session is built: the Connect client would retry for minutes"))
    with pytest.raises(Exception) as raised:  # Dagster's resource error, caused by ours
        with build_resources({"pyspark": SparkResource(spark_config={"spark.remote": remote})}):
            pass
    assert isinstance(raised.value.__cause__, SparkUnreachable)
    assert str(raised.value.__cause__).startswith(f"the Spark Connect server {remote} is unreachable (")
    assert "set KCL_PIPELINE_SPARK_FALLBACK_MASTER" in str(raised.value.__cause__)


def test_a_tick_refuses_a_consumer_window_unlike_the_partitions(defs):
    from dagster import build_sensor_context

    from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource

    sensor = defs.resolve_sensor_def("kinesis_consumer")
    consumer = KinesisConsumerResource(stream="s", application="a", window_minutes=5, landing_uri="/tmp/z",
                                       output_uri="/tmp/o")
    with build_sensor_context(resources={"consumer": consumer, "aws": AwsResource(), "s3": object()}) as context:
        with pytest.raises(Exception, match=r"window \(5 min\) differs from the partitions' \(2 min\)"):
            sensor(context)


def test_the_checks_that_guard_checkpoints_block_the_checkpoint_commit():
    """A failed chain or count check must stop the window run before kinesis_checkpoints commits."""
    from kcl_pipeline.defs.kinesis.checks import build_checks
    from kcl_pipeline.defs.kinesis.partitions import window_partitions

    settings = PipelineSettings.from_env({"KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
    chain, counts, within, _ = build_checks(window_partitions(settings), settings.window_ms)
    blocking = {spec.name: spec.blocking for checks in (chain, counts, within) for spec in checks.check_specs}
    assert blocking == {"chain_unbroken": True, "rows_reconcile": True, "checkpoint_within_materialised": False}


def test_a_split_child_is_not_stalled_behind_its_parents_untransformed_window():
    """Children read once the parent's last record has landed, not once SHARD_END is committed (that waits for
    the window's transform, so one failed run would stop the split for ever)."""
    from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource
    from kcl_pipeline.kcl.core.lineage import blocked_on_parents
    from kcl_pipeline.kcl.core.model import TRIM_HORIZON, Checkpoint, Lease
    from kcl_pipeline.zone.progress import ShardProgress

    consumer = KinesisConsumerResource(stream="s", application="a", window_minutes=2, landing_uri="/tmp/z",
                                       output_uri="/tmp/o")
    config = consumer.settings().consumer_config(AwsResource().settings(), "me#1", 20.0)
    drained = ShardProgress("shardId-0", shard_end_landed=True).to_attributes()
    parent = Lease(lease_key="shardId-0", checkpoint=Checkpoint(TRIM_HORIZON),
                   extra={k: v for k, v in drained.items() if v is not None})
    child = Lease(lease_key="shardId-1", checkpoint=Checkpoint(TRIM_HORIZON), parent_shard_ids=("shardId-0",))
    assert not parent.is_ended
    assert blocked_on_parents(child, {"shardId-0": parent}, config.parent_drained_attribute) == []
    assert blocked_on_parents(child, {"shardId-0": parent}, None) == ["shardId-0"]


def test_a_multi_stream_deployment_has_each_streams_assets_jobs_checks_and_schedule_under_its_prefix(tmp_path):
    settings = PipelineSettings.from_env({"KCL_PIPELINE_PROFILE": "demo", "KCL_PIPELINE_STREAM": "orders, click-stream",
                                          "KCL_PIPELINE_PARTITIONS_START": "2026-11-21"}, now=NOW)
    multi = build_definitions(settings)
    for prefix in ("orders", "click_stream"):
        window_job = multi.resolve_job_def(f"kinesis_window_job__{prefix}")
        assert set(window_job.asset_layer.selected_asset_keys) == {AssetKey([prefix, "transformed_records"]),
                                                                   AssetKey([prefix, "kinesis_checkpoints"])}
        assert set(window_job.asset_layer.asset_graph.asset_check_keys) == {
            AssetCheckKey(AssetKey([prefix, "landed_records"]), "chain_unbroken"),
            AssetCheckKey(AssetKey([prefix, "transformed_records"]), "rows_reconcile"),
            AssetCheckKey(AssetKey([prefix, "kinesis_checkpoints"]), "checkpoint_within_materialised")}
        landed = multi.resolve_assets_def(AssetKey([prefix, "landed_records"]))
        assert landed.group_names_by_key[AssetKey([prefix, "landed_records"])] == f"kinesis_{prefix}"
        assert multi.resolve_schedule_def(f"backfill_previous_day__{prefix}").job_name == \
            f"kinesis_backfill_job__{prefix}"
    # One sensor hosts the application's one lease manager and requests every stream's runs.
    sensor = multi.resolve_sensor_def("kinesis_consumer")
    assert {job.name for job in sensor.jobs} == {f"kinesis_{kind}_job__{p}" for kind in ("window", "checkpoints")
                                                 for p in ("orders", "click_stream")}
    assert multi.resources["consumer"].settings().streams == ("orders", "click-stream")


def test_a_stream_setting_with_an_empty_name_or_two_streams_sharing_a_dagster_name_fails_to_load():
    from kcl_pipeline.kcl.config import ConfigError

    for value, message in (("orders,", "has an empty name"), ("a-b,a.b", "would share the Dagster name 'a_b'"),
                           ("orders,orders", "a stream is named twice")):
        with pytest.raises(ConfigError, match=message):
            PipelineSettings.from_env({"KCL_PIPELINE_STREAM": value, "KCL_PIPELINE_PARTITIONS_START": "2026-11-21"},
                                      now=NOW)
