"""Stream identity in the landing zone: two streams of one name (other accounts or regions) in one zone.

A stream named by its ARN lands in `<name>@<region>@<account>`; every batch's footer records the stream's ARN;
a consumer refuses to follow, resume after or trust a batch of another stream (ForeignStreamError, naming both);
`landing verify` reports another stream's batches and a directory holding two streams. A zone landed before
stream identity (bare `<name>` directory, footers without an ARN) keeps working.

The real collision, two emulated regions and `kcl-pipeline consume`, is in test_stream_identity_consumers.py.
"""
from __future__ import annotations

import pytest

from kcl_pipeline.audit.verify import verify_zone
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.core.streams import parse_stream_arn
from kcl_pipeline.zone.batch import encode_batch, read_batch_info
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.errors import ForeignStreamError, LandingConfigError
from kcl_pipeline.zone.layout import (
    directory_identity,
    foreign_stream,
    landing_directory,
    link_key,
    parse_batch_key,
)
from kcl_pipeline.zone.sink import LandingProcessor, landing_spec

from .helpers import SHARD, T0, Clock, deliver, init, make_records

A = "arn:aws:kinesis:us-east-1:111111111111:stream/orders"
B = "arn:aws:kinesis:eu-west-1:222222222222:stream/orders"
B_OTHER_REGION = "arn:aws:kinesis:us-east-1:222222222222:stream/orders"
TRIM = Checkpoint("TRIM_HORIZON")


def land(store, stream: str, stream_arn: str | None, records, start: Checkpoint = TRIM) -> LandingProcessor:
    clock = Clock(T0 + 120_000)
    p = LandingProcessor(store, stream, stream_arn=stream_arn, max_batch_records=10, clock=clock.time,
                         monotonic=clock.monotonic)
    init(p, start)
    if p.resume_position() is not None and not p.resume_position().is_sentinel:
        records = [r for r in records if r.position() > p.resume_position().key()]
    deliver(p, records, 7)
    p.flush()
    return p


def ids(store, stream: str) -> list[bytes]:
    return read_batches(store, stream).column("data").to_pylist()


# -- the layout ---------------------------------------------------------------------------------------------

def test_two_streams_of_one_name_in_other_accounts_or_regions_have_their_own_directories():
    assert landing_directory(A) == "orders@us-east-1@111111111111"
    assert landing_directory(B) == "orders@eu-west-1@222222222222"
    assert landing_directory(B_OTHER_REGION) == "orders@us-east-1@222222222222"
    assert len({landing_directory(s) for s in (A, B, B_OTHER_REGION, "orders")}) == 4
    # A directory is its own directory (every key builder takes either), and names its stream.
    assert landing_directory(landing_directory(B)) == landing_directory(B)
    assert directory_identity(landing_directory(B)) == ("orders", "eu-west-1", "222222222222")
    # Neither a bare name nor a multi-stream incarnation's `<name>@<creationEpoch>` is an identity directory.
    assert directory_identity("orders") is None and directory_identity("orders@1700000000") is None
    key = link_key(B, 0, SHARD, TRIM)
    assert key == f"orders@eu-west-1@222222222222/_start/{SHARD}/after=TRIM_HORIZON_0"


def test_a_batch_key_in_an_identity_directory_reads_back_with_its_directory():
    (batch,) = [encode_batch(landing_directory(B), SHARD, make_records(3), TRIM, stream_arn=B)]
    assert batch.key.key().startswith("orders@eu-west-1@222222222222/dt=")
    assert parse_batch_key(batch.key.key()) == batch.key


@pytest.mark.parametrize("name", [".", ".."])
def test_no_stream_arn_names_a_directory_leaving_the_zone(name):
    with pytest.raises(ValueError):
        parse_stream_arn(f"arn:aws:kinesis:us-east-1:111111111111:stream/{name}/x")
    assert "/" not in landing_directory(f"arn:aws:kinesis:us-east-1:111111111111:stream/{name}")


