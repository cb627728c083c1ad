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

import bisect
import errno
import os
import random
import re
import shutil
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ..kcl.shells.aws import AwsSettings, client, parse_timestamp
from .errors import LandingError, ZoneAccessError, ZoneNotFoundError, ZoneUnavailableError
from .layout import Zone

TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")  # `.<object name>.<uuid4 hex>.tmp`
_ACCESS_CODES = frozenset({"AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                           "SignatureDoesNotMatch", "AccountProblem", "InvalidToken", "ExpiredToken"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404", "NotFound"})
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)
# S3 answers 409 ConditionalRequestConflict while another conditional write of the key is in flight: retried
# after a full-jitter back-off (a random pause up to 50 ms, doubling), so two writers that conflicted do not
# retry in lockstep and conflict again.
_CONFLICT_RETRIES = 5
_CONFLICT_BACKOFF_SECONDS = 0.05
# Multipart parts: S3's minimum is 5 MiB (except the last); 8 MiB keeps a writer's buffer small.
UPLOAD_PART_BYTES = 8 * 1024 * 1024
_MIN_PART_BYTES = 5 * 1024 * 1024
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys
# ListObjectsV2 MaxKeys. S3 (and MinIO, Ceph) answer at most 1,000 keys a page whatever is asked, so this changes
# nothing there; an emulator that re-reads the whole bucket for every page (moto) answers more, which keeps a
# long listing (the audit's whole history) linear instead of quadratic in the bucket's size.
LIST_PAGE_KEYS = 10_000
# A writer holds its temporary (or multipart upload) for one object's write; one far older was left by a writer
# that was killed. Six hours leaves any real write (a transform task streaming a large file) alone.
STALE_TEMPORARY_SECONDS = 6 * 3600
MEMORY_SCHEME = "memory://"


@dataclass(frozen=True)
class ObjectVersion:
    """One listed object: its key, size, and a tag that changes whenever the object is replaced ("" when the
    store cannot tell: such an object is always read again)."""

    key: str
    size: int
    tag: str


