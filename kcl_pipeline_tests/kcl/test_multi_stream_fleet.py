"""A multi-stream application with real processes: `kcl-pipeline consume --stream A --stream B` on the emulators.

Three consumers share one lease table for two streams; each stream is split while records flow, and stream B
is deleted and re-created (same name, same shard ids) mid-run. Checked: every record of each stream (and of
each incarnation of B) delivered, and under its own stream's lease; every lease item in KCL's multi-stream
format; no checkpoint of one stream (or of B's first incarnation) on another's lease; SIGTERM leaves no lease
owned.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import time

import pytest

from kcl_pipeline.kcl.core.streams import parse_multi_stream_key
from kcl_pipeline.kcl.core.table.lease_codec import is_lease_item
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.shards import list_shards, stream_scope, wait_stream_active
from kcl_pipeline.local.producer import produce

from .fleet_support import consume_process, sink_lines, stop_processes, wait_until

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HEARTBEAT, EXPIRY, CYCLE = 1.0, 3.0, 1.0


def _lines(outs) -> list[dict]:
    return sink_lines(outs)


def _payload(record: dict) -> dict:
    return json.loads(base64.b64decode(record["data_base64"]))


def _split_first(kinesis, stream: str) -> None:
    shard = min((s for s in list_shards(kinesis, stream) if s.ending_sequence_number is None),
                key=lambda s: int(s.hash_key_range.starting_hash_key))
    lo, hi = int(shard.hash_key_range.starting_hash_key), int(shard.hash_key_range.ending_hash_key)
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str((lo + hi) // 2))
    wait_stream_active(kinesis, stream)


def test_multi_stream_fleet_splits_and_a_recreated_stream_never_resumes_from_stale_checkpoints(
        emulators, kinesis_client, dynamodb_client, unique_name, tmp_path):
    a, b, app = unique_name("msa"), unique_name("msb"), unique_name("msapp")
    for stream in (a, b):
        kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    for stream in (a, b):
        wait_stream_active(kinesis_client, stream)
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    produced: dict[str, set[int]] = {}  # stream identifier -> ids
    next_id = [0]

    def put(stream: str, count: int, aggregate: int) -> None:
        identifier = stream_scope(kinesis_client, stream).identifier
        first = next_id[0]
        produce(kinesis_client, stream, count=count, rate=None, aggregate=aggregate,
                payload=lambda n: json.dumps({"stream": stream, "id": first + n}).encode(), poison_every=None,
                create_shards=None)
        produced.setdefault(identifier, set()).update(range(first, first + count))
        next_id[0] += count

    def delivered() -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for r in _lines(outs.values()):
            out.setdefault(r["stream"], set()).add(_payload(r)["id"])
        return out

    def all_delivered() -> bool:
        got = delivered()
        return all(ids <= got.get(identifier, set()) for identifier, ids in produced.items())

    put(a, 200, 1)
    put(b, 200, 10)
    old_b = stream_scope(kinesis_client, b).identifier
    table = LeaseTable(app, dynamodb_client)
    outs = {w: tmp_path / w for w in ("c1", "c2", "c3")}
    procs: dict[str, subprocess.Popen] = {
        w: consume_process(env, [a, b], app, w, outs[w], tmp_path / f"{w}.log", heartbeat=HEARTBEAT,
                           expiry=EXPIRY, cycle=CYCLE) for w in outs}
    try:
        wait_until(lambda: table.ensure_table() is False and len(table.scan()) == 4, 60, "four leases, two per stream")
        wait_until(all_delivered, 90, "the first records of both streams delivered")

        # A split on each stream while records flow.
        _split_first(kinesis_client, a)
        put(a, 150, 1)
        _split_first(kinesis_client, b)
        put(b, 150, 5)
        wait_until(all_delivered, 120, "every record of both streams delivered after the splits")

        # Stream B deleted and re-created: the same name and shard ids, a new creation time.
        kinesis_client.delete_stream(StreamName=b)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b in kinesis_client.list_streams()["StreamNames"]:
            time.sleep(0.2)
        time.sleep(1.5)  # the identifier carries the creation time in seconds
        put(a, 100, 1)
        kinesis_client.create_stream(StreamName=b, ShardCount=2)
        wait_stream_active(kinesis_client, b)
        new_b = stream_scope(kinesis_client, b).identifier
        assert new_b != old_b
        put(b, 200, 1)
        wait_until(all_delivered, 120, "every record of the re-created stream delivered")
    finally:
        stop_processes(procs.values(), 40)

    logs = {w: (tmp_path / f"{w}.log").read_text() for w in outs}
    for w, p in procs.items():
        assert p.returncode == 0, logs[w][-3000:]
    got = delivered()
    for identifier, ids in produced.items():
        assert ids <= got[identifier], identifier
    # Each record under its own stream's lease: the new B delivered only its own records, from TRIM_HORIZON.
    for r in _lines(outs.values()):
        assert _payload(r)["stream"] == r["stream"].split(":")[1]
    assert got[new_b] == produced[new_b], "the re-created stream delivered records that are not its own"

    # Every lease in KCL's multi-stream format; checkpoints only of records delivered under the same lease.
    seqs: dict[str, set[str]] = {}
    for r in _lines(outs.values()):
        seqs.setdefault(f"{r['stream']}:{r['shard_id']}", set()).add(r["sequence_number"])
    # Only leases (a table with KCL 3.x metadata would also hold entities: worker metrics, the migration state).
    items = [item for item in dynamodb_client.scan(TableName=app, ConsistentRead=True)["Items"]
             if is_lease_item(item)]
    identifiers = {a_id for a_id in produced}
    for item in items:
        key = item["leaseKey"]["S"]
        parsed = parse_multi_stream_key(key)
        assert parsed is not None and parsed[0] in identifiers, key
        assert item["streamName"] == {"S": parsed[0]} and item["shardId"] == {"S": parsed[1]}
        assert all(":" not in p for p in item.get("parentShardId", {}).get("SS", [])), item  # as Java: shard ids
        checkpoint = item["checkpoint"]["S"]
        if checkpoint[0].isdigit():
            assert checkpoint in seqs.get(key, set()), f"{key} checkpointed {checkpoint}, not one of its records"
    lease_keys = {item["leaseKey"]["S"] for item in items}
    assert sum(k.startswith(new_b + ":") for k in lease_keys) >= 2
    assert sum(k.startswith(old_b + ":") for k in lease_keys)
    # SIGTERM left no lease owned.
    assert [lease.lease_key for lease in table.scan() if lease.lease_owner] == []


def test_multi_stream_landing_puts_each_stream_incarnation_in_its_own_directory_exactly_once(
        emulators, kinesis_client, unique_name, tmp_path):
    """`consume --stream A --stream B --landing DIR`: one directory per stream incarnation (`<name>@<epoch>`),
    every record landed exactly once, chains verified; the re-created stream never continues the old chains."""
    import sys

    from kcl_pipeline.audit.verify import verify_zone
    from kcl_pipeline.zone.chain import read_batches
    from kcl_pipeline.zone.layout import stream_directory
    from kcl_pipeline.zone.store import open_store

    a, b, app = unique_name("mla"), unique_name("mlb"), unique_name("mlapp")
    for stream in (a, b):
        kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    for stream in (a, b):
        wait_stream_active(kinesis_client, stream)
    zone = tmp_path / "zone"
    env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1"}
    produced: dict[str, set[int]] = {}
    next_id = [0]

    def put(stream: str, count: int) -> None:
        identifier = stream_scope(kinesis_client, stream).identifier
        first = next_id[0]
        produce(kinesis_client, stream, count=count, rate=None, aggregate=4,
                payload=lambda n: json.dumps({"id": first + n}).encode(), poison_every=None, create_shards=None)
        produced.setdefault(stream_directory(identifier), set()).update(range(first, first + count))
        next_id[0] += count

    store = open_store(str(zone))

    def landed(directory: str) -> list[int]:
        try:
            return [json.loads(d)["id"] for d in read_batches(store, directory).column("data").to_pylist()]
        except Exception:
            return []

    def all_landed() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        return all(ids <= set(landed(d)) for d, ids in produced.items())

    put(a, 150)
    put(b, 150)
    cmd = [sys.executable, "-m", "kcl_pipeline.cli", "consume", "--stream", a, "--stream", b, "--application", app,
           "--worker-id", "lander", "--landing", str(zone), "--heartbeat-seconds", "1", "--lease-expiry-seconds",
           "3", "--cycle-seconds", "1", "--leases-to-acquire", "4", "--batch-seconds", "0.5"]
    log = tmp_path / "lander.log"
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(all_landed, 90, "both streams landed")
        kinesis_client.delete_stream(StreamName=b)
        time.sleep(1.5)
        kinesis_client.create_stream(StreamName=b, ShardCount=2)
        wait_stream_active(kinesis_client, b)
        put(b, 150)
        put(a, 50)
        wait_until(all_landed, 90, "the re-created stream landed")
    finally:
        stop_processes([proc], 40)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert sorted(store.list_dirs("")) == sorted(produced)  # a@e1, b@e1 and b@e2
    for directory, ids in produced.items():
        got = landed(directory)
        assert sorted(got) == sorted(ids), directory  # exactly once, and only its own records
    report = verify_zone(str(zone))
    assert report.ok, report


def test_forget_incarnation_deletes_only_an_earlier_incarnations_leases(emulators, kinesis_client, dynamodb_client,
                                                                         unique_name):
    """The operator's tool for what the sensor reports after a re-creation: the old incarnation's leases go,
    the current incarnation's stay, and the current incarnation itself is refused."""
    from click.testing import CliRunner

    from kcl_pipeline.cli import main
    from kcl_pipeline.kcl.core.model import Checkpoint, Lease
    from kcl_pipeline.kcl.core.streams import identifier_parts, multi_stream_key
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable
    from kcl_pipeline.kcl.shells.shards import stream_scope
    from kcl_pipeline.local.producer import produce

    stream, application = unique_name("forget"), unique_name("forget-app")
    produce(kinesis_client, stream, 1, create_shards=1)
    current = stream_scope(kinesis_client, stream).identifier
    account, name, epoch = identifier_parts(current)
    earlier = f"{account}:{name}:{epoch - 600}"
    table = LeaseTable(application, dynamodb_client)
    table.ensure_table()
    for identifier in (earlier, current):
        for shard in ("shardId-000000000000", "shardId-000000000001"):
            assert table.create(Lease(multi_stream_key(identifier, shard), Checkpoint("TRIM_HORIZON")))
    env = emulators.env()
    refused = CliRunner().invoke(main, ["forget-incarnation", current, "--application", application], env=env)
    assert refused.exit_code == 2 and "is the current incarnation" in refused.output
    bad = CliRunner().invoke(main, ["forget-incarnation", "orders", "--application", application], env=env)
    assert bad.exit_code == 2 and "is not a stream identifier" in bad.output
    done = CliRunner().invoke(main, ["forget-incarnation", earlier, "--application", application], env=env)
    assert done.exit_code == 0 and "2 of 2 leases" in done.output, done.output
    assert sorted(lease.lease_key for lease in table.scan()) == [
        multi_stream_key(current, "shardId-000000000000"), multi_stream_key(current, "shardId-000000000001")]


