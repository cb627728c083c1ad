"""What the sensor tests share: the pipeline's two jobs over the built assets, and the resources a consumer sensor
runs with against the emulators."""
from __future__ import annotations

from dagster import AssetSelection, define_asset_job
from dagster_aws.s3 import S3Resource

from kcl_pipeline.defs.kinesis.jobs import CHECKPOINTS_JOB, WINDOW_JOB
from kcl_pipeline.defs.kinesis.resources import SPARK_RUN_TAG, AwsResource, KinesisConsumerResource


def pipeline_jobs(transformed, checkpoints) -> list:
    """The window job (transform and checkpoints, tagged as a Spark run) and the checkpoints-only job."""
    return [define_asset_job(WINDOW_JOB, selection=AssetSelection.assets(transformed, checkpoints),
                             tags={SPARK_RUN_TAG: "true"}),
            define_asset_job(CHECKPOINTS_JOB, selection=AssetSelection.assets(checkpoints))]


def sensor_resources(emulators, consumer: KinesisConsumerResource) -> dict:
    """The consumer sensor's resources: `consumer`, and S3 and AWS at the emulators."""
    return {"consumer": consumer, "s3": S3Resource(endpoint_url=emulators.s3, region_name=emulators.region),
            "aws": AwsResource(region=emulators.region, kinesis_endpoint_url=emulators.kinesis,
                               dynamodb_endpoint_url=emulators.dynamodb, s3_endpoint_url=emulators.s3,
                               cloudwatch_endpoint_url=emulators.cloudwatch)}
