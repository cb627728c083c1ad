"""`kcl-pipeline …`: the consumer, the demo producer, the lease table, the local emulators, the landing zone."""
from __future__ import annotations

import functools
import json
import logging
import sys

import click
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from .kcl.aws import AwsSettings, client
from .kcl.config import ConfigError, ConsumerConfig, InitialPosition

log = logging.getLogger("kcl_pipeline")


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def friendly_errors(fn):
    """Known failures become one clear line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .kcl.lease_table import LeaseTableError
        from .kcl.shards import KinesisError
        from .landing.errors import LandingError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, KinesisError, LeaseTableError, LandingError, ValueError) as exc:
            raise UserError(str(exc)) from None
        except EndpointConnectionError as exc:
            raise UserError(f"cannot reach the AWS endpoint: {exc}") from None
        except NoCredentialsError:
            raise UserError("no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile)") \
                from None
        except ClientError as exc:
            err = exc.response.get("Error", {})
            raise UserError(f"{exc.operation_name} failed: {err.get('Code')}: {err.get('Message')}") from None
        except BotoCoreError as exc:
            raise UserError(str(exc)) from None

    return wrapper


def aws_options(fn):
    fn = click.option("--region", default=None, help="AWS region (default: AWS_REGION or us-east-1).")(fn)
    fn = click.option("--endpoint-url", default=None,
                      help="One endpoint for every AWS service (default: AWS_ENDPOINT_URL[_<SERVICE>] or AWS).")(fn)
    return fn


def _settings(region, endpoint_url) -> AwsSettings:
    return AwsSettings(region=region, endpoint_url=endpoint_url)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v: debug).")
def main(verbose: int) -> None:
    """kcl_pipeline: a leaderless, Java-KCL-v2-compatible Kinesis consumer and its Dagster pipeline."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("botocore", "urllib3", "boto3", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@main.command()
@click.option("--stream", required=True, help="Kinesis stream name.")
@click.option("--application", required=True, help="Application name = lease table name (shared by the fleet).")
@click.option("--initial-position", type=click.Choice(["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"],
              case_sensitive=False), default="TRIM_HORIZON", show_default=True,
              help="Where leases of shards with no history start.")
@click.option("--timestamp", default=None, help="ISO 8601 timestamp for AT_TIMESTAMP.")
@click.option("--worker-id", default=None, help="This consumer's unique id (default: a new UUID).")
@click.option("--max-leases", type=int, default=64, show_default=True)
@click.option("--leases-to-acquire", type=int, default=1, show_default=True, help="Leases taken per cycle.")
@click.option("--heartbeat-seconds", type=float, default=None, help="Lease heartbeat period [default: 10].")
@click.option("--lease-expiry-seconds", type=float, default=None,
              help="A lease unchanged this long is free for others [default: 30].")
@click.option("--java-compatible", is_flag=True,
              help="Heartbeat 3 s / expiry 10 s: required when Java KCL consumers share the lease table.")
@click.option("--cycle-seconds", type=float, default=20.0, show_default=True)
@click.option("--metrics-namespace", default=None, help="Publish metrics to this CloudWatch namespace.")
@click.option("--sink", default=None, help="jsonl:DIR — one JSON line per record in DIR/<shard_id>.jsonl.")
@click.option("--landing", default=None,
              help="Land records as Parquet in s3://bucket/prefix or a directory (exactly once; checkpoints after "
                   "each landed batch when run without Dagster).")
@click.option("--batch-seconds", type=float, default=None,
              help="With --landing: flush a batch once its oldest record waited this long [default: 30].")
