"""Object access for the transform: the landing zone it reads and the output it writes, on S3 or a directory.

The Spark data sources run this on executors (and in Spark's planner process), which never inherit the
driver's environment on a cluster: everything needed to reach S3 travels in `S3Options`, flattened into
Spark data source options. Credentials are optional (None = the executor's own credential chain, e.g. an
instance role); option names containing "secret"/"token"/"access_key" are redacted by Spark in plans.

(landing/store.py was not committed when this was written; this is the transform's own minimal listing.)
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Mapping

from ..landing.layout import Zone


class StorageNotFoundError(FileNotFoundError):
    """The zone or output location itself does not exist (missing bucket or directory)."""


@dataclass(frozen=True)
class S3Options:
    endpoint_url: str | None = None
    region: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None

    @classmethod
    def from_aws_settings(cls, settings, *, env_credentials: bool = False) -> "S3Options":
        """From kcl/aws.AwsSettings; with env_credentials, also pin the driver's AWS_* keys (emulators,
        executors started before the variables were set)."""
        env = os.environ if env_credentials else {}
        return cls(
            endpoint_url=settings.endpoint_for("s3"),
            region=settings.resolved_region(),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=env.get("AWS_SESSION_TOKEN"),
        )

    def to_options(self) -> dict[str, str]:
        return {f"s3_{f.name}": getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "S3Options":
        # Spark hands data sources a case-insensitive dict whose keys come back lower-cased.
        lowered = {str(k).lower(): v for k, v in options.items()}
        return cls(**{f.name: lowered.get(f"s3_{f.name}") or None for f in fields(cls)})


class ObjectStore:
    """Keys are '/'-separated and relative to the location's root (an S3 prefix or a directory)."""

    uri: str

    def check_exists(self) -> None:
        raise NotImplementedError

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(relative key, size in bytes) of every object under `prefix`, in key order."""
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError

    def get_optional(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""
        raise NotImplementedError

    def put(self, key: str, body: bytes) -> None:
        raise NotImplementedError

    def move(self, src: str, dst: str) -> None:
        raise NotImplementedError

    def delete(self, keys: list[str]) -> None:
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> None:
        self.delete([key for key, _size in self.list(prefix)])

    def local_path(self, key: str) -> str | None:
        """A filesystem path for `key` when the store is a directory (lets pyarrow read/write in place)."""
        return None


def open_store(uri: str, s3: S3Options | None = None) -> ObjectStore:
    zone = Zone.parse(uri)
    if zone.scheme == "s3":
        return S3Store(zone, s3 or S3Options())
    return LocalStore(zone)


class LocalStore(ObjectStore):
    def __init__(self, zone: Zone) -> None:
        self.uri = zone.uri
        self.root = Path(zone.root)

    def check_exists(self) -> None:
        if not self.root.is_dir():
            raise StorageNotFoundError(f"{self.uri}: directory {self.root} does not exist")

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        base = self.root / prefix
        # A prefix is a directory ("a/b/") or a name stem ("a/b/part-"): walk the directory that holds it.
        top = base if prefix.endswith("/") or not prefix else base.parent
        if not top.is_dir():
            return
        found = []
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                rel = Path(dirpath, name).relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    found.append((rel, os.stat(os.path.join(dirpath, name)).st_size))
        yield from sorted(found)

    def get(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def put(self, key: str, body: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(body)
        os.replace(tmp, path)  # readers never see a half-written object

    def move(self, src: str, dst: str) -> None:
        target = self.root / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.root / src, target)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            (self.root / key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        path = self.root / prefix
        if prefix.endswith("/") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            super().delete_prefix(prefix)

    def get_optional(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except FileNotFoundError:
            return None

    def local_path(self, key: str) -> str | None:
        return str(self.root / key)


class S3Store(ObjectStore):
    def __init__(self, zone: Zone, options: S3Options) -> None:
        self.uri = zone.uri
        self.bucket = zone.bucket
        self.root = zone.root
        self.options = options
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(
                aws_access_key_id=self.options.aws_access_key_id,
                aws_secret_access_key=self.options.aws_secret_access_key,
                aws_session_token=self.options.aws_session_token,
                region_name=self.options.region,
            )
            self._client = session.client(
                "s3", endpoint_url=self.options.endpoint_url,
                config=Config(retries={"mode": "standard", "max_attempts": 8}, connect_timeout=5, read_timeout=60),
            )
        return self._client

    def __getstate__(self):  # a boto3 client is not picklable; executors build their own
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _full(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def check_exists(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise StorageNotFoundError(
                    f"{self.uri}: bucket {self.bucket!r} does not exist"
                    f" (endpoint {self.options.endpoint_url or 'AWS'})") from exc
            raise

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        from botocore.exceptions import ClientError

        strip = len(self.root) + 1 if self.root else 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._full(prefix))
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield obj["Key"][strip:], int(obj["Size"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
                raise StorageNotFoundError(f"{self.uri}: bucket {self.bucket!r} does not exist") from exc
            raise

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()

    def get_optional(self, key: str) -> bytes | None:
        try:
            return self.get(key)
        except self.client.exceptions.NoSuchKey:
            return None

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=body)

    def move(self, src: str, dst: str) -> None:
        # Objects here are task outputs (far below CopyObject's 5 GB limit).
        self.client.copy_object(Bucket=self.bucket, Key=self._full(dst),
                                CopySource={"Bucket": self.bucket, "Key": self._full(src)})
        self.client.delete_object(Bucket=self.bucket, Key=self._full(src))

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = [{"Key": self._full(k)} for k in keys[i:i + 1000]]
            if chunk:
                resp = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
                errors = resp.get("Errors") or []
                if errors:
                    raise OSError(f"{self.uri}: could not delete {len(errors)} objects, e.g. {errors[0]}")