@dataclass(frozen=True)
class S3Options:
    """How a process reaches S3 when it cannot inherit the caller's environment (Spark executors on a
    cluster): carried as plain strings (Spark data source options), credentials optional (None = the
    process's own credential chain, e.g. an instance role)."""

    endpoint_url: str | None = None
    region: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None

    @classmethod
    def from_aws_settings(cls, settings: AwsSettings, *, env_credentials: bool = False) -> "S3Options":
        """From AwsSettings; with env_credentials, also pin this process's AWS_* keys (emulators, executors
        started before the variables were set)."""
        env = os.environ if env_credentials else {}
        return cls(
            endpoint_url=settings.endpoint_for("s3"),
            region=settings.resolved_region(),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=env.get("AWS_SESSION_TOKEN"),
        )

    def to_options(self) -> dict[str, str]:
        """Flat `s3_*` options (Spark redacts names containing secret/token/access_key in plans)."""
        return {f"s3_{f.name}": getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "S3Options":
        # Spark hands data sources a case-insensitive dict whose keys come back lower-cased.
        lowered = {str(k).lower(): v for k, v in options.items()}
        return cls(**{f.name: lowered.get(f"s3_{f.name}") or None for f in fields(cls)})

    def client(self):
        import boto3
        import botocore.session
        from botocore.config import Config

        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        session = boto3.session.Session(
            aws_access_key_id=self.aws_access_key_id, aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token, region_name=self.region, botocore_session=core)
        return session.client("s3", endpoint_url=self.endpoint_url, config=Config(
            retries={"mode": "standard", "max_attempts": 8}, connect_timeout=5, read_timeout=60,
            max_pool_connections=20))


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


# -- local directory ---------------------------------------------------------------------------------------

class _LocalUpload(Upload):
    def __init__(self, store: "LocalZoneStore", key: str) -> None:
        super().__init__()
        self.store, self.key = store, key
        self.path = store._path(key)
        store._check_root()
        self.tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.tmp, "xb")
        except OSError as exc:
            raise store._fail(exc, f"write {key}") from exc

    def _write(self, view: memoryview) -> None:
        try:
            self.file.write(view)
        except OSError as exc:
            self.abort()
            raise self.store._fail(exc, f"write {self.key}") from exc

    def _finish(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self._discard()
            raise self.store._fail(exc, f"write {self.key}") from exc

    def _discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


class LocalZoneStore(ZoneStore):
    def __init__(self, zone: Zone, what: str = "landing zone"):
        if zone.scheme != "file":
            raise ValueError(f"{zone.uri} is not a local directory zone")
        self.zone = zone
        self.what = what
        self.root = Path(zone.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key, f"{self.what} {self.uri}").split("/"))

    def _fail(self, exc: OSError, action: str) -> LandingError:
        if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return ZoneAccessError(f"{self.what} {self.uri}: cannot {action}: {exc.strerror or exc} "
                                   f"(directory {self.root} is not writable by this process)")
        return LandingError(f"{self.what} {self.uri}: cannot {action}: {exc}")

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise ZoneNotFoundError(f"{self.what} {self.uri}: directory {self.root} does not exist "
                                    f"(create it, or ask for the zone to be created)")

    def ensure_zone(self, create: bool = False) -> bool:
        if self.root.exists() and not self.root.is_dir():
            raise ZoneNotFoundError(f"{self.what} {self.uri}: {self.root} exists and is not a directory")
        created = False
        if not self.root.exists():
            if not create:
                self._check_root()
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._fail(exc, f"create directory {self.root}") from exc
            created = True
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ZoneAccessError(f"{self.what} {self.uri}: directory {self.root} is not writable by this process")
        return created

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        return ((v.key, v.size) for v in self.list_versions(prefix))

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        self._check_root()
        # A prefix is a directory ("a/b/") or a name stem ("a/b/c"): walk the directory that holds it.
        head = prefix.rpartition("/")[0]
        top = self._path(head + "/x").parent if head else self.root
        found: list[ObjectVersion] = []
        try:
            self._walk(top, head + "/" if head else "", prefix, found)
        except OSError as exc:
            raise self._fail(exc, f"list {prefix!r}") from exc
        found.sort(key=lambda v: v.key)
        return iter(found)

    def _walk(self, directory: Path, rel: str, prefix: str, out: list[ObjectVersion]) -> None:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue  # temporaries (and hidden files) are never stored objects
            key = rel + entry.name
            if entry.is_dir(follow_symlinks=False):
                if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                    self._walk(Path(entry.path), key + "/", prefix, out)
            elif key.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed while listing
                # A replaced object is a new file (a renamed temporary or a new link): a new inode and mtime.
                out.append(ObjectVersion(key, st.st_size, _file_tag(st)))

    def list_dirs(self, prefix: str) -> list[str]:
        self._check_root()
        directory = self._path(prefix + "x").parent if prefix else self.root
        try:
            return sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._fail(exc, f"list {prefix!r}") from exc

    def put_if_absent(self, key: str, body: bytes) -> bool:
        path = self._path(key)
        self._check_root()  # never create the zone itself as a side effect of a write
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)  # fails if the name exists: no replace, ever
                except FileExistsError:
                    return False
                _fsync_dir(path.parent)
                return True
            finally:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        except LandingError:
            raise
        except OSError as exc:
            raise self._fail(exc, f"write {key}") from exc

    def put(self, key: str, body: bytes) -> None:
        with self.upload(key) as out:
            out.write(body)

    def upload(self, key: str, part_bytes: int = UPLOAD_PART_BYTES) -> Upload:
        return _LocalUpload(self, key)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise self._fail(exc, f"read {key}") from exc

    def get_optional(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._fail(exc, f"read {key}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        body, size, _tag = self.get_tail_version(key, nbytes)
        return body, size

    def get_version(self, key: str) -> tuple[bytes, str]:
        body, _size, tag = self.get_tail_version(key, -1)
        return body, tag

    def get_tail_version(self, key: str, nbytes: int) -> tuple[bytes, int, str]:
        """`nbytes` < 0: the whole object. The tag is the open file's (a replaced object is another file)."""
        try:
            with open(self._path(key), "rb") as f:
                st = os.fstat(f.fileno())
                if nbytes >= 0:
                    f.seek(max(0, st.st_size - nbytes))
                return f.read(), st.st_size, _file_tag(st)
        except OSError as exc:
            raise self._fail(exc, f"read {key}") from exc

    def delete(self, keys: list[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                raise self._fail(exc, f"delete {key}") from exc
            parents.add(path.parent)
        # Directories exist only for their objects (as on S3): remove the ones left empty, up to the root.
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root and self.root in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    def delete_prefix(self, prefix: str) -> None:
        if prefix.endswith("/"):
            path = self._path(prefix + "x").parent
            if path.is_dir():
                # Everything under the directory goes, temporaries too; what cannot be removed is an error
                # naming it (ignoring it would leave objects a caller believes gone).
                def failed(_function, failed_path, exc_info) -> None:
                    exc = exc_info[1]
                    if isinstance(exc, FileNotFoundError):
                        return  # removed meanwhile (another writer's cleanup)
                    where = os.path.relpath(failed_path, self.root)
                    raise self._fail(exc, f"delete {where} (deleting {prefix!r})") from exc

                shutil.rmtree(path, onerror=failed)
            return
        super().delete_prefix(prefix)

    def sweep_temporaries(self, prefix: str = "", older_than_seconds: float = STALE_TEMPORARY_SECONDS) -> list[str]:
        self._check_root()
        head = prefix.rpartition("/")[0]
        top = self._path(head + "/x").parent if head else self.root
        cutoff = time.time() - older_than_seconds
        removed: list[str] = []
        for directory, dirs, files in os.walk(top):
            rel_dir = os.path.relpath(directory, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            dirs[:] = [d for d in dirs
                       if (rel_dir + d + "/").startswith(prefix) or prefix.startswith(rel_dir + d + "/")]
            for name in files:
                # Only this store's temporaries (a hidden file of another kind is not ours to remove), of an
                # object under the prefix.
                match = _TEMP_NAME.match(name)
                if match is None or not (rel_dir + match["name"]).startswith(prefix):
                    continue
                path = os.path.join(directory, name)
                try:
                    if os.stat(path).st_mtime >= cutoff:
                        continue  # a writer may still be at work
                    os.unlink(path)
                except FileNotFoundError:
                    continue  # its writer finished (renamed or removed it) meanwhile
                except OSError as exc:
                    raise self._fail(exc, f"remove the temporary {rel_dir}{name}") from exc
                removed.append(rel_dir + name)
        return sorted(removed)

    def local_path(self, key: str) -> str | None:
        return str(self._path(key))


def _file_tag(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the link itself is already atomic
    finally:
        os.close(fd)


# -- S3 ------------------------------------------------------------------------------------------------------

class _S3Upload(Upload):
    """Parts of `part_bytes` are sent as they fill; an object smaller than one part is one PutObject."""

    def __init__(self, store: "S3ZoneStore", key: str, part_bytes: int) -> None:
        super().__init__()
        if part_bytes < _MIN_PART_BYTES:
            raise ValueError(f"upload parts are at least 5 MiB (S3's minimum), got {part_bytes}")
        self.store, self.key, self.part_bytes = store, key, part_bytes
        self.full = store._full(key)
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict] = []

    def _call(self, action: str, fn, **kwargs):
        try:
            return fn(Bucket=self.store.bucket, Key=self.full, **kwargs)
        except Exception as exc:
            if action != "abort":
                self.abort()
            raise self.store._error(exc, f"{action} {self.key}") from exc

    def _send_part(self) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("write", self.store.client.create_multipart_upload)["UploadId"]
        number = len(self.parts) + 1
        resp = self._call("write", self.store.client.upload_part, UploadId=self.upload_id, PartNumber=number,
                          Body=bytes(self.buffer))
        self.parts.append({"PartNumber": number, "ETag": resp["ETag"]})
        self.buffer.clear()

    def _write(self, view: memoryview) -> None:
        self.buffer += view
        if len(self.buffer) >= self.part_bytes:
            self._send_part()

    def _finish(self) -> None:
        if self.upload_id is None:
            self._call("write", self.store.client.put_object, Body=bytes(self.buffer))
            return
        if self.buffer:
            self._send_part()
        self._call("write", self.store.client.complete_multipart_upload, UploadId=self.upload_id,
                   MultipartUpload={"Parts": self.parts})

    def _discard(self) -> None:
        self.buffer.clear()
        if self.upload_id is not None:
            # Best effort; a bucket lifecycle rule (AbortIncompleteMultipartUpload) sweeps what a killed
            # process leaves, as docs/transform.md says.
            try:
                self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.full,
                                                         UploadId=self.upload_id)
            except Exception:
                pass


class S3ZoneStore(ZoneStore):
    def __init__(self, zone: Zone, s3_client=None, *, options: S3Options | None = None,
                 page_size: int | None = None, what: str = "landing zone"):
        if zone.scheme != "s3":
            raise ValueError(f"{zone.uri} is not an s3:// zone")
        self.zone = zone
        self.what = what
        self.bucket = zone.bucket
        self.options = options
        self._client = s3_client
        self.page_size = page_size  # ListObjectsV2 MaxKeys; None = LIST_PAGE_KEYS

    @property
    def client(self):
        if self._client is None:
            self._client = (self.options or S3Options()).client()
        return self._client

    def __getstate__(self):  # a boto3 client does not pickle; the receiving process builds its own
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _full(self, key: str) -> str:
        return self.zone.full_key(check_key(key, f"{self.what} {self.uri}"))

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.zone.root) + 1:] if self.zone.root else full_key

    def _error(self, exc: Exception, action: str) -> Exception:
        endpoint = getattr(getattr(self._client, "meta", None), "endpoint_url", None) or "AWS"
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            message = exc.response.get("Error", {}).get("Message", "")
            if code in _MISSING_BUCKET_CODES:
                return ZoneNotFoundError(f"{self.what} {self.uri}: bucket {self.bucket!r} does not exist "
                                         f"({action}; endpoint {endpoint})")
            if code in _ACCESS_CODES:
                return ZoneAccessError(f"{self.what} {self.uri}: access denied to {action} "
                                       f"({code}: {message or 'no message'}; endpoint {endpoint})")
            return LandingError(f"{self.what} {self.uri}: {action} failed: {code}: {message}")
        if isinstance(exc, _UNREACHABLE):
            return ZoneUnavailableError(f"{self.what} {self.uri}: S3 unreachable during {action} ({exc})")
        if isinstance(exc, BotoCoreError):
            return LandingError(f"{self.what} {self.uri}: {action} failed: {exc}")
        return exc

    def ensure_zone(self, create: bool = False) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "")
            missing = code in _MISSING_BUCKET_CODES or status == 404
            if missing and not create:
                raise ZoneNotFoundError(f"{self.what} {self.uri}: bucket {self.bucket!r} does not exist "
                                        f"(endpoint {self.client.meta.endpoint_url or 'AWS'})") from exc
            if not missing:
                raise self._error(exc, f"find bucket {self.bucket!r}") from exc
        except Exception as exc:
            raise self._error(exc, f"find bucket {self.bucket!r}") from exc
        region = self.client.meta.region_name
        request: dict[str, Any] = {"Bucket": self.bucket}  # a CreateBucket request
        if region and region != "us-east-1":
            request["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self.client.create_bucket(**request)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise self._error(exc, f"create bucket {self.bucket!r}") from exc
            return False
        except Exception as exc:
            raise self._error(exc, f"create bucket {self.bucket!r}") from exc
        return True

    def _pages(self, prefix: str, **extra) -> Iterator[dict]:
        paginator = self.client.get_paginator("list_objects_v2")
        extra["PaginationConfig"] = {"PageSize": self.page_size or LIST_PAGE_KEYS}
        full = self.zone.full_key(prefix) if prefix else (self.zone.root + "/" if self.zone.root else "")
        try:
            yield from paginator.paginate(Bucket=self.bucket, Prefix=full, **extra)
        except Exception as exc:
            raise self._error(exc, f"list {prefix!r}") from exc

    def list_objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        for page in self._pages(prefix):
            for obj in page.get("Contents", ()):
                yield self._relative(obj["Key"]), int(obj["Size"])

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        for page in self._pages(prefix):
            for obj in page.get("Contents", ()):
                # The ETag is the content's digest (of its parts' digests for a multipart upload): a replaced
                # object with other content has another one.
                yield ObjectVersion(self._relative(obj["Key"]), int(obj["Size"]), str(obj.get("ETag") or ""))

    def sweep_temporaries(self, prefix: str = "", older_than_seconds: float = STALE_TEMPORARY_SECONDS) -> list[str]:
        """Abort the multipart uploads under `prefix` begun more than `older_than_seconds` ago (a killed
        writer's parts, invisible to readers but stored; a bucket lifecycle rule does the same)."""
        full = self.zone.full_key(prefix) if prefix else (self.zone.root + "/" if self.zone.root else "")
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than_seconds)
        removed: list[str] = []
        try:
            for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                    Prefix=full):
                for upload in page.get("Uploads", ()):
                    if upload["Initiated"] >= cutoff or self._sent_part_since(upload, cutoff):
                        continue  # a writer may still be at work
                    try:
                        self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                           UploadId=upload["UploadId"])
                    except ClientError as exc:
                        if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                            continue  # completed or aborted meanwhile
                        raise
                    removed.append(f"{self._relative(upload['Key'])} (upload {upload['UploadId']})")
        except Exception as exc:
            raise self._error(exc, f"sweep the incomplete uploads under {prefix!r}") from exc
        return sorted(removed)

    def list_dirs(self, prefix: str) -> list[str]:
        names = []
        for page in self._pages(prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", ()):
                names.append(self._relative(common["Prefix"])[len(prefix):].rstrip("/"))
        return sorted(names)

    def _sent_part_since(self, upload: Mapping[str, Any], cutoff: datetime) -> bool:
        """Whether the upload's writer sent a part after `cutoff`: a long write (a large file streamed for hours)
        is alive while parts keep coming, however long ago it began (emulators also misreport the start)."""
        try:
            for page in self.client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=upload["Key"],
                                                                         UploadId=upload["UploadId"]):
                if any(part["LastModified"] >= cutoff for part in page.get("Parts", ())):
                    return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchUpload":
                return True  # completed or aborted meanwhile: nothing to sweep
            raise
        return False

    def put_if_absent(self, key: str, body: bytes) -> bool:
        full = self._full(key)
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=body, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "PreconditionFailed" or status == 412:
                    return False  # already landed under this key
                if (code == "ConditionalRequestConflict" or status == 409) and attempt < _CONFLICT_RETRIES:
                    time.sleep(random.uniform(0, _CONFLICT_BACKOFF_SECONDS * 2 ** attempt))
                    continue
                raise self._error(exc, f"write {key}") from exc
            except Exception as exc:
                raise self._error(exc, f"write {key}") from exc
        raise AssertionError("unreachable")

    def put(self, key: str, body: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=body)
        except Exception as exc:
            raise self._error(exc, f"write {key}") from exc

    def upload(self, key: str, part_bytes: int = UPLOAD_PART_BYTES) -> Upload:
        return _S3Upload(self, key, part_bytes)

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc

    def get_optional(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._error(exc, f"read {key}") from exc
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._full(key))
            return True
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or exc.response.get("Error", {}).get("Code") in _MISSING_KEY_CODES:
                return False
            raise self._error(exc, f"find {key}") from exc
        except Exception as exc:
            raise self._error(exc, f"find {key}") from exc

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        body, size, _tag = self.get_tail_version(key, nbytes)
        return body, size

    def get_version(self, key: str) -> tuple[bytes, str]:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
            return resp["Body"].read(), str(resp.get("ETag") or "")
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc

    def get_tail_version(self, key: str, nbytes: int) -> tuple[bytes, int, str]:
        """The tag is the ETag of the object read (a ranged read answers the whole object's)."""
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key), Range=f"bytes=-{nbytes}")
            body = resp["Body"].read()
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc
        content_range = resp.get("ContentRange") or ""
        total = content_range.rpartition("/")[2]
        return body, int(total) if total.isdigit() else len(body), str(resp.get("ETag") or "")

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            chunk = [{"Key": self._full(k)} for k in keys[i:i + _DELETE_BATCH]]
            try:
                resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
            except Exception as exc:
                raise self._error(exc, f"delete {len(chunk)} objects") from exc
            errors = resp.get("Errors") or []
            if errors:
                raise LandingError(f"{self.what} {self.uri}: could not delete {len(errors)} objects, "
                                   f"e.g. {errors[0].get('Key')} ({errors[0].get('Code')})")


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
