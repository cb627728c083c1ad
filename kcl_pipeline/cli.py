"""`kcl-pipeline …`: the consumer, the demo producer, the lease table, the local emulators, the landing zone."""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
from pathlib import Path

import click
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError, NoRegionError

from .kcl.aws_settings import AwsSettings
from .kcl.config import (
    JAVA_COMPATIBLE_TIMINGS,
    RETRIEVALS,
    WORKER_START_METHOD_ENV,
    WORKER_START_METHODS,
    ConfigError,
    ConsumerConfig,
    InitialPosition,
)
from .kcl.shells.aws import client

log = logging.getLogger("kcl_pipeline")


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def friendly_errors(fn):
    """Known failures become one clear line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .kcl.core.table.lease_codec import LeaseTableError
        from .kcl.shells.fleet.kcl3_tables import Kcl3FleetActive
        from .kcl.shells.fleet.manager import ManagerStalled
        from .kcl.shells.shards import KinesisError
        from .zone.errors import LandingError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, KinesisError, LeaseTableError, LandingError, Kcl3FleetActive, ManagerStalled,
                ValueError) as exc:
            raise UserError(str(exc)) from None
        except EndpointConnectionError as exc:
            raise UserError(f"cannot reach the AWS endpoint: {exc}") from None
        except NoCredentialsError:
            raise UserError("no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)") \
                from None
        except ClientError as exc:
            err = exc.response.get("Error", {})
            raise UserError(f"{exc.operation_name} failed: {err.get('Code')}: {err.get('Message')}") from None
        except NoRegionError:
            raise UserError("no AWS region: pass --region, set AWS_REGION or give the profile a region "
                            "(aws configure set region …)") from None
        except BotoCoreError as exc:
            raise UserError(str(exc)) from None

    return wrapper


def aws_options(fn):
    fn = click.option("--region", default=None,
                      help="AWS region [default: AWS_REGION, else botocore's chain: AWS_DEFAULT_REGION, the "
                           "profile's region].")(fn)
    fn = click.option("--endpoint-url", default=None,
                      help="One endpoint for every AWS service (default: AWS_ENDPOINT_URL[_<SERVICE>] or AWS).")(fn)
    return fn


def progress_option(fn):
    return click.option("--progress/--no-progress", default=None,
                        help="Show progress on stderr [default: when stderr is a terminal].")(fn)


class Progress:
    """Progress on stderr (stdout keeps the results and --json): click's bar on a terminal; when asked for
    elsewhere (`--progress` into a log), one line per tenth. `update(done, total)` takes absolute counts."""

    def __init__(self, label: str, enabled: bool | None):
        self.label = label
        self.terminal = sys.stderr.isatty()
        self.enabled = self.terminal if enabled is None else enabled
        self._bar = None
        self._done = 0
        self._tenth = -1

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.terminal:
            if self._bar is None:
                self._bar = click.progressbar(length=max(total, 1), label=self.label, file=sys.stderr,
                                              show_pos=True)
                self._bar.__enter__()
            self._bar.length = max(total, 1)
            self._bar.update(done - self._done)
        else:
            tenth = 10 * done // total if total else 10
            if tenth > self._tenth:
                click.echo(f"{self.label}: {done}/{total} ({100 * done // total if total else 100}%)", err=True)
                self._tenth = tenth
        self._done = done

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _settings(region, endpoint_url) -> AwsSettings:
    return AwsSettings(region=region, endpoint_url=endpoint_url)


def parse_sink(spec: str):
    """`jsonl:DIR` -> the ProcessorSpec of kcl/jsonl_sink.py's JsonlSink writing into DIR."""
    from .kcl.shells.workers.worker import ProcessorSpec

    kind, sep, arg = spec.partition(":")
    if kind != "jsonl" or not sep or not arg:
        raise ValueError(f"--sink {spec!r}: expected jsonl:DIR")
    return ProcessorSpec("kcl_pipeline.kcl.jsonl_sink:JsonlSink", {"directory": str(Path(arg).resolve())})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kcl_pipeline")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"


def _require_extras(command: str, modules: dict[str, str]) -> None:
    """Fail in one line, before any work, when an optional dependency group is not installed."""
    import importlib.util

    missing = sorted({extra for module, extra in modules.items() if importlib.util.find_spec(module) is None})
    if missing:
        raise UserError(f"`kcl-pipeline {command}` needs the {', '.join(missing)} extra: "
                        f"pip install 'kcl_pipeline[{','.join(missing)}]'")


def _preflight(node: bool, java: bool) -> None:
    """node/npm and Java 17 are checked before any emulator or Dagster starts (exit 2 with what is missing);
    the npm emulators are installed into the user cache on first use."""
    from .local.prerequisites import Needs, PrerequisiteMissing, ensure_ready

    try:
        ensure_ready(Needs(node=node, java=java))
    except PrerequisiteMissing as exc:
        raise UserError(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="kcl-pipeline")
