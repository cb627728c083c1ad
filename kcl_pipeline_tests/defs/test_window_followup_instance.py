"""The sensor's follow-up of reported windows against a real (ephemeral) Dagster instance: a window whose run
failed for good is requested again under a new run key, a committed one is forgotten, an overdue one is
named as stalled."""
from __future__ import annotations

from datetime import datetime, timezone

from dagster import (
    DagsterInstance,
    Definitions,
    Failure,
    TimeWindowPartitionsDefinition,
    asset,
    define_asset_job,
    materialize,
)

from kcl_pipeline.defs.kinesis.jobs import WINDOW_JOB
from kcl_pipeline.defs.kinesis.tick import observe_windows
from kcl_pipeline.windows.followup import Outstanding, RunState, follow_up, rerun_key
from kcl_pipeline.windows.keys import PARTITION_FMT, partition_key
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.zone.store import open_store

W = 60_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % W
PARTITIONS = TimeWindowPartitionsDefinition(
    start=datetime.fromtimestamp(T0 / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
    fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC")


@asset(name="transformed_records", partitions_def=PARTITIONS)
def failing_transform(context) -> None:
    raise Failure("the transform failed")


@asset(name="transformed_records", partitions_def=PARTITIONS)
def good_transform(context) -> None:
    return None


def test_a_window_whose_run_failed_is_requested_again_and_a_materialised_one_forgotten(tmp_path):
    instance = DagsterInstance.ephemeral()
    output = open_store(str(tmp_path / "out"))
    output.ensure_zone(create=True)
    failed, done, queued = T0, T0 + W, T0 + 2 * W
    job = define_asset_job(WINDOW_JOB, selection=[failing_transform], partitions_def=PARTITIONS)
    resolved = Definitions(assets=[failing_transform], jobs=[job]).resolve_job_def(WINDOW_JOB)
    result = resolved.execute_in_process(partition_key=partition_key(failed), instance=instance,
                                         raise_on_error=False)
    assert not result.success
    assert materialize([good_transform], partition_key=partition_key(done), instance=instance).success
    output.put(commit_key(done), WindowCommit(done, done + W, "run", frozenset()).to_json())  # its commit

    outstanding = {failed: Outstanding(1), done: Outstanding(1), queued: Outstanding(1)}
    observed = observe_windows(instance, output, outstanding)
    assert observed[failed].run is RunState.FAILED and not observed[failed].materialised
    assert observed[done].materialised
    assert observed[queued].run is RunState.NONE

    decision = follow_up(outstanding, observed, now_ms=queued + W + 300_000, window_ms=W, overdue_ms=300_000,
                         max_requests=3)
    assert decision.rerequest == (failed,)
    # the cursor never forgets an unmaterialised window
    assert decision.outstanding == {failed: Outstanding(2), queued: Outstanding(1)}
    assert decision.stalled == (failed, queued)
    assert rerun_key(partition_key(failed), decision.outstanding[failed].requests) != f"window-{partition_key(failed)}"
    cursor = Cursor("w", queued + W, None, decision.outstanding)
    assert Cursor.parse(cursor.to_json()) == cursor


def test_the_stall_check_fails_naming_each_stalled_window_the_sensor_reported():
    from dagster import AssetCheckKey, AssetObservation, AssetSelection, MetadataValue

    from kcl_pipeline.defs.kinesis.assets import TRANSFORMED
    from kcl_pipeline.defs.kinesis.checks import build_checks
    from kcl_pipeline.defs.kinesis.resources import KinesisConsumerResource

    instance = DagsterInstance.ephemeral()
    stalled_check = build_checks(PARTITIONS, W)[3]
    consumer = KinesisConsumerResource(stream="s", application="a", window_minutes=1, landing_uri="/tmp/z",
                                       output_uri="/tmp/o")

    def verdict():
        result = materialize([good_transform, stalled_check], selection=AssetSelection.checks(stalled_check),
                             instance=instance, resources={"consumer": consumer})
        (evaluation,) = result.get_asset_check_evaluations()
        assert evaluation.asset_check_key == AssetCheckKey(TRANSFORMED, "windows_not_stalled")
        return evaluation

    assert verdict().passed  # nothing observed yet
    names = [partition_key(T0), partition_key(T0 + W)]
    instance.report_runless_asset_event(AssetObservation(
        asset_key=TRANSFORMED, metadata={"stalled_windows": 2, "stalled": MetadataValue.json(names)}))
    failed = verdict()
    assert not failed.passed and all(name in failed.description for name in names)
