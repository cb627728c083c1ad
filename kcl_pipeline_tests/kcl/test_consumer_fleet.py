"""The fleet, for real: `kcl-pipeline consume` processes on kinesis-local + dynalite over HTTP.

Three consumers share a 6-shard stream carrying KPL and plain records; one is killed with SIGKILL (its
whole process group, as a crashed host) and its shards are taken; a shard is split and two are merged
while records flow; a fourth consumer joins and the fleet rebalances. A monitor thread polls the lease
table throughout and checks the protocol's invariants as they happen.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kcl_pipeline.kcl.core.fleet.balance import imbalance, reported_load
from kcl_pipeline.kcl.core.model import Checkpoint
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active
from kcl_pipeline.local.producer import produce

from .fleet_support import TablePoller, consume_process, delivered_records, record_ids, stop_processes, wait_until

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HEARTBEAT, EXPIRY, CYCLE = 1.0, 3.0, 1.0


class LeaseMonitor(TablePoller):
    """Polls the lease table; records checkpoint regressions, SHARD_END times and first-owned times."""

    def __init__(self, table: LeaseTable):
        super().__init__(table)
        self.last: dict[str, Checkpoint] = {}
        self.regressions: list[str] = []
        self.ended_at: dict[str, float] = {}
        self.first_owned_at: dict[str, float] = {}
        self.parents: dict[str, tuple[str, ...]] = {}
        self.owners: dict[str, str | None] = {}

    def observe(self, leases, now: float) -> None:
        for lease in leases:
            key, cp = lease.lease_key, lease.checkpoint
            self.parents[key] = lease.parent_shard_ids
            self.owners[key] = lease.lease_owner
            prev = self.last.get(key)
            if prev is not None and not _not_before(prev, cp):
                self.regressions.append(f"{key}: {prev} -> {cp}")
            self.last[key] = cp
            if cp.is_shard_end:
                self.ended_at.setdefault(key, now)
            if lease.lease_owner:
                self.first_owned_at.setdefault(key, now)


def _not_before(prev: Checkpoint, cp: Checkpoint) -> bool:
    if prev.is_shard_end:
        return cp.is_shard_end
    if cp.is_shard_end or prev.is_starting_sentinel:
        return True
    if cp.is_starting_sentinel:
        return False
    return cp.key() >= prev.key()


def _consume(env, stream, app, worker, out: Path, log: Path) -> subprocess.Popen:
    return consume_process(env, stream, app, worker, out, log, heartbeat=HEARTBEAT, expiry=EXPIRY, cycle=CYCLE)


def test_fleet_failover_resharding_rebalance(emulators, kinesis_client, dynamodb_client, unique_name, tmp_path):
    stream, app = unique_name("fleet"), unique_name("fleetapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=6)
    wait_stream_active(kinesis_client, stream)
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    produced: set[int] = set()
    next_id = [0]

    def put(count: int, aggregate: int) -> None:
        report = produce(kinesis_client, stream, count=count, rate=None, aggregate=aggregate,
                         payload=lambda n: json.dumps({"id": n + next_id[0]}).encode(),
                         poison_every=None, create_shards=None)
        produced.update(n + next_id[0] for n in range(count))
        assert report.user_records == count
        next_id[0] += count

    put(300, 1)
    put(600, 20)

    table = LeaseTable(app, dynamodb_client)
    procs: dict[str, subprocess.Popen] = {}
    outs = {w: tmp_path / w for w in ("c1", "c2", "c3", "c4")}
    for w in ("c1", "c2", "c3"):
        procs[w] = _consume(env, stream, app, w, outs[w], tmp_path / f"{w}.log")
    monitor = None
    try:
        wait_until(lambda: table.ensure_table() is False and len(table.scan()) == 6, 30, "six leases")
        monitor = LeaseMonitor(table)
        monitor.start()
        wait_until(lambda: all(lease.lease_owner for lease in table.scan()), 30, "every lease owned")
        # Every lease can be owned before the last consumer has taken its share (the first two started sooner):
        # the crash below needs c1 to hold something, so wait for the fleet to share the leases out.
        wait_until(lambda: {lease.lease_owner for lease in table.scan()} == {"c1", "c2", "c3"}, 60,
                   "each of the three consumers holding a lease")

        # Crash c1: SIGKILL its whole process group (manager and workers), as a host dying.
        victims = {lease.lease_key for lease in table.scan() if lease.lease_owner == "c1"}
        assert victims, "c1 should hold at least one lease in a 3-consumer fleet of 6 shards"
        os.killpg(procs["c1"].pid, signal.SIGKILL)
        procs["c1"].wait()
        killed_at = time.monotonic()
        # A liveness wait, not a bound (the figure is printed): the survivors see the leases expire at their
        # cycles and take each through a worker process they spawn, whose start took tens of seconds in CI's load.
        wait_until(lambda: all(monitor.owners.get(k) not in (None, "c1") for k in victims), 180,
                   "c1's leases taken by the survivors")
        failover = time.monotonic() - killed_at
        print(f"failover after SIGKILL: {failover:.1f}s = {failover / EXPIRY:.2f}x the lease expiry")

        # Reshard while records flow: split one shard, merge two adjacent ones.
        shards = {s.shard_id: s for s in list_shards(kinesis_client, stream)}
        ordered = sorted(shards.values(), key=lambda s: int(s.hash_key_range.starting_hash_key))
        split = ordered[0]
        mid = (int(split.hash_key_range.starting_hash_key) + int(split.hash_key_range.ending_hash_key)) // 2
        kinesis_client.split_shard(StreamName=stream, ShardToSplit=split.shard_id, NewStartingHashKey=str(mid))
        wait_stream_active(kinesis_client, stream)
        put(200, 1)
        kinesis_client.merge_shards(StreamName=stream, ShardToMerge=ordered[2].shard_id,
                                    AdjacentShardToMerge=ordered[3].shard_id)
        wait_stream_active(kinesis_client, stream)
        put(200, 10)

        # A fourth consumer joins.
        procs["c4"] = _consume(env, stream, app, "c4", outs["c4"], tmp_path / "c4.log")

        def balanced():
            # Holders report their smoothed throughput, so the fleet balances by load (within the stated
            # tolerance) until the reports decay to 0 after production stops, and by count after that.
            live = [lease for lease in table.scan() if not lease.is_ended]
            held: dict[str, dict[str, float | None]] = {w: {} for w in ("c2", "c3", "c4")}
            for lease in live:
                if lease.lease_owner not in held:
                    return False
                held[lease.lease_owner][lease.lease_key] = reported_load(lease)
            return imbalance(held) is None and {w: len(keys) for w, keys in held.items()}

        counts = wait_until(balanced, 90, "the fleet to rebalance (by load, or within one lease once idle)")
        print(f"balanced: {counts}")

        def all_delivered():
            return produced <= record_ids(delivered_records(outs.values()).values())

        wait_until(all_delivered, 90, "every produced record delivered")
    finally:
        if monitor is not None:
            monitor.stop.set()
        stop_processes(procs.values(), 40)

    for w in ("c2", "c3", "c4"):
        assert procs[w].returncode == 0, (tmp_path / f"{w}.log").read_text()[-3000:]
    delivered = delivered_records(outs.values())
    assert produced <= record_ids(delivered.values())
    assert monitor.regressions == []
    # No child before its parents ended: a child lease is owned only after each parent is SHARD_END.
    for child, parents in monitor.parents.items():
        if child in monitor.first_owned_at and parents:
            for parent in parents:
                if parent in monitor.last:
                    assert parent in monitor.ended_at, f"{child} owned while parent {parent} not ended"
                    assert monitor.ended_at[parent] <= monitor.first_owned_at[child] + 0.11, (child, parent)
    # Graceful stop released every lease, finished ones included.
    assert [lease.lease_key for lease in table.scan() if lease.lease_owner] == []
