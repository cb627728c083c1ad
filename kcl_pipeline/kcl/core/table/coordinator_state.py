"""KCL 3.x's coordinator state: which protocol a Java 3.x fleet runs on this application, and where it keeps it.

Java KCL 3.x records the 2.x→3.x migration in an item `Migration3.0`: `cv` (the client version the fleet runs),
`mb` (the worker that last modified it), `mts` (when, epoch millis), `h` (history). Where the item lives depends on
the version that created the application's metadata (Java's CoordinatorStateDAO):

* KCL 3.0–3.4, and 3.5 until a table migration completes: a table of its own, `<application>-CoordinatorState`
  (hash key `key`), with the worker metrics in `<application>-WorkerMetricStats` (hash key `wid`);
* KCL 3.5+ for a new application, for every 2.x → 3.x upgrade, and once a 3.4 → 3.5 table migration is COMPLETE:
  the lease table itself, as items keyed by `leaseKey` with an `entityType` (`CLIENT_VERSION_MIGRATION` for
  `Migration3.0`, `LEADER` for the leader lock `Leader`, `TABLE_MIGRATION` for `TableMigration3.5`,
  `WORKER_METRIC_STATS` for each worker's metrics, keyed by its worker id).

`Layout` names the two; `choose_layout` picks one from what the tables hold, as Java does: no
`<application>-CoordinatorState` table, or its `TableMigration3.5` item (`tm`) COMPLETE, is the one-table layout.
Java reads the migration item from the separate table first and falls back to the lease table until the table
migration is COMPLETE (`effective_migration`).

The items are parsed here (pure: item in, value out); `shells/fleet/kcl3_tables.py` reads them,
`core/fleet/fleet_mode.py` decides what this consumer does about them. Nothing here writes, or strips attributes
of, KCL 3.x's items.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

MIGRATION_KEY = "Migration3.0"        # MigrationState.MIGRATION_HASH_KEY
LEADER_KEY = "Leader"                 # LeaderLock.LEADER_HASH_KEY
TABLE_MIGRATION_KEY = "TableMigration3.5"  # TableMigrationState.TABLE_MIGRATION_HASH_KEY
HASH_KEY = "key"                      # the separate table's hash key (LegacyTableCoordinatorStateDAODelegate)
LEASE_TABLE_HASH_KEY = "leaseKey"     # the lease table's (DynamoDBLeaseSerializer.LEASE_KEY_KEY)

# EntityType's DynamoDB values (the `entityType` attribute).
ENTITY_CLIENT_VERSION_MIGRATION = "CLIENT_VERSION_MIGRATION"
ENTITY_LEADER = "LEADER"
ENTITY_TABLE_MIGRATION = "TABLE_MIGRATION"
ENTITY_WORKER_METRIC_STATS = "WORKER_METRIC_STATS"

TABLE_MIGRATION_STATUS_ATTRIBUTE = "tm"  # TableMigrationState.TABLE_MIGRATION_STATUS_ATTRIBUTE_NAME
TABLE_MIGRATION_COMPLETE = "TABLE_MIGRATION_STATUS_COMPLETE"
LEADER_OWNER_ATTRIBUTE = "ownerName"  # the DynamoDB lock client's item: the lock's holder
LEADER_RELEASED_ATTRIBUTE = "isReleased"  # the lock client writes the string "1" on release
LEADER_VERSION_ATTRIBUTE = "recordVersionNumber"  # a new value at every heartbeat of the lock's holder
LEADER_DURATION_ATTRIBUTE = "leaseDuration"  # milliseconds, a string: the lock is stale after it unchanged

# Java infers these entities from their key when an item has no entityType (CoordinatorStateDAODelegate's
# resolveEntityType: records written before the attribute existed); they are never leases.
INFERRED_ENTITIES = {MIGRATION_KEY: ENTITY_CLIENT_VERSION_MIGRATION, TABLE_MIGRATION_KEY: ENTITY_TABLE_MIGRATION}


class Layout(enum.StrEnum):
    """Where a Java 3.x fleet keeps its metadata (and where this consumer reads and writes its part of it)."""

    LEASE_TABLE = "one-table"           # KCL 3.5+: entities of the lease table
    SEPARATE_TABLES = "separate-tables"  # KCL 3.0–3.4: <app>-CoordinatorState and <app>-WorkerMetricStats

CLIENT_VERSION_INIT = "CLIENT_VERSION_INIT"
CLIENT_VERSION_UPGRADE_FROM_2X = "CLIENT_VERSION_UPGRADE_FROM_2X"
CLIENT_VERSION_2X = "CLIENT_VERSION_2X"
CLIENT_VERSION_3X_WITH_ROLLBACK = "CLIENT_VERSION_3X_WITH_ROLLBACK"
CLIENT_VERSION_3X = "CLIENT_VERSION_3X"

# 2.x-compatible: 3.x workers (if any) run the 2.x lease-count protocol, leaderless like this consumer.
COMPATIBLE_VERSIONS = frozenset({CLIENT_VERSION_INIT, CLIENT_VERSION_UPGRADE_FROM_2X, CLIENT_VERSION_2X})
# Leader-assigned: a 3.x leader owns the assignment (3X_WITH_ROLLBACK is already 3.x mode, only reversible).
LEADER_ASSIGNED_VERSIONS = frozenset({CLIENT_VERSION_3X_WITH_ROLLBACK, CLIENT_VERSION_3X})


def coordinator_state_table(application: str) -> str:
    """Java KCL 3.x's default name of the coordinator state table."""
    return f"{application}-CoordinatorState"


