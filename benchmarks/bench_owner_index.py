"""Lease-table read units per consumer-minute: full scans only vs scans plus the leaseOwner index.

Measured on dynalite (the DynamoDB emulator), from the ConsumedCapacity it reports per request
(ReturnConsumedCapacity=TOTAL, DynamoDB's own rules: 4 KB per read unit, consistent scans, eventually
consistent index queries at half a unit): a table of 1,000 leases owned by 20 consumers (50 each).
Per consumer-minute, with the default 20 s manager cycle (3 cycles a minute):
  * scan-only (the named peer, today's behaviour and Java KCL 2.x's): every cycle scans the whole table;
  * with the index: one full scan every `--scan-every` cycles, and in between the consumer queries the
    index for its own leases. LABEL: the per-request units are measured; the schedule is computed — the
    manager does not yet skip scans (see docs/kcl3.md).

    .venv/bin/python benchmarks/bench_owner_index.py [--shards 1000] [--consumers 20] [--scan-every 6]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.kcl.core.model import Checkpoint, Lease  # noqa: E402
from kcl_pipeline.kcl.core.table.lease_codec import OWNER_INDEX_NAME  # noqa: E402
from kcl_pipeline.kcl.shells.aws import client  # noqa: E402
from kcl_pipeline.kcl.shells.lease_table import LeaseTable  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402

SEQUENCE = "49590338271490256608559692538361571095921575989136588898"  # a realistic 56-digit sequence number
CYCLES_PER_MINUTE = 60 / 20.0


def units(ddb, operation: str, **request) -> float:
    total = 0.0
    while True:
        page = getattr(ddb, operation)(ReturnConsumedCapacity="TOTAL", **request)
        total += page.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0)
        if not page.get("LastEvaluatedKey"):
            return total
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=20)
    parser.add_argument("--scan-every", type=int, default=6)
    args = parser.parse_args()
    stack = EmulatorStack(Path(tempfile.mkdtemp(prefix="bench-index-")))
    endpoints = stack.start()
    os.environ.update(endpoints.env())
    try:
        ddb = client("dynamodb", endpoints.aws_settings())
        table = LeaseTable("bench-owner-index", ddb)
        table.ensure_table()
        for i in range(args.shards):
            table.create(Lease(f"shardId-{i:012d}", Checkpoint(SEQUENCE), f"consumer-{i % args.consumers:02d}#1", 17,
                               parent_shard_ids=(f"shardId-{i + 5000:012d}",)))
        scan = units(ddb, "scan", TableName=table.table_name, ConsistentRead=True)
        query = units(ddb, "query", TableName=table.table_name, IndexName=OWNER_INDEX_NAME,
                      KeyConditionExpression="leaseOwner = :o",
                      ExpressionAttributeValues={":o": {"S": "consumer-00#1"}})
    finally:
        stack.stop()
    scan_only = scan * CYCLES_PER_MINUTE
    with_index = (scan + (args.scan_every - 1) * query) / args.scan_every * CYCLES_PER_MINUTE
    print(f"{args.shards} leases, {args.consumers} consumers; dynalite ConsumedCapacity per request: "
          f"full consistent scan {scan:.1f} RCU, own-leases index query {query:.1f} RCU")
    print(f"read units per consumer-minute (20 s cycle): scan-only {scan_only:.1f}, "
          f"index + a scan every {args.scan_every} cycles {with_index:.1f} "
          f"(ratio index/scan-only {with_index / scan_only:.2f}); fleet: {scan_only * args.consumers:.0f} vs "
          f"{with_index * args.consumers:.0f} RCU/min")


if __name__ == "__main__":
    main()
