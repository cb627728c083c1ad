"""Object access for the landing zone: S3 (boto3) or a local directory, with the same keys and semantics.

The one write is `put_if_absent`: an object appears whole under its final key or not at all, and an
existing object is never replaced. On S3 that is a conditional PutObject (`If-None-Match: *`; a 412
PreconditionFailed means "already landed", not an error). In a directory it is a temporary file in
the same directory (named `.<name>.<random>.tmp`, skipped by listings) hard-linked to the final name:
`link` fails if the name exists, so a partly written object is never visible under its final key and
two writers cannot replace each other's object.

Keys are relative to the zone root ('/'-separated); listings come back in lexicographic key order,
as S3 returns them.

This is the project's one object store: the landing zone, the transform's output and the window commits
all go through it (the Spark data sources too: an S3 store built from `S3Options` pickles without its
client, and each executor builds its own). Other writes: `put` replaces an object whole (manifests,
commits), `upload` streams a large object (S3 multipart, or a temporary file renamed into place) so a
writer never holds the whole object in memory, and neither leaves a partial object under its key.

A third store, `MemoryZoneStore` (`memory://<name>`), keeps objects in this process with the same contract
(one contract test suite runs against all three): tests and the simulation use it.

Versions: `list_versions` gives each object a tag that changes whenever the object is replaced (S3's ETag; a
file's inode, size and modification time; the memory store's write counter), so a reader that cached what it
learnt from an object (the audit's index) knows when to read it again.

Leftovers of killed writers (a directory's `.tmp` files, S3's incomplete multipart uploads) are invisible to
every reader; `sweep_temporaries` removes those older than a writer can take (`STALE_TEMPORARY_SECONDS`).
"""
from __future__ import annotations

from ...kcl.aws_settings import AwsSettings
from ...kcl.shells.aws import client
from ..layout import Zone
from .base import (
    LIST_PAGE_KEYS,
    STALE_TEMPORARY_SECONDS,
    UPLOAD_PART_BYTES,
    ObjectVersion,
    Upload,
    ZoneStore,
    check_key,
)
from .local import LocalZoneStore
from .memory import MEMORY_SCHEME, MemoryZoneStore
from .s3 import S3Options, S3ZoneStore

__all__ = ["LIST_PAGE_KEYS", "MEMORY_SCHEME", "STALE_TEMPORARY_SECONDS", "UPLOAD_PART_BYTES", "LocalZoneStore",
           "MemoryZoneStore", "ObjectVersion", "S3Options", "S3ZoneStore", "Upload", "ZoneStore", "check_key",
           "open_store"]


def open_store(zone: Zone | str, aws: AwsSettings | None = None, *, s3_client=None,
               s3: S3Options | None = None, what: str = "landing zone") -> ZoneStore:
    """The store for a URI: `s3://bucket/prefix`, `memory://name` (this process's memory) or a local directory
    (path or file:// URI).

    S3 clients: `s3_client` as given; else from `s3` (picklable: executors rebuild the client); else from
    `aws` (AwsSettings, the consumer's client settings)."""
    if isinstance(zone, str) and zone.startswith(MEMORY_SCHEME):
        return MemoryZoneStore(zone[len(MEMORY_SCHEME):], what=what)
    zone = zone if isinstance(zone, Zone) else Zone.parse(zone)
    if zone.scheme == "s3":
        if s3_client is None and s3 is None:
            s3_client = client("s3", aws)
        return S3ZoneStore(zone, s3_client, options=s3, what=what)
    return LocalZoneStore(zone, what=what)


