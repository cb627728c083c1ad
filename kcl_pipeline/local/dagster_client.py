"""Launching and watching partition backfills through the Dagster webserver's GraphQL API (for the CLI)."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable

from ..windows.keys import partition_key

BACKFILL_ASSETS = ("landed_records", "transformed_records")

_LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on PartitionSetNotFoundError { message }
    ... on UnauthorizedError { message }
  }
}"""

_STATUS = """
query Status($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      status
      numPartitions
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted
            numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
    }
    ... on PythonError { message }
  }
}"""


@dataclass(frozen=True)
class BackfillProgress:
    """A backfill's status and, for its last asset (transformed_records), windows done / failed / targeted."""

    status: str
    done: int = 0
    failed: int = 0
    total: int = 0

    @classmethod
    def from_graphql(cls, backfill: dict, asset: str = BACKFILL_ASSETS[-1]) -> "BackfillProgress":
        statuses = ((backfill.get("assetBackfillData") or {}).get("assetBackfillStatuses")) or []
        counts = next((c for c in statuses if (c.get("assetKey") or {}).get("path") == [asset]), None)
        if counts is None:
            return cls(backfill["status"], total=int(backfill.get("numPartitions") or 0))
        return cls(backfill["status"], int(counts["numPartitionsMaterialized"]), int(counts["numPartitionsFailed"]),
                   int(counts["numPartitionsTargeted"]))


class DagsterApiError(RuntimeError):
    pass


def window_keys(start_ms: int, end_ms: int, window_ms: int) -> list[str]:
    if start_ms % window_ms or end_ms % window_ms or end_ms <= start_ms:
        raise ValueError(f"[{start_ms}, {end_ms}) must be whole windows of {window_ms // 60_000} minutes")
    return [partition_key(t) for t in range(start_ms, end_ms, window_ms)]


def graphql(url: str, query: str, variables: dict) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}/graphql", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            payload = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        raise DagsterApiError(f"cannot reach the Dagster webserver at {url}: {exc}") from None
    if payload.get("errors"):
        raise DagsterApiError(f"Dagster GraphQL error: {payload['errors'][0].get('message')}")
    return payload["data"]


def launch_backfill(url: str, partition_keys: list[str], assets=BACKFILL_ASSETS) -> str:
    params = {"partitionNames": partition_keys, "assetSelection": [{"path": [a]} for a in assets],
              "fromFailure": False}
    result = graphql(url, _LAUNCH, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise DagsterApiError(f"backfill refused ({result['__typename']}): {result.get('message')}")
    return result["backfillId"]


def backfill_progress(url: str, backfill_id: str) -> BackfillProgress:
    result = graphql(url, _STATUS, {"id": backfill_id})["partitionBackfillOrError"]
    if result["__typename"] != "PartitionBackfill":
        raise DagsterApiError(f"backfill {backfill_id}: {result.get('message')}")
    return BackfillProgress.from_graphql(result)


def backfill_status(url: str, backfill_id: str) -> str:
    return backfill_progress(url, backfill_id).status


def wait_backfill(url: str, backfill_id: str, timeout: float, poll: float = 2.0,
                  on_progress: Callable[[BackfillProgress], None] | None = None) -> str:
    deadline = time.monotonic() + timeout
    progress = backfill_progress(url, backfill_id)
    while True:
        if on_progress is not None:
            on_progress(progress)
        if progress.status not in ("REQUESTED", "CANCELING") or time.monotonic() >= deadline:
            return progress.status
        time.sleep(poll)
        progress = backfill_progress(url, backfill_id)
