"""The real Java KCL 2.7.2 (kcl_pipeline_tests/java_peer) beside `kcl-pipeline consume`, on one stream and one
lease table, judged by what both kinds delivered: the union of the Java peers' output files and our JSONL sinks
holds every produced payload (plain and KPL-aggregated, put by the project's own producer), and a record is
delivered twice only in a hand-over window — by a new holder re-reading from the checkpoint the previous holder left
(after a kill -9, or a Java take of a lease our consumer held until its next heartbeat).

Timings: ours heartbeat 2 s / expiry 6 s / cycle 2 s; Java failoverTimeMillis 6000 (renews every ~2 s, runs its
lease taker every 12.05 s), shardSyncIntervalMillis 5000. (Maven's KCL 2.x line ends at 2.7.2: 2.7.3 is not
served by Maven Central.)
"""
from __future__ import annotations

import time

import pytest

from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active

from ..kcl.fleet_support import wait_until
from .conftest import EXPIRY, FAILOVER_MS
from .peer_support import Deliveries

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.emulator]

TAKER_INTERVAL = 2 * (FAILOVER_MS + 25) / 1000  # Java 2.x: takeleases every 2 x (failover + epsilon)


def _position(checkpoint: str, sub: int = 0) -> tuple[int, int]:
    return int(checkpoint), sub


def _checkpoint_of(item: dict) -> tuple[int, int] | None:
    cp = item.get("checkpoint", {}).get("S", "")
    if not cp.isdigit():
        return None
    return int(cp), int(item.get("checkpointSubSequenceNumber", {}).get("N", "0"))


def _at_last_delivery(watch, fleet, shard: str, worker: str) -> bool:
    """The lease's checkpoint is at the last record `worker` delivered of it (and it delivered some)."""
    delivered = [d.position for d in fleet.deliveries().of_shard(shard, worker)]
    return bool(delivered) and _checkpoint_of(watch.items[shard]) == max(delivered)


def _assert_complete(fleet, what: str) -> Deliveries:
    missing = fleet.missing()
    assert not missing, (f"{what}: {len(missing)} produced records delivered by nobody, e.g. {missing[:10]}\n"
                         f"{fleet.logs()}")
    return fleet.deliveries()


def _assert_no_self_repeats(got: Deliveries) -> None:
    """A record delivered twice was delivered by two different workers (a hand-over), never twice by one, and
    what a new holder re-delivered is where it started: each worker's re-deliveries on a shard are the first
    records of one of its stints there (a stint: a run of its deliveries contiguous in the shard's record order),
    i.e. it re-read from the checkpoint the previous holder left, and nowhere else."""
    duplicates = got.duplicates()
    for key, ds in duplicates.items():
        by = [d.by for d in ds]
        assert len(by) == len(set(by)), f"{key} delivered {len(by)} times by {by}"
    for shard in {key[0] for key in duplicates}:
        order = sorted({d.position for d in got.of_shard(shard)})
        index = {p: i for i, p in enumerate(order)}
        redelivered: dict[str, set[tuple[int, int]]] = {}
        for key, ds in duplicates.items():
            if key[0] == shard:
                for later in sorted(ds, key=lambda d: d.at_ms)[1:]:
                    redelivered.setdefault(later.by, set()).add(later.position)
        for worker, positions in redelivered.items():
            mine = sorted({d.position for d in got.of_shard(shard, worker)})
            stints, run = [], [mine[0]]
            for p in mine[1:]:
                if index[p] == index[run[-1]] + 1:
                    run.append(p)
                else:
                    stints.append(run)
                    run = [p]
            stints.append(run)
            for stint in stints:
                again = [p for p in stint if p in positions]
                assert again == stint[:len(again)], (
                    f"{worker} re-delivered records of {shard} in the middle of a stint, not from where it started "
                    f"(stint from {stint[0]}, re-delivered {again[:3]}...)")


def _wait_all_delivered(fleet, timeout: float, what: str) -> Deliveries:
    wait_until(lambda: not fleet.missing(), timeout, what)
    return fleet.deliveries()