@click.option("--batch-mb", type=float, default=None, help="With --landing: flush a batch at this size [default: 8].")
@aws_options
@friendly_errors
def consume(stream, application, initial_position, timestamp, worker_id, max_leases, leases_to_acquire,
            heartbeat_seconds, lease_expiry_seconds, java_compatible, cycle_seconds, metrics_namespace, sink, landing,
            batch_seconds, batch_mb, region, endpoint_url):
    """Run a headless consumer: a full peer of the fleet sharing the lease table. Stops on SIGTERM/SIGINT."""
    from .kcl.consumer import run_consumer
    from .kcl.jsonl_sink import parse_sink

    if bool(sink) == bool(landing):
        raise UserError("give exactly one of --sink jsonl:DIR or --landing URI")
    if sink and (batch_seconds is not None or batch_mb is not None):
        raise UserError("--batch-seconds and --batch-mb only apply to --landing")
    kwargs = {}
    if worker_id:
        kwargs["worker_id"] = worker_id
    if java_compatible:
        kwargs.update(heartbeat_seconds=3.0, lease_expiry_seconds=10.0)
    if heartbeat_seconds is not None:
        kwargs["heartbeat_seconds"] = heartbeat_seconds
    if lease_expiry_seconds is not None:
        kwargs["lease_expiry_seconds"] = lease_expiry_seconds
    config = ConsumerConfig(
        stream=stream, application=application,
        initial_position=InitialPosition.parse(initial_position, timestamp),
        max_leases=max_leases, leases_to_acquire=leases_to_acquire, cycle_seconds=cycle_seconds,
        metrics_namespace=metrics_namespace, aws=_settings(region, endpoint_url), **kwargs)
    if sink:
        spec = parse_sink(sink)
    else:
        from .landing.layout import Zone
        from .landing.sink import landing_spec
        from .landing.store import open_store

        # Fail fast (exit 2) on a missing bucket; a local directory is created.
        local_zone = Zone.parse(landing).scheme == "file"
        open_store(landing, config.aws).ensure_zone(create=local_zone)
        settings = {}
        if batch_seconds is not None:
            settings["max_batch_age_seconds"] = batch_seconds
        if batch_mb is not None:
            settings["max_batch_bytes"] = int(batch_mb * 1024 * 1024)
        spec = landing_spec(landing, stream, aws=config.aws, standalone=True, **settings)
    sys.exit(run_consumer(config, spec))


@main.command()
@click.option("--stream", required=True)
@click.option("--count", type=int, default=1000, show_default=True, help="User records to produce.")
@click.option("--rate", type=float, default=None, help="User records per second (default: as fast as possible).")
@click.option("--aggregate", type=int, default=1, show_default=True,
              help="User records per KPL aggregate (1 = plain records).")
@click.option("--create-shards", type=int, default=None, help="Create the stream with N shards if it is missing.")
@click.option("--poison-every", type=int, default=None, help="Make every k-th payload invalid JSON.")
@aws_options
@friendly_errors
def produce(stream, count, rate, aggregate, create_shards, poison_every, region, endpoint_url):
    """The demo producer: JSON payloads, plain or KPL-aggregated."""
    from .local.producer import produce as run_produce

    if count < 0 or aggregate < 1:
        raise UserError("--count must be >= 0 and --aggregate >= 1")
    kinesis = client("kinesis", _settings(region, endpoint_url))
    report = run_produce(kinesis, stream, count=count, rate=rate, aggregate=aggregate, payload=None,
                         poison_every=poison_every, create_shards=create_shards)
    click.echo(json.dumps({k: v for k, v in vars(report).items() if k != "ids"}, default=str))


