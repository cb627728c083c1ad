"""The I/O of KCL 3.x's metadata: the migration state (`<app>-CoordinatorState`) and this consumer's worker
metrics (`<app>-WorkerMetricStats`). The items and the decisions on them are pure (`core/coordinator_state.py`,
`core/worker_metrics.py`); these functions read and write them."""
from __future__ import annotations

from typing import Any, Sequence

from ..core.coordinator_state import HASH_KEY as STATE_HASH_KEY
from ..core.coordinator_state import (
    MIGRATION_KEY,
    MigrationState,
    Verdict,
    coordinator_state_table,
    decide,
    migration_state_from_item,
)
from ..core.worker_metrics import HASH_KEY as METRICS_HASH_KEY
from ..core.worker_metrics import last_updates, metrics_update, worker_metrics_table


class Kcl3FleetActive(RuntimeError):
    """A KCL 3.x fleet runs this application leader-assigned; starting would fight its leader."""


def read_migration_state(dynamodb_client, application: str) -> MigrationState | None:
    """The migration item, or None when there is no coordinator state table or no item (strongly consistent)."""
    try:
        response = dynamodb_client.get_item(TableName=coordinator_state_table(application),
                                            Key={STATE_HASH_KEY: {"S": MIGRATION_KEY}}, ConsistentRead=True)
    except dynamodb_client.exceptions.ResourceNotFoundException:
        return None
    return migration_state_from_item(response.get("Item"))


def check_coordinator_state(dynamodb_client, application: str) -> Verdict:
    """Raise Kcl3FleetActive (or CoordinatorStateInvalid) unless this consumer may start."""
    verdict = decide(read_migration_state(dynamodb_client, application), application)
    if not verdict.proceed:
        raise Kcl3FleetActive(verdict.reason)
    return verdict


def publish(dynamodb_client, application: str, worker_id: str, now_epoch_seconds: int,
            throughput_kbps: Sequence[float]) -> None:
    """Write this worker's item; create the table (as KCL 3.x does, PAY_PER_REQUEST) when missing."""
    table = worker_metrics_table(application)
    update = metrics_update(worker_id, now_epoch_seconds, throughput_kbps)
    try:
        dynamodb_client.update_item(TableName=table, **update)
    except dynamodb_client.exceptions.ResourceNotFoundException:
        try:
            dynamodb_client.create_table(
                TableName=table, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": METRICS_HASH_KEY, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": METRICS_HASH_KEY, "KeyType": "HASH"}])
        except dynamodb_client.exceptions.ResourceInUseException:
            pass  # another consumer created it first
        dynamodb_client.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        dynamodb_client.update_item(TableName=table, **update)


def read_last_updates(dynamodb_client, application: str) -> dict[str, float]:
    """Every worker's last update in `<application>-WorkerMetricStats` (no table yet: none)."""
    table = worker_metrics_table(application)
    items: list[dict] = []
    request: dict[str, Any] = {"TableName": table, "ProjectionExpression": "wid, lut"}
    try:
        while True:
            page = dynamodb_client.scan(**request)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except dynamodb_client.exceptions.ResourceNotFoundException:
        return {}
    return last_updates(items)
