"""The store's contract: what every backend of the zone does alike (`ZoneStore`), its versions and its
streamed writes (`Upload`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

from ..layout import Zone

# Streamed writes go in parts of this size: 8 MiB keeps a writer's buffer small (and is above S3's 5 MiB
# minimum part).
UPLOAD_PART_BYTES = 8 * 1024 * 1024
# ListObjectsV2 MaxKeys. S3 (and MinIO, Ceph) answer at most 1,000 keys a page whatever is asked, so this changes
# nothing there; an emulator that re-reads the whole bucket for every page (moto) answers more, which keeps a
# long listing (the audit's whole history) linear instead of quadratic in the bucket's size.
LIST_PAGE_KEYS = 10_000
# A writer holds its temporary (or multipart upload) for one object's write; one far older was left by a writer
# that was killed. Six hours leaves any real write (a transform task streaming a large file) alone.
STALE_TEMPORARY_SECONDS = 6 * 3600



@dataclass(frozen=True)
class ObjectVersion:
    """One listed object: its key, size, and a tag that changes whenever the object is replaced ("" when the
    store cannot tell: such an object is always read again)."""

    key: str
    size: int
    tag: str


def check_key(key: str, where: str) -> str:
    """The one key guard: '/'-separated, relative, no empty, '.' or '..' segment (a key never escapes its root)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{where}: invalid key {key!r}")
    return key


class Upload:
    """A streamed write of one object (a writable binary file for pyarrow): `close()` makes it appear whole
    under its key, `abort()` (or an exception inside `with`) leaves nothing. After abort, close is a no-op,
    so a writer closed late (pyarrow closes on garbage collection) cannot publish a partial object."""

    def __init__(self) -> None:
        self._written = 0
        self._done = False
        self._aborted = False

    @property
    def closed(self) -> bool:
        return self._done

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self._aborted:
            return len(view)  # a writer flushing into an aborted upload (on collection) changes nothing
        if self._done:
            raise ValueError("write to a closed upload")
        self._write(view)
        self._written += len(view)
        return len(view)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._finish()

    def abort(self) -> None:
        if not self._done:
            self._done = self._aborted = True
            self._discard()

    def __enter__(self) -> "Upload":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _write(self, view: memoryview) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def _discard(self) -> None:
        raise NotImplementedError


class ZoneStore(ABC):
    """One root's objects (a landing zone, or the transform's output)."""

    zone: Zone
    what: str = "landing zone"  # how messages name the root

    @property
    def uri(self) -> str:
        return self.zone.uri

    @abstractmethod
    def ensure_zone(self, create: bool = False) -> bool:
        """Check the bucket / directory exists (True if this call created it). Missing and not `create`:
        ZoneNotFoundError; not usable: ZoneAccessError."""

    def check_exists(self) -> None:
        self.ensure_zone(create=False)

    @abstractmethod
    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size in bytes) of every object under `prefix` (a string prefix, as S3), in key order;
        temporaries skipped."""

    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under `prefix`, in key order."""
        return (key for key, _size in self.list_objects(prefix))

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """Every object under `prefix` with its version tag, in key order (the stores below all know their
        tags; a store that does not says "" and its objects are never taken as unchanged)."""
        return (ObjectVersion(key, size, "") for key, size in self.list_objects(prefix))

    @abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the 'directories' directly under `prefix` (which ends with '/' or is empty)."""

    @abstractmethod
    def put_if_absent(self, key: str, body: bytes) -> bool:
        """Write `body` under `key` unless an object is there already. True if written, False if it existed."""

    @abstractmethod
    def put(self, key: str, body: bytes) -> None:
        """Write `body` under `key`, replacing what is there (readers see the old object or the new, whole)."""

    @abstractmethod
    def upload(self, key: str, part_bytes: int = UPLOAD_PART_BYTES) -> Upload:
        """A streamed write of `key` (replacing it on close); memory held is about one part."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        ...

    @abstractmethod
    def get_optional(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""

    @abstractmethod
    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        """The last `nbytes` of the object (all of it if smaller) and the object's size."""

    def get_version(self, key: str) -> tuple[bytes, str]:
        """`get`, with the tag (as `list_versions` gives it) of the bytes read — not of the object when it was
        listed, which may have been replaced since. "" when the store cannot tell."""
        return self.get(key), ""

    def get_tail_version(self, key: str, nbytes: int) -> tuple[bytes, int, str]:
        """`get_tail`, with the tag of the object whose tail was read ("" when the store cannot tell)."""
        return (*self.get_tail(key, nbytes), "")

    @abstractmethod
    def delete(self, keys: list[str]) -> None:
        """Remove these objects (missing ones are fine)."""

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object under `prefix`; an object that cannot be removed is an error naming it."""
        self.delete(list(self.list_keys(prefix)))

    def sweep_temporaries(self, prefix: str = "", older_than_seconds: float = STALE_TEMPORARY_SECONDS) -> list[str]:
        """Remove what killed writers left under `prefix` (never visible to readers) when older than
        `older_than_seconds`; returns what was removed. A writer still at work is younger and left alone."""
        return []

    def local_path(self, key: str) -> str | None:
        """A filesystem path for `key` when the store is a directory (lets pyarrow read in place)."""
        return None


