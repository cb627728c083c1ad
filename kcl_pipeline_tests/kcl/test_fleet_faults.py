"""Lease safety under real faults, with real processes: `kcl-pipeline consume` on kinesis-local + dynalite.

Three consumers share a 6-shard stream, one of them started twice under the same `--worker-id`; every
DynamoDB request goes through a fault-injecting proxy that drops 5 % of the responses after the write was
applied (botocore retries; the table must read back what happened). One whole consumer (its manager and
its workers) is frozen with SIGSTOP for 2.5× the lease expiry and then thawed: a zombie — and meanwhile an
operator restarts it, so a new process runs under the zombie's own worker id.

Checked: every record delivered; the zombie delivers nothing for a lease once its new incarnation (same
id: only the counter tells them apart) has delivered from it; no lease stays owned-but-unworked (owner set,
counter still) longer than one expiry + the slowest cycle the live consumers ran (plus the monitor's own polling
slack); SIGTERM leaves no lease owned.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import wait_stream_active
from kcl_pipeline.local.producer import produce
from kcl_pipeline_tests.fault_proxy import FaultProxy, drop_responses

from .fleet_support import (
    TablePoller,
    consume_process,
    delivered_records,
    record_ids,
    sink_lines,
    stop_processes,
    wait_until,
)

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HEARTBEAT, EXPIRY, CYCLE = 1.0, 3.0, 1.0
# The monitor scans every ~0.1 s through its own (fault-free) client; allow for its polling and for a
# loaded 2-core machine scheduling the taker's scan late.
SLACK = 2.0


# A KCL multi-stream lease, another stream's leases under the same application name (free, held by a Java
# peer, ended), and KCL 3.x entities that are not leases.
FOREIGN_ITEMS = [
    {"leaseKey": {"S": "123456789012:orders:1700000000:shardId-000000000000"}, "leaseCounter": {"N": "3"},
     "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
     "checkpointSubSequenceNumber": {"N": "0"}, "streamName": {"S": "orders"},
     "shardID": {"S": "shardId-000000000000"}},
    {"leaseKey": {"S": "shardId-000000000090"}, "leaseCounter": {"N": "9"}, "checkpoint": {"S": "TRIM_HORIZON"},
     "checkpointSubSequenceNumber": {"N": "0"}},
    {"leaseKey": {"S": "shardId-000000000091"}, "leaseCounter": {"N": "77"}, "leaseOwner": {"S": "java-peer"},
     "checkpoint": {"S": "12345"}, "checkpointSubSequenceNumber": {"N": "0"}, "throughputKBps": {"N": "1.5"}},
    {"leaseKey": {"S": "shardId-000000000092"}, "leaseCounter": {"N": "1"}, "checkpoint": {"S": "SHARD_END"},
     "checkpointSubSequenceNumber": {"N": "0"}, "parentShardId": {"SS": ["shardId-000000000089"]}},
    {"leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "COORDINATOR_STATE"}, "cs": {"S": "KCL_3X_COMPATIBLE"}},
    {"leaseKey": {"S": "worker-metrics-1"}, "entityType": {"S": "WORKER_METRICS"}, "wmv": {"NS": ["12.5"]}},
]


class OwnershipMonitor(TablePoller):
    """Records, per lease, every (owner, counter) change with the wall time it was seen."""

    clock = staticmethod(time.time)

    def __init__(self, table: LeaseTable):
        super().__init__(table)
        self.history: dict[str, list[tuple[float, str | None, int, bool]]] = {}
        self.max_unworked: dict[str, float] = {}
        self._still_since: dict[str, tuple[str | None, int, float]] = {}

    def observe(self, leases, now: float) -> None:
        for lease in leases:
            key = lease.lease_key
            state = (lease.lease_owner, lease.lease_counter, lease.is_ended)
            seen = self.history.setdefault(key, [])
            if not seen or seen[-1][1:] != state:
                seen.append((now, *state))
            previous = self._still_since.get(key)
            if previous is None or previous[:2] != state[:2]:
                self._still_since[key] = (lease.lease_owner, lease.lease_counter, now)
            elif lease.lease_owner is not None and not lease.is_ended:
                self.max_unworked[key] = max(self.max_unworked.get(key, 0.0), now - previous[2])


def _consume(env, stream, app, worker_id, out: Path, log: Path) -> subprocess.Popen:
    return consume_process(env, stream, app, worker_id, out, log, heartbeat=HEARTBEAT, expiry=EXPIRY, cycle=CYCLE)


def _longest_cycle(log: str) -> float:
    """The longest time between two cycle lines of a consumer's log (its manager's cycles as they ran)."""
    stamps = [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in log.splitlines()
              if "fleet.manager: cycle " in line]
    return max((b - a for a, b in pairwise(stamps)), default=0.0)


def _slowest_worker_start(log: str) -> float:
    """The longest time from a manager's spawn of a lease's worker process to a worker of that lease showing its
    first line: the worker takes the lease itself once it runs, so a taker's lease stays still for its start too
    (tens of seconds on a loaded two-core machine, where a Python process importing boto3 waits for a core; a
    worker that has not shown its take within the manager's start patience is killed and spawned again, so the
    time counts from the first spawn of such a series)."""
    stamp = lambda line: datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # noqa: E731
    first_spawn: dict[str, float] = {}
    longest = 0.0
    for line in log.splitlines():
        if "spawned worker pid" in line:
            first_spawn.setdefault(line.split(" for ")[1].split()[0], stamp(line))
        elif "[worker " in line:
            shard = line.split("[worker ", 1)[1].split("]", 1)[0]
            if shard in first_spawn:
                longest = max(longest, stamp(line) - first_spawn.pop(shard))
    return longest


def _lines(out: Path) -> list[dict]:
    return sink_lines([out])


@pytest.mark.timeout(1200)
def test_fleet_survives_a_zombie_a_duplicate_worker_id_and_lost_responses(
        emulators, kinesis_client, dynamodb_client, unique_name, tmp_path):
    stream, app = unique_name("faults"), unique_name("faultsapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=6)
    wait_stream_active(kinesis_client, stream)
    proxy = FaultProxy(emulators.dynamodb, drop_responses(0.05, seed=11)).start()
    env = {**os.environ, **emulators.env(), "AWS_ENDPOINT_URL_DYNAMODB": proxy.url, "PYTHONUNBUFFERED": "1"}
    produced: set[int] = set()
    next_id = [0]

    def put(count: int, aggregate: int) -> None:
        produce(kinesis_client, stream, count=count, rate=None, aggregate=aggregate,
                payload=lambda n: json.dumps({"id": n + next_id[0]}).encode(), poison_every=None,
                create_shards=None)
        produced.update(n + next_id[0] for n in range(count))
        next_id[0] += count

    put(300, 1)
    put(300, 10)
    table = LeaseTable(app, dynamodb_client)  # direct, fault-free: the monitor's view is the truth
    table.ensure_table()
    for item in FOREIGN_ITEMS:  # a shared table: none of these may change
        dynamodb_client.put_item(TableName=app, Item=item)
    names = {"zombie": "zombie", "twin-a": "twin", "twin-b": "twin", "steady": "steady"}
    outs = {name: tmp_path / name for name in names}
    procs = {name: _consume(env, stream, app, wid, outs[name], tmp_path / f"{name}.log")
             for name, wid in names.items()}
    monitor = OwnershipMonitor(table)
    try:
        wait_until(lambda: len(table.scan()) == 6 + 4, 60, "six leases beside the four foreign ones")
        monitor.start()
        ours = lambda: [lease for lease in table.scan() if lease.lease_key.startswith("shardId-00000000000")]  # noqa: E731
        wait_until(lambda: all(lease.lease_owner for lease in ours())
              and any(lease.lease_owner == "zombie" for lease in ours()), 60,
              "every lease owned, some by the consumer to freeze")

        os.killpg(procs["zombie"].pid, signal.SIGSTOP)  # the manager and its workers
        # The operator restarts the hung service: a new process under the same worker id.
        outs["restarted"] = tmp_path / "restarted"
        procs["restarted"] = _consume(env, stream, app, "zombie", outs["restarted"], tmp_path / "restarted.log")
        names["restarted"] = "zombie"
        put(200, 1)
        time.sleep(2.5 * EXPIRY)
        # On a loaded machine the new process may start after the others took the frozen leases; it then
        # steals its share by balance, which is by load while the leases report traffic: a consumer holding
        # nothing may stay so, within the balance's tolerance, until the reports decay (30-s smoothing: about
        # 3.5 minutes from a busy shard to idle) and the count decides. The zombie thaws only once it holds one,
        # or the check below is empty.
        wait_until(lambda: "spawned worker pid" in (tmp_path / "restarted.log").read_text(), 300,
                   "the restarted incarnation holding a lease")
        # ... and having delivered from it (the zombie check below compares against its first delivery; once
        # the zombie thaws, the twins under one id may both back off and the new one could deliver nothing).
        for _ in range(20):
            if outs["restarted"].exists() and _lines(outs["restarted"]):
                break
            put(60, 1)
            time.sleep(1.5)
        os.killpg(procs["zombie"].pid, signal.SIGCONT)
        put(200, 5)

        wait_until(lambda: produced <= record_ids(delivered_records(outs.values()).values()), 120,
                   "every produced record delivered")
        time.sleep(2 * EXPIRY)  # let the thawed zombie settle (and rejoin)
    finally:
        monitor.stop.set()
        stop_processes(procs.values(), 60)
        proxy.stop()

    logs = {name: (tmp_path / f"{name}.log").read_text() for name in names}
    for name, p in procs.items():
        assert p.returncode == 0, logs[name][-3000:]
    assert produced <= record_ids(delivered_records(outs.values()).values())
    assert sum(proxy.faults.values()) > 0, "the proxy dropped no response: the test proved nothing"

    # Once the new incarnation delivered from a shard, the zombie (same worker id) delivered nothing more from it.
    first_new = {}
    for r in _lines(outs["restarted"]):
        first_new[r["shard_id"]] = min(first_new.get(r["shard_id"], r["delivered_at_ms"]), r["delivered_at_ms"])
    assert first_new, "the restarted incarnation never took a lease"
    late = [(r["shard_id"], r["delivered_at_ms"] - first_new[r["shard_id"]]) for r in _lines(outs["zombie"])
            if r["shard_id"] in first_new and r["delivered_at_ms"] > first_new[r["shard_id"]]]
    assert late == [], f"the zombie delivered after its new incarnation took its lease: {late[:5]}"

    # No lease owned but unworked for longer than one expiry + the slowest cycle the takers actually ran + the
    # slowest start of a taker's worker process: on a loaded two-core machine (the suite and the Java lane beside
    # it) a consumer's cycle stretched from 1 s to several and a worker's start to tens of seconds, and a taker
    # takes at its cycle, through the worker it spawns. A lease nobody works stays still for the rest of the test.
    foreign_keys = {item["leaseKey"]["S"] for item in FOREIGN_ITEMS}
    worst = max((age for key, age in monitor.max_unworked.items() if key not in foreign_keys), default=0.0)
    slowest_cycle = max(_longest_cycle(logs[name]) for name in names if name != "zombie")
    slowest_start = max(_slowest_worker_start(logs[name]) for name in names if name != "zombie")
    assert worst <= EXPIRY + max(CYCLE, slowest_cycle) + slowest_start + SLACK, (
        slowest_cycle, slowest_start, monitor.max_unworked)

    # The duplicate worker id was noticed and said loudly, not silently shared.
    assert "another live process is writing under this consumer's worker id twin" in logs["twin-a"] + logs["twin-b"]

    # SIGTERM left no lease owned, finished ones included (other applications' leases are theirs to hold).
    assert [lease.lease_key for lease in table.scan()
            if lease.lease_owner and lease.lease_key not in foreign_keys] == []

    # Other applications' items in the shared table, byte for byte as they were.
    for item in FOREIGN_ITEMS:
        assert dynamodb_client.get_item(TableName=app, Key={"leaseKey": item["leaseKey"]},
                                        ConsistentRead=True).get("Item") == item
