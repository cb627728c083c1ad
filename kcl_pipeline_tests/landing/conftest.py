"""Landing-zone fixtures: a fresh zone per test, as a local directory or an S3 bucket on the moto server."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.aws import client
from kcl_pipeline.landing.store import open_store


@pytest.fixture
def local_zone(tmp_path):
    """(uri, store) of an existing, empty local-directory zone."""
    root = tmp_path / "zone"
    root.mkdir()
    return str(root), open_store(str(root))


@pytest.fixture
def s3_zone(aws_settings, unique_name):
    """(uri, store) of an existing, empty bucket zone (with a key prefix) on the emulator's S3."""
    bucket = unique_name("landing")
    client("s3", aws_settings).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/zone"
    return uri, open_store(uri, aws_settings)


@pytest.fixture(params=["local", "s3"])
def any_zone(request):
    """Both kinds of zone: the same behaviour is required of each."""
    return request.getfixturevalue(f"{request.param}_zone")