def test_forget_incarnation_keeps_a_lease_that_moved_since_it_was_read_and_exits_1(emulators, dynamodb_client,
                                                                                  unique_name, monkeypatch):
    from click.testing import CliRunner

    from kcl_pipeline.cli import main
    from kcl_pipeline.kcl.core.model import Checkpoint, Lease
    from kcl_pipeline.kcl.core.streams import multi_stream_key
    from kcl_pipeline.kcl.shells.lease_table import LeaseTable

    application = unique_name("forget-app")
    earlier = "000000000000:gone-stream:1700000000"  # a stream that no longer exists
    table = LeaseTable(application, dynamodb_client)
    table.ensure_table()
    keys = [multi_stream_key(earlier, f"shardId-00000000000{i}") for i in range(2)]
    for key in keys:
        assert table.create(Lease(key, Checkpoint("TRIM_HORIZON")))
    read = table.scan()
    assert table.acquire(keys[1], "late-worker", None, 0) is not None  # moves after the command read it
    monkeypatch.setattr(LeaseTable, "scan", lambda self: read)
    result = CliRunner().invoke(main, ["forget-incarnation", earlier, "--application", application],
                                env=emulators.env())
    assert result.exit_code == 1 and f"kept {keys[1]}" in result.output and "1 of 2 leases" in result.output
    monkeypatch.undo()
    assert [lease.lease_key for lease in table.scan()] == [keys[1]]
