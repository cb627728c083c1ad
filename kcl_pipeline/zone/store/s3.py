"""The zone on S3: conditional writes, multipart uploads, paged listings."""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Mapping

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from ...kcl.aws_settings import AwsSettings, S3RequestSettings
from ...kcl.shells.aws import instrument, parse_timestamp, s3_requests_of
from ..errors import LandingError, ZoneAccessError, ZoneNotFoundError, ZoneUnavailableError
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
# Multipart parts: S3's minimum is 5 MiB (except the last).
_MIN_PART_BYTES = 5 * 1024 * 1024
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys


@dataclass(frozen=True)
class S3Options:
    """How a process reaches S3 when it cannot inherit the caller's environment (Spark executors on a
    cluster): carried as plain strings (Spark data source options), credentials optional (None = the
    process's own credential chain, e.g. an instance role). The SSE-KMS key and the expected bucket owner
    travel too (None: the receiving process's variables, AwsSettings.s3_requests)."""

    endpoint_url: str | None = None
    region: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    sse_kms_key_id: str | None = None
    expected_bucket_owner: str | None = None

    @classmethod
    def from_aws_settings(cls, settings: AwsSettings, *, env_credentials: bool = False) -> "S3Options":
        """From AwsSettings; with env_credentials, also pin this process's AWS_* keys (see pins_credentials)."""
        env = os.environ if env_credentials else {}
        requests = settings.s3_requests()
        return cls(
            endpoint_url=settings.endpoint_for("s3"),
            region=settings.resolved_region(),
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=env.get("AWS_SESSION_TOKEN"),
            sse_kms_key_id=requests.sse_kms_key_id,
            expected_bucket_owner=requests.expected_bucket_owner,
        )

    @staticmethod
    def pins_credentials(settings: AwsSettings, asked: bool | None = None) -> bool:
        """Whether this process's AWS keys travel with the options to Spark (and are in every data source's
        options): as `asked`, else only when S3 is at an explicit endpoint (the emulators, an S3-compatible
        store), whose keys a cluster's executors have no way to find. On AWS each executor's own credential
        chain (an instance or pod role) is the one to use; the driver's keys, a session token among them,
        would outlive the executors' need of them in Spark's plans and event logs."""
        return asked if asked is not None else settings.endpoint_for("s3") is not None

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
        made = session.client("s3", endpoint_url=self.endpoint_url, config=Config(
            retries={"mode": "standard", "max_attempts": 8}, connect_timeout=5, read_timeout=60,
            max_pool_connections=20))
        return instrument(made, S3RequestSettings.from_environment(os.environ, self.sse_kms_key_id,
                                                                   self.expected_bucket_owner))



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
            # process leaves, as docs/transform-commits.md says.
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
                owner = s3_requests_of(self._client).expected_bucket_owner
                # S3 answers a request whose ExpectedBucketOwner is not the bucket's owner with a bare 403.
                hint = (f"; or bucket {self.bucket!r} is not owned by account {owner} "
                        f"(KCL_PIPELINE_S3_EXPECTED_BUCKET_OWNER)") if owner else ""
                return ZoneAccessError(f"{self.what} {self.uri}: access denied to {action} "
                                       f"({code}: {message or 'no message'}; endpoint {endpoint}{hint})")
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


