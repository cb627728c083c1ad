"""The consumer a Dagster deployment hosts (or observes): what its `consumer` resource carries, in plain Python.

Each field is declared here once. The Dagster resource's configuration fields are made from these
(defs/kinesis/resources.py) and give them back as a ConsumerSettings (`settings()`); PipelineSettings (the
environment's settings, settings.py) is a ConsumerSettings with what is fixed when Definitions are built. The
lease manager's ConsumerConfig and the landing sink's ProcessorSpec are built from here, whoever hosts them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..kcl.aws_settings import AwsSettings
from ..kcl.config import ConsumerConfig, InitialPosition, consumer_default
from ..kcl.core.model import Checkpoint
from ..windows.backfill import BackfillPace
from ..zone.progress import A_SHARD_END as SHARD_END_LANDED

if TYPE_CHECKING:
    from ..kcl.shells.workers.worker import ProcessorSpec


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings:
    """Stream, application (= lease table), windows, zones, leases, and the bounds of the sensor's ticks.

    Defaults of the consumer's own settings are ConsumerConfig's (kcl/config.py)."""

    stream: str  # a name or an ARN
    # A multi-stream application's other streams (one lease table; one set of assets per stream).
    more_streams: tuple[str, ...] = ()
    application: str
    table_name: str | None = consumer_default("table_name")
    initial_position: str = InitialPosition().kind
    initial_timestamp: str | None = None
    window_minutes: int = 60
    landing_uri: str
    output_uri: str
    create_zones: bool = False
    worker_id: str | None = None
    heartbeat_seconds: float = consumer_default("heartbeat_seconds")
    lease_expiry_seconds: float = consumer_default("lease_expiry_seconds")
    max_leases: int = consumer_default("max_leases")
    leases_to_acquire: int = consumer_default("leases_to_acquire")
    # No lease-manager cycle succeeded for this long: the hosting sensor's tick fails, saying so (0: never).
    stall_seconds: float = consumer_default("stall_seconds")
    grace_seconds: float = 10.0  # clock grace of window completeness
    metrics_namespace: str | None = consumer_default("metrics_namespace")
    metrics_naming: str = consumer_default("metrics_naming")
    # polling or fanout: how the hosted lease workers read their shards.
    retrieval: str = consumer_default("retrieval")
    decoder: str = "json"  # the transform's payload decoder
    # auto: Spark's own Parquet reader for a directory zone, the Python data source for s3:// (no s3a in
    # PyPI's pyspark); native for s3:// needs hadoop-aws on the cluster.
    landing_reader: str = "auto"
    # True: the sensor runs this deployment's lease manager and its workers; False: an observer (reports
    # windows and requests runs; the fleet is `kcl-pipeline consume --checkpoint-by dagster` members elsewhere).
    host_workers: bool = True
    # Bounds of one sensor tick (a tick must return well inside Dagster's 60 s).
    max_windows_per_tick: int = 12
    tick_budget_seconds: float = 30.0
    # A reported window not materialised this long after its end is STALLED (sensor status, metric); a window
    # whose run failed for good is requested again up to max_window_requests times in all. The same 300 s as
    # the audit's default transform grace.
    overdue_seconds: float = 300.0
    max_window_requests: int = 3
    # A backfill's reads (landed_records in a run): shards at once, its share of each shard's 5 GetRecords/s,
    # and a deadline after which the run fails (what it landed stays; a retry goes on without duplicates).
    backfill_parallelism: int = BackfillPace.parallelism
    backfill_reads_per_second: float = BackfillPace.reads_per_second
    backfill_deadline_seconds: float = 3600.0

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream, *self.more_streams)

    @property
    def window_ms(self) -> int:
        return self.window_minutes * 60_000

    @property
    def grace_ms(self) -> int:
        return int(self.grace_seconds * 1000)

    @property
    def overdue_ms(self) -> int:
        return int(self.overdue_seconds * 1000)

    @property
    def lease_table(self) -> str:
        """The lease table: table_name, else the application's name (Java KCL's rule)."""
        return self.table_name or self.application

    def initial_checkpoint(self) -> Checkpoint:
        """Where a new lease starts (a child's, created when the checkpoint plan ends its parent)."""
        return InitialPosition.parse(self.initial_position, self.initial_timestamp).checkpoint()

    def backfill_pace(self) -> BackfillPace:
        return BackfillPace(parallelism=self.backfill_parallelism, reads_per_second=self.backfill_reads_per_second)

    def consumer_config(self, aws: AwsSettings, worker_id: str, cycle_seconds: float) -> ConsumerConfig:
        """The hosted lease manager's configuration."""
        return ConsumerConfig(
            stream=self.stream, application=self.application, table_name=self.table_name, worker_id=worker_id,
            initial_position=InitialPosition.parse(self.initial_position, self.initial_timestamp),
            leases_to_acquire=self.leases_to_acquire, max_leases=self.max_leases,
            heartbeat_seconds=self.heartbeat_seconds, lease_expiry_seconds=self.lease_expiry_seconds,
            cycle_seconds=cycle_seconds, metrics_namespace=self.metrics_namespace,
            metrics_naming=self.metrics_naming, retrieval=self.retrieval, aws=aws, stall_seconds=self.stall_seconds,
            # Children are read once the parent's last record has LANDED (the sink's heartbeat says so), not
            # once SHARD_END is committed after the transform: a failed or late window run must not stop
            # a resharded stream. SHARD_END itself still waits for materialisation.
            parent_drained_attribute=SHARD_END_LANDED, more_streams=self.more_streams)

    def stream_arn(self, aws: AwsSettings) -> str | None:
        """The one stream's ARN, recorded in every batch so that a chain of another stream of this name is refused
        (resolved once: DescribeStreamSummary for a name); None for a multi-stream application, whose directories
        are its incarnations'."""
        from ..kcl.shells.aws import client
        from ..kcl.shells.shards import resolve_stream_arn

        return None if self.more_streams else resolve_stream_arn(client("kinesis", aws), self.stream)

    def processor_spec(self, aws: AwsSettings, stream_arn: str | None = None) -> ProcessorSpec:
        """The landing sink in pipeline mode: it never checkpoints (kinesis_checkpoints does). `stream_arn`:
        `stream_arn(aws)`, resolved here when not given."""
        from ..zone.sink import landing_spec

        arn = stream_arn if stream_arn is not None else self.stream_arn(aws)
        return landing_spec(self.landing_uri, self.stream, aws=aws, standalone=False, stream_arn=arn,
                            create_zone=self.create_zones)

    def check_stream_chains(self, aws: AwsSettings, stream_arn: str | None) -> None:
        """Before the first worker starts: ForeignStreamError (one line, the one `kcl-pipeline consume` exits 2
        with) when a chain of the stream's directory is another stream's (sink.check_stream_chains). Reads only:
        a zone not created yet holds no chain to refuse."""
        from ..zone.errors import ZoneNotFoundError
        from ..zone.sink import check_stream_chains
        from ..zone.store import open_store

        if stream_arn is None:
            return
        try:
            check_stream_chains(open_store(self.landing_uri, aws), self.stream, stream_arn)
        except ZoneNotFoundError:
            return  # the sink creates it (create_zones) or fails naming it