@click.option("-v", "--verbose", count=True, help="More logging (-v: debug).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON object per log line on stderr (for log shippers).")
def main(verbose: int, log_format: str) -> None:
    """kcl_pipeline: a leaderless, Java-KCL-v2-compatible Kinesis consumer and its Dagster pipeline."""
    from .log_format import configure

    configure(logging.DEBUG if verbose else logging.INFO, log_format)
    for noisy in ("botocore", "urllib3", "boto3", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# consume's flags that are ConsumerConfig fields of the same name.
_CONSUMER_FLAGS = ("stream", "application", "table_name", "coordinator_state_table_name",
                   "worker_metrics_table_name", "worker_id", "max_leases", "leases_to_acquire",
                   "heartbeat_seconds", "lease_expiry_seconds", "cycle_seconds", "worker_metrics_period_seconds",
                   "metrics_namespace", "metrics_naming", "retrieval", "worker_start_method", "stall_seconds",
                   "health_file")


def consumer_config_from_cli(ctx: click.Context, properties_file: str | None, java_compatible: bool, *,
                             region: str | None, endpoint_url: str | None) -> ConsumerConfig:
    """ConsumerConfig from, in rising precedence: its own defaults, --java-compatible, a properties file,
    flags given on the command line. Flags left at their default do not override the file."""
    from click.core import ParameterSource

    given = {name for name in (*_CONSUMER_FLAGS, "initial_position", "timestamp", "region")
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}
    params = ctx.params
    kwargs: dict = dict(JAVA_COMPATIBLE_TIMINGS) if java_compatible else {}
    if properties_file:
        from .kcl.properties import read_properties_file

        imported = read_properties_file(properties_file)
        if imported.ignored:
            click.echo(f"note: {properties_file}: {', '.join(imported.ignored)} only configure kclpy's "
                       f"MultiLangDaemon; ignored", err=True)
        kwargs.update(imported.settings)
    for name in _CONSUMER_FLAGS:
        if name in given and params[name] is not None:
            kwargs[name] = params[name]
    if isinstance(kwargs.get("stream"), tuple):  # --stream given once or more: a multi-stream application
        kwargs["stream"], *more = kwargs["stream"]
        kwargs["more_streams"] = tuple(more)
    if "initial_position" in given or "timestamp" in given or "initial_position" not in kwargs:
        kwargs["initial_position"] = InitialPosition.parse(params["initial_position"], params["timestamp"])
    for required in ("stream", "application"):
        if not kwargs.get(required):
            raise UserError(f"--{required} is required (or a --properties file that sets "
                            f"{'streamName' if required == 'stream' else 'applicationName'})")
    file_region = kwargs.pop("region", None)
    kwargs["aws"] = AwsSettings(region=region or file_region, endpoint_url=endpoint_url)
    return ConsumerConfig(**kwargs)


def _default(name: str):
    from .kcl.config import consumer_default

    return consumer_default(name)


@main.command()
@click.option("--properties", "properties_file", default=None, type=click.Path(dir_okay=False),
              help="A Java KCL / kclpy .properties file; flags given as well override its values.")
@click.option("--stream", multiple=True,
              help="Kinesis stream name or ARN (streamName / streamArn; with --landing an ARN lands in "
                   "<name>@<region>@<account>, a name in <name>). Repeat it for a multi-stream application: "
                   "one lease table, KCL's multi-stream lease keys (account:stream:creationEpoch:shardId).")
@click.option("--application", default=None, help="Application name, shared by the fleet (applicationName).")
@click.option("--table-name", default=None,
              help="Lease table (tableName) [default: the application name].")
@click.option("--coordinator-state-table-name", default=None,
              help="A KCL 3.x application's own name for its coordinator-state table (coordinatorStateTableName) "
                   "[default: <application>-CoordinatorState].")
@click.option("--worker-metrics-table-name", default=None,
              help="A KCL 3.x application's own name for its worker-metrics table (workerMetricsTableName) "
                   "[default: <application>-WorkerMetricStats].")
@click.option("--initial-position", type=click.Choice(["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"],
              case_sensitive=False), default=InitialPosition().kind, show_default=True,
              help="Where leases of shards with no history start (initialPositionInStream).")
@click.option("--timestamp", default=None, help="ISO 8601 timestamp for AT_TIMESTAMP.")
@click.option("--worker-id", default=None, help="This consumer's unique id (workerIdentifier) [default: a new UUID].")
@click.option("--max-leases", type=int, default=_default("max_leases"), show_default=True,
              help="maxLeasesForWorker.")
@click.option("--leases-to-acquire", type=int, default=_default("leases_to_acquire"), show_default=True,
              help="Leases taken per cycle (maxLeasesToStealAtOneTime).")
@click.option("--heartbeat-seconds", type=float, default=_default("heartbeat_seconds"), show_default=True,
              help="Lease heartbeat period.")
@click.option("--lease-expiry-seconds", type=float, default=_default("lease_expiry_seconds"), show_default=True,
              help="A lease unchanged this long is free for others (failoverTimeMillis / 1000).")
@click.option("--java-compatible", is_flag=True,
              help="Heartbeat {heartbeat_seconds:g} s / expiry {lease_expiry_seconds:g} s: required when Java KCL "
                   "consumers share the lease table.".format(**JAVA_COMPATIBLE_TIMINGS))
@click.option("--cycle-seconds", type=float, default=_default("cycle_seconds"), show_default=True,
              help="Lease-manager cycle, which also lists shards (shardSyncIntervalMillis / 1000).")
@click.option("--worker-metrics-period-seconds", type=float, default=_default("worker_metrics_period_seconds"),
              show_default=True, help="How often this consumer writes its KCL 3.x worker metrics item and reads the "
                                      "fleet's (idle consumers, graceful hand-offs); 0: never.")
@click.option("--metrics-namespace", default=None, help="Publish metrics to this CloudWatch namespace.")
@click.option("--metrics-naming", type=click.Choice(["pipeline", "kcl"]), default=_default("metrics_naming"),
              show_default=True, help="kcl: Java KCL's metric names and dimensions (its dashboards carry over).")
@click.option("--retrieval", type=click.Choice(RETRIEVALS), default=_default("retrieval"), show_default=True,
              envvar="KCL_PIPELINE_RETRIEVAL", show_envvar=True,
              help="polling: GetRecords (the shard's 5 reads/s and 2 MB/s shared with every application); fanout: "
                   "enhanced fan-out, SubscribeToShard through a stream consumer named after the application, "
                   "registered if missing (2 MB/s per shard of its own; billed by AWS; docs/fanout.md).")
@click.option("--worker-start-method", type=click.Choice(WORKER_START_METHODS, case_sensitive=False), default=None,
              envvar=WORKER_START_METHOD_ENV, show_envvar=True,
              help="How lease workers start: forkserver (forked from a server that preloaded the worker, landing, "
                   "boto3 and pyarrow: about half the memory per lease) or spawn (a fresh interpreter each) "
                   "[default: forkserver; docs/memory.md].")
@click.option("--stall-seconds", type=float, default=_default("stall_seconds"), show_default=True,
              help="Give up (exit 2, one line saying why) once no lease-manager cycle has succeeded for this long: "
                   "the lease table gone, credentials refused, endpoints unreachable; 0: never.")
@click.option("--health-file", default=None, type=click.Path(dir_okay=False),
              help="Touch this file after every successful lease-manager cycle, for a liveness probe that checks "
                   "its age (docs/deployment.md) [default: none].")
@click.option("--sink", default=None,
              help="jsonl:DIR — one JSON line per record in DIR/<lease key>.jsonl (the shard id of a single stream).")
@click.option("--landing", default=None,
              help="Land records as Parquet in s3://bucket/prefix or a directory (exactly once; checkpoints after "
                   "each landed batch when run without Dagster).")
@click.option("--checkpoint-by", type=click.Choice(["self", "dagster"]), default="self", show_default=True,
              help="With --landing: `self` checkpoints after each landed batch; `dagster` makes this a fleet member "
                   "of the Dagster pipeline (it lands only; the pipeline commits checkpoints once windows are "
                   "transformed).")
@click.option("--batch-seconds", type=float, default=None,
              help="With --landing: flush a batch once its oldest record waited this long [default: 30].")
@click.option("--batch-mb", type=float, default=None, help="With --landing: flush a batch at this size [default: 8].")
@aws_options
@click.pass_context
@friendly_errors
def consume(ctx, properties_file, stream, application, table_name, coordinator_state_table_name,
            worker_metrics_table_name, initial_position, timestamp, worker_id,
            max_leases, leases_to_acquire, heartbeat_seconds, lease_expiry_seconds, java_compatible, cycle_seconds,
            worker_metrics_period_seconds, metrics_namespace, metrics_naming, retrieval, worker_start_method,
            stall_seconds, health_file, sink, landing, checkpoint_by, batch_seconds, batch_mb, region, endpoint_url):
    """Run a headless consumer: a full peer of the fleet sharing the lease table. Stops on SIGTERM/SIGINT."""
    from .kcl.shells.fleet.consumer import run_consumer

    if bool(sink) == bool(landing):
        raise UserError("give exactly one of --sink jsonl:DIR or --landing URI")
    if sink and (batch_seconds is not None or batch_mb is not None or checkpoint_by != "self"):
        raise UserError("--batch-seconds, --batch-mb and --checkpoint-by only apply to --landing")
    from .deployment.settings import check_variable_names

    # Every check runs before anything is written: the directory of a local zone is created only after them.
    check_variable_names(os.environ)  # --retrieval and --worker-start-method are read from KCL_PIPELINE_* too
    config = consumer_config_from_cli(ctx, properties_file, java_compatible, region=region,
                                      endpoint_url=endpoint_url)
    if config.health_file and not os.path.isdir(os.path.dirname(os.path.abspath(config.health_file))):
        raise UserError(f"--health-file {config.health_file}: its directory does not exist")
    if sink:
        spec = parse_sink(sink)
    else:
        from .zone.layout import Zone
        from .zone.sink import check_stream_chains, landing_spec
        from .zone.store import open_store

        local_zone = Zone.parse(landing).scheme == "file"
        settings = {}
        for flag, value in (("--batch-seconds", batch_seconds), ("--batch-mb", batch_mb)):
            if value is not None and not math.isfinite(value):
                raise UserError(f"{flag} must be a finite number, got {value!r}")
        if batch_seconds is not None:
            settings["max_batch_age_seconds"] = batch_seconds
        if batch_mb is not None:
            settings["max_batch_bytes"] = int(batch_mb * 1024 * 1024)
        from .kcl.shells.aws import client
        from .kcl.shells.shards import resolve_stream_arn

        # One stream: its ARN goes into every batch, so a chain of another stream of this name is refused (a
        # multi-stream application's directories are its incarnations').
        arn = None if config.more_streams else resolve_stream_arn(client("kinesis", config.aws), config.stream)
        spec = landing_spec(landing, config.stream, aws=config.aws, standalone=checkpoint_by == "self",
                            stream_arn=arn, **settings)
        # Fail fast (exit 2) on a missing bucket; a local directory is created.
        store = open_store(landing, config.aws)
        store.ensure_zone(create=local_zone)
        if arn is not None:  # and on a directory whose chains are another stream's of the name (exit 2)
            check_stream_chains(store, config.stream, arn)
    sys.exit(run_consumer(config, spec))


@main.command()
@click.option("--stream", required=True)
@click.option("--count", type=int, default=1000, show_default=True, help="User records to produce.")
@click.option("--rate", type=float, default=None, help="User records per second (default: as fast as possible).")
@click.option("--aggregate", type=int, default=1, show_default=True,
              help="At most this many user records per KPL aggregate (1 = plain records); as the KPL does, an "
                   "aggregate holds only records whose partition keys hash to the shard it is put to.")
@click.option("--create-shards", type=int, default=None, help="Create the stream with N shards if it is missing.")
@click.option("--poison-every", type=int, default=None, help="Make every k-th payload invalid JSON.")
@aws_options
@progress_option
@friendly_errors
def produce(stream, count, rate, aggregate, create_shards, poison_every, region, endpoint_url, progress):
    """The demo producer: JSON payloads, plain or KPL-aggregated."""
    from .local.producer import produce as run_produce

    if count < 0 or aggregate < 1:
        raise UserError("--count must be >= 0 and --aggregate >= 1")
    kinesis = client("kinesis", _settings(region, endpoint_url))
    with Progress(f"producing to {stream}", progress) as bar:
        report = run_produce(kinesis, stream, count=count, rate=rate, aggregate=aggregate, payload=None,
                             poison_every=poison_every, create_shards=create_shards,
                             on_progress=lambda n: bar.update(n, count))
    click.echo(json.dumps({k: v for k, v in vars(report).items() if k != "ids"}, default=str))


@main.command()
@click.option("--application", required=True, help="Application name (the lease table unless --table-name).")
@click.option("--table-name", default=None, help="The lease table (Java's tableName) [default: the application].")
@click.option("--coordinator-state-table-name", default=None,
              help="A KCL 3.x application's coordinator-state table [default: <application>-CoordinatorState].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per lease, for scripts.")
@aws_options
@friendly_errors
def leases(application, table_name, coordinator_state_table_name, as_json, region, endpoint_url):
    """Show the lease table: owner, counter, checkpoint, parents, landing progress. Then, on stderr, this host's
    lease workers' memory (PSS in all and the largest; stdout keeps the table or the JSON lines)."""
    from .kcl.shells.fleet.kcl3_tables import fleet_status
    from .kcl.shells.lease_table import LeaseTable
    from .kcl.shells.workers.memory import host_report

    table = LeaseTable(table_name or application, client("dynamodb", _settings(region, endpoint_url)))
    scanned = table.scan()
    rows = sorted(scanned, key=lambda lease: lease.lease_key)
    if as_json:
        for lease in rows:
            click.echo(json.dumps({
                "leaseKey": lease.lease_key, "leaseOwner": lease.lease_owner, "leaseCounter": lease.lease_counter,
                "checkpoint": lease.checkpoint.sequence_number,
                "checkpointSubSequenceNumber": lease.checkpoint.sub_sequence_number,
                "ownerSwitchesSinceCheckpoint": lease.owner_switches_since_checkpoint,
                "parentShardIds": list(lease.parent_shard_ids), "childShardIds": list(lease.child_shard_ids),
                "extra": lease.extra}, default=str))
    elif not rows:
        click.echo(f"lease table {table_name or application} is empty")
    else:
        width = max(24, *(len(lease.lease_key) for lease in rows))  # multi-stream keys run to ~60 characters
        header = f"{'lease':<{width}} {'owner':<40} {'counter':>7}  checkpoint"
        click.echo(header)
        for lease in rows:
            cp = lease.checkpoint
            cps = cp.sequence_number if cp.is_sentinel and cp.sequence_number != "AT_TIMESTAMP" else str(cp)
            click.echo(f"{lease.lease_key:<{width}} {lease.lease_owner or '-':<40} {lease.lease_counter:>7}  {cps}")
    # The KCL 3.x fleet's mode and leader (its migration state, where its version keeps it), on stderr: stdout
    # keeps the table or the JSON lines.
    fleet = fleet_status(table.client, application, table.table_name, scanned, coordinator_state_table_name)
    click.echo(f"kcl3: {fleet.summary()}", err=True)
    click.echo(host_report(), err=True)


@main.command("forget-incarnation")
@click.argument("incarnation")
@click.option("--application", required=True, help="Application name (the lease table unless --table-name).")
@click.option("--table-name", default=None, help="The lease table (Java's tableName) [default: the application].")
@aws_options
@friendly_errors
def forget_incarnation(incarnation, application, table_name, region, endpoint_url):
    """Delete the leases of a deleted stream's earlier INCARNATION (`account:StreamName:creationEpoch`, as the
    sensor and the lease keys name it) from a multi-stream application's lease table.

    A re-created stream starts afresh under its new creation time; its old leases stay, unowned, until
    removed. The stream's current incarnation is refused (exit 2). Each delete is conditional on the counter
    just read, so a lease something still renews is left (exit 1)."""
    from .kcl.core.streams import identifier_parts, parse_multi_stream_key
    from .kcl.shells.lease_table import LeaseTable
    from .kcl.shells.shards import StreamNotFound, stream_scope

    try:
        account, name, _epoch = identifier_parts(incarnation)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    aws = _settings(region, endpoint_url)
    kinesis = client("kinesis", aws)
    try:  # by ARN: the incarnation names its account (a cross-account stream is described where it lives)
        current = stream_scope(kinesis, f"arn:aws:kinesis:{kinesis.meta.region_name}:{account}:stream/{name}"
                               ).identifier
    except StreamNotFound:
        current = None
    if current == incarnation:
        raise UserError(f"{incarnation} is the current incarnation of stream {name}: its leases are live")
    table = LeaseTable(table_name or application, client("dynamodb", aws))
    mine = [lease for lease in table.scan()
            if (parse_multi_stream_key(lease.lease_key) or (None,))[0] == incarnation]
    if not mine:
        click.echo(f"no lease of {incarnation} in {table.table_name}")
        return
    kept = []
    for lease in sorted(mine, key=lambda lease: lease.lease_key):
        if table.delete(lease.lease_key, lease.lease_counter):
            click.echo(f"deleted {lease.lease_key} (checkpoint {lease.checkpoint})")
        else:
            kept.append(lease.lease_key)
            click.echo(f"kept {lease.lease_key}: it changed since it was read (something still renews it)")
    click.echo(f"{len(mine) - len(kept)} of {len(mine)} leases of {incarnation} deleted")
    sys.exit(1 if kept else 0)


@main.command()
@click.option("--port", type=int, default=3000, show_default=True, help="Dagster UI port on 127.0.0.1.")
@click.option("--stream", default="kcl-pipeline-demo", show_default=True)
@click.option("--shards", type=int, default=4, show_default=True)
@click.option("--rate", type=float, default=40.0, show_default=True, help="Demo records per second.")
@click.option("--window-minutes", type=int, default=2, show_default=True, help="Partition (window) length.")
@click.option("--no-producer", is_flag=True, help="Do not run the demo producer (produce yourself).")
@click.option("--state-dir", default=".kcl_local", show_default=True,
              help="Logs, env.sh, and what a restart starts again from: DAGSTER_HOME, the emulators' state, the zones.")
@click.option("--dagster-storage", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True,
              help="postgres: Dagster's storage in the PostgreSQL at DAGSTER_POSTGRES_URL.")
@click.option("--code-servers", type=click.IntRange(1, 2), default=1, show_default=True,
              help="2: a fleet-member code location beside the pipeline's, each in its own code server, sharing "
                   "the fleet (the two-host shape).")
@click.option("--cold-spark", is_flag=True, help="No Spark Connect server: every window run starts its own "
                                                   "Spark session (by default runs attach to a warm one).")
@friendly_errors
def demo(port, stream, shards, rate, window_minutes, no_producer, state_dir, dagster_storage, code_servers,
         cold_spark):
    """Emulators + demo stream + KPL producer + `dagster dev` with the consumer sensor on. Ctrl-C stops all."""
    from .local.demo import DemoOptions, run_demo

    if shards < 1 or rate <= 0:
        raise UserError("--shards must be >= 1 and --rate > 0")
    _require_extras("demo", {"dagster": "dagster", "dagster_webserver": "dagster", "pyspark": "dagster",
                             "moto": "local", "flask_cors": "local"})
    if dagster_storage == "postgres":
        _check_postgres_storage("demo")
    _preflight(node=True, java=True)
    sys.exit(run_demo(DemoOptions(state_dir=Path(state_dir), port=port, stream=stream, shards=shards, rate=rate,
                                  window_minutes=window_minutes, producer=not no_producer,
                                  dagster_storage=dagster_storage, code_servers=code_servers,
                                  warm_spark=not cold_spark)))


def _check_postgres_storage(command: str) -> None:
    import os

    from .deployment.home import POSTGRES_URL_ENV

    _require_extras(command, {"dagster_postgres": "postgres"})
    if not os.environ.get(POSTGRES_URL_ENV):
        raise UserError(f"PostgreSQL storage reads {POSTGRES_URL_ENV} "
                        f"(postgresql+psycopg2://user:password@host:5432/dagster); it is not set")


@main.command("dagster-home")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--storage", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True,
              help="sqlite: one host, under DIRECTORY; postgres: shared by every host (DAGSTER_POSTGRES_URL).")
