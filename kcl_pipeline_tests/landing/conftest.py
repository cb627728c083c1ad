"""Landing-zone fixtures: a fresh zone per test, as a local directory or an S3 bucket on the moto server."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.zone.store import ZoneStore, open_store


@dataclass(frozen=True)
class TestZone:
    """An existing, empty zone: its URI, a store on it, and the AWS settings that reach it."""

    uri: str
    store: ZoneStore
    aws: AwsSettings | None = None

    def __iter__(self):  # `uri, store = zone`
        return iter((self.uri, self.store))

    def reopen(self) -> ZoneStore:
        """A fresh store on the same zone (what a new worker process would build)."""
        return open_store(self.uri, self.aws)


@pytest.fixture
def local_zone(tmp_path) -> TestZone:
    root = tmp_path / "zone"
    root.mkdir()
    return TestZone(str(root), open_store(str(root)))


@pytest.fixture
def s3_zone(aws_settings, unique_name) -> TestZone:
    bucket = unique_name("landing")
    client("s3", aws_settings).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/zone"
    return TestZone(uri, open_store(uri, aws_settings), aws_settings)


@pytest.fixture(params=["local", "s3"])
def any_zone(request) -> TestZone:
    """Both kinds of zone: the same behaviour is required of each."""
    return request.getfixturevalue(f"{request.param}_zone")


@pytest.fixture
def memory_zone(unique_name) -> TestZone:
    uri = f"memory://{unique_name('zone')}"
    store = open_store(uri)
    store.ensure_zone(create=True)
    yield TestZone(uri, store)
    store.drop()  # type: ignore[attr-defined]


@pytest.fixture(params=["local", "s3", "memory"])
def every_store(request) -> TestZone:
    """The three stores of zone/store.py (a directory, S3 on the moto server, memory): one contract."""
    return request.getfixturevalue(f"{request.param}_zone")
