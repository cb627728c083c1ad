"""Moving a stream's bare-name directory `<name>/` into its identity directory `<name>@<region>@<account>/`
(`kcl-pipeline landing migrate`): the decisions, as pure functions. The I/O is audit/migrate.py's.

Every object that names a key of the directory is rewritten, so the chain reads back whole from its new place
and a consumer configured by the stream's ARN resumes where the old one stopped:

* a batch's key, its footer's `stream` (the directory) and `prev_key`, and its rows' `stream` column (the
  directory: docs/landing.md, "Stream identity"); a footer naming no stream is given the stream's ARN;
* a link's key and the batch key its body names (the holder's line is kept; `ended-empty` stays);
* in the transform's output, the batch keys the window commits name and those the checkpoint record's late
  windows name.

The migration is copy-then-delete, recorded by a marker object in the identity directory
(`<target>/_migration.json`: source, target, stream ARN, phase), written before anything is copied and moved to
the delete phase before anything is deleted, so a migration stopped anywhere is finished by running it again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..kcl.core.model import Lease
from ..kcl.core.streams import STREAM_ARN_RE, stream_name
from .layout import (
    ENDED_EMPTY,
    LINK_PREFIX,
    foreign_stream,
    identity_directory,
    landing_directory,
    link_target,
)

MARKER_NAME = "_migration.json"
MARKER_VERSION = 1
COPY = "copy"  # the marker's first phase: the source is whole, its copies are being written
DELETE = "delete"  # every copy and output rewrite is done: the source is being deleted
PHASES = (COPY, DELETE)


class MigrationRefused(ValueError):
    """The migration cannot go ahead as asked (one line: what, and what to do)."""


def marker_key(target: str) -> str:
    """The migration's marker, in the identity directory (not a batch, nor a link: no reader takes it for one)."""
    return f"{target}/{MARKER_NAME}"