@friendly_errors
def dagster_home(directory, storage):
    """Write the project's Dagster instance (dagster.yaml) into DIRECTORY, to use as DAGSTER_HOME."""
    from .deployment.home import POSTGRES_URL_ENV, prepare_dagster_home

    home = prepare_dagster_home(directory, storage=storage)
    click.echo(f"export DAGSTER_HOME={home}")
    if storage == "postgres":
        click.echo(f"# and {POSTGRES_URL_ENV}=postgresql+psycopg2://user:password@host:5432/dagster "
                   f"in every Dagster process's environment")


def _echo_report_json(report, **extra) -> None:
    """A report as one JSON object (dataclasses, checkpoints as their fields), for scripts."""
    import dataclasses

    body = {"ok": report.ok, **extra, **dataclasses.asdict(report)}
    click.echo(json.dumps(body, default=str, sort_keys=True))


def _pipeline_settings():
    """The Dagster deployment's settings (KCL_PIPELINE_* variables): defaults for audit and backfill."""
    from .deployment.settings import PipelineSettings

    return PipelineSettings.from_env(for_partitions=False)


@main.command()
@click.option("--window", default=None,
              help="START, START/END or START/PT15M (ISO 8601 UTC); default: the whole history, incrementally "
                   "(an index in the output zone keeps what earlier audits read).")
