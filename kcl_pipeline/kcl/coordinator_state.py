"""KCL 3.x's coordinator state: is a KCL 3.x fleet running this application in 3.x mode?

KCL 3.x keeps, beside the lease table, a coordinator state table (`<application>-CoordinatorState`, hash
key `key`). Its item `Migration3.0` says which protocol the fleet runs (`cv`, the client version; `mb`, who
set it; `mts`, when; `h`, the history of changes):

* `CLIENT_VERSION_2X`, `CLIENT_VERSION_UPGRADE_FROM_2X` — the fleet runs the KCL 2.x protocol (leaderless
  taking and stealing by lease counter): this consumer can share the lease table, as with Java KCL 2.x;
* `CLIENT_VERSION_3X_WITH_ROLLBACK`, `CLIENT_VERSION_3X` — an elected leader assigns leases; a worker that
  takes or steals on its own would fight the leader's assignments;
* `CLIENT_VERSION_INIT` — the fleet is still deciding.

Decision (docs/kcl3.md): this consumer refuses to start beside a fleet in (or entering) 3.x mode, with a
message saying why and what to do, rather than follow a leader's assignments. It only reads the item.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .lease_table import LeaseTableError

MIGRATION_KEY = "Migration3.0"
LEADERLESS_VERSIONS = frozenset({"CLIENT_VERSION_2X", "CLIENT_VERSION_UPGRADE_FROM_2X"})


class Kcl3FleetConflict(LeaseTableError):
    """A KCL 3.x fleet runs this application in 3.x (leader-assigned) mode."""


@dataclass(frozen=True)
class MigrationState:
    client_version: str | None
    modified_by: str | None = None
    modified_at_ms: int | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Mapping[str, Any]]) -> "MigrationState":
        def text(name: str) -> str | None:
            value = item.get(name)
            return value.get("S") if isinstance(value, Mapping) else None

        mts = item.get("mts")
        modified_at = int(mts["N"]) if isinstance(mts, Mapping) and "N" in mts else None
        return cls(text("cv"), text("mb"), modified_at)


def coordinator_state_table(application: str) -> str:
    """KCL 3.x's default name for the application's coordinator state table."""
    return f"{application}-CoordinatorState"


def conflict(application: str, state: MigrationState | None) -> str | None:
    """Why this consumer must not join the application's fleet, or None when it may (pure)."""
    if state is None or state.client_version in LEADERLESS_VERSIONS:
        return None
    who = f" (set by {state.modified_by})" if state.modified_by else ""
    return (f"application {application}: a KCL 3.x fleet runs it with client version {state.client_version}{who} "
            f"in table {coordinator_state_table(application)}, where an elected leader assigns leases; this "
            f"consumer takes and steals leases itself (the KCL 2.x protocol) and would fight those assignments. "
            f"Run it under another application name, or keep the KCL 3.x fleet in 2.x-compatible mode "
            f"(CLIENT_VERSION_2X / CLIENT_VERSION_UPGRADE_FROM_2X).")


def read_migration_state(dynamodb_client, application: str) -> MigrationState | None:
    """The migration item, or None when the application has no coordinator state table or no such item."""
    try:
        response = dynamodb_client.get_item(TableName=coordinator_state_table(application),
                                            Key={"key": {"S": MIGRATION_KEY}}, ConsistentRead=True)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        if code == "ResourceNotFoundException":
            return None
        raise LeaseTableError(f"cannot read {coordinator_state_table(application)} ({code or type(exc).__name__}: "
                              f"{exc}); it says whether a KCL 3.x fleet runs application {application}") from exc
    item = response.get("Item")
    return MigrationState.from_item(item) if item else None


def check_fleet_compatible(dynamodb_client, application: str) -> MigrationState | None:
    """Raise Kcl3FleetConflict when a KCL 3.x fleet runs `application` in 3.x mode; else the state read."""
    state = read_migration_state(dynamodb_client, application)
    reason = conflict(application, state)
    if reason:
        raise Kcl3FleetConflict(reason)
    return state


__all__ = ["Kcl3FleetConflict", "MIGRATION_KEY", "MigrationState", "check_fleet_compatible", "conflict",
           "coordinator_state_table", "read_migration_state"]
