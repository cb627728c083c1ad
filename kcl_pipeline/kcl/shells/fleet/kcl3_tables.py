"""The I/O of KCL 3.x's metadata, in both of its layouts (core/table/coordinator_state.py's `Layout`):

* the separate tables of KCL 3.0–3.4: `<app>-CoordinatorState` (the migration state, the leader lock, the
  3.4 → 3.5 table migration state) and `<app>-WorkerMetricStats`;
* KCL 3.5's one-table layout: the same entities as items of the lease table (`entityType`), which the lease
  manager's scans read anyway (lease_codec.LeaseScan.entities).

What the items mean and what this consumer does about them is pure (`core/table/coordinator_state.py`,
`core/fleet/fleet_mode.py`, `core/table/worker_metrics.py`); these functions read them, and write this consumer's worker
metrics item where the fleet's leader reads it. In the one-table layout the separate tables are never created.
Nothing here writes the migration state, the leader lock or another worker's item.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from botocore.exceptions import ClientError

from ...core.fleet import fleet_mode
from ...core.table.coordinator_state import HASH_KEY as STATE_HASH_KEY
from ...core.table.coordinator_state import (
    LEADER_KEY,
    LEASE_TABLE_HASH_KEY,
    MIGRATION_KEY,
    TABLE_MIGRATION_KEY,
    Layout,
    MigrationState,
    Verdict,
    choose_layout,
    coordinator_state_table,
    decide,
    leader_from_item,
    lease_table_leader,
    lease_table_migration,
    lease_table_table_migration,
    migration_state_from_item,
    table_migration_status,
)
from ...core.table.lease_codec import scan_entities
from ...core.table.worker_metrics import ENTITY_TYPE as METRICS_ENTITY_TYPE
from ...core.table.worker_metrics import HASH_KEY as METRICS_HASH_KEY
from ...core.table.worker_metrics import (
    last_updates,
    lease_table_last_updates,
    lease_table_metrics_update,
    metrics_update,
    worker_metrics_table,
)

log = logging.getLogger(__name__)


class Kcl3FleetActive(RuntimeError):
    """A KCL 3.x fleet runs this application in a mode this consumer cannot recognise; starting might fight it."""


def _code(exc: Exception) -> str | None:
    return exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None


def _missing(_client: Any, exc: Exception) -> bool:
    """DynamoDB's ResourceNotFoundException (from any client: boto3's modelled exceptions are ClientErrors)."""
    return _code(exc) == "ResourceNotFoundException"


def _get(client: Any, table: str, key_name: str, key: str) -> Mapping[str, Any] | None:
    """One item (strongly consistent); None when the item or the table is missing."""
    try:
        return client.get_item(TableName=table, Key={key_name: {"S": key}}, ConsistentRead=True).get("Item")
    except Exception as exc:
        if _missing(client, exc):
            return None
        raise


def _table_exists(client: Any, table: str) -> bool:
    try:
        client.describe_table(TableName=table)
        return True
    except Exception as exc:
        if _missing(client, exc):
            return False
        raise


def read_migration_state(dynamodb_client: Any, application: str,
                         state_table: str | None = None) -> MigrationState | None:
    """The separate table's migration item, or None when there is no such table or no item. `state_table`: the
    application's coordinator-state table when it names its own (Java's CoordinatorStateTableConfig.tableName)."""
    return migration_state_from_item(_get(dynamodb_client, state_table or coordinator_state_table(application),
                                          STATE_HASH_KEY, MIGRATION_KEY))


def read_fleet(client: Any, application: str, lease_table: str, view: fleet_mode.FleetView, now: float,
               with_lease_table: bool = False, state_table: str | None = None) -> fleet_mode.FleetView:
    """The view after reading the separate table (its existence decides the layout, with the table migration
    state), and with `with_lease_table` the lease table's entities too (at start, before any scan). `state_table`
    names the coordinator-state table when the application configures its own (Java reads that name from
    CoordinatorStateTableConfig; looking only for the default would run leaderless beside a 3.x leader)."""
    separate_table = state_table or coordinator_state_table(application)
    exists = _table_exists(client, separate_table)
    separate = leader = status = None
    if exists:
        separate = migration_state_from_item(_get(client, separate_table, STATE_HASH_KEY, MIGRATION_KEY))
        leader = leader_from_item(_get(client, separate_table, STATE_HASH_KEY, LEADER_KEY))
        status = table_migration_status(_get(client, separate_table, STATE_HASH_KEY, TABLE_MIGRATION_KEY))
    lease_items: list[Mapping[str, Any]] = []
    if with_lease_table:
        lease_items = [item for key in (MIGRATION_KEY, LEADER_KEY, TABLE_MIGRATION_KEY)
                       if (item := _get(client, lease_table, LEASE_TABLE_HASH_KEY, key)) is not None]
        status = status or lease_table_table_migration(lease_items)
    layout = choose_layout(exists, status)
    if not with_lease_table:
        return fleet_mode.watched(view, now, layout, separate, leader)
    return fleet_mode.watched(view, now, layout, separate, leader, lease_table_migration(lease_items),
                              lease_table_leader(lease_items))


def start_watch(client: Any, application: str, lease_table: str, now: float,
                state_table: str | None = None) -> fleet_mode.FleetView:
    """At start, before the lease table is created or touched: where the fleet keeps its metadata and the mode
    this consumer starts in. Raise Kcl3FleetActive for a client version this code does not know, or
    CoordinatorStateInvalid for a migration item not in KCL 3.x's format (a fleet's mode is never guessed)."""
    view = read_fleet(client, application, lease_table, fleet_mode.FleetView(), now, with_lease_table=True,
                      state_table=state_table)
    verdict = decide(view.migration, application)
    if not verdict.proceed:
        raise Kcl3FleetActive(verdict.reason)
    log.info("KCL 3.x: %s; %s", verdict.reason, view.summary())
    return view


def fleet_status(client: Any, application: str, lease_table: str, scanned: Any,
                 state_table: str | None = None) -> fleet_mode.FleetView:
    """What an observer (`kcl-pipeline leases`) says of the Java 3.x fleet: the separate table's state and the
    lease table's items the scan `scanned` (a LeaseScan) met."""
    view = read_fleet(client, application, lease_table, fleet_mode.FleetView(), 0.0, state_table=state_table)
    return fleet_mode.scanned(view, scan_entities(scanned))