@click.option("--full", is_flag=True, help="Without --window: read every object again, ignoring the index.")
@click.option("--sweep-temporaries", is_flag=True,
              help="First remove what killed writers left in the landing zone and the output (temporary files, "
                   "incomplete multipart uploads) older than 6 hours.")
@click.option("--landing", "zone", default=None, help="Landing zone URI [default: KCL_PIPELINE_LANDING_URI].")
@click.option("--output", default=None, help="Transform output URI [default: KCL_PIPELINE_OUTPUT_URI].")
@click.option("--stream", default=None, help="[default: KCL_PIPELINE_STREAM]")
@click.option("--stream-arn", default=None,
              help="The stream every batch must be of, for a stream landing under its bare name (a stream given "
                   "by its ARN is expected already); batches of another stream, or a directory naming two, fail.")
@click.option("--application", default=None, help="Lease table for the checkpoint check [default: the pipeline's].")
@click.option("--window-minutes", type=int, default=None, help="[default: KCL_PIPELINE_WINDOW_MINUTES]")
@click.option("--transform-grace", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="Seconds after a window's end by which it must be transformed; a window landed and still "
                   "untransformed after that fails the audit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (every check's outcome), for scripts.")
@aws_options
@friendly_errors
def audit(window, full, sweep_temporaries, zone, output, stream, stream_arn, application, window_minutes,
          transform_grace, as_json, region, endpoint_url):
    """The lineage audit: chain per shard, landed = transformed + duplicates + quarantined, checkpoints ≤
    materialised, every batch of its directory's stream (as `landing verify`); over the whole history unless
    --window. Exit 1 when a check fails."""
    import os

    from .audit.stream import audit as run_audit
    from .audit.verify import parse_window

    settings = _pipeline_settings()
    window_ms = (window_minutes or settings.window_minutes) * 60_000
    aws = _settings(region, endpoint_url)
    # Records before the first partition are never transformed by a window run (the checkpoint plan steps over
    # them): only a deployment that set its partitions' start says where that is.
    start = settings.partitions_start if os.environ.get("KCL_PIPELINE_PARTITIONS_START") else None
    options = dict(window=parse_window(window) if window else None, aws=aws, full=full,
                   transform_grace_ms=int(transform_grace * 1000),
                   first_window_ms=int(start.timestamp() * 1000) if start is not None else None)
    if sweep_temporaries:
        from .zone.errors import ZoneNotFoundError
        from .zone.store import open_store

        for uri in (zone or settings.landing_uri, output or settings.output_uri):
            try:
                swept = open_store(uri, aws).sweep_temporaries()
            except ZoneNotFoundError as exc:
                click.echo(f"{uri}: nothing to sweep ({exc})", err=True)  # an output nothing was written to yet
                continue
            click.echo(f"{uri}: swept {len(swept)} leftovers of killed writers" + "".join(f"\n  {k}" for k in swept),
                       err=True)
    if len(settings.streams) == 1:
        report = run_audit(zone or settings.landing_uri, output or settings.output_uri, stream or settings.stream,
                           window_ms, application=application or settings.application, stream_arn=stream_arn,
                           **options)
    elif stream_arn is not None:
        raise UserError("--stream-arn names one stream's ARN: a multi-stream deployment's directories are its "
                        "incarnations' (<name>@<creationEpoch>), which record no ARN")
    else:
        report = _audit_streams([stream] if stream else settings.streams, zone or settings.landing_uri,
                                output or settings.output_uri, application or settings.application, window_ms,
                                run_audit, **options)
    if as_json:
        _echo_report_json(report)
    else:
        for line in report.lines():
            click.echo(line)
    sys.exit(0 if report.ok else 1)


