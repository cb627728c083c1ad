"""Object access for the landing zone: S3 (boto3) or a local directory, with the same keys and semantics.

The one write is `put_if_absent`: an object appears whole under its final key or not at all, and an
existing object is never replaced. On S3 that is a conditional PutObject (`If-None-Match: *`; a 412
PreconditionFailed means "already landed", not an error). In a directory it is a temporary file in
the same directory (named `.<name>.<random>.tmp`, skipped by listings) hard-linked to the final name:
`link` fails if the name exists, so a partly written object is never visible under its final key and
two writers cannot replace each other's object.

Keys are relative to the zone root ('/'-separated); listings come back in lexicographic key order,
as S3 returns them.
"""
from __future__ import annotations

import errno
import os
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterator

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ..kcl.aws import AwsSettings, client
from .errors import LandingError, ZoneAccessError, ZoneNotFoundError, ZoneUnavailableError
from .layout import Zone

TEMP_SUFFIX = ".tmp"
_ACCESS_CODES = frozenset({"AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                           "SignatureDoesNotMatch", "AccountProblem", "InvalidToken", "ExpiredToken"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404", "NotFound"})
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)
# S3 answers 409 ConditionalRequestConflict while another conditional write of the key is in flight.
_CONFLICT_RETRIES = 5


class ZoneStore(ABC):
    """One landing zone's objects."""

    zone: Zone

    @property
    def uri(self) -> str:
        return self.zone.uri

    @abstractmethod
    def ensure_zone(self, create: bool = False) -> bool:
        """Check the bucket / directory exists (True if this call created it). Missing and not `create`:
        ZoneNotFoundError; not usable: ZoneAccessError."""

    @abstractmethod
    def list_keys(self, prefix: str) -> Iterator[str]:
        """Every object key under `prefix` (a string prefix, as S3), in key order; temporaries skipped."""

    @abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the 'directories' directly under `prefix` (which ends with '/' or is empty)."""

    @abstractmethod
    def put_if_absent(self, key: str, body: bytes) -> bool:
        """Write `body` under `key` unless an object is there already. True if written, False if it existed."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        ...

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""

    @abstractmethod
    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        """The last `nbytes` of the object (all of it if smaller) and the object's size."""


def open_store(zone: Zone | str, aws: AwsSettings | None = None, *, s3_client=None) -> ZoneStore:
    """The store for a zone URI: `s3://bucket/prefix` or a local directory (path or file:// URI)."""
    zone = zone if isinstance(zone, Zone) else Zone.parse(zone)
    if zone.scheme == "s3":
        return S3ZoneStore(zone, s3_client or client("s3", aws))
    return LocalZoneStore(zone)


# -- local directory ---------------------------------------------------------------------------------------