@dataclass(frozen=True)
class MigrationState:
    client_version: str
    modified_by: str | None = None
    modified_at_millis: int | None = None


@dataclass(frozen=True)
class Verdict:
    proceed: bool
    reason: str


class CoordinatorStateInvalid(ValueError):
    """The migration item is there but not in KCL 3.x's format: never guess a fleet's mode."""


def migration_state_from_item(item: Mapping[str, Mapping] | None) -> MigrationState | None:
    if item is None:
        return None
    cv = item.get("cv")
    if not isinstance(cv, Mapping) or not isinstance(cv.get("S"), str) or not cv["S"]:
        raise CoordinatorStateInvalid(
            f"coordinator state item {MIGRATION_KEY!r} has no string attribute 'cv' (client version): {dict(item)!r}")
    mb = item.get("mb", {}).get("S") if isinstance(item.get("mb"), Mapping) else None
    mts_text = item.get("mts", {}).get("N") if isinstance(item.get("mts"), Mapping) else None
    try:
        mts = int(mts_text) if mts_text is not None else None
    except ValueError:
        raise CoordinatorStateInvalid(f"coordinator state item {MIGRATION_KEY!r}: 'mts' is not a number: "
                                      f"{mts_text!r}") from None
    return MigrationState(cv["S"], mb, mts)


def choose_layout(coordinator_table_exists: bool, table_migration_status: str | None) -> Layout:
    """Java's TableMigrationStateMachine: no `<application>-CoordinatorState` table is the one-table layout (a new
    3.5 application, a 2.x → 3.x upgrade); so is a COMPLETE table migration. Otherwise the separate tables."""
    if not coordinator_table_exists or table_migration_status == TABLE_MIGRATION_COMPLETE:
        return Layout.LEASE_TABLE
    return Layout.SEPARATE_TABLES


def _entity(items: Iterable[Mapping[str, Any]], key: str, entity: str) -> Mapping[str, Any] | None:
    for item in items:
        if item.get(LEASE_TABLE_HASH_KEY, {}).get("S") != key:
            continue
        typed = item.get("entityType", {}).get("S") if "entityType" in item else INFERRED_ENTITIES.get(key)
        if typed == entity:
            return item
    return None


def lease_table_migration(items: Iterable[Mapping[str, Any]]) -> MigrationState | None:
    """The migration state among the lease table's items (keyed `Migration3.0`, entityType
    CLIENT_VERSION_MIGRATION); None when there is none. An item of another type under that key is not it."""
    return migration_state_from_item(_entity(list(items), MIGRATION_KEY, ENTITY_CLIENT_VERSION_MIGRATION))


def table_migration_status(item: Mapping[str, Any] | None) -> str | None:
    """`tm` of a TableMigration3.5 item (TableMigrationStatus), None without an item or a string status."""
    if item is None:
        return None
    status = item.get(TABLE_MIGRATION_STATUS_ATTRIBUTE)
    return status.get("S") if isinstance(status, Mapping) else None


def lease_table_table_migration(items: Iterable[Mapping[str, Any]]) -> str | None:
    return table_migration_status(_entity(list(items), TABLE_MIGRATION_KEY, ENTITY_TABLE_MIGRATION))


@dataclass(frozen=True)
class LeaderLock:
    """The DynamoDB lock client's item for the leader lock: its holder, the record version its heartbeats
    change, and how long the lock lives without one (its `leaseDuration`)."""

    owner: str
    version: str | None = None
    duration_seconds: float | None = None