def _audit_streams(streams, zone: str, output: str, application: str, window_ms: int, run_audit, *, aws, **options):
    """A multi-stream deployment's audit: each stream's current incarnation, in its landing directory and its
    own output location (`<output>/<stream name>`), its checkpoints against its own leases."""
    import dataclasses

    from .audit.lineage import AuditReport
    from .deployment.streams import PipelineStream
    from .kcl.core.streams import stream_name
    from .kcl.core.table.lease_codec import LeaseTableMissing
    from .kcl.shells.aws import client
    from .kcl.shells.lease_table import LeaseTable
    from .zone.stream_slice import read_slice

    try:
        leases = LeaseTable(application, client("dynamodb", aws)).scan()
    except LeaseTableMissing:
        leases = None  # the checkpoints check is skipped, as for a single stream without a table
    report = AuditReport()
    for stream in streams:
        view = read_slice(stream, True, aws, leases or [], shards=False)
        name = stream_name(stream)
        part = run_audit(zone, PipelineStream(stream).output_uri(output), view.directory, window_ms, aws=aws,
                         leases=None if leases is None else view.leases_by_shard_id(), **options)
        report.outcomes += [dataclasses.replace(o, stream=name) for o in part.outcomes]
        report.scopes += [dataclasses.replace(s, stream=name) for s in part.scopes]
    return report


