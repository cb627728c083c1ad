"""The zone in a local directory: temporary files hard-linked to their final names."""
from __future__ import annotations

import errno
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator

from ..errors import LandingError, ZoneAccessError, ZoneNotFoundError
from ..layout import Zone
from .base import STALE_TEMPORARY_SECONDS, UPLOAD_PART_BYTES, ObjectVersion, Upload, ZoneStore, check_key

TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.tmp$")  # `.<object name>.<uuid4 hex>.tmp`


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


