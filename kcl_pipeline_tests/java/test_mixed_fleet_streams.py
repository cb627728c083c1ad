"""The real Java KCL 2.7.2 (kcl_pipeline_tests/java_peer) beside `kcl-pipeline consume`: where an application
starts (AT_TIMESTAMP, both ways) and one application over two streams (KCL's multi-stream lease format), judged by
what both kinds delivered and by the lease table's rows.

- AT_TIMESTAMP: the lease carries the sentinel `AT_TIMESTAMP` with sub-sequence 0 (Java's HierarchicalShardSyncer;
  ours writes it the same way); the timestamp is only in each worker's configuration. A lease one kind created and
  the other kind reads first must start at the configured timestamp, not at the stream's start (the item's 0 read
  as epoch milliseconds would read the whole retention). Records put before the timestamp are delivered by nobody;
  every record after it by exactly one worker, or by two only on a lease that changed hands.
- Multi-stream: two streams, one application and lease table; ours with `--stream A --stream B`, the peer with a
  MultiStreamTracker over the same two streams (its `--stream A --stream B`). Both kinds must derive the same
  stream identifiers (`account:stream:creationEpoch` from DescribeStreamSummary), so the table holds exactly one
  lease per shard, under `account:stream:creationEpoch:shardId`, with `streamName` and `shardId` attributes, each
  written by both kinds over the run; every record of both streams is delivered.

Timings as test_mixed_fleet_kcl2.py: ours heartbeat 2 s / expiry 6 s / cycle 2 s; Java failoverTimeMillis 6000,
shardSyncIntervalMillis 5000, its lease taker every 12.05 s.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from kcl_pipeline.kcl.shells.shards import wait_stream_active

from ..kcl.fleet_support import wait_until
from .conftest import FAILOVER_MS, MixedFleet
from .peer_support import Deliveries, KplProducer
from .test_mixed_fleet_kcl2 import _assert_no_self_repeats

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.emulator]

TAKER_INTERVAL = 2 * (FAILOVER_MS + 25) / 1000
# A 2.x worker on an empty lease table waits a random 1-30 s (re-checking every 3 s) before it syncs shards itself.
JAVA_EMPTY_TABLE_WAIT = 30


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def _put_around_a_timestamp(producer: KplProducer) -> tuple[set[int], set[int], int]:
    """Records before, the timestamp (epoch ms, ~1.5 s after the last of them), records after (~1.5 s later):
    (ids before, ids after, timestamp)."""
    first = producer.next_id
    producer.put(40, 1)
    producer.put(60, 6)
    before = set(range(first, producer.next_id))
    time.sleep(1.5)
    timestamp = time.time_ns() // 1_000_000
    time.sleep(1.5)
    first = producer.next_id
    producer.put(40, 1)
    producer.put(60, 6)
    return before, set(range(first, producer.next_id)), timestamp


def _ids_by_worker(got: Deliveries, produced: dict[str, int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for d in got.records:
        out.setdefault(produced[d.digest], []).append(d.by)
    return out


def _handed_over(watch) -> set[str]:
    return {k for k, h in watch.history.items() if len({o for _, o, _, _ in h if o}) > 1}


def _first_taken_at_sentinel(watch, key: str, by: str) -> None:
    """`key` was first owned by `by`, and its checkpoint then was still Java's AT_TIMESTAMP sentinel."""
    hist = watch.history[key]
    first = next((h for h in hist if h[1]), None)
    assert first is not None and first[1] == by, f"{key} first owned by {first}, not {by}: {hist}"
    assert first[3] == "AT_TIMESTAMP", f"{by} took {key} at checkpoint {first[3]!r}, not AT_TIMESTAMP: {hist}"


def _assert_sentinel_rows(items: list[dict]) -> None:
    for item in items:
        assert item["checkpoint"]["S"] == "AT_TIMESTAMP", item
        assert item["checkpointSubSequenceNumber"]["N"] == "0", f"not Java's AT_TIMESTAMP row: {item}"