def _assert_java_clean(peer) -> None:
    assert peer.exceptions() == [], f"the Java peer {peer.worker_id} logged:\n" + "\n".join(peer.exceptions()[:20])


def test_java_delivers_every_aggregate_of_our_producer(mixed_fleet):
    """The referee of `kcl-pipeline produce --aggregate`: 300 user records with random partition keys in KPL
    aggregates of 10 on a 2-shard stream, read by the real Java KCL alone, are every one delivered, from inside the
    aggregates. Java drops a whole aggregate holding a user record outside the receiving shard's hash key range:
    before the producer aggregated per shard (it packed any keys together) Java delivered 0 of these 300."""
    fleet = mixed_fleet(2)
    report = fleet.producer.put(300, 10)
    assert report.user_records == 300 and report.aggregates == report.kinesis_records >= 30
    assert len(report.shards) == 2 and report.off_shard_user_records == 0
    java = fleet.start_java("j1")
    try:
        wait_until(lambda: not fleet.missing(), 90, "every aggregated record delivered by the Java KCL")
    except AssertionError:
        got = fleet.deliveries()
        raise AssertionError(f"the Java KCL delivered {len(got.digests())} of 300 aggregated user records "
                             f"(shards {sorted(got.holders())})\n{java.log_tail()}") from None
    assert java.stop() == 0, java.log_tail()
    got = fleet.deliveries()
    assert len(got.records) == 300 and not got.duplicates()
    assert {d.by for d in got.records} == {"j1"} and len(got.holders()) == 2
    assert max(d.sub_sequence_number for d in got.records) == 9  # read from inside the aggregates
    _assert_java_clean(java)


def test_leases_balance_across_kinds(mixed_fleet):
    """(a) Four shards, one of ours and one Java worker: two leases each, and it stays so (no lease changes hands
    over a further Java taker interval) while records flow; nothing lost; a record delivered twice only on a shard
    that changed hands."""
    fleet = mixed_fleet(4)
    fleet.producer.put(300, 1)
    fleet.producer.put(500, 10)
    with fleet.watch() as watch:
        fleet.start_ours("c1")
        wait_until(lambda: len(watch.owners()) == 4 and all(watch.owners().values()), 40, "four leases held by c1")
        java = fleet.start_java("j1")

        def balanced():
            owners = list(watch.owners().values())
            return owners.count("c1") == 2 and owners.count("j1") == 2

        wait_until(balanced, 3 * TAKER_INTERVAL + 10, "two leases each for c1 and j1")
        settled = {k: len(h) for k, h in watch.history.items()}
        owners_then = watch.owners()
        fleet.producer.put(200, 1)
        fleet.producer.put(200, 10)
        got = _wait_all_delivered(fleet, 60, "every record delivered")
        time.sleep(TAKER_INTERVAL + 4)  # stays balanced: Java's taker runs at least once more, ours ~8 cycles
        assert watch.owners() == owners_then, (owners_then, watch.owners())
        moved = {k for k, h in watch.history.items() if len({owner for _, owner, _, _ in h[settled[k] - 1:]}) > 1}
        assert not moved, f"leases changed hands after the fleet balanced: {moved}"
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert java.stop() == 0, java.log_tail()
    got = _assert_complete(fleet, "balance")
    _assert_no_self_repeats(got)
    handed_over = {k for k, h in watch.history.items() if len({o for _, o, _, _ in h if o}) > 1}
    assert {k[0] for k in got.duplicates()} <= handed_over
    _assert_java_clean(java)
    print(f"balanced {owners_then}; {len(got.records)} deliveries, {len(got.duplicates())} duplicates "
          f"on hand-over of {sorted(handed_over)}")


