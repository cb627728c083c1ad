"""Each stream's jobs: the window run the sensor requests for a complete window (transform, then checkpoints),
the checkpoints-only run it requests when shards must be ended, and the backfill the daily schedule runs."""
from __future__ import annotations

from dagster import AssetChecksDefinition, AssetSelection, TimeWindowPartitionsDefinition, define_asset_job

from ...deployment.streams import PipelineStream
from .assets import CHECKPOINTS, LANDED, TRANSFORMED
from .resources import SPARK_RUN_TAG

WINDOW_JOB = "kinesis_window_job"
CHECKPOINTS_JOB = "kinesis_checkpoints_job"
BACKFILL_JOB = "kinesis_backfill_job"
SHARD_END_TAG = "kcl_pipeline/shard_end"  # a checkpoints run's tag: the shards whose end it was requested for


def window_job(partitions_def: TimeWindowPartitionsDefinition, target: PipelineStream, chain: AssetChecksDefinition,
               stalled: AssetChecksDefinition):
    return define_asset_job(
        # windows_not_stalled is the sensor's verdict (evaluated by the sensor), not a window run's step.
        target.job(WINDOW_JOB),
        selection=(AssetSelection.assets(target.key(TRANSFORMED), target.key(CHECKPOINTS))
                   | AssetSelection.checks(chain)) - AssetSelection.checks(stalled),
        partitions_def=partitions_def, tags={SPARK_RUN_TAG: "true"},
        description=target.about("Transform a window the kinesis_consumer sensor reported complete, then commit its "
                                 "checkpoints."))


def checkpoints_job(partitions_def: TimeWindowPartitionsDefinition, target: PipelineStream):
    return define_asset_job(
        target.job(CHECKPOINTS_JOB), selection=AssetSelection.assets(target.key(CHECKPOINTS)),
        partitions_def=partitions_def,
        description=target.about("Apply the checkpoint plan alone (the sensor runs it when a shard's last record has "
                                 "landed, so the shard is ended and its children's leases are created)."))


def backfill_job(partitions_def: TimeWindowPartitionsDefinition, target: PipelineStream,
                 stalled: AssetChecksDefinition):
    return define_asset_job(
        target.job(BACKFILL_JOB),
        selection=AssetSelection.assets(target.key(LANDED), target.key(TRANSFORMED)) - AssetSelection.checks(stalled),
        partitions_def=partitions_def,
        # No Spark run tag: the re-reads run beside the live window runs; only the transform step waits for
        # the `spark` pool's slot.
        description=target.about("Re-land windows from Kinesis (bounded re-reads) and transform them; checkpoints "
                                 "untouched."))