@dataclass(frozen=True)
class Migration:
    """What moves where: the directory `source` (a bare stream name) into `target`, the stream ARN's identity
    directory."""

    source: str
    target: str
    stream_arn: str

    @classmethod
    def of(cls, stream: str, stream_arn: str) -> "Migration":
        """The migration of the bare-name directory of `stream` for `stream_arn`: MigrationRefused when `stream`
        is not a bare name, `stream_arn` not an ARN, or their names differ."""
        if not STREAM_ARN_RE.fullmatch(stream_arn):
            raise MigrationRefused(f"--stream-arn {stream_arn!r} is not a stream ARN "
                                   f"(arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
        if STREAM_ARN_RE.fullmatch(stream) or "@" in stream:
            raise MigrationRefused(f"--stream {stream!r}: give the bare name of the directory to move (its stream "
                                   f"name), not an ARN or an identity directory")
        source = landing_directory(stream)
        if stream_name(stream_arn) != source:
            raise MigrationRefused(f"--stream-arn {stream_arn} names stream {stream_name(stream_arn)}, not {source}")
        return cls(source, identity_directory(stream_arn), stream_arn)

    def key(self, key: str) -> str:
        """The key in the identity directory of a key of the source directory (others are not this
        migration's: ValueError)."""
        head, sep, rest = key.partition("/")
        if head == self.target and sep:
            return key  # already moved (a migration run again)
        if head != self.source or not sep:
            raise ValueError(f"{key} is not under {self.source}/")
        return f"{self.target}/{rest}"

    def named_key(self, key: str) -> str:
        """A key named by another object: moved when it is of the source directory, else as it is."""
        return self.key(key) if key.startswith(f"{self.source}/") else key

    def link_body(self, body: bytes) -> bytes:
        """A link's body with the batch key it names moved (its other lines, the holder's, as they are)."""
        target = link_target(body)
        if target == ENDED_EMPTY or not target.startswith(f"{self.source}/"):
            return body
        first, sep, rest = body.decode("utf-8", "replace").partition("\n")
        return f"{self.named_key(first.strip())}{sep}{rest}".encode()

    def stream_refusal(self, key: str, footer_arn: str | None) -> str | None:
        """Why a batch of the source must not move into the stream's identity directory (its footer names
        another stream), or None. A footer naming no stream (landed before stream identity) may."""
        why = foreign_stream(self.source, footer_arn, self.stream_arn)
        return None if why is None else f"batch {key}: {why}"

    def output_object(self, data: Mapping) -> dict | None:
        """A window commit's JSON (or the checkpoint record's) with the batch keys it names moved; None when it
        names none of the source directory."""
        return _moved_keys(data, self)

    def to_marker(self, phase: str) -> bytes:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        return json.dumps({"v": MARKER_VERSION, "source": self.source, "target": self.target,
                           "stream_arn": self.stream_arn, "phase": phase}, sort_keys=True).encode()


def read_marker(raw: bytes, where: str) -> tuple[Migration, str]:
    """The migration and phase a marker records; MigrationRefused naming `where` when it is not one."""
    try:
        data = json.loads(raw)
        if data.get("v") != MARKER_VERSION or data.get("phase") not in PHASES:
            raise ValueError(f"version {data.get('v')!r}, phase {data.get('phase')!r}")
        return Migration(str(data["source"]), str(data["target"]), str(data["stream_arn"])), str(data["phase"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MigrationRefused(f"{where} is not a migration marker ({exc}); move it away") from None


def resumable(migration: Migration, marker: tuple[Migration, str] | None, target_keys: Sequence[str]) -> str:
    """The phase to run: COPY for a new migration or one stopped while copying, DELETE for one stopped while
    deleting. MigrationRefused when the identity directory already holds objects no migration of this source
    put there (a consumer configured by the ARN landed there: two chains cannot be merged), or when the marker
    is another migration's."""
    if marker is not None:
        recorded, phase = marker
        if recorded != migration:
            raise MigrationRefused(f"{migration.target}/ holds an unfinished migration of {recorded.source}/ for "
                                   f"{recorded.stream_arn}: run that one again to finish it")
        return phase
    landed = [k for k in target_keys if k != marker_key(migration.target)]
    if landed:
        raise MigrationRefused(f"{migration.target}/ already holds {len(landed)} objects (e.g. {landed[0]}): a "
                               f"consumer configured by the ARN landed there, and two chains of one shard cannot "
                               f"be merged; nothing was moved")
    return COPY


def live_leases(before: Iterable[Lease], after: Iterable[Lease]) -> list[str]:
    """Pure: the leases whose counter moved between two scans of the lease table (a holder heartbeating: a
    consumer of the application is running), each as `<lease key> (owner, counter a -> b)`."""
    seen = {lease.lease_key: lease for lease in before}
    live = []
    for lease in after:
        was = seen.get(lease.lease_key)
        if was is not None and was.lease_counter != lease.lease_counter:
            live.append(f"{lease.lease_key} ({lease.lease_owner}, counter {was.lease_counter} -> "
                        f"{lease.lease_counter})")
    return sorted(live)


def is_link(key: str) -> bool:
    return f"/{LINK_PREFIX}" in key


def _moved_keys(data: Mapping, migration: Migration) -> dict | None:
    """`data` (a commit: `batches`; a checkpoint record: `late[].batches`) with its batch keys moved."""
    out = dict(data)
    changed = False
    if isinstance(data.get("batches"), list):
        moved = sorted(migration.named_key(str(k)) for k in data["batches"])
        changed |= moved != sorted(str(k) for k in data["batches"])
        out["batches"] = moved
    if isinstance(data.get("late"), list):
        late = []
        for item in data["late"]:
            if isinstance(item, dict) and isinstance(item.get("batches"), list):
                moved = [migration.named_key(str(k)) for k in item["batches"]]
                changed |= moved != item["batches"]
                item = {**item, "batches": moved}
            late.append(item)
        out["late"] = late
    return out if changed else None
