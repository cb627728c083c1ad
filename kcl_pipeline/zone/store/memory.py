"""The zone in this process's memory (`memory://<name>`): tests and the simulation."""
from __future__ import annotations

import bisect
import sys
import threading
from typing import Iterator

from ..errors import LandingError, ZoneNotFoundError
from ..layout import Zone
from .base import UPLOAD_PART_BYTES, ObjectVersion, Upload, ZoneStore, check_key

MEMORY_SCHEME = "memory://"


# -- memory --------------------------------------------------------------------------------------------------

class _MemoryObjects:
    """A memory zone's objects, shared by every store opened on its name in this process, with their keys kept
    in order: a listing is a bisection to its prefix and a copy of that range only (no sort, no copy of the
    whole zone), as S3 serves a prefix from its index. Writing a new key inserts it in place (a list insert,
    which moves pointers in C: cheap next to a sort of the zone per listing)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, tuple[bytes, int]] = {}  # key -> (body, version)
        self.keys: list[str] = []  # the keys of `objects`, sorted
        self.version = 0

    def write(self, key: str, body: bytes, *, replace: bool) -> bool:
        with self.lock:
            if key in self.objects:
                if not replace:
                    return False
            else:
                bisect.insort(self.keys, key)
            self.version += 1
            self.objects[key] = (bytes(body), self.version)
            return True

    def remove(self, keys: list[str]) -> None:
        with self.lock:
            for key in keys:
                if self.objects.pop(key, None) is not None:
                    del self.keys[bisect.bisect_left(self.keys, key)]

    def listed(self, prefix: str) -> list[tuple[str, tuple[bytes, int]]]:
        """(key, (body, version)) of the objects under `prefix`, in key order, as they are now."""
        with self.lock:
            keys = self.keys
            lo = bisect.bisect_left(keys, prefix)
            if prefix and ord(prefix[-1]) < sys.maxunicode:
                # The keys starting with `prefix` are exactly those from it up to (not including) the prefix
                # with its last character's successor.
                hi = bisect.bisect_left(keys, prefix[:-1] + chr(ord(prefix[-1]) + 1), lo)
            else:
                hi = lo
                while hi < len(keys) and keys[hi].startswith(prefix):
                    hi += 1
            objects = self.objects
            return [(key, objects[key]) for key in keys[lo:hi]]


_MEMORY_ZONES: dict[str, _MemoryObjects] = {}
_MEMORY_ZONES_LOCK = threading.Lock()


class _MemoryUpload(Upload):
    def __init__(self, store: "MemoryZoneStore", key: str) -> None:
        super().__init__()
        self.store, self.key = store, check_key(key, f"{store.what} {store.uri}")
        store._objects()  # a missing zone fails here, as a directory's or a bucket's upload does
        self.buffer = bytearray()

    def _write(self, view: memoryview) -> None:
        self.buffer += view

    def _finish(self) -> None:
        self.store._objects().write(self.key, bytes(self.buffer), replace=True)
        self.buffer.clear()

    def _discard(self) -> None:
        self.buffer.clear()


class MemoryZoneStore(ZoneStore):
    """`memory://<name>`: objects in this process's memory, under the same contract as a directory and S3
    (put-if-absent atomic, writes whole, listings in key order). Every store opened on one name shares its
    objects, as processes share a bucket; it never crosses a process (pickling it is refused)."""

    def __init__(self, name: str, what: str = "landing zone"):
        if not name or "/" in name:
            raise ValueError(f"memory zone name {name!r} must be non-empty, without '/'")
        self.zone = Zone(f"{MEMORY_SCHEME}{name}", "memory", None, name)
        self.what = what
        self.name = name

    def __getstate__(self):
        raise TypeError(f"{self.what} {self.uri} lives in this process's memory and cannot be sent to another")

    def _objects(self) -> _MemoryObjects:
        zone = _MEMORY_ZONES.get(self.name)
        if zone is None:
            raise ZoneNotFoundError(f"{self.what} {self.uri}: memory zone {self.name!r} does not exist "
                                    f"(create it, or ask for the zone to be created)")
        return zone

    def _key(self, key: str) -> str:
        return check_key(key, f"{self.what} {self.uri}")

    def ensure_zone(self, create: bool = False) -> bool:
        with _MEMORY_ZONES_LOCK:
            if self.name in _MEMORY_ZONES:
                return False
            if not create:
                raise ZoneNotFoundError(f"{self.what} {self.uri}: memory zone {self.name!r} does not exist")
            _MEMORY_ZONES[self.name] = _MemoryObjects()
            return True

    def drop(self) -> None:
        """Forget the zone and its objects (tests)."""
        with _MEMORY_ZONES_LOCK:
            _MEMORY_ZONES.pop(self.name, None)

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        return iter([(key, len(body)) for key, (body, _version) in self._objects().listed(prefix)])

    def list_keys(self, prefix: str) -> Iterator[str]:
        return iter([key for key, _object in self._objects().listed(prefix)])

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        return iter([ObjectVersion(key, len(body), str(version))
                     for key, (body, version) in self._objects().listed(prefix)])

    def list_dirs(self, prefix: str) -> list[str]:
        cut = len(prefix)
        names = {key[cut:].split("/", 1)[0] for key, _object in self._objects().listed(prefix) if "/" in key[cut:]}
        return sorted(names)

    def put_if_absent(self, key: str, body: bytes) -> bool:
        return self._objects().write(self._key(key), body, replace=False)

    def put(self, key: str, body: bytes) -> None:
        self._objects().write(self._key(key), body, replace=True)

    def upload(self, key: str, part_bytes: int = UPLOAD_PART_BYTES) -> Upload:
        return _MemoryUpload(self, key)

    def get(self, key: str) -> bytes:
        body = self.get_optional(key)
        if body is None:
            raise LandingError(f"{self.what} {self.uri}: cannot read {key}: no such object")
        return body

    def get_optional(self, key: str) -> bytes | None:
        zone = self._objects()
        with zone.lock:
            found = zone.objects.get(self._key(key))
        return None if found is None else found[0]

    def get_version(self, key: str) -> tuple[bytes, str]:
        zone = self._objects()
        with zone.lock:
            found = zone.objects.get(self._key(key))
        if found is None:
            raise LandingError(f"{self.what} {self.uri}: cannot read {key}: no such object")
        return found[0], str(found[1])

    def get_tail_version(self, key: str, nbytes: int) -> tuple[bytes, int, str]:
        body, tag = self.get_version(key)
        return body[max(0, len(body) - nbytes):], len(body), tag

    def exists(self, key: str) -> bool:
        zone = self._objects()
        with zone.lock:
            return self._key(key) in zone.objects

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        body = self.get(key)
        return body[max(0, len(body) - nbytes):], len(body)

    def delete(self, keys: list[str]) -> None:
        zone = self._objects()
        zone.remove([self._key(k) for k in keys])