@main.command()
@click.option("--window", required=True, help="START, START/END or START/PT15M (ISO 8601 UTC): whole windows.")
@click.option("--url", default="http://127.0.0.1:3000", show_default=True, help="The Dagster webserver.")
@click.option("--window-minutes", type=int, default=None, help="[default: KCL_PIPELINE_WINDOW_MINUTES]")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the backfill finishes.")
@click.option("--timeout", type=float, default=3600, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (id, windows, status), for scripts.")
@progress_option
@friendly_errors
def backfill(window, url, window_minutes, wait, timeout, as_json, progress):
    """Re-land and re-transform a time range (bounded AT_TIMESTAMP re-reads, isolated from the live leases)."""
    from .audit.verify import parse_window
    from .local.dagster_client import DagsterApiError, launch_backfill, wait_backfill, window_keys

    window_ms = (window_minutes or _pipeline_settings().window_minutes) * 60_000
    keys = window_keys(*parse_window(window), window_ms)
    try:
        backfill_id = launch_backfill(url, keys)
        if not as_json:
            click.echo(f"backfill {backfill_id}: {len(keys)} window(s) {keys[0]} … {keys[-1]}")
        if not wait:
            if as_json:
                click.echo(json.dumps({"backfill_id": backfill_id, "windows": keys, "status": "LAUNCHED"}))
            return
        with Progress(f"backfill {backfill_id}: windows transformed", progress) as bar:
            status = wait_backfill(url, backfill_id, timeout,
                                   on_progress=lambda p: bar.update(p.done + p.failed, p.total or len(keys)))
    except DagsterApiError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"backfill_id": backfill_id, "windows": keys, "status": status}))
    else:
        click.echo(f"backfill {backfill_id}: {status}")
    sys.exit(0 if status in ("COMPLETED", "COMPLETED_SUCCESS") else 1)


