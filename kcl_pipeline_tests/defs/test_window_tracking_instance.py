"""Issue 20 §9 against a real (ephemeral) Dagster instance: a window re-run because batches landed in it late
is followed — its failed run is requested again, it is named stalled, and Dagster's "materialised" does not
count while its commit does not name the late batches.

Before: the sensor requested the re-run once (`reopened_requests`) and never looked again; the window showed
materialised, so nothing flagged it when the re-run failed for good, and the checkpoints stopped silently.
"""
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
from kcl_pipeline.windows.checkpoints.record import CheckpointRecord, read_checkpoint_record, write_checkpoint_record
from kcl_pipeline.windows.followup import RunState, follow_up, reopen_run_key, track_reports
from kcl_pipeline.windows.keys import PARTITION_FMT, partition_key
from kcl_pipeline.windows.manifest import WindowCommit, commit_key
from kcl_pipeline.windows.tick.cursor import Cursor
from kcl_pipeline.zone.store import open_store

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


def test_a_window_rerun_for_late_batches_whose_run_fails_is_followed_and_named(tmp_path):
    instance = DagsterInstance.ephemeral()
    output = open_store(str(tmp_path / "out"))
    output.ensure_zone(create=True)
    window, stuck = T0, T0 + W
    key = partition_key(window)
    # the window ran once (Dagster shows it materialised, its commit names what it read), then a batch landed
    assert materialize([good_transform], partition_key=key, instance=instance).success
    output.put(commit_key(window), WindowCommit(window, window + W, "run-1", frozenset({"early"})).to_json())
    # the checkpoint run's record, as it stores it beside the commits
    write_checkpoint_record(output, CheckpointRecord.of_run(None, frontier={}, late={window: [LATE]},
                                                            uncommitted=[stuck], now_ms=T0 + 50 * W),
                            replaces_legacy=True)

    report = read_checkpoint_record(output)
    assert report is not None and report.late == {window: (LATE,)} and report.uncommitted == (stuck,)
    assert report.new_since(None)
    now = T0 + 100 * W
    tracked = track_reports({}, report.late, report.uncommitted, report=str(report.report),
                            reported_before_ms=T0 + 10 * W, now_ms=now, partition=partition_key)
    assert tracked.request == (window, stuck)
    assert tracked.outstanding[window].run_key(key) == reopen_run_key(key, [LATE])
    acted = Cursor.parse(Cursor("w", T0 + 10 * W, None, tracked.outstanding, checkpoint_report=report.report)
                         .to_json())
    assert acted.outstanding == tracked.outstanding and not report.new_since(acted.checkpoint_report)

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


class _Stream:
    """The parts of a stream's tick the checkpoint-record read uses."""

    def __init__(self, output) -> None:
        self.output, self.said = output, []

    def say(self, message: str) -> None:
        self.said.append(message)


def test_the_sensor_acts_on_each_stored_checkpoint_report_once_and_names_a_malformed_one(tmp_path):
    """The tick reads the checkpoint record in the output (not the materialisation metadata) and its decisions
    act on a new report once; an object that is not a record is named on the status line and nothing is asked."""
    from kcl_pipeline.defs.kinesis.tick import _checkpoint_record
    from kcl_pipeline.windows.checkpoints.record import RECORD_KEY
    from kcl_pipeline.windows.tick.decisions import SensorRules, follow_windows, start_tick

    output = open_store(str(tmp_path / "out"))
    output.ensure_zone(create=True)
    stream = _Stream(output)
    record = CheckpointRecord.of_run(None, frontier={}, late={T0: [LATE]}, uncommitted=[], now_ms=T0 + 50 * W)
    write_checkpoint_record(output, record, replaces_legacy=True)
    rules = SensorRules(window_ms=W, grace_ms=1_000, overdue_ms=300_000, max_window_requests=3,
                        max_windows_per_tick=12, partitions_start_ms=T0)

    def follow(cursor: Cursor):
        begun = start_tick(cursor, rules, None)
        return follow_windows(cursor, begun, rules, now_ms=T0 + 100 * W, observed={},
                              checkpoint_report=_checkpoint_record(stream), leases=[], shards=[])

    cursor = Cursor(next_window_ms=T0 + 10 * W, checkpoint_report=41)  # an event storage id, from before records
    followed = follow(cursor)
    assert followed.checkpoint_report == record.report
    assert [run.run_key for run in followed.runs] == [reopen_run_key(partition_key(T0), [LATE])]
    again = follow(Cursor(next_window_ms=T0 + 10 * W, checkpoint_report=followed.checkpoint_report,
                          outstanding=dict(followed.outstanding)))
    assert again.runs == ()  # the same report: nothing asked again

    output.put(RECORD_KEY, b"not json")
    assert _checkpoint_record(stream) is None
    assert f"{RECORD_KEY}: not a checkpoint record" in stream.said[-1]
