"""Where the AWS APIs are: the region and endpoints a consumer's clients use, and the environment that gives a
child process the same. A plain record below the shells (config.py holds one, shells/aws.py makes clients
from one), so that configuring the consumer imports no shell."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import botocore.session

_SERVICE_ENV = {
    "kinesis": "AWS_ENDPOINT_URL_KINESIS",
    "dynamodb": "AWS_ENDPOINT_URL_DYNAMODB",
    "s3": "AWS_ENDPOINT_URL_S3",
    "cloudwatch": "AWS_ENDPOINT_URL_CLOUDWATCH",
}


@dataclass(frozen=True)
class AwsSettings:
    """Where the AWS APIs are. Empty means the SDK's own resolution (env vars, config files, AWS)."""

    region: str | None = None
    endpoint_url: str | None = None  # one endpoint for every service (e.g. LocalStack)
    endpoint_urls: dict[str, str] = field(default_factory=dict)  # per service, wins over endpoint_url
    max_attempts: int = 8

    def endpoint_for(self, service: str) -> str | None:
        return (
            self.endpoint_urls.get(service)
            or self.endpoint_url
            or os.environ.get(_SERVICE_ENV.get(service, ""))
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )

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
        return env
