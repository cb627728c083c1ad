"""Where the AWS APIs are: the region and endpoints a consumer's clients use, and the environment that gives a
child process the same. A plain record below the shells (config.py holds one, shells/aws.py makes clients
from one), so that configuring the consumer imports no shell."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping

import botocore.session

_SERVICE_ENV = {
    "kinesis": "AWS_ENDPOINT_URL_KINESIS",
    "dynamodb": "AWS_ENDPOINT_URL_DYNAMODB",
    "s3": "AWS_ENDPOINT_URL_S3",
    "cloudwatch": "AWS_ENDPOINT_URL_CLOUDWATCH",
}
# What every S3 request carries, when set (docs/deployment.md, "Least privilege"): the SSE-KMS key new objects
# are encrypted with, and the account that must own the bucket (S3 answers 403 AccessDenied otherwise, so a
# bucket name taken over by another account never receives the zone's data). Read wherever the S3 endpoint
# is: every process reaching S3 (consumers, workers, the code location, Spark's executors) carries them.
S3_SSE_KMS_KEY_ID_ENV = "KCL_PIPELINE_S3_SSE_KMS_KEY_ID"
S3_EXPECTED_BUCKET_OWNER_ENV = "KCL_PIPELINE_S3_EXPECTED_BUCKET_OWNER"
# A file every process of this run appends the AWS calls it makes to, one JSON line each (shells/aws.py): how
# the tests prove each role's IAM policy covers what it calls. Unset (always, outside those tests): nothing.
AWS_CALL_LOG_ENV = "KCL_PIPELINE_AWS_CALL_LOG"
_ACCOUNT_RE = re.compile(r"\d{12}")
_KMS_KEY_RE = re.compile(r"[A-Za-z0-9:/_.-]{1,2048}")


@dataclass(frozen=True)
class S3RequestSettings:
    """What every S3 request of this process adds to its parameters (shells/aws.py applies it)."""

    sse_kms_key_id: str | None = None
    expected_bucket_owner: str | None = None

    def __post_init__(self) -> None:
        if self.expected_bucket_owner is not None and not _ACCOUNT_RE.fullmatch(self.expected_bucket_owner):
            raise ValueError(f"{S3_EXPECTED_BUCKET_OWNER_ENV} must be a 12-digit AWS account id, "
                             f"got {self.expected_bucket_owner!r}")
        if self.sse_kms_key_id is not None and not _KMS_KEY_RE.fullmatch(self.sse_kms_key_id):
            raise ValueError(f"{S3_SSE_KMS_KEY_ID_ENV} must be a KMS key id, key ARN, alias/<name> or alias ARN, "
                             f"got {self.sse_kms_key_id!r}")

    @classmethod
    def from_environment(cls, env: Mapping[str, str], sse_kms_key_id: str | None = None,
                         expected_bucket_owner: str | None = None) -> "S3RequestSettings":
        """The explicit values, else `env`'s variables (a blank one is unset). Raises ValueError naming the
        variable when a value is malformed."""
        def given(explicit: str | None, variable: str) -> str | None:
            return explicit or env.get(variable, "").strip() or None

        return cls(given(sse_kms_key_id, S3_SSE_KMS_KEY_ID_ENV),
                   given(expected_bucket_owner, S3_EXPECTED_BUCKET_OWNER_ENV))

    def __bool__(self) -> bool:
        return bool(self.sse_kms_key_id or self.expected_bucket_owner)

    def parameters(self, accepted: frozenset[str] | set[str]) -> dict[str, str]:
        """The parameters to add to a request whose operation accepts `accepted` (its input members): the
        owner wherever S3 takes one (every call but CreateBucket and ListBuckets), the key on the writes that
        create an object (PutObject, CreateMultipartUpload, CopyObject)."""
        extra: dict[str, str] = {}
        if self.expected_bucket_owner and "ExpectedBucketOwner" in accepted:
            extra["ExpectedBucketOwner"] = self.expected_bucket_owner
        if self.sse_kms_key_id and "SSEKMSKeyId" in accepted:
            extra["ServerSideEncryption"] = "aws:kms"
            extra["SSEKMSKeyId"] = self.sse_kms_key_id
        return extra


@dataclass(frozen=True)
class AwsSettings:
    """Where the AWS APIs are. Empty means the SDK's own resolution (env vars, config files, AWS)."""

    region: str | None = None
    endpoint_url: str | None = None  # one endpoint for every service (e.g. LocalStack)
    endpoint_urls: dict[str, str] = field(default_factory=dict)  # per service, wins over endpoint_url
    max_attempts: int = 8
    # None: the variables above (S3_SSE_KMS_KEY_ID_ENV, S3_EXPECTED_BUCKET_OWNER_ENV).
    s3_sse_kms_key_id: str | None = None
    s3_expected_bucket_owner: str | None = None

    def endpoint_for(self, service: str) -> str | None:
        return (
            self.endpoint_urls.get(service)
            or self.endpoint_url
            or os.environ.get(_SERVICE_ENV.get(service, ""))
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )

    def s3_requests(self) -> S3RequestSettings:
        """What S3 requests carry: explicit, else the environment's (S3RequestSettings.from_environment)."""
        return S3RequestSettings.from_environment(os.environ, self.s3_sse_kms_key_id, self.s3_expected_bucket_owner)

    def resolved_region(self) -> str | None:
        """The region: explicit, else AWS_REGION (the cross-SDK variable botocore does not read), else
        botocore's own chain (AWS_DEFAULT_REGION, then the profile's `region` in ~/.aws/config). None when
        nothing names one: no region is invented, so a profile's region is never overridden."""
        return self.region or os.environ.get("AWS_REGION") or botocore.session.Session().get_config_variable("region")

    def to_env(self) -> dict[str, str]:
        """Environment that reproduces these settings in a child process."""
        region = self.resolved_region()
        env = {"AWS_REGION": region, "AWS_DEFAULT_REGION": region} if region else {}
        for service, var in _SERVICE_ENV.items():
            url = self.endpoint_for(service)
            if url:
                env[var] = url
        s3 = self.s3_requests()
        for variable, value in ((S3_SSE_KMS_KEY_ID_ENV, s3.sse_kms_key_id),
                                (S3_EXPECTED_BUCKET_OWNER_ENV, s3.expected_bucket_owner)):
            if value:
                env[variable] = value
        return env