def _judge_at_timestamp(fleet: MixedFleet, watch, before: set[int], after: set[int]) -> Deliveries:
    got = fleet.deliveries()
    by_id = _ids_by_worker(got, fleet.producer.produced)
    early = {n: by_id[n] for n in sorted(before & set(by_id))}
    assert not early, (f"{len(early)} records put before the timestamp were delivered, e.g. "
                       f"{dict(list(early.items())[:5])}\n{fleet.logs()}")
    missing = sorted(after - set(by_id))
    assert not missing, (f"{len(missing)} records after the timestamp delivered by nobody: {missing[:10]}\n"
                         f"{fleet.logs()}")
    for n, workers in by_id.items():
        assert len(workers) == len(set(workers)), f"record {n} delivered twice by one worker: {workers}"
    _assert_no_self_repeats(got)
    handed = _handed_over(watch)
    for key, ds in got.duplicates().items():
        assert key[0] in handed, f"{key} delivered by {[d.by for d in ds]} on a lease that never changed hands"
    return got


def test_java_created_at_timestamp_leases_read_by_ours_from_the_timestamp(mixed_fleet):
    """A Java worker (AT_TIMESTAMP, at most one lease) creates both leases of a 2-shard stream at its initial
    position and takes one; ours, configured with the same AT_TIMESTAMP and timestamp, takes the other while its
    checkpoint is still Java's sentinel (AT_TIMESTAMP, sub-sequence 0) and reads it from the timestamp: nothing put
    before the timestamp is delivered by either kind, everything after it by exactly one."""
    fleet = mixed_fleet(2)
    before, after, timestamp = _put_around_a_timestamp(fleet.producer)
    with fleet.watch() as watch:
        java = fleet.start_java("j1", extra=["--initial-position", "AT_TIMESTAMP", "--timestamp", str(timestamp),
                                             "--max-leases", "1"])
        wait_until(lambda: len(watch.items) == 2 and "j1" in watch.owners().values(),
                   JAVA_EMPTY_TABLE_WAIT + 30, "j1 creating both leases and taking one")
        free = [k for k, o in watch.owners().items() if o is None]
        assert len(free) == 1, watch.owners()
        _assert_sentinel_rows([i for i in watch.scan() if i["leaseKey"]["S"] == free[0]])
        fleet.start_ours("c1", extra=["--initial-position", "AT_TIMESTAMP", "--timestamp", _iso(timestamp)])
        wait_until(lambda: watch.owners().get(free[0]) == "c1", 30, "c1 taking the lease Java created")
        wait_until(lambda: after <= set(_ids_by_worker(fleet.deliveries(), fleet.producer.produced)), 60,
                   "every record after the timestamp delivered")
        time.sleep(3)  # a late delivery from before the timestamp would show now
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert java.stop() == 0, java.log_tail()
    _first_taken_at_sentinel(watch, free[0], "c1")
    got = _judge_at_timestamp(fleet, watch, before, after)
    assert {d.kind for d in got.of_shard(free[0])} == {"ours"}, "ours read nothing of the lease Java created"
    assert java.exceptions() == [], "\n".join(java.exceptions()[:20])
    print(f"ours started {free[0]} at the timestamp; {len(got.records)} deliveries of {len(after)} records after it")


