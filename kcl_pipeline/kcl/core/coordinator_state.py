"""KCL 3.x's coordinator state: is a 3.x fleet running leader-assigned on this application?

Java KCL 3.x keeps a table `<application>-CoordinatorState` (hash key `key`) next to the lease table. Its
item `Migration3.0` records the 2.x→3.x migration: `cv` (the client version the fleet runs), `mb` (the
worker that last modified it), `mts` (when, epoch millis), `h` (history). In the 3.x modes an elected
leader assigns leases by load and 3.x workers renew only what they are given; a leaderless peer taking
leases on its own would fight that leader. This consumer therefore refuses to start in those modes and
proceeds in the 2.x-compatible ones (docs/kcl3.md explains the choice).

`decide` is the pure decision (item in, verdict out); `shells/kcl3_tables.py` reads the item around it.
It only ever reads: nothing here writes or strips attributes of KCL 3.x's items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

MIGRATION_KEY = "Migration3.0"
HASH_KEY = "key"

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


def decide(state: MigrationState | None, application: str) -> Verdict:
    """Proceed when no 3.x fleet is recorded or it runs 2.x-compatible; refuse in 3.x (leader-assigned) mode.

    An unknown client version is refused too: a newer KCL's mode cannot be assumed to be leaderless.
    """
    if state is None:
        return Verdict(True, "no KCL 3.x migration state: a 2.x-compatible table")
    version = state.client_version
    if version in COMPATIBLE_VERSIONS:
        return Verdict(True, f"KCL 3.x fleet in 2.x-compatible mode ({version})")
    by = f" (set by {state.modified_by})" if state.modified_by else ""
    table = coordinator_state_table(application)
    if version in LEADER_ASSIGNED_VERSIONS:
        return Verdict(False, (
            f"a KCL 3.x fleet runs application {application!r} in 3.x mode ({version}{by} in {table}): its leader "
            f"assigns leases, and a leaderless consumer would fight it. Refusing to start. Run this consumer "
            f"under another application name, or roll the KCL 3.x fleet back to {CLIENT_VERSION_2X} "
            f"(KCL's migration tool) first."))
    return Verdict(False, (
        f"unknown KCL client version {version!r}{by} in {table}: refusing to start rather than guess whether a "
        f"leader assigns this application's leases"))
