"""This consumer's worker metrics item, where a KCL 3.x leader reads it: in KCL 3.0–3.4's table
`<application>-WorkerMetricStats` (hash key `wid`), or — KCL 3.5's one-table layout (coordinator_state.Layout) —
in the lease table, keyed by `leaseKey` = the worker id with `entityType` WORKER_METRIC_STATS (Java's
LeaseTableWorkerMetricStats: the worker id is the item's leaseKey; its other attributes are the same).

KCL 3.x's format: `wid` (worker id), `lut` (last update, epoch seconds), `sts` (metric name → list of
recent values), `opr` (operating range), `properties`, `sup`/`slu` (support code and its update time).
A worker whose `sts` holds `THROUGHPUT` uses KCL's default metric: load is judged by throughput, and no
operating range is needed. This consumer publishes THROUGHPUT (KB/s, most recent last) — CPU utilisation
of a container is not reliably observable from Python without extra dependencies.

The write sets only `lut` and `sts`: any other attribute (a KCL 3.x worker's `opr`, `properties`, `sup`,
`slu` under the same id, or attributes of later versions) is never stripped.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

HASH_KEY = "wid"
THROUGHPUT_METRIC = "THROUGHPUT"  # KCL's WorkerMetricType.THROUGHPUT.name(): the default worker metric
MAX_VALUES = 10  # recent values kept, most recent last


def worker_metrics_table(application: str) -> str:
    return f"{application}-WorkerMetricStats"


def metrics_update(worker_id: str, now_epoch_seconds: int, throughput_kbps: Sequence[float]) -> dict[str, Any]:
    """The UpdateItem arguments (without TableName) for this worker's item: pure."""
    if not worker_id:
        raise ValueError("worker metrics need a worker id")
    values = list(throughput_kbps)[-MAX_VALUES:]
    for value in values:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"worker metric {THROUGHPUT_METRIC}: values must be finite numbers >= 0, got {value!r}")
    return dict(Key={HASH_KEY: {"S": worker_id}},
                UpdateExpression="SET lut = :lut, sts = :sts",
                ExpressionAttributeValues={
                    ":lut": {"N": str(int(now_epoch_seconds))},
                    ":sts": {"M": {THROUGHPUT_METRIC: {"L": [{"N": repr(float(v))} for v in values]}}}})


LEASE_TABLE_HASH_KEY = "leaseKey"
ENTITY_TYPE = "WORKER_METRIC_STATS"  # EntityType.WORKER_METRIC_STATS's value


def lease_table_metrics_update(worker_id: str, now_epoch_seconds: int,
                               throughput_kbps: Sequence[float]) -> dict[str, Any]:
    """The UpdateItem arguments (without TableName) for this worker's item in the lease table (the one-table
    layout): the same `lut` and `sts`, with `entityType` WORKER_METRIC_STATS, and only on an item that is no
    lease or other entity (a worker id equal to a lease key must never overwrite that lease)."""
    legacy = metrics_update(worker_id, now_epoch_seconds, throughput_kbps)
    return dict(Key={LEASE_TABLE_HASH_KEY: {"S": worker_id}},
                UpdateExpression="SET entityType = :entity, lut = :lut, sts = :sts",
                ConditionExpression="attribute_not_exists(leaseKey) OR entityType = :entity",
                ExpressionAttributeValues={**legacy["ExpressionAttributeValues"], ":entity": {"S": ENTITY_TYPE}})


def lease_table_last_updates(items: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Worker id → `lut` of the lease table's WORKER_METRIC_STATS items (others are skipped)."""
    return last_updates({HASH_KEY: item[LEASE_TABLE_HASH_KEY], **item} for item in items
                        if item.get("entityType", {}).get("S") == ENTITY_TYPE and LEASE_TABLE_HASH_KEY in item)


def last_updates(items: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Worker id → `lut` (epoch seconds) of each item of the worker metrics table, as DynamoDB returns
    them; an item without a string `wid` or a numeric `lut` (another tool's, or half-written) is skipped."""
    found: dict[str, float] = {}
    for item in items:
        wid, lut = item.get(HASH_KEY, {}).get("S"), item.get("lut", {}).get("N")
        try:
            value = float(lut) if wid and lut is not None else None
        except ValueError:
            value = None
        if value is not None and math.isfinite(value):
            found[wid] = value
    return found


def live_workers(updates: Mapping[str, float], now_epoch_seconds: float, fresh_seconds: float) -> set[str]:
    """The workers whose item was updated within `fresh_seconds` (pure; clocks of different hosts, so
    the window must be wide: see `fresh_seconds` in cycle.py)."""
    return {wid for wid, lut in updates.items() if now_epoch_seconds - lut <= fresh_seconds}
