"""The pipeline's streams and the names Dagster gives their objects (asset key prefixes, job names, run keys).

A single-stream deployment keeps its plain names (`landed_records`, `kinesis_window_job`, …). A multi-stream
deployment (KCL_PIPELINE_STREAM=a,b) has one set of assets, checks, jobs and schedule per stream, each named
with the stream's prefix (`orders/landed_records`, `kinesis_window_job__orders`): every stream has its own
window partitions, materialisation history and runs, and its windows complete on their own. One sensor hosts
the one lease manager of all the streams (one lease table) and reports each stream's windows.

A stream's slice (zone/stream_slice.py) is read where it is used, at tick or run time: its current
incarnation, leases, shards and landing directory. A deleted and re-created stream is a new incarnation (new
leases, checkpoints and landing directory), and the pipeline follows it (docs/kcl3.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.config import ConfigError
from ..kcl.core.model import Lease
from ..kcl.core.streams import stream_name
from ..zone.layout import landing_directory
from ..zone.stream_slice import StreamSlice, current_scope, read_slice

if TYPE_CHECKING:
    from .consumer import ConsumerSettings

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def stream_prefix(stream: str) -> str:
    """A stream's name as a Dagster name part (asset key prefix, job suffix): letters, digits and '_'."""
    return _NOT_NAME.sub("_", stream_name(stream))


def check_prefixes(streams: Sequence[str]) -> None:
    """Two streams whose names differ only in '.' or '-' (`a-b`, `a.b`) would share Dagster names."""
    seen: dict[str, str] = {}
    for stream in streams:
        prefix = stream_prefix(stream)
        if prefix in seen:
            raise ConfigError(f"streams {seen[prefix]} and {stream} would share the Dagster name {prefix!r} "
                              f"(asset keys and job names allow letters, digits and '_' only)")
        seen[prefix] = stream


@dataclass(frozen=True)
class PipelineStream:
    """One stream of the pipeline and how its Dagster objects are named. `stream` None: the single stream of a
    single-stream deployment, named by the consumer resource at run time (plain names, no prefix)."""

    stream: str | None = None

    @property
    def multi(self) -> bool:
        return self.stream is not None

    @property
    def prefix(self) -> str | None:
        return None if self.stream is None else stream_prefix(self.stream)

    def key(self, base):
        """The stream's `base` asset key (a Dagster AssetKey), under the stream's prefix when there are several."""
        return base if self.prefix is None else base.with_prefix(self.prefix)

    def job(self, base: str) -> str:
        return base if self.prefix is None else f"{base}__{self.prefix}"

    def run_key(self, key: str) -> str:
        """Run keys are the sensor's, whatever the job: each stream's are its own."""
        return key if self.prefix is None else f"{self.prefix}:{key}"

    @property
    def group(self) -> str:
        return "kinesis" if self.prefix is None else f"kinesis_{self.prefix}"

    def about(self, text: str) -> str:
        """`text` about this stream, named when there are several."""
        return text if self.stream is None else f"{stream_name(self.stream)}: {text}"

    def configured(self, consumer: ConsumerSettings) -> str:
        """The stream's name or ARN as configured (`consumer`: the deployment's, or its Dagster resource)."""
        return self.stream or consumer.stream

    def output_uri(self, base_uri: str) -> str:
        """Each stream of several has its own output location under the configured one."""
        return base_uri if self.stream is None else f"{base_uri.rstrip('/')}/{stream_name(self.stream)}"

    def read_slice(self, consumer: ConsumerSettings, aws: AwsSettings, leases: Iterable[Lease], *,
                   shards: bool = True) -> StreamSlice:
        return read_slice(self.configured(consumer), self.multi, aws, leases, shards=shards)

    def directory(self, consumer: ConsumerSettings, aws: AwsSettings) -> str:
        """Where the stream's current incarnation lands."""
        scope = current_scope(self.configured(consumer), self.multi, aws)
        return landing_directory(scope.stream, scope.identifier)


def pipeline_streams(streams: Sequence[str]) -> list[PipelineStream]:
    """One PipelineStream per configured stream (a single stream keeps the plain names)."""
    return [PipelineStream()] if len(streams) == 1 else [PipelineStream(stream) for stream in streams]
