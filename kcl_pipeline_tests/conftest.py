"""Shared fixtures: one local emulator stack per test session, over HTTP on 127.0.0.1.

- `emulators` (session): kinesis-local, dynalite, and a moto server for S3 and CloudWatch → `Endpoints`.
- `moto_endpoints` (session): the same moto server used for every service (DynamoDB second opinion;
  Kinesis volume without resharding: moto mishandles Kinesis resharding).
- `aws_settings`, `kinesis_client`, `dynamodb_client`, `s3_client`, `cloudwatch_client`: built with
  kcl/aws.py `client()` against `emulators`.
- `any_dynamodb_client` (parametrized): dynalite and moto's DynamoDB, for tests that must pass on both.
- `unique_name(prefix)`: a fresh stream / table / bucket name, so tests share the stack without clashing.

Tests that use any of these are marked `emulator` automatically (deselect with `-m "not emulator"`).
"""
from __future__ import annotations

import importlib.util
import os
import uuid
from typing import Callable

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.local.emulators import EmulatorStack, Endpoints

# The SDK refuses to sign without credentials; the emulators accept any. Never let a test reach real AWS
# through an instance-metadata lookup either.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

# A core + [local] install (CI's extra-Python jobs) has no Dagster or Spark: their layers' tests are not
# collected there; everything else runs on every supported Python.
_PIPELINE_INSTALLED = all(importlib.util.find_spec(m) is not None for m in ("dagster", "pyspark"))
collect_ignore = [] if _PIPELINE_INSTALLED else ["defs", "transform", "test_end_to_end.py", "test_postgres.py"]

EMULATOR_FIXTURES = frozenset({
    "emulators", "moto_endpoints", "aws_settings", "moto_settings", "kinesis_client", "dynamodb_client",
    "s3_client", "cloudwatch_client", "any_dynamodb_client",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if EMULATOR_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.emulator)


@pytest.fixture(scope="session")
def emulators(tmp_path_factory) -> Endpoints:
    stack = EmulatorStack(tmp_path_factory.mktemp("emulator-logs"))
    endpoints = stack.start()
    try:
        yield endpoints
    finally:
        stack.stop()


@pytest.fixture(scope="session")
def moto_endpoints(emulators: Endpoints) -> Endpoints:
    assert emulators.moto, "the session stack runs a moto server"
    url = emulators.moto
    return Endpoints(kinesis=url, dynamodb=url, s3=url, cloudwatch=url, region=emulators.region, moto=url)


@pytest.fixture(scope="session")
def aws_settings(emulators: Endpoints) -> AwsSettings:
    return emulators.aws_settings()


@pytest.fixture(scope="session")
def moto_settings(moto_endpoints: Endpoints) -> AwsSettings:
    return moto_endpoints.aws_settings()


@pytest.fixture(scope="session")
def kinesis_client(aws_settings: AwsSettings):
    return client("kinesis", aws_settings)


@pytest.fixture(scope="session")
def dynamodb_client(aws_settings: AwsSettings):
    return client("dynamodb", aws_settings)


@pytest.fixture(scope="session")
def s3_client(aws_settings: AwsSettings):
    return client("s3", aws_settings)


@pytest.fixture(scope="session")
def cloudwatch_client(aws_settings: AwsSettings):
    return client("cloudwatch", aws_settings)


@pytest.fixture(scope="session")
def _moto_dynamodb_client(moto_settings: AwsSettings):
    return client("dynamodb", moto_settings)


@pytest.fixture(params=["dynalite", "moto"])
def any_dynamodb_client(request):
    """DynamoDB over HTTP from dynalite (the strict one) and from moto (a second opinion)."""
    if request.param == "dynalite":
        return request.getfixturevalue("dynamodb_client")
    return request.getfixturevalue("_moto_dynamodb_client")


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """unique_name("orders") → "orders-3f9c0a1b2d": lowercase, valid for streams, tables and buckets."""

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make