def test_kill9_each_kind_resumes_from_the_others_checkpoint(mixed_fleet):
    """(b) kill -9 of a Java worker: ours takes its lease after the expiry and reads on from Java's last
    checkpoint; then kill -9 of ours (its whole process group): a Java worker takes our leases and reads on from
    our last checkpoint. Records re-delivered are exactly those the dead holder delivered after its checkpoint."""
    fleet = mixed_fleet(2)
    fleet.producer.put(200, 1)
    fleet.producer.put(200, 10)
    with fleet.watch() as watch:
        fleet.start_ours("c1")
        wait_until(lambda: list(watch.owners().values()) == ["c1", "c1"], 40, "both leases held by c1")
        j1 = fleet.start_java("j1")
        java_shard = wait_until(lambda: next((k for k, o in watch.owners().items() if o == "j1"), None),
                                2 * TAKER_INTERVAL + 10, "j1 taking one lease from c1")
        fleet.producer.put(200, 1)
        fleet.producer.put(200, 10)
        _wait_all_delivered(fleet, 60, "every record delivered by c1 and j1")
        wait_until(lambda: _at_last_delivery(watch, fleet, java_shard, "j1"), 20,
                   "j1's checkpoint at its last delivered record")
        j1.kill()
        killed, killed_ms = time.monotonic(), time.time() * 1000
        java_checkpoint = _checkpoint_of(watch.items[java_shard])
        fleet.producer.put(150, 1)
        fleet.producer.put(150, 10)
        wait_until(lambda: watch.owners().get(java_shard) == "c1", EXPIRY * 2 + 4 * 2 + 10,
                   "c1 taking the dead Java worker's lease")
        print(f"c1 took j1's lease {time.monotonic() - killed:.1f}s after kill -9 (expiry {EXPIRY:.0f}s)")
        got = _wait_all_delivered(fleet, 60, "every record delivered after j1's crash")
        c1_taken = [d for d in got.of_shard(java_shard, "c1") if d.at_ms >= killed_ms]
        c1_after = [d for d in c1_taken if d.position > java_checkpoint]
        c1_redelivered = [d for d in c1_taken if d.position <= java_checkpoint]
        assert c1_after, "c1 delivered nothing of the dead Java worker's shard"
        assert not c1_redelivered, (f"c1 re-delivered {len(c1_redelivered)} records at or before j1's checkpoint "
                                    f"{java_checkpoint}")

        # And the other way round: a Java worker joins, takes one lease; ours is killed; Java takes the rest.
        j2 = fleet.start_java("j2")
        wait_until(lambda: sorted(o or "" for o in watch.owners().values()) == ["c1", "j2"], 2 * TAKER_INTERVAL + 10,
                   "j2 taking one lease from c1")
        our_shard = next(k for k, o in watch.owners().items() if o == "c1")
        fleet.producer.put(150, 1)
        fleet.producer.put(150, 10)
        _wait_all_delivered(fleet, 60, "every record delivered by c1 and j2")
        # Ours checkpoints on its heartbeats: let one pass so the checkpoint is at its last delivered record.
        wait_until(lambda: _at_last_delivery(watch, fleet, our_shard, "c1"), 3 * 2 + 2,
                   "c1's checkpoint at its last delivered record")
        fleet.kill_ours("c1")
        killed, killed_ms = time.monotonic(), time.time() * 1000
        our_checkpoint = _checkpoint_of(watch.items[our_shard])
        fleet.producer.put(150, 1)
        fleet.producer.put(150, 10)
        wait_until(lambda: watch.owners().get(our_shard) == "j2", FAILOVER_MS / 1000 + 2 * TAKER_INTERVAL + 10,
                   "j2 taking the dead consumer's lease")
        print(f"j2 took c1's lease {time.monotonic() - killed:.1f}s after kill -9 (failover {FAILOVER_MS} ms)")
        got = _wait_all_delivered(fleet, 60, "every record delivered after c1's crash")
    assert j2.stop() == 0, j2.log_tail()
    got = _assert_complete(fleet, "kill -9")
    j2_taken = [d for d in got.of_shard(our_shard, "j2") if d.at_ms >= killed_ms]
    j2_early = [d for d in j2_taken if d.position <= our_checkpoint]
    assert not j2_early, f"j2 delivered {len(j2_early)} records at or before c1's checkpoint {our_checkpoint}"
    assert [d for d in j2_taken if d.position > our_checkpoint]
    _assert_no_self_repeats(got)
    for key in got.duplicates():
        # The only windows: j1's records after its checkpoint (re-read by c1), c1's after its own (re-read by j2),
        # and c1's records after its heartbeat-borne checkpoint when j1 or j2 took a lease from it.
        assert key[0] in (java_shard, our_shard), key
    _assert_java_clean(j2)
    print(f"{len(got.records)} deliveries, {len(got.duplicates())} duplicates")