def test_foreign_stream_judges_a_footer_against_the_directory_and_the_stream_expected():
    assert foreign_stream("orders", None, B) is None  # landed before stream identity: nobody's in particular
    assert foreign_stream("orders", A, None) is None
    assert foreign_stream("orders", A, A) is None
    assert B in foreign_stream("orders", B, A) and A in foreign_stream("orders", B, A)
    assert foreign_stream(landing_directory(B), B, None) is None
    assert "orders@eu-west-1@222222222222" in foreign_stream(landing_directory(B), B_OTHER_REGION, None)
    assert "not a stream ARN" in foreign_stream("orders", "orders", None)


# -- the footer ------------------------------------------------------------------------------------------------

def test_every_batch_records_its_streams_arn(local_zone):
    land(local_zone.store, "orders", A, make_records(20))
    batches = list_batches(local_zone.store, "orders")
    assert batches and {read_batch_info(local_zone.store, b).stream_arn for b in batches} == {A}


def test_a_stream_named_by_its_arn_lands_in_its_identity_directory_and_records_it(local_zone):
    land(local_zone.store, B, None, make_records(20))
    assert local_zone.store.list_dirs("") == ["orders@eu-west-1@222222222222"]
    batches = list_batches(local_zone.store, B)
    assert batches == list_batches(local_zone.store, "orders@eu-west-1@222222222222")
    assert {read_batch_info(local_zone.store, b).stream_arn for b in batches} == {B}
    assert len(ids(local_zone.store, B)) == 20


def test_a_stream_arn_that_is_not_one_is_refused_before_any_worker_starts(local_zone):
    with pytest.raises(LandingConfigError, match="not a Kinesis stream ARN"):
        landing_spec(local_zone.uri, "orders", stream_arn="arn:aws:kinesis:us-east-1:1:stream/orders")
    with pytest.raises(LandingConfigError, match="not a Kinesis stream ARN"):
        LandingProcessor(local_zone.uri, "orders", stream_arn="orders")


# -- the collision: consumers ------------------------------------------------------------------------------

def test_a_consumer_refuses_to_follow_another_streams_chain_in_its_directory(local_zone):
    """The operator's crash loop: B (another account's `orders`, its own lease table, named by its name) found A's
    start link in `orders/`, followed A's chain and asked its own stream for records after A's sequence number.
    Now it stops before reading anything, naming both streams and what to do."""
    store = local_zone.store
    land(store, "orders", A, make_records(20))
    before = sorted(store.list_keys(""))
    b = LandingProcessor(store, "orders", stream_arn=B, clock=Clock(T0).time)
    with pytest.raises(ForeignStreamError) as err:
        init(b, TRIM)
    message = str(err.value)
    assert A in message and B in message and "ARN" in message and "\n" not in message
    assert sorted(store.list_keys("")) == before  # nothing written, nothing lost


def test_a_consumer_resuming_from_a_checkpoint_refuses_another_streams_batches(local_zone):
    store = local_zone.store
    records = make_records(20)
    land(store, "orders", A, records)
    b = LandingProcessor(store, "orders", stream_arn=B, clock=Clock(T0 + 60_000).time)
    with pytest.raises(ForeignStreamError, match="222222222222"):
        init(b, records[3].checkpoint)


def test_two_streams_of_one_name_named_by_their_arns_land_side_by_side(local_zone):
    store = local_zone.store
    a_records, b_records = make_records(20, seed=1), make_records(30, seed=2)  # the same positions in both
    land(store, A, None, a_records)
    land(store, B, None, b_records)
    assert sorted(store.list_dirs("")) == ["orders@eu-west-1@222222222222", "orders@us-east-1@111111111111"]
    assert ids(store, A) == [r.data for r in a_records]
    assert ids(store, B) == [r.data for r in b_records]
    report = verify_zone(local_zone.uri, store=store)
    assert report.ok and report.rows == 50, report.lines()


