"""Beside a Java KCL 3.x fleet: take leases leaderless, or follow its leader — decided afresh as the fleet migrates.

Java's workers re-read the migration state every minute (ClientVersionChangeMonitor) and change protocol when
it flips; so does this consumer. The state flips while a fleet runs: an upgrade's leader writes
CLIENT_VERSION_3X_WITH_ROLLBACK once the leaseOwner index is active and every lease owner publishes fresh
worker metrics (MigrationReadyMonitor: this consumer's own metrics count towards that), an operator rolls
back to CLIENT_VERSION_2X, a default-config 3.x worker joining a table with no migration state writes
CLIENT_VERSION_3X.

* `FleetMode.LEADERLESS` — no 3.x state, or a 2.x-compatible one (INIT, UPGRADE_FROM_2X, 2X): every consumer
  takes, steals and balances by lease count or load, as KCL 2.x does (and 3.x in those modes).
* `FleetMode.FOLLOWER` — 3X_WITH_ROLLBACK, 3X (and, at run time, a client version this code does not know:
  a newer KCL's leader is never fought): a leader assigns leases. This consumer takes no lease and steals none;
  it works the leases the leader assigns to its worker id (`adoptions`, as Java's DynamoDBLeaseDiscoverer:
  owned by us, no hand-off pending), renews them fenced by the counter (the leader's assignments and evictions
  move it, so a reassigned lease is lost at the next heartbeat), answers the leader's graceful hand-offs, and
  keeps publishing its worker metrics where the leader reads them. It never touches the leader lock.

`FleetView` is what the tables last said (pure; the manager's shells read them): the separate table's migration
item at the minute watch (`watched`), the lease table's items at every scan (`scanned`: in the one-table layout
they ride on the scan the cycle makes anyway). Its `mode` follows Java's read order (coordinator_state's
`effective_migration`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Collection, Iterable, Mapping, Sequence

from ..model import Lease
from ..table.coordinator_state import (
    CLIENT_VERSION_2X,
    CLIENT_VERSION_INIT,
    COMPATIBLE_VERSIONS,
    TABLE_MIGRATION_COMPLETE,
    CoordinatorStateInvalid,
    Layout,
    LeaderLock,
    MigrationState,
    effective_migration,
    lease_table_leader_lock,
    lease_table_migration,
    lease_table_table_migration,
    live_leader,
)
from ..table.lease_rules import CLAIM_OWNER_ATTRIBUTE, HANDOFF_ATTRIBUTE, held_by_another_protocol

# Java's ClientVersionChangeMonitor polls the migration state once a minute.
WATCH_PERIOD_SECONDS = 60.0


class FleetMode(enum.StrEnum):
    LEADERLESS = "leaderless"
    FOLLOWER = "follower"


def mode_of(state: MigrationState | None) -> FleetMode:
    """Leaderless with no 3.x state or a 2.x-compatible one; a follower in every other client version."""
    if state is None or state.client_version in COMPATIBLE_VERSIONS:
        return FleetMode.LEADERLESS
    return FleetMode.FOLLOWER


@dataclass(frozen=True)
class FleetView:
    """What the tables last said about the Java 3.x fleet sharing this application."""

    layout: Layout = Layout.LEASE_TABLE          # a new application's, until the tables say otherwise
    separate: MigrationState | None = None       # <app>-CoordinatorState's Migration3.0, at the last watch
    lease_table: MigrationState | None = None    # the lease table's Migration3.0, at the last scan
    separate_leader: str | None = None
    lease_table_leader: str | None = None
    # The lease table's leader lock as last scanned, and since when its record version stood still (a lock whose
    # holder stopped heartbeating is stale after its lease duration: no leader is shown then).
    lease_table_lock: LeaderLock | None = None
    lease_table_lock_since: float | None = None
    watched_at: float | None = None              # the manager's clock at the last watch (None: never)
    # A COMPLETE 3.4 → 3.5 table migration was seen in the lease table: final, so the one-table layout holds
    # whatever the separate table (which Java stops writing) says at a later watch.
    migrated: bool = False
    problem: str | None = None                   # the last item that could not be read (the view kept)

    @property
    def migration(self) -> MigrationState | None:
        return effective_migration(self.layout, self.separate, self.lease_table)

    @property
    def mode(self) -> FleetMode:
        return mode_of(self.migration)

    @property
    def leader(self) -> str | None:
        if self.layout is Layout.SEPARATE_TABLES and self.separate_leader is not None:
            return self.separate_leader
        return self.lease_table_leader

    def summary(self) -> str:
        """One line for logs, the sensor and `leases`: the mode, the client version, the layout, the leader."""
        version = self.migration.client_version if self.migration is not None else "no KCL 3.x migration state"
        text = f"mode={self.mode} ({version}, {self.layout} layout) leader={self.leader or '-'}"
        return text + (f" problem={self.problem}" if self.problem else "")


def publishes_worker_metrics(view: FleetView) -> bool:
    """Whether this consumer writes its worker metrics item (and reads the fleet's): only once a migration state
    says a KCL 3.x fleet is upgrading or upgraded (UPGRADE_FROM_2X, the 3.x versions, a version this code does not
    know), the versions in which Java 3.x workers publish theirs and a leader (or its MigrationReadyMonitor) reads
    them. With no migration state, INIT or 2X the application is a 2.x one: every KCL 2.x worker's lease listing
    fails on an item without the lease attributes (its serializer requires `leaseCounter`), so nothing but leases
    goes into its lease table, and Java 3.x writes no metrics in those versions either (after a rollback the
    migration tool deletes them). The same rule holds in the separate layout, as Java's does."""
    migration = view.migration
    return migration is not None and migration.client_version not in (CLIENT_VERSION_INIT, CLIENT_VERSION_2X)


def java_fleet_seen(leases: Sequence[Lease], view: FleetView) -> bool:
    """Java KCL consumers share this table: a lease held by a holder that did not take it by this protocol's
    acquire (`lease_rules.held_by_another_protocol`), or a KCL 3.x migration state."""
    return view.migration is not None or any(held_by_another_protocol(lease) for lease in leases)


def watch_due(view: FleetView, now: float, period: float = WATCH_PERIOD_SECONDS) -> bool:
    """Whether the manager reads the separate tables again: at first, then once per `period`."""
    return view.watched_at is None or now - view.watched_at >= period


def watched(view: FleetView, now: float, layout: Layout, separate: MigrationState | None,
            separate_leader: str | None = None, lease_table: MigrationState | None = None,
            lease_table_leader: str | None = None) -> FleetView:
    """The view after the manager's watch: the layout and the separate table's items (and, at start, before
    any scan, the lease table's)."""
    if view.migrated:
        layout = Layout.LEASE_TABLE
    view = replace(view, layout=layout, separate=separate, separate_leader=separate_leader, watched_at=now,
                   problem=None)
    if lease_table is not None or lease_table_leader is not None:
        view = replace(view, lease_table=lease_table, lease_table_leader=lease_table_leader)
    return view


def watch_failed(view: FleetView, now: float, problem: str) -> FleetView:
    """A watch that could not read the tables keeps what was known (Java's monitor retries next minute)."""
    return replace(view, watched_at=now, problem=problem)


def scanned(view: FleetView, entities: Iterable[Mapping[str, Any]] | None, now: float | None = None) -> FleetView:
    """The view after a scan of the lease table met its non-lease items (None: the scan says nothing, e.g. a
    list from elsewhere). A malformed migration item keeps the last known state, as Java's monitor keeps
    its version when it cannot deserialize the item; a COMPLETE table migration there moves to the one-table
    layout (Java writes COMPLETE into the lease table too). `now` (when the scan returned) judges the leader
    lock's staleness across scans (`coordinator_state.live_leader`)."""
    if entities is None:
        return view
    items = list(entities)
    try:
        migration, problem = lease_table_migration(items), None
    except CoordinatorStateInvalid as exc:
        migration, problem = view.lease_table, str(exc)
    migrated = view.migrated or lease_table_table_migration(items) == TABLE_MIGRATION_COMPLETE
    layout = Layout.LEASE_TABLE if migrated else view.layout
    lock = lease_table_leader_lock(items)
    leader, since = live_leader(lock, view.lease_table_lock, view.lease_table_lock_since, now)
    return replace(view, layout=layout, lease_table=migration, lease_table_leader=leader, lease_table_lock=lock,
                   lease_table_lock_since=since, problem=problem, migrated=migrated)


def change(before: FleetView, after: FleetView) -> str | None:
    """What changed that the logs should say: a new mode (with the client version that made it), or None."""
    if before.mode is after.mode:
        return None
    version = after.migration.client_version if after.migration is not None else "no migration state"
    return f"KCL 3.x fleet mode {before.mode} -> {after.mode} ({version}, leader {after.leader or '-'})"


def adoptions(worker_id: str, leases: Sequence[Lease], locally_worked: Collection[str],
              previous: Mapping[str, Lease], ages: Mapping[str, float] | None = None,
              expiry_seconds: float = 0.0) -> list[tuple[Lease, bool]]:
    """The leases the leader assigned to this worker that no local worker works yet, each with whether its
    worker must wait out one expiry before delivering (`stolen`).

    Assigned: `leaseOwner` is our worker id, no `checkpointOwner` (a graceful hand-off to us is still pending:
    the previous holder has not checkpointed yet; Java's discoverer waits for it too), not ended. A lease whose
    last take was this worker id's own (`leaseClaimOwner` is us) may be held by another process under the same
    id (a duplicate worker id: it renews it): it is adopted only once its counter has stood still for the expiry
    (`ages`: seconds since this consumer saw its counter or owner change), as after the leader reassigned us a
    lease we had let expire. The wait is skipped only when the previous holder cannot still be delivering: the
    lease was free when last seen, or it was a graceful hand-off to us (then our owner with a `checkpointOwner`:
    the holder stepped aside before the assignment removed it). A lease assigned away from a live holder — the
    leader's assignment is not conditioned on the counter — waits, as a steal does, until that holder's renewal
    has failed."""
    found = []
    for lease in leases:
        if (lease.lease_owner != worker_id or lease.is_ended or lease.lease_key in locally_worked
                or HANDOFF_ATTRIBUTE in lease.extra):
            continue
        before = previous.get(lease.lease_key)
        handed = (before is not None and before.lease_owner == worker_id
                  and before.extra.get(HANDOFF_ATTRIBUTE) is not None)
        free = before is not None and before.lease_owner is None
        moved_to_us = handed or free or (before is not None and before.lease_owner not in (None, worker_id))
        ours_by_our_take = lease.extra.get(CLAIM_OWNER_ATTRIBUTE) == worker_id
        if ours_by_our_take and not moved_to_us and (
                ages is None or ages.get(lease.lease_key, 0.0) <= expiry_seconds):
            continue  # ours by our own take, never seen elsewhere: maybe another process under our id renews it
        # A lease the leader moved to us since the last scan is adopted now, so its counter moves again before
        # the leader judges it expired; when the last take was our id's (a stale take of ours, or another
        # process under our id adopting it first), its worker waits one expiry before delivering.
        found.append((lease, ours_by_our_take or not (free or handed)))
    return found


def assigned_to(worker_id: str, leases: Sequence[Lease], locally_worked: Collection[str],
                ages: Mapping[str, float] | None = None, expiry_seconds: float = 0.0) -> bool:
    """Whether any lease waits to be adopted (a reason for the manager to run its cycle now)."""
    return bool(adoptions(worker_id, leases, locally_worked, {}, ages, expiry_seconds))


__all__ = [
    "FleetMode", "FleetView", "WATCH_PERIOD_SECONDS", "adoptions", "assigned_to", "change", "java_fleet_seen",
    "mode_of", "publishes_worker_metrics", "scanned", "watch_due", "watch_failed", "watched",
]