class LocalZoneStore(ZoneStore):
    def __init__(self, zone: Zone):
        if zone.scheme != "file":
            raise ValueError(f"{zone.uri} is not a local directory zone")
        self.zone = zone
        self.root = Path(zone.root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
            raise ValueError(f"landing zone {self.uri}: invalid key {key!r}")
        return self.root.joinpath(*parts)

    def _fail(self, exc: OSError, action: str) -> LandingError:
        if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return ZoneAccessError(f"landing zone {self.uri}: cannot {action}: {exc.strerror or exc} "
                                   f"(directory {self.root} is not writable by this process)")
        return LandingError(f"landing zone {self.uri}: cannot {action}: {exc}")

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise ZoneNotFoundError(f"landing zone {self.uri}: directory {self.root} does not exist "
                                    f"(create it, or ask for the zone to be created)")

    def ensure_zone(self, create: bool = False) -> bool:
        if self.root.exists() and not self.root.is_dir():
            raise ZoneNotFoundError(f"landing zone {self.uri}: {self.root} exists and is not a directory")
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
            raise ZoneAccessError(f"landing zone {self.uri}: directory {self.root} is not writable by this process")
        return created

    def list_keys(self, prefix: str) -> Iterator[str]:
        self._check_root()
        # A prefix is a directory ("a/b/") or a name stem ("a/b/c"): walk the directory that holds it.
        head = prefix.rpartition("/")[0]
        top = self._path(head + "/x").parent if head else self.root
        found: list[str] = []
        try:
            self._walk(top, head + "/" if head else "", prefix, found)
        except OSError as exc:
            raise self._fail(exc, f"list {prefix!r}") from exc
        found.sort()
        return iter(found)

    def _walk(self, directory: Path, rel: str, prefix: str, out: list[str]) -> None:
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        except NotADirectoryError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue  # temporaries (and hidden files) are never landed objects
            key = rel + entry.name
            if entry.is_dir(follow_symlinks=False):
                if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                    self._walk(Path(entry.path), key + "/", prefix, out)
            elif key.startswith(prefix):
                out.append(key)

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

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            raise self._fail(exc, f"read {key}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - nbytes))
                return f.read(), size
        except OSError as exc:
            raise self._fail(exc, f"read {key}") from exc


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

class S3ZoneStore(ZoneStore):
    def __init__(self, zone: Zone, s3_client, *, page_size: int | None = None):
        if zone.scheme != "s3":
            raise ValueError(f"{zone.uri} is not an s3:// zone")
        self.zone = zone
        self.bucket = zone.bucket
        self.client = s3_client
        self.page_size = page_size  # ListObjectsV2 MaxKeys; None = S3's 1000

    def _full(self, key: str) -> str:
        return self.zone.full_key(key)

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.zone.root) + 1:] if self.zone.root else full_key

    def _error(self, exc: Exception, action: str) -> Exception:
        endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", None) or "AWS"
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            message = exc.response.get("Error", {}).get("Message", "")
            if code in _MISSING_BUCKET_CODES:
                return ZoneNotFoundError(f"landing zone {self.uri}: bucket {self.bucket!r} does not exist "
                                         f"({action}; endpoint {endpoint})")
            if code in _ACCESS_CODES:
                return ZoneAccessError(f"landing zone {self.uri}: access denied to {action} "
                                       f"({code}: {message or 'no message'}; endpoint {endpoint})")
            return LandingError(f"landing zone {self.uri}: {action} failed: {code}: {message}")
        if isinstance(exc, _UNREACHABLE):
            return ZoneUnavailableError(f"landing zone {self.uri}: S3 unreachable during {action} ({exc})")
        if isinstance(exc, BotoCoreError):
            return LandingError(f"landing zone {self.uri}: {action} failed: {exc}")
        return exc

    def ensure_zone(self, create: bool = False) -> bool:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "")
            if not (code in _MISSING_BUCKET_CODES or status == 404) or not create:
                raise self._error(exc, f"find bucket {self.bucket!r}") from exc
        except Exception as exc:
            raise self._error(exc, f"find bucket {self.bucket!r}") from exc
        region = self.client.meta.region_name
        request = {"Bucket": self.bucket}
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
        if self.page_size:
            extra["PaginationConfig"] = {"PageSize": self.page_size}
        try:
            yield from paginator.paginate(Bucket=self.bucket, Prefix=self._full(prefix), **extra)
        except Exception as exc:
            raise self._error(exc, f"list {prefix!r}") from exc

    def list_keys(self, prefix: str) -> Iterator[str]:
        for page in self._pages(prefix):
            for obj in page.get("Contents", ()):
                yield self._relative(obj["Key"])

    def list_dirs(self, prefix: str) -> list[str]:
        names = []
        for page in self._pages(prefix, Delimiter="/"):
            for common in page.get("CommonPrefixes", ()):
                names.append(self._relative(common["Prefix"])[len(prefix):].rstrip("/"))
        return sorted(names)

    def put_if_absent(self, key: str, body: bytes) -> bool:
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=body, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "PreconditionFailed" or status == 412:
                    return False  # already landed under this key
                if (code == "ConditionalRequestConflict" or status == 409) and attempt < _CONFLICT_RETRIES:
                    time.sleep(0.05 * 2 ** attempt)  # another conditional write of the key is in flight
                    continue
                raise self._error(exc, f"write {key}") from exc
            except Exception as exc:
                raise self._error(exc, f"write {key}") from exc
        raise AssertionError("unreachable")

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._full(key))
            return True
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error(exc, f"find {key}") from exc
        except Exception as exc:
            raise self._error(exc, f"find {key}") from exc

    def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._full(key), Range=f"bytes=-{nbytes}")
            body = resp["Body"].read()
        except Exception as exc:
            raise self._error(exc, f"read {key}") from exc
        content_range = resp.get("ContentRange") or ""
        total = content_range.rpartition("/")[2]
        return body, int(total) if total.isdigit() else len(body)
