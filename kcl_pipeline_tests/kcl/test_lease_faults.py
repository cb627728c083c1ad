"""Lost responses: a write applied by DynamoDB whose answer never reaches the client.

A fault-injecting proxy on loopback forwards the request to the emulator (dynalite, and moto's DynamoDB),
then resets the client's connection instead of answering. botocore retries; the retry fails its
condition against our own applied write. The table must read the item back and report success, never a
lost race (which would leave the lease owned by nobody who works it until it expires).
"""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.core.model import SHARD_END, TRIM_HORIZON, Checkpoint, Lease
from kcl_pipeline.kcl.core.table.lease_codec import LeaseTableUnavailable
from kcl_pipeline.kcl.core.table.lease_rules import CLAIM_OWNER_ATTRIBUTE
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline_tests.fault_proxy import Fault, FaultKind, FaultProxy, Scripted

KEY = "shardId-000000000001"
LOST = Fault(FaultKind.DROP_RESPONSE)


@pytest.fixture(params=["dynalite", "moto"])
def faulty(request, emulators, unique_name):
    """(table through the proxy, the same table direct, the proxy)."""
    upstream = emulators.dynamodb if request.param == "dynalite" else emulators.moto
    proxy = FaultProxy(upstream).start()
    name = unique_name("faults")
    direct = LeaseTable(name, client("dynamodb", AwsSettings(region=emulators.region, endpoint_url=upstream)))
    direct.ensure_table()
    through = LeaseTable(name, client("dynamodb", AwsSettings(region=emulators.region, endpoint_url=proxy.url)))
    try:
        yield through, direct, proxy
    finally:
        proxy.stop()


def lose_next(proxy: FaultProxy, operation: str) -> Scripted:
    script = Scripted((operation, LOST))
    proxy.policy = script
    return script


def test_acquire_whose_response_was_lost_is_reported_acquired(faulty):
    table, direct, proxy = faulty
    assert direct.create(Lease(KEY, Checkpoint(TRIM_HORIZON), lease_counter=4))
    script = lose_next(proxy, "UpdateItem")
    taken = table.acquire(KEY, "me", None, 4)
    assert script.done, "the proxy dropped the first answer"
    assert taken is not None and (taken.lease_owner, taken.lease_counter) == ("me", 5)
    assert table.ambiguous_writes == 1
    assert direct.get(KEY).lease_owner == "me"


def test_heartbeat_and_checkpoint_whose_response_was_lost_are_reported_applied(faulty):
    table, direct, proxy = faulty
    # Held by this protocol ("me" took it by our acquire): the pipeline's ownerless commit may write under it.
    assert direct.create(Lease(KEY, Checkpoint("100"), "me", 5, extra={CLAIM_OWNER_ATTRIBUTE: "me"}))
    lose_next(proxy, "UpdateItem")
    assert table.heartbeat(KEY, "me", 5, {"landingX": 1}) is True
    lose_next(proxy, "UpdateItem")
    assert table.heartbeat(KEY, "me", 6, checkpoint=Checkpoint("200")) is True
    lose_next(proxy, "UpdateItem")
    assert table.checkpoint(KEY, Checkpoint("300", 2)) is True  # the ownerless commit
    after = direct.get(KEY)
    assert (after.lease_counter, after.checkpoint, after.extra.get("landingX")) == (7, Checkpoint("300", 2), 1)
    assert table.ambiguous_writes == 3


def test_release_end_and_delete_whose_response_was_lost_are_reported_applied(faulty):
    table, direct, proxy = faulty
    assert direct.create(Lease(KEY, Checkpoint("100"), "me", 5))
    lose_next(proxy, "UpdateItem")
    assert table.release(KEY, "me", 5) is True
    assert direct.get(KEY).lease_owner is None
    assert direct.acquire(KEY, "me", None, 6) is not None
    lose_next(proxy, "UpdateItem")
    assert table.end(KEY, "me", 7) is True
    assert direct.get(KEY).checkpoint == Checkpoint(SHARD_END)
    lose_next(proxy, "DeleteItem")
    assert table.delete(KEY, 8) is True
    assert direct.get(KEY) is None


def test_a_real_lost_race_after_a_retry_is_still_a_lost_race(faulty):
    # The dropped request never reached the table; meanwhile a peer took the lease: the re-read says "not ours".
    table, direct, proxy = faulty
    assert direct.create(Lease(KEY, Checkpoint(TRIM_HORIZON), lease_counter=4))
    assert direct.acquire(KEY, "peer", None, 4) is not None
    proxy.policy = Scripted(("UpdateItem", Fault(FaultKind.DROP_REQUEST)))
    assert table.acquire(KEY, "me", None, 4) is None
    assert direct.get(KEY).lease_owner == "peer"


def test_unknown_outcome_is_an_error_not_a_lost_race(emulators, unique_name):
    proxy = FaultProxy(emulators.dynamodb).start()
    try:
        name = unique_name("faults")
        direct = LeaseTable(name, client("dynamodb", AwsSettings(region=emulators.region,
                                                                  endpoint_url=emulators.dynamodb)))
        direct.ensure_table()
        assert direct.create(Lease(KEY, Checkpoint("100"), "me", 5))
        proxy.policy = lambda operation, _body: LOST if operation in ("UpdateItem", "GetItem") else None
        table = LeaseTable(name, client("dynamodb", AwsSettings(region=emulators.region, endpoint_url=proxy.url,
                                                                max_attempts=2)))
        with pytest.raises(LeaseTableUnavailable, match="unknown outcome"):
            table.heartbeat(KEY, "me", 5)
    finally:
        proxy.stop()


def test_an_ambiguous_acquire_is_not_judged_ours_when_a_twin_under_our_worker_id_took_the_lease(faulty):
    """Two processes run under one worker id. Ours sends its acquire; the request is lost on the way and,
    before botocore's retry, the twin takes the lease. The retry fails its condition and the re-read shows
    owner "me" at the counter we meant to write — yet the take was the twin's: only the claim tells."""
    table, direct, proxy = faulty
    assert direct.create(Lease(KEY, Checkpoint(TRIM_HORIZON), lease_counter=4))
    twin: list = []

    def policy(operation: str, _body: bytes) -> Fault | None:
        if operation == "UpdateItem" and not twin:
            twin.append(direct.acquire(KEY, "me", None, 4, claim="twin-process"))
            return Fault(FaultKind.DROP_REQUEST)
        return None

    proxy.policy = policy
    taken = table.acquire(KEY, "me", None, 4, claim="this-process")
    assert twin and twin[0] is not None, "the twin took the lease between our two attempts"
    assert taken is None, "the twin's take was judged ours: two processes would deliver the lease"
    assert table.ambiguous_writes == 1
    assert direct.get(KEY).extra["leaseClaim"] == "twin-process"