def test_our_at_timestamp_leases_read_by_java_from_the_timestamp(mixed_fleet):
    """Ours (AT_TIMESTAMP, at most one lease) creates both leases, Java's way (the sentinel, sub-sequence 0), and
    takes one; a Java worker with the same initial position takes the other at its first taker run and reads it from
    its configured timestamp: nothing before the timestamp delivered, everything after it by exactly one."""
    fleet = mixed_fleet(2)
    before, after, timestamp = _put_around_a_timestamp(fleet.producer)
    with fleet.watch() as watch:
        fleet.start_ours("c1", extra=["--initial-position", "AT_TIMESTAMP", "--timestamp", _iso(timestamp),
                                      "--max-leases", "1"])
        wait_until(lambda: len(watch.items) == 2 and "c1" in watch.owners().values(), 40,
                   "c1 creating both leases and taking one")
        free = [k for k, o in watch.owners().items() if o is None]
        assert len(free) == 1, watch.owners()
        _assert_sentinel_rows([i for i in watch.scan() if i["leaseKey"]["S"] == free[0]])
        java = fleet.start_java("j1", extra=["--initial-position", "AT_TIMESTAMP", "--timestamp", str(timestamp)])
        wait_until(lambda: watch.owners().get(free[0]) == "j1", TAKER_INTERVAL + 30, "j1 taking the lease ours created")
        wait_until(lambda: after <= set(_ids_by_worker(fleet.deliveries(), fleet.producer.produced)), 60,
                   "every record after the timestamp delivered")
        time.sleep(3)
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert java.stop() == 0, java.log_tail()
    _first_taken_at_sentinel(watch, free[0], "j1")
    got = _judge_at_timestamp(fleet, watch, before, after)
    assert {d.kind for d in got.of_shard(free[0])} == {"java"}, "Java read nothing of the lease ours created"
    starts = [e["detail"] for e in java.events() if e["event"] == "initialize" and e["shard_id"] == free[0]]
    assert starts and "AT_TIMESTAMP" in starts[0], starts
    assert java.exceptions() == [], "\n".join(java.exceptions()[:20])
    print(f"Java started {free[0]} at {starts[0]}; {len(got.records)} deliveries of {len(after)} records after it")


# -- one application over two streams ---------------------------------------------------------------------------

_MULTI_KEY = re.compile(r"^(\d+):([A-Za-z0-9_.-]+):(\d+):(shardId-\d+)$")


@pytest.fixture
def two_stream_fleet(emulators, kinesis_client, dynamodb_client, kcl2_peer, unique_name, tmp_path):
    fleets: list[MixedFleet] = []

    def make(shards: int) -> tuple[MixedFleet, dict[str, KplProducer]]:
        streams = [unique_name("msa"), unique_name("msb")]
        for s in streams:
            kinesis_client.create_stream(StreamName=s, ShardCount=shards)
        for s in streams:
            wait_stream_active(kinesis_client, s)
        producers = {s: KplProducer(kinesis_client, s, seed=11 + i) for i, s in enumerate(streams)}
        producers[streams[1]].next_id = 100_000  # payloads {"id": n}: disjoint ids, so digests tell the streams apart
        env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
        # MixedFleet's stream is handed as is to consume_process / start_peer, which both take several.
        fleet = MixedFleet(env, tmp_path, streams, unique_name("msapp"), kinesis_client, dynamodb_client, kcl2_peer,
                           producers[streams[0]])
        fleets.append(fleet)
        return fleet, producers

    yield make
    for fleet in fleets:
        fleet.close()