def test_a_zone_landed_before_stream_identity_keeps_working(local_zone):
    """Batches without an ARN in a bare `<name>` directory: a consumer of the stream (named by its name, its ARN
    known) resumes after them, and verify passes them and the new batches alike."""
    store = local_zone.store
    records = make_records(40)
    land(store, "orders", None, records[:20])  # the writer before stream identity recorded no ARN
    p = land(store, "orders", A, records)
    assert p.stats.records_already_landed == 0 and p.stats.rows_written == 20  # resumed after the old chain
    assert ids(store, "orders") == [r.data for r in records]
    infos = [read_batch_info(store, b) for b in list_batches(store, "orders")]
    assert {i.stream_arn for i in infos} == {None, A}
    report = verify_zone(local_zone.uri, store=store, stream_arn=A)
    assert report.ok, report.lines()


# -- verify --------------------------------------------------------------------------------------------------

def _put(store, directory: str, arn: str | None, records, prev) -> None:
    batch = encode_batch(directory, SHARD, records, prev, stream_arn=arn)
    assert store.put_if_absent(batch.key.key(), batch.body)


def test_verify_fails_a_directory_holding_batches_of_two_streams(local_zone):
    """What `landing verify --deep --application B` called `OK: 100 rows`: a chain whose batches are of two
    streams named alike."""
    store = local_zone.store
    records = make_records(20)
    _put(store, "orders", A, records[:10], TRIM)
    _put(store, "orders", B, records[10:], records[9].checkpoint)
    report = verify_zone(local_zone.uri, store=store, deep=True)
    assert not report.ok
    assert any(A in m and B in m for m in report.mixed_streams), report.lines()
    assert any(line.startswith("  mixed streams: orders holds batches of 2 streams") for line in report.lines())


def test_verify_fails_batches_of_another_stream_than_the_one_expected(local_zone):
    store = local_zone.store
    _put(store, "orders", A, make_records(10), TRIM)
    assert verify_zone(local_zone.uri, store=store, stream_arn=A).ok
    report = verify_zone(local_zone.uri, store=store, stream="orders", stream_arn=B)
    assert not report.ok
    (foreign,) = report.streams["orders"][SHARD].foreign
    assert A in foreign and B in foreign
    assert any(line.startswith("    foreign: orders/") for line in report.lines())


def test_verify_fails_a_batch_whose_footer_is_not_its_identity_directorys_stream(local_zone):
    store = local_zone.store
    _put(store, landing_directory(B), B_OTHER_REGION, make_records(10), TRIM)  # copied in from elsewhere
    report = verify_zone(local_zone.uri, store=store)
    assert not report.ok
    assert "orders@eu-west-1@222222222222" in report.streams["orders@eu-west-1@222222222222"][SHARD].foreign[0]
    # A stream given by its ARN is its identity directory, and its batches must be of it.
    assert not verify_zone(local_zone.uri, store=store, stream=B).ok
    with pytest.raises(ValueError, match="not one"):
        verify_zone(local_zone.uri, store=store, stream_arn="orders")


def test_the_audit_of_a_stream_named_by_its_arn_covers_its_identity_directory(local_zone, tmp_path):
    from kcl_pipeline.audit.stream import audit
    from kcl_pipeline.zone.store import open_store

    land(local_zone.store, A, None, make_records(10, seed=1))
    land(local_zone.store, B, None, make_records(20, seed=2))
    output = open_store(str(tmp_path / "out"))
    output.ensure_zone(create=True)
    report = audit(local_zone.uri, output.uri, B, 60_000, store=local_zone.store, output=output, now_ms=T0)
    (scope,) = report.scopes
    assert (scope.directory, scope.batches) == \
        ("orders@eu-west-1@222222222222", len(list_batches(local_zone.store, B)))


def test_a_consumer_is_refused_before_it_starts_when_its_directorys_chains_are_another_streams(local_zone):
    from kcl_pipeline.zone.sink import check_stream_chains

    store = local_zone.store
    check_stream_chains(store, "orders", B)  # nothing landed: nothing to refuse
    land(store, "orders", A, make_records(20))
    check_stream_chains(store, "orders", A)  # its own
    check_stream_chains(store, B, B)  # its own directory, elsewhere
    with pytest.raises(ForeignStreamError) as err:
        check_stream_chains(store, "orders", B)
    assert A in str(err.value) and B in str(err.value) and "\n" not in str(err.value)