def check_coordinator_state(dynamodb_client: Any, application: str, lease_table: str | None = None,
                            state_table: str | None = None) -> Verdict:
    """Raise Kcl3FleetActive (or CoordinatorStateInvalid) unless this consumer may start; the verdict."""
    view = start_watch(dynamodb_client, application, lease_table or application, 0.0, state_table)
    return decide(view.migration, application)


def watch(client: Any, application: str, lease_table: str, view: fleet_mode.FleetView,
          now: float, state_table: str | None = None) -> fleet_mode.FleetView:
    """The manager's watch, once a minute (Java's ClientVersionChangeMonitor): the separate table's migration
    state and the layout. A failed read keeps what was known (logged); a change of mode is logged."""
    if not fleet_mode.watch_due(view, now):
        return view
    try:
        after = read_fleet(client, application, lease_table, view, now, state_table=state_table)
    except Exception as exc:
        log.warning("could not read KCL 3.x's coordinator state (%s); keeping %s: %s: %s",
                    state_table or coordinator_state_table(application), view.summary(), type(exc).__name__, exc)
        return fleet_mode.watch_failed(view, now, f"{type(exc).__name__}: {exc}")
    changed = fleet_mode.change(view, after)
    if changed:
        log.warning("%s", changed)
    if after.layout is not view.layout:
        log.warning("KCL 3.x metadata layout %s -> %s", view.layout, after.layout)
    return after


def publish(dynamodb_client: Any, application: str, worker_id: str, now_epoch_seconds: int,
            throughput_kbps: Sequence[float], layout: Layout = Layout.SEPARATE_TABLES,
            lease_table: str | None = None, metrics_table: str | None = None) -> None:
    """Write this worker's metrics item where the fleet's leader reads it: an item of the lease table in the
    one-table layout (never creating another table); `<application>-WorkerMetricStats` (or the application's own
    name for it, `metrics_table`) in the separate layout, created (as KCL 3.x does, PAY_PER_REQUEST) when
    missing."""
    if layout is Layout.LEASE_TABLE:
        dynamodb_client.update_item(TableName=lease_table or application,
                                    **lease_table_metrics_update(worker_id, now_epoch_seconds, throughput_kbps))
        return
    table = metrics_table or worker_metrics_table(application)
    update = metrics_update(worker_id, now_epoch_seconds, throughput_kbps)
    try:
        dynamodb_client.update_item(TableName=table, **update)
    except ClientError as exc:
        if not _missing(dynamodb_client, exc):
            raise
        try:
            dynamodb_client.create_table(
                TableName=table, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": METRICS_HASH_KEY, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": METRICS_HASH_KEY, "KeyType": "HASH"}])
        except ClientError as create_exc:
            if _code(create_exc) != "ResourceInUseException":
                raise  # else another consumer created it first
        dynamodb_client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        dynamodb_client.update_item(TableName=table, **update)


def _scan_all(client: Any, request: dict[str, Any]) -> list[dict]:
    items: list[dict] = []
    while True:
        page = client.scan(**request)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def read_last_updates(dynamodb_client: Any, application: str, layout: Layout = Layout.SEPARATE_TABLES,
                      lease_table: str | None = None, metrics_table: str | None = None) -> dict[str, float]:
    """Every worker's last update: the lease table's WORKER_METRIC_STATS items (Java's filtered scan) in the
    one-table layout; in the separate layout `<application>-WorkerMetricStats` (no table yet: none), merged with
    the lease table's items when `lease_table` is given, the latest per worker (Java reads both until its table
    migration is COMPLETE)."""
    found: dict[str, float] = {}
    if layout is Layout.SEPARATE_TABLES:
        try:
            table = metrics_table or worker_metrics_table(application)
            found = last_updates(_scan_all(dynamodb_client, {"TableName": table, "ProjectionExpression": "wid, lut"}))
        except ClientError as exc:
            if not _missing(dynamodb_client, exc):
                raise
            found = {}
    if layout is Layout.LEASE_TABLE or lease_table is not None:
        in_lease_table = lease_table_last_updates(_scan_all(dynamodb_client, {
            "TableName": lease_table or application, "FilterExpression": "entityType = :entity",
            "ProjectionExpression": "leaseKey, lut, entityType",
            "ExpressionAttributeValues": {":entity": {"S": METRICS_ENTITY_TYPE}}}))
        for worker, lut in in_lease_table.items():
            found[worker] = max(lut, found.get(worker, lut))
    return found