def test_our_sigterm_releases_and_java_takes_at_once(mixed_fleet):
    """(c) SIGTERM of ours: it checkpoints what it delivered and releases its leases (no owner, counter moved on);
    the Java worker takes them at its next lease-taker run (within one taker interval, not an expiry plus a taker
    run as after a crash) and reads on from our checkpoint: nothing lost, nothing delivered twice."""
    fleet = mixed_fleet(2)
    fleet.producer.put(200, 1)
    fleet.producer.put(200, 10)
    with fleet.watch() as watch:
        fleet.start_ours("c1")
        wait_until(lambda: list(watch.owners().values()) == ["c1", "c1"], 40, "both leases held by c1")
        _wait_all_delivered(fleet, 40, "every record delivered by c1")
        java = fleet.start_java("j1", extra=["--max-leases", "2"])
        wait_until(lambda: sorted(o or "" for o in watch.owners().values()) == ["c1", "j1"], 2 * TAKER_INTERVAL + 10,
                   "j1 taking one lease from c1")
        our_shard = next(k for k, o in watch.owners().items() if o == "c1")
        fleet.producer.put(100, 1)
        fleet.producer.put(100, 10)
        _wait_all_delivered(fleet, 40, "every record delivered by c1 and j1")
        assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
        stopped = time.monotonic()
        item = watch.scan()
        ours_now = {i["leaseKey"]["S"]: i for i in item}[our_shard]
        assert "leaseOwner" not in ours_now, f"c1 exited leaving {our_shard} owned: {ours_now}"
        released_at = _checkpoint_of(ours_now)
        c1_last = max(d.position for d in fleet.deliveries().of_shard(our_shard, "c1"))
        assert released_at == c1_last, f"released with checkpoint {released_at}, c1 delivered up to {c1_last}"
        wait_until(lambda: watch.owners().get(our_shard) == "j1", TAKER_INTERVAL + 10, "j1 taking the released lease")
        took = time.monotonic() - stopped
        print(f"j1 took the released lease {took:.1f}s after c1 exited (Java's taker runs every {TAKER_INTERVAL}s)")
        assert took <= TAKER_INTERVAL + 3, f"j1 took the released lease only after {took:.1f}s"
        fleet.producer.put(100, 1)
        fleet.producer.put(100, 10)
        _wait_all_delivered(fleet, 40, "every record delivered after c1 stopped")
    assert java.stop() == 0, java.log_tail()
    got = _assert_complete(fleet, "graceful hand-over")
    handed = [key for key in got.duplicates() if key[0] == our_shard]
    assert not handed, f"{len(handed)} records of the released shard delivered twice, e.g. {handed[:3]}"
    _assert_no_self_repeats(got)
    _assert_java_clean(java)


def test_kcl2_worker_joins_a_table_ours_ran_on(mixed_fleet):
    """(d) A KCL 2.x worker started on a lease table our consumer has run on (publishing its worker metrics every
    second) lists the leases without error, takes its share while ours runs and the rest when ours stops, and
    reads on from our checkpoints. Regression: a worker-metrics item in a 2.x lease table breaks every KCL 2.x
    lease listing."""
    fleet = mixed_fleet(2)
    fleet.producer.put(200, 1)
    fleet.producer.put(200, 10)
    with fleet.watch() as watch:
        fleet.start_ours("c1", extra=["--worker-metrics-period-seconds", "1"])
        wait_until(lambda: list(watch.owners().values()) == ["c1", "c1"], 40, "both leases held by c1")
        _wait_all_delivered(fleet, 40, "every record delivered by c1")
        time.sleep(3)  # several worker-metrics periods
        java = fleet.start_java("j1")
        try:
            wait_until(lambda: "j1" in watch.owners().values(), 2 * TAKER_INTERVAL + 10, "j1 taking a lease")
        except AssertionError:
            foreign = [i for i in watch.scan() if "leaseCounter" not in i or "checkpoint" not in i]
            raise AssertionError(f"the KCL 2.x worker took no lease; items without lease attributes: {foreign}\n"
                                 + "\n".join(java.exceptions()[:20])) from None
        assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
        wait_until(lambda: list(watch.owners().values()) == ["j1", "j1"], TAKER_INTERVAL + 10,
                   "j1 taking the lease c1 released")
        fleet.producer.put(100, 1)
        fleet.producer.put(100, 10)
        _wait_all_delivered(fleet, 40, "every record delivered")
    assert java.stop() == 0, java.log_tail()
    got = _assert_complete(fleet, "joining")
    _assert_no_self_repeats(got)
    _assert_java_clean(java)