@main.group()
def landing() -> None:
    """The landing zone: verify the chain of landed batches; migrate a bare-name directory to its stream's
    identity."""


@landing.command("verify")
@click.option("--landing", "zone", required=True, help="s3://bucket/prefix or a local directory.")
@click.option("--window", default=None,
              help="START (one hour), START/END or START/PT15M, ISO 8601 UTC (default: everything).")
@click.option("--stream", default=None,
              help="Only this stream's directory: a name, an ARN (its directory <name>@<region>@<account>, and "
                   "every batch must be of that stream), or a multi-stream application's <name>@<creationEpoch> "
                   "[default: every stream in the zone].")
@click.option("--stream-arn", default=None,
              help="Every batch verified must be of this stream (its footer's ARN): for a stream landing under "
                   "its bare name.")
@click.option("--shard", default=None, help="Only this shard.")
@click.option("--deep", is_flag=True, help="Read every batch's rows, not only footers and keys.")
@click.option("--application", default=None,
              help="Cross-check the consumer's lease table (starting positions, landing progress, checkpoints).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (per stream and shard), for scripts.")
@click.option("--sweep-temporaries", is_flag=True,
              help="First remove what killed writers left in the zone (temporary files, incomplete multipart "
                   "uploads) older than 6 hours.")
@aws_options
@progress_option
@friendly_errors
def landing_verify(zone, window, stream, stream_arn, shard, deep, application, as_json, sweep_temporaries, region,
                   endpoint_url, progress):
    """Per-shard chain status, row counts, gaps and overlaps. Exit 1 on a gap, an overlap, a batch of another
    stream than its directory's (or --stream-arn), or (with --application) a chain that does not start at a
    starting position or falls short of the lease table."""
    from .audit.verify import verify_zone
    from .zone.store import open_store

    aws = _settings(region, endpoint_url)
    if sweep_temporaries:
        swept = open_store(zone, aws).sweep_temporaries()
        click.echo(f"swept {len(swept)} leftovers of killed writers" + "".join(f"\n  {k}" for k in swept), err=True)
    leases = None
    if application:
        from .kcl.shells.aws import client
        from .kcl.shells.lease_table import LeaseTable

        leases = LeaseTable(application, client("dynamodb", aws)).scan()
    with Progress("batches verified", progress) as bar:
        report = verify_zone(zone, window, stream=stream, shard=shard, aws=aws, deep=deep, leases=leases,
                             on_progress=bar.update, stream_arn=stream_arn)
    if as_json:
        _echo_report_json(report, rows=report.rows)
        sys.exit(0 if report.ok else 1)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)


MIGRATE_WATCH_SECONDS = _default("lease_expiry_seconds") + 5.0  # a live holder renews within an expiry


@landing.command("migrate")
@click.option("--landing", "zone", required=True, help="s3://bucket/prefix or a local directory.")
@click.option("--stream", required=True, help="The stream's name: its directory <name>/ is moved.")
@click.option("--stream-arn", required=True,
              help="The stream's ARN: the directory moves into <name>@<region>@<account>/, where a consumer "
                   "configured by this ARN lands.")
@click.option("--application", required=True, help="The consumer application (its lease table is watched).")
@click.option("--table-name", default=None, help="The lease table [default: the application's name].")
@click.option("--output", default=None,
              help="The transform's output location: its window commits and checkpoint record name the batches.")
@click.option("--no-output", is_flag=True, help="The stream has no transform output (landing only).")
@click.option("--watch-seconds", type=click.FloatRange(min=0), default=MIGRATE_WATCH_SECONDS, show_default=True,
              help="How long the lease table is watched: a lease whose counter moves meanwhile is a live consumer, "
                   "and the migration is refused.")
@click.option("--dry-run", is_flag=True, help="Check everything and print what would be done; write nothing.")
@aws_options
@friendly_errors
def landing_migrate(zone, stream, stream_arn, application, table_name, output, no_output, watch_seconds, dry_run,
                    region, endpoint_url):
    """Move a zone's <name>/ directory (landed before stream identity, or by a consumer configured by the stream's
    name) into <name>@<region>@<account>/ for --stream-arn, so that a consumer configured by that ARN resumes
    where the old one stopped: nothing lost, nothing landed twice.

    Rewrites every batch (key, footer, the rows' stream column), link (key and the batch its body names), the
    window commits and the checkpoint record in --output; refuses (exit 2) while a consumer of --application
    holds a live lease, or when a batch is of another stream. Copy, then delete; stopped anywhere, run it again
    to finish. Rows already in the transform's output keep the old stream value (docs/landing.md)."""
    from .audit.migrate import check_no_live_consumer, migrate_zone
    from .kcl.core.table.lease_codec import LeaseTableMissing
    from .kcl.shells.aws import client
    from .kcl.shells.lease_table import LeaseTable
    from .zone.migration import Migration
    from .zone.store import open_store

    if bool(output) == no_output:
        raise UserError("give exactly one of --output URI or --no-output")
    migration = Migration.of(stream, stream_arn)
    aws = _settings(region, endpoint_url)
    store = open_store(zone, aws)
    out = None if no_output else open_store(output, aws, what="transform output")
    table = LeaseTable(table_name or application, client("dynamodb", aws))
    try:
        watched = check_no_live_consumer(table.scan, watch_seconds)
    except LeaseTableMissing:
        raise UserError(f"lease table {table_name or application} does not exist: give the application whose "
                        f"consumer landed {migration.source}/ (--application, --table-name)") from None
    report = migrate_zone(store, out, migration, dry_run=dry_run)
    report.leases_watched = watched
    for line in report.lines():
        click.echo(line)


