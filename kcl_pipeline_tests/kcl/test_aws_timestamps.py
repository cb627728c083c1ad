"""aws.py's clients parse timestamps without dateutil (a tenth of the lineage audit's client CPU went to it): the
same instants as botocore's own parser, for every form a service sends."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from botocore.utils import parse_timestamp as botocores

from kcl_pipeline.kcl.shells.aws import client, parse_timestamp
from kcl_pipeline.zone.store import S3Options


@pytest.mark.parametrize("value", [
    "2024-05-01T12:00:00.000Z", "2024-05-01T12:00:00Z", "2024-05-01T12:00:00.123456Z",  # S3 listings, CloudWatch
    "Wed, 01 May 2024 12:00:00 GMT", "Thu, 29 Feb 2024 23:59:59 GMT",  # S3 headers (Last-Modified)
    1714564800, 1714564800.25, "1714564800",  # JSON services: epoch seconds
    "2024-05-01T12:00:00+02:00", "2024-05-01 12:00:00", "2024-05-01T12:00:00.1234567Z",  # botocore's own
])
def test_the_same_instants_as_botocores_parser(value):
    mine, theirs = parse_timestamp(value), botocores(value)
    assert mine == theirs and mine.utcoffset() == theirs.utcoffset()


def test_what_botocore_refuses_is_refused():
    with pytest.raises(ValueError):
        parse_timestamp("not a timeZ")
    with pytest.raises(ValueError):
        botocores("not a timeZ")


@pytest.mark.parametrize("made_by", ["aws.client", "S3Options.client"])
def test_s3_clients_give_aware_times_from_listings_and_reads(aws_settings, emulators, unique_name, made_by):
    s3 = client("s3", aws_settings) if made_by == "aws.client" else \
        S3Options(endpoint_url=emulators.s3, region=emulators.region).client()
    bucket = unique_name("ts")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"][0]["LastModified"]  # ISO 8601 in the XML body
    read = s3.head_object(Bucket=bucket, Key="k")["LastModified"]  # RFC 7231 in a header
    assert listed.utcoffset() == read.utcoffset() == timedelta(0)
    assert abs(listed - datetime.now(timezone.utc)) < timedelta(minutes=5) and abs(listed - read) < timedelta(seconds=1)