def test_split_mid_run_parents_before_children_across_kinds(mixed_fleet):
    """(e) Both shards split while one of ours and one Java worker each hold one: every child lease is owned only
    after its parent's lease is SHARD_END and every child record is delivered after the parent's last record,
    whichever kind held the parent and whichever takes the child; nothing lost."""
    fleet = mixed_fleet(2)
    fleet.producer.put(150, 1)
    fleet.producer.put(150, 10)
    with fleet.watch() as watch:
        fleet.start_ours("c1")
        wait_until(lambda: list(watch.owners().values()) == ["c1", "c1"], 40, "both leases held by c1")
        # KCL 2.x's graceful shutdown waits for the processor of a SHARD_END lease it still holds, which never
        # answers: past 5 s the peer shuts down by force (exit 3).
        java = fleet.start_java("j1", extra=["--shutdown-timeout-millis", "5000"])
        wait_until(lambda: sorted(o or "" for o in watch.owners().values()) == ["c1", "j1"], 2 * TAKER_INTERVAL + 10,
                   "j1 taking one lease from c1")
        parents_held = dict(watch.owners())
        _wait_all_delivered(fleet, 40, "every record delivered before the splits")
        shards = {s.shard_id: s for s in list_shards(fleet.kinesis, fleet.stream)}
        for shard in sorted(parents_held):
            lo = int(shards[shard].hash_key_range.starting_hash_key)
            hi = int(shards[shard].hash_key_range.ending_hash_key)
            fleet.kinesis.split_shard(StreamName=fleet.stream, ShardToSplit=shard,
                                      NewStartingHashKey=str((lo + hi) // 2))
            wait_stream_active(fleet.kinesis, fleet.stream)
        fleet.producer.put(200, 1)
        fleet.producer.put(200, 10)
        children = {s.shard_id: (s.parent_shard_id,) for s in list_shards(fleet.kinesis, fleet.stream)
                    if s.parent_shard_id}
        assert len(children) == 4, children
        got = _wait_all_delivered(fleet, 90, "every record delivered after the splits")
        wait_until(lambda: all(watch.owners().get(c) for c in children), 30, "every child lease owned")
    assert fleet.stop_ours("c1") == 0, fleet.our_log("c1")[-3000:]
    assert java.stop() in (0, 3), java.log_tail()
    got = _assert_complete(fleet, "split")
    _assert_no_self_repeats(got)
    for child, parents in children.items():
        child_hist = watch.history[child]
        first_owned = next(t for t, owner, _, _ in child_hist if owner)
        for parent in parents:
            ended = next((t for t, _, _, cp in watch.history[parent] if cp == "SHARD_END"), None)
            assert ended is not None and ended <= first_owned + 0.25, (
                f"{child} owned by {next(o for _, o, _, _ in child_hist if o)} before its parent {parent} "
                f"(held by {parents_held[parent]}) was SHARD_END")
            parent_last = max(d.at_ms for d in got.of_shard(parent))
            child_first = min((d.at_ms for d in got.of_shard(child)), default=None)
            assert child_first is None or child_first >= parent_last, (child, parent, child_first, parent_last)
    print("parents held by", parents_held, "; children taken by",
          {c: sorted({o for _, o, _, _ in watch.history[c] if o}) for c in children})