@main.group()
def local() -> None:
    """The demo's AWS emulators on loopback (kinesis-local, dynalite, moto), its stream and producer, for your own
    `dagster dev` at the repository root."""


@local.command("up")
@click.option("--state-dir", default=".kcl_local", show_default=True,
              help="Logs, the environment file (env.sh, for `source`), the pid file used by `local down`, and "
                   "what a restart starts again from: DAGSTER_HOME, the emulators' state, the zones.")
@click.option("--stream", default="kcl-pipeline-demo", show_default=True)
@click.option("--shards", type=int, default=4, show_default=True)
@click.option("--rate", type=float, default=40.0, show_default=True, help="Demo records per second.")
@click.option("--window-minutes", type=int, default=2, show_default=True, help="Partition (window) length.")
@click.option("--no-producer", is_flag=True, help="Do not run the demo producer (produce yourself).")
@click.option("--cold-spark", is_flag=True, help="No Spark Connect server: every window run starts its own "
                                                   "Spark session (by default env.sh points runs at a warm one).")
@friendly_errors
def local_up(state_dir, stream, shards, rate, window_minutes, no_producer, cold_spark):
    """The demo without `dagster dev`: the emulators, the demo stream and its KPL producer, DAGSTER_HOME, and
    the demo's environment in STATE_DIR/env.sh. `source` it in another shell and run `dagster dev` at the
    repository root. Runs in the foreground; Ctrl-C (or `local down`) stops everything."""
    import os
    from pathlib import Path

    from .local.demo import DemoOptions, run_local_up

    if shards < 1 or rate <= 0:
        raise UserError("--shards must be >= 1 and --rate > 0")
    _require_extras("local up", {"moto": "local", "flask_cors": "local"})
    _preflight(node=True, java=False)  # without Java, the warm Spark Connect server is skipped (one line)
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    pid_file = state / "local.pid"
    running = _running_pid(pid_file)
    if running is not None:  # its `local down` and a shell sourcing its env.sh rely on these files
        raise UserError(f"`kcl-pipeline local up` is already running for {state} (pid {running}); stop it with "
                        f"`kcl-pipeline local down --state-dir {state}` or use another --state-dir")
    pid_file.write_text(str(os.getpid()))
    try:
        code = run_local_up(DemoOptions(state_dir=state, stream=stream, shards=shards, rate=rate,
                                        window_minutes=window_minutes, producer=not no_producer,
                                        warm_spark=not cold_spark))
    finally:
        pid_file.unlink(missing_ok=True)
    sys.exit(code)


def _running_pid(pid_file) -> int | None:
    """The pid in `pid_file` when that process is alive (a stale file of a killed `local up` is not)."""
    import os

    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    except PermissionError:  # alive, another user's
        return pid
    return pid


@local.command("down")
@click.option("--state-dir", default=".kcl_local", show_default=True)
@click.option("--wait-seconds", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="How long to wait for `local up` to have stopped everything.")
@friendly_errors
def local_down(state_dir, wait_seconds):
    """Stop what `local up` started in another terminal (the producer, the emulators)."""
    import os
    import signal
    import time
    from pathlib import Path

    pid_file = Path(state_dir) / "local.pid"
    if not pid_file.exists():
        raise UserError(f"no running `kcl-pipeline local up` found ({pid_file} is missing)")
    pid = int(pid_file.read_text().strip())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        raise UserError(f"`local up` (pid {pid}) is not running any more") from None
    deadline = time.monotonic() + wait_seconds
    while pid_file.exists():  # `local up` removes it once everything it started has stopped
        if time.monotonic() >= deadline:
            raise UserError(f"`local up` (pid {pid}) was asked to stop but is still running after "
                            f"{wait_seconds:g} s; see its terminal")
        time.sleep(0.1)
    click.echo(f"stopped `local up` (pid {pid}): the producer, the Spark Connect server and the emulators")


@local.command("reset")
@click.option("--state-dir", default=".kcl_local", show_default=True)
@friendly_errors
def local_reset(state_dir):
    """Start afresh: delete what STATE_DIR keeps across runs: the Dagster home (its runs, asset history, sensor
    cursors and the first partition it keeps), the emulators' state (the stream and its records, the lease table
    and its checkpoints) and the zones (landed batches, the transform's output), so that the next `demo` or
    `local up` makes new ones from the current window. Refused while `local up` runs on it; stop `dagster dev`
    on that home first."""
    from pathlib import Path

    from .local.demo import reset_state

    state = Path(state_dir)
    running = _running_pid(state / "local.pid")
    if running is not None:
        raise UserError(f"`kcl-pipeline local up` (pid {running}) is running on {state}: stop it first "
                        f"(`kcl-pipeline local down --state-dir {state}`)")
    deleted = reset_state(state)
    for line in deleted:
        click.echo(line)
    if not deleted:
        click.echo(f"nothing to reset: {state.resolve()} has no Dagster home, emulator state or zones")


def _add_simulate() -> None:
    from .sim.cli import simulate
    main.add_command(simulate)


_add_simulate()


if __name__ == "__main__":  # pragma: no cover
    main()