@main.command()
@click.option("--application", required=True, help="Application name = lease table name.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per lease, for scripts.")
@aws_options
@friendly_errors
def leases(application, as_json, region, endpoint_url):
    """Show the lease table: owner, counter, checkpoint, parents, landing progress."""
    from .kcl.lease_table import LeaseTable

    table = LeaseTable(application, client("dynamodb", _settings(region, endpoint_url)))
    rows = sorted(table.scan(), key=lambda lease: lease.lease_key)
    if as_json:
        for lease in rows:
            click.echo(json.dumps({
                "leaseKey": lease.lease_key, "leaseOwner": lease.lease_owner, "leaseCounter": lease.lease_counter,
                "checkpoint": lease.checkpoint.sequence_number,
                "checkpointSubSequenceNumber": lease.checkpoint.sub_sequence_number,
                "ownerSwitchesSinceCheckpoint": lease.owner_switches_since_checkpoint,
                "parentShardIds": list(lease.parent_shard_ids), "childShardIds": list(lease.child_shard_ids),
                "extra": lease.extra}, default=str))
        return
    if not rows:
        click.echo(f"lease table {application} is empty")
        return
    header = f"{'lease':<24} {'owner':<40} {'counter':>7}  checkpoint"
    click.echo(header)
    for lease in rows:
        cp = lease.checkpoint
        cps = cp.sequence_number if cp.is_sentinel and cp.sequence_number != "AT_TIMESTAMP" else str(cp)
        click.echo(f"{lease.lease_key:<24} {lease.lease_owner or '-':<40} {lease.lease_counter:>7}  {cps}")


@main.command()
@click.option("--port", type=int, default=3000, show_default=True, help="Dagster UI port on 127.0.0.1.")
@click.option("--stream", default="kcl-pipeline-demo", show_default=True)
@click.option("--shards", type=int, default=4, show_default=True)
@click.option("--rate", type=float, default=40.0, show_default=True, help="Demo records per second.")
@click.option("--window-minutes", type=int, default=2, show_default=True, help="Partition (window) length.")
@click.option("--no-producer", is_flag=True, help="Do not run the demo producer (produce yourself).")
@click.option("--state-dir", default=".kcl_local", show_default=True, help="Logs, DAGSTER_HOME, env.sh.")
@friendly_errors
def demo(port, stream, shards, rate, window_minutes, no_producer, state_dir):
    """Emulators + demo stream + KPL producer + `dagster dev` with the consumer sensor on. Ctrl-C stops all."""
    from pathlib import Path

    from .local.demo import DemoOptions, run_demo

    if shards < 1 or rate <= 0:
        raise UserError("--shards must be >= 1 and --rate > 0")
    sys.exit(run_demo(DemoOptions(state_dir=Path(state_dir), port=port, stream=stream, shards=shards, rate=rate,
                                  window_minutes=window_minutes, producer=not no_producer)))


def _pipeline_settings():
    """The Dagster deployment's settings (KCL_PIPELINE_* variables): defaults for audit and backfill."""
    from .defs.kinesis.settings import PipelineSettings

    return PipelineSettings.from_env()


@main.command()
@click.option("--window", default=None,
              help="START, START/END or START/PT15M (ISO 8601 UTC); default: the last materialised windows.")
@click.option("--last", type=int, default=24, show_default=True, help="Without --window: how many windows.")
@click.option("--landing", "zone", default=None, help="Landing zone URI [default: KCL_PIPELINE_LANDING_URI].")
@click.option("--output", default=None, help="Transform output URI [default: KCL_PIPELINE_OUTPUT_URI].")
@click.option("--stream", default=None, help="[default: KCL_PIPELINE_STREAM]")
@click.option("--application", default=None, help="Lease table for the checkpoint check [default: the pipeline's].")
@click.option("--window-minutes", type=int, default=None, help="[default: KCL_PIPELINE_WINDOW_MINUTES]")
@aws_options
@friendly_errors
def audit(window, last, zone, output, stream, application, window_minutes, region, endpoint_url):
    """The lineage audit: chain per shard, landed = transformed + duplicates + quarantined, checkpoints ≤
    materialised. Exit 1 when a check fails."""
    from .landing.audit import audit as run_audit
    from .landing.verify import parse_window

    settings = _pipeline_settings()
    window_ms = (window_minutes or settings.window_minutes) * 60_000
    report = run_audit(zone or settings.landing_uri, output or settings.output_uri, stream or settings.stream,
                       window_ms, window=parse_window(window) if window else None,
                       application=application or settings.application, aws=_settings(region, endpoint_url),
                       last=last)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)