def test_multi_stream_application_across_kinds(two_stream_fleet):
    """Two 2-shard streams, one application: ours (`--stream A --stream B`) creates the four leases and reads both
    streams; a Java 2.x worker with a MultiStreamTracker over the same streams joins and steals its share (two);
    ours stops (releasing), Java takes the rest. The table holds exactly the four multi-stream leases throughout
    (no second set under another identifier, no single-stream key), each lease owned by both kinds over the run;
    every record of both streams delivered, twice only on a lease that changed hands."""
    fleet, producers = two_stream_fleet(2)
    streams = list(producers)

    def put_batch():
        for p in producers.values():
            p.put(30, 1)
            p.put(60, 6)

    def produced() -> dict[str, int]:
        return {d: n for p in producers.values() for d, n in p.produced.items()}

    def missing() -> list[int]:
        seen = fleet.deliveries().digests()
        return sorted(n for d, n in produced().items() if d not in seen)

    def stream_of(n: int) -> str:
        return streams[1] if n >= 100_000 else streams[0]

    put_batch()
    with fleet.watch() as watch:
        fleet.start_ours("c1")
        wait_until(lambda: len(watch.items) == 4 and set(watch.owners().values()) == {"c1"}, 40,
                   "c1 creating and taking the four leases of both streams")
        wait_until(lambda: not missing(), 40, "the first records of both streams delivered by c1")
        # Java then resumes from our checkpoints (none of its initialize events at TRIM_HORIZON).
        wait_until(lambda: all(watch.checkpoint(k).isdigit() for k in watch.items), 10,
                   "c1's checkpoints of the four leases written")
        java = fleet.start_java("j1")

        def balanced():
            owners = list(watch.owners().values())
            return owners.count("c1") == 2 and owners.count("j1") == 2

        try:
            wait_until(balanced, 3 * TAKER_INTERVAL + 15, "two leases each for c1 and j1")
        except AssertionError:
            raise AssertionError(f"not balanced: {watch.owners()}; table keys {sorted(watch.items)}\n"
                                 + "\n".join(java.exceptions()[:20]) + f"\n{java.log_tail(3000)}") from None
        balanced_owners = watch.owners()
        put_batch()
        wait_until(lambda: not missing(), 60, "every record delivered by c1 and j1")
        assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
        wait_until(lambda: set(watch.owners().values()) == {"j1"}, TAKER_INTERVAL + 15, "j1 taking c1's leases")
        put_batch()
        wait_until(lambda: not missing(), 60, "every record delivered by j1")
        rows = watch.scan()
    assert java.stop() == 0, java.log_tail()

    # The table: exactly one multi-stream lease per shard, in Java's format, whichever kind wrote it last.
    leases = [r for r in rows if r.get("entityType", {}).get("S", "LEASE") == "LEASE"]
    keys = sorted(r["leaseKey"]["S"] for r in leases)
    assert len(keys) == 4, f"expected the four leases of two 2-shard streams, the table holds {keys}"
    identifiers: dict[str, set[str]] = {}
    for r in leases:
        key = r["leaseKey"]["S"]
        m = _MULTI_KEY.match(key)
        assert m, f"not a multi-stream lease key: {key}"
        account, name, epoch, shard = m.groups()
        assert r["streamName"]["S"] == f"{account}:{name}:{epoch}", r
        assert r["shardId"]["S"] == shard, r
        identifiers.setdefault(name, set()).add(f"{account}:{name}:{epoch}")
    assert set(identifiers) == set(streams) and all(len(v) == 1 for v in identifiers.values()), identifiers
    owned_by = {k: {o for _, o, _, _ in h if o} for k, h in watch.history.items()}
    assert set(owned_by) == set(keys), (sorted(owned_by), keys)  # nothing else ever appeared
    assert all({"c1", "j1"} <= o for o in owned_by.values()), owned_by

    # Delivery: everything, by both kinds from both streams, twice only in a hand-over window. Both streams have a
    # shardId-000000000000 (and kinesis-local repeats sequence numbers across streams): judged per lease key, the
    # stream told by the payload's id.
    assert not missing(), missing()[:10]
    ids = produced()
    identifier = {name: next(iter(v)) for name, v in identifiers.items()}
    got = Deliveries([replace(d, shard_id=f"{identifier[stream_of(ids[d.digest])]}:{d.shard_id}")
                      for d in fleet.deliveries().records])
    per_kind = {(d.kind, stream_of(ids[d.digest])) for d in got.records}
    assert per_kind == {(k, s) for k in ("ours", "java") for s in streams}, per_kind
    _assert_no_self_repeats(got)
    handed = _handed_over(watch)
    assert {key[0] for key in got.duplicates()} <= handed, (sorted(got.duplicates())[:5], handed)
    starts = [e["detail"] for e in java.events() if e["event"] == "initialize"]
    assert len(starts) >= 4 and not [s for s in starts if "TRIM_HORIZON" in s], starts
    assert java.exceptions() == [], "\n".join(java.exceptions()[:20])
    print(f"balanced {balanced_owners}; {len(got.records)} deliveries of {len(ids)} records, "
          f"{len(got.duplicates())} on hand-overs; Java started at {starts}")
