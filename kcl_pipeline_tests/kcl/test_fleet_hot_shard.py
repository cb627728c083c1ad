"""A 10x hot shard, balanced by load with real processes: two `kcl-pipeline consume` on kinesis-local +
dynalite, twelve shards, one of them carrying ten times the traffic of each other one.

The count balance (six leases each) leaves the hot shard's consumer with 15 of the 21 units of traffic
(1.43x the mean); the hot shard alone is lighter than the mean, so the stated tolerance applies in full.
Checked: the holders' `throughputKBps` reports move the fleet until no consumer carries more than the mean
x 1.2, and then no lease changes owner for a steady stretch; a move was a graceful hand-off; SIGTERM leaves
no lease owned.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from kcl_pipeline.kcl.core.fleet.balance import imbalance, reported_load
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, wait_stream_active

from .fleet_support import TablePoller, consume_process, stop_processes, wait_until

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HEARTBEAT, EXPIRY, CYCLE = 1.0, 3.0, 1.0
SHARDS, HOT, RECORD = 12, 10, b"x" * 1000
STEADY = 20.0  # seconds without a move once within the tolerance


class Moves(TablePoller):
    """Counts owner changes of live leases (steals and hand-offs alike), with when they were seen."""

    clock = staticmethod(time.monotonic)

    def __init__(self, table: LeaseTable):
        super().__init__(table)
        self.owners: dict[str, str | None] = {}
        self.moves: list[float] = []

    def observe(self, leases, now: float) -> None:
        for lease in leases:
            before = self.owners.get(lease.lease_key)
            if before is not None and lease.lease_owner is not None and before != lease.lease_owner:
                self.moves.append(now)
            if lease.lease_owner is not None:
                self.owners[lease.lease_key] = lease.lease_owner


def _produce(kinesis_client, stream: str, stop: threading.Event) -> None:
    """Ten records a second on each shard, a hundred on the hot one (1 KB each), until stopped."""
    starts = sorted(int(s.hash_key_range.starting_hash_key) for s in list_shards(kinesis_client, stream))
    batch = [{"Data": RECORD, "PartitionKey": "k", "ExplicitHashKey": str(start)} for start in starts]
    batch += [{"Data": RECORD, "PartitionKey": "k", "ExplicitHashKey": str(starts[0])}] * (HOT - 1)
    while not stop.is_set():
        kinesis_client.put_records(StreamName=stream, Records=batch)
        stop.wait(0.1)


def test_a_10x_hot_shard_is_balanced_by_load_and_then_nothing_moves(
        emulators, kinesis_client, dynamodb_client, unique_name, tmp_path: Path):
    stream, app = unique_name("hot"), unique_name("hotapp")
    kinesis_client.create_stream(StreamName=stream, ShardCount=SHARDS)
    wait_stream_active(kinesis_client, stream)
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(kinesis_client, stream, stop), daemon=True)
    producer.start()
    table = LeaseTable(app, dynamodb_client)
    names = ("c1", "c2")
    # Peers are known to run this protocol (and so asked for hand-offs) once their worker metrics were read:
    # every 2 s here, not the default 30 s, so that the first moves are already graceful.
    def start(w: str):
        return consume_process(env, stream, app, w, tmp_path / w, tmp_path / f"{w}.log", heartbeat=HEARTBEAT,
                               expiry=EXPIRY, cycle=CYCLE, extra=("--worker-metrics-period-seconds", "2"))

    # The first consumer takes every lease before the second starts: started together, the two could split the
    # leases within the tolerance by chance (the hot shard alone against the other eleven), and nothing would
    # have to move.
    procs = {names[0]: start(names[0])}
    moves = Moves(table)
    try:
        wait_until(lambda: table.ensure_table() is False and len(table.scan()) == SHARDS
                   and all(lease.lease_owner == names[0] for lease in table.scan()), 120,
                   f"{names[0]} holding all twelve leases")
        moves.start()
        procs[names[1]] = start(names[1])

        def within():
            held: dict[str, dict[str, float | None]] = {w: {} for w in names}
            for lease in table.scan():
                if lease.lease_owner not in held:
                    return False
                held[lease.lease_owner][lease.lease_key] = reported_load(lease)
            reported = [v for leases in held.values() for v in leases.values()]
            return all(v for v in reported) and imbalance(held) is None and held

        def steady():
            held = within()
            # The poller must have seen this ownership: on a starved host it can lag behind the moves, and a
            # fleet judged steady on a poller that had recorded none of them yet was not.
            seen = held and all(moves.owners.get(key) == owner for owner, leases in held.items() for key in leases)
            return seen and (not moves.moves or time.monotonic() - moves.moves[-1] >= STEADY) and held

        held = wait_until(steady, 240, f"the fleet within the load tolerance, with no move for {STEADY:.0f}s",
                          interval=1.0)
        moved_before = len(moves.moves)
        time.sleep(10.0)  # and it stays put
        assert len(moves.moves) == moved_before, "a lease moved in steady state"
        # The reported loads are rates over the last heartbeats: beside other work one look may stray past the
        # tolerance for a moment (it did once, with the machine shared); the fleet must be within it again, and
        # nothing may have moved meanwhile.
        wait_until(within, 30, "the fleet back within the load tolerance, without a move", interval=1.0)
        assert len(moves.moves) == moved_before, "a lease moved in steady state"
        loads = {w: sum(v for v in leases.values()) for w, leases in held.items()}
        print(f"balanced after {moved_before} moves; loads (KB/s) {({w: round(x, 1) for w, x in loads.items()})}")
    finally:
        stop.set()
        moves.stop.set()
        stop_processes(procs.values(), 60)
        producer.join(10)
    logs = {w: (tmp_path / f"{w}.log").read_text() for w in names}
    for w, p in procs.items():
        assert p.returncode == 0, logs[w][-3000:]
    assert moves.moves, "no lease moved: the test proved nothing"
    # A lease cannot be split: no consumer carries more than 1.2x the mean or, when one lease alone reports more
    # than the mean, 1.2x that lease (the hot shard's new holder drains its backlog at several times its rate, and
    # on CI's shared cores the balanced fleet reported 234 vs 53 KB/s, the hot shard alone above the mean).
    heaviest = max(v for leases in held.values() for v in leases.values() if v is not None)
    assert max(loads.values()) <= 1.2 * max(sum(loads.values()) / len(loads), heaviest), (loads, held)
    assert any("asked" in log and "graceful hand-off" in log for log in logs.values()), \
        "no balance move was a graceful hand-off"
    assert [lease.lease_key for lease in table.scan() if lease.lease_owner] == []
