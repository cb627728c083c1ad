"""Issue 20 §9 against a real (ephemeral) Dagster instance: a window re-run because batches landed in it late
is followed — its failed run is requested again, it is named stalled, and Dagster's "materialised" does not
count while its commit does not name the late batches.

Before: the sensor requested the re-run once (`reopened_requests`) and never looked again; the window showed
materialised, so nothing flagged it when the re-run failed for good, and the checkpoints stopped silently.
"""
from __future__ import annotations

from datetime import datetime, timezone

from dagster import (
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    Failure,
    MetadataValue,
    TimeWindowPartitionsDefinition,
    asset,
    define_asset_job,
    materialize,
)

from kcl_pipeline.defs.kinesis.assets import CHECKPOINTS, REOPENED, SINGLE, UNCOMMITTED
from kcl_pipeline.defs.kinesis.cursor import Cursor
from kcl_pipeline.defs.kinesis.jobs import WINDOW_JOB
from kcl_pipeline.defs.kinesis.partitions import PARTITION_FMT, partition_key, window_of
from kcl_pipeline.defs.kinesis.tick import observe_windows, read_checkpoint_report
from kcl_pipeline.landing.store import open_store
from kcl_pipeline.landing.window_followup import RunState, follow_up, reopen_run_key, track_reports
from kcl_pipeline.transform.manifest import WindowCommit, commit_key

W = 60_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % W
PARTITIONS = TimeWindowPartitionsDefinition(
    start=datetime.fromtimestamp(T0 / 1000 - 3600, tz=timezone.utc).replace(tzinfo=None),
    fmt=PARTITION_FMT, cron_schedule="* * * * *", timezone="UTC")
LATE = "s/dt=2026-11-18/hh=00/mm=00/shardId-0/1_0-2_0.parquet"


@asset(name="transformed_records", partitions_def=PARTITIONS)
def failing_transform(context) -> None:
    raise Failure("the transform failed")


@asset(name="transformed_records", partitions_def=PARTITIONS)
def good_transform(context) -> None:
    return None


def start_of(key: str) -> int:
    return window_of(PARTITIONS, key)[0]


def test_a_window_rerun_for_late_batches_whose_run_fails_is_followed_and_named(tmp_path):
    instance = DagsterInstance.ephemeral()
    output = open_store(str(tmp_path / "out"))
    output.ensure_zone(create=True)
    window, stuck = T0, T0 + W
    key = partition_key(window)
    # the window ran once (Dagster shows it materialised, its commit names what it read), then a batch landed
    assert materialize([good_transform], partition_key=key, instance=instance).success
    output.put(commit_key(window), WindowCommit(window, window + W, "run-1", frozenset({"early"})).to_json())
    instance.report_runless_asset_event(AssetMaterialization(asset_key=CHECKPOINTS, partition=key, metadata={
        REOPENED: MetadataValue.json({key: [LATE]}),
        UNCOMMITTED: MetadataValue.json([partition_key(stuck)])}))

    report = read_checkpoint_report(instance, SINGLE, start_of)
    assert report is not None and report.late == {window: [LATE]} and report.uncommitted == [stuck]
    now = T0 + 100 * W
    tracked = track_reports({}, report.late, report.uncommitted, report=str(report.storage_id),
                            reported_before_ms=T0 + 10 * W, now_ms=now, partition=partition_key)
    assert tracked.request == (window, stuck)
    assert tracked.outstanding[window].run_key(key) == reopen_run_key(key, [LATE])
    assert Cursor.parse(Cursor("w", T0 + 10 * W, None, tracked.outstanding, checkpoint_report=report.storage_id)
                        .to_json()).outstanding == tracked.outstanding

    # the re-run fails for good: Dagster still says "materialised", the follow-up does not believe it
    job = define_asset_job(WINDOW_JOB, selection=[failing_transform], partitions_def=PARTITIONS)
    resolved = Definitions(assets=[failing_transform], jobs=[job]).resolve_job_def(WINDOW_JOB)
    assert not resolved.execute_in_process(partition_key=key, instance=instance, raise_on_error=False).success
    observed = observe_windows(instance, output, tracked.outstanding)
    assert not observed[window].materialised and observed[window].run is RunState.FAILED
    decision = follow_up(tracked.outstanding, observed, now_ms=now + 10 * W, window_ms=W, overdue_ms=5 * W,
                         max_requests=3)
    assert window in decision.rerequest and window in decision.stalled
    assert decision.outstanding[window].run_key(key) != tracked.outstanding[window].run_key(key)

    # done once its commit names the late batch
    output.put(commit_key(window), WindowCommit(window, window + W, "run-2", frozenset({"early", LATE})).to_json())
    assert observe_windows(instance, output, decision.outstanding)[window].materialised