def leader_lock_from_item(item: Mapping[str, Any] | None) -> LeaderLock | None:
    """The held lock, None when there is no item, no owner, or the lock client released it (`isReleased`: the
    string "1", as the lock client writes it; a boolean true is read the same)."""
    if item is None:
        return None
    released = item.get(LEADER_RELEASED_ATTRIBUTE, {})
    if isinstance(released, Mapping) and (released.get("BOOL") is True or released.get("S") == "1"):
        return None
    owner = item.get(LEADER_OWNER_ATTRIBUTE)
    if not (isinstance(owner, Mapping) and owner.get("S")):
        return None
    version = item.get(LEADER_VERSION_ATTRIBUTE, {})
    duration = item.get(LEADER_DURATION_ATTRIBUTE, {})
    text = (duration.get("S") or duration.get("N")) if isinstance(duration, Mapping) else None
    try:
        seconds = float(text) / 1000 if text is not None else None
    except ValueError:
        seconds = None
    return LeaderLock(owner["S"], version.get("S") if isinstance(version, Mapping) else None, seconds)


def leader_from_item(item: Mapping[str, Any] | None) -> str | None:
    """The worker holding the leader lock (the lock client's `ownerName`), None when unheld or released."""
    lock = leader_lock_from_item(item)
    return lock.owner if lock is not None else None


def lease_table_leader_lock(items: Iterable[Mapping[str, Any]]) -> LeaderLock | None:
    """The leader lock among the lease table's items (keyed `Leader`, entityType LEADER)."""
    return leader_lock_from_item(_entity(list(items), LEADER_KEY, ENTITY_LEADER))


def live_leader(lock: LeaderLock | None, before: LeaderLock | None, unchanged_since: float | None,
                now: float | None) -> tuple[str | None, float | None]:
    """The leader to show, judged as the lock client judges a lock: stale once its record version stood still
    for its lease duration (its holder stopped heartbeating) — and when that version was first seen. `before`
    and `unchanged_since`: the lock and the time of the previous look; `now` None (a single look) trusts it."""
    if lock is None:
        return None, None
    if now is None:
        return lock.owner, None
    same = before is not None and before.version == lock.version and before.owner == lock.owner
    since = unchanged_since if same and unchanged_since is not None else now
    if lock.duration_seconds is not None and lock.version is not None and now - since > lock.duration_seconds:
        return None, since
    return lock.owner, since


def lease_table_leader(items: Iterable[Mapping[str, Any]]) -> str | None:
    """The leader among the lease table's items (keyed `Leader`, entityType LEADER)."""
    return leader_from_item(_entity(list(items), LEADER_KEY, ENTITY_LEADER))


def effective_migration(layout: Layout, separate: MigrationState | None,
                        lease_table: MigrationState | None) -> MigrationState | None:
    """Java's CoordinatorStateDAO.getCoordinatorState: in the separate layout the separate table's item, else the
    lease table's; in the one-table layout the lease table's — or, while a 3.4 → 3.5 table migration has not
    copied it there yet, the separate table's last one (the fleet's state did not change: reading "none" would
    flip this consumer to leaderless and back)."""
    if layout is Layout.SEPARATE_TABLES and separate is not None:
        return separate
    return lease_table if lease_table is not None else separate


def decide(state: MigrationState | None, application: str) -> Verdict:
    """Proceed unless the client version is unknown: with no 3.x fleet recorded, or a 2.x-compatible one, this
    consumer takes leases leaderless; in the 3.x modes (a leader assigns leases) it follows the leader
    (core/fleet/fleet_mode.py). An unknown client version is refused at start: a newer KCL's mode is never guessed."""
    if state is None:
        return Verdict(True, "no KCL 3.x migration state: a 2.x-compatible table")
    version = state.client_version
    if version in COMPATIBLE_VERSIONS:
        return Verdict(True, f"KCL 3.x fleet in 2.x-compatible mode ({version})")
    by = f" (set by {state.modified_by})" if state.modified_by else ""
    if version in LEADER_ASSIGNED_VERSIONS:
        return Verdict(True, f"KCL 3.x fleet in 3.x mode ({version}{by}): its leader assigns leases; this consumer "
                             f"follows it (takes no lease, works those assigned to it)")
    return Verdict(False, (
        f"unknown KCL client version {version!r}{by} for application {application!r}: refusing to start rather "
        f"than guess whether a leader assigns this application's leases"))