@main.command()
@click.option("--window", required=True, help="START, START/END or START/PT15M (ISO 8601 UTC): whole windows.")
@click.option("--url", default="http://127.0.0.1:3000", show_default=True, help="The Dagster webserver.")
@click.option("--window-minutes", type=int, default=None, help="[default: KCL_PIPELINE_WINDOW_MINUTES]")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the backfill finishes.")
@click.option("--timeout", type=float, default=3600, show_default=True)
@friendly_errors
def backfill(window, url, window_minutes, wait, timeout):
    """Re-land and re-transform a time range (bounded AT_TIMESTAMP re-reads, isolated from the live leases)."""
    from .landing.verify import parse_window
    from .local.dagster_client import DagsterApiError, launch_backfill, wait_backfill, window_keys

    window_ms = (window_minutes or _pipeline_settings().window_minutes) * 60_000
    keys = window_keys(*parse_window(window), window_ms)
    try:
        backfill_id = launch_backfill(url, keys)
        click.echo(f"backfill {backfill_id}: {len(keys)} window(s) {keys[0]} … {keys[-1]}")
        if not wait:
            return
        status = wait_backfill(url, backfill_id, timeout)
    except DagsterApiError as exc:
        raise UserError(str(exc)) from None
    click.echo(f"backfill {backfill_id}: {status}")
    sys.exit(0 if status in ("COMPLETED", "COMPLETED_SUCCESS") else 1)


@main.group()
def landing() -> None:
    """The landing zone: verify the chain of landed batches."""


@landing.command("verify")
@click.option("--landing", "zone", required=True, help="s3://bucket/prefix or a local directory.")
@click.option("--window", default=None,
              help="START (one hour), START/END or START/PT15M, ISO 8601 UTC (default: everything).")
@click.option("--stream", default=None, help="Only this stream (default: every stream in the zone).")
@click.option("--shard", default=None, help="Only this shard.")
@click.option("--deep", is_flag=True, help="Read every batch's rows, not only footers and keys.")
@click.option("--application", default=None,
              help="Cross-check the consumer's lease table (starting positions, landing progress, checkpoints).")
@aws_options
@friendly_errors
def landing_verify(zone, window, stream, shard, deep, application, region, endpoint_url):
    """Per-shard chain status, row counts, gaps and overlaps. Exit 1 on a gap, an overlap, or (with
    --application) a chain that does not start at a starting position or falls short of the lease table."""
    from .landing.verify import verify_zone

    aws = _settings(region, endpoint_url)
    leases = None
    if application:
        from .kcl.aws import client
        from .kcl.lease_table import LeaseTable

        leases = LeaseTable(application, client("dynamodb", aws)).scan()
    report = verify_zone(zone, window, stream=stream, shard=shard, aws=aws, deep=deep, leases=leases)
    for line in report.lines():
        click.echo(line)
    sys.exit(0 if report.ok else 1)


@main.group()
def local() -> None:
    """The embedded AWS emulators on loopback (kinesis-local, dynalite, moto)."""


@local.command("up")
@click.option("--state-dir", default=".kcl_local", show_default=True,
              help="Logs, the endpoints file (env.sh, for `source`) and the pid file used by `local down`.")
@friendly_errors
def local_up(state_dir):
    """Start the emulators in the foreground; print the endpoints; Ctrl-C (or `local down`) stops them."""
    import os
    from pathlib import Path

    from .local.emulators import run_stack_foreground

    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    pid_file = state / "local.pid"
    pid_file.write_text(str(os.getpid()))
    try:
        code = run_stack_foreground(state / "logs", env_file=state / "env.sh")
    finally:
        pid_file.unlink(missing_ok=True)
    sys.exit(code)


@local.command("down")
@click.option("--state-dir", default=".kcl_local", show_default=True)
@friendly_errors
def local_down(state_dir):
    """Stop the emulators started by `local up` in another terminal."""
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
    for _ in range(100):
        if not pid_file.exists():
            break
        time.sleep(0.1)
    click.echo(f"stopped the emulators (pid {pid})")


if __name__ == "__main__":  # pragma: no cover
    main()
