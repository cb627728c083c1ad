"""The fleet member a sensor hosts: this code server's lease manager and its worker processes, one per held lease.

The manager lives in a module-level registry (keyed by stream, application and the hosting sensor) so its
workers survive from tick to tick inside the code server; everything that must outlive the process is
elsewhere: leases and progress in the lease table, data in the landing zone, and the consumer's name in the
sensor's cursor. When ticks stop (sensor off, code reloaded, server killed), the workers stop by themselves
after `keepalive` without a cycle (3 sensor intervals), or at once when the code server exits, and release
their leases; a new code server takes them over only once they are free or expired, so a reload never has
two workers on one lease.

A sensor that hosts no workers (an observer) reads the fleet from the lease table instead (`observe_fleet`).
"""
from __future__ import annotations

import logging
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Sequence

from ...kcl.core.lease_codec import LeaseTableMissing
from ...kcl.core.model import Lease, Shard
from ...kcl.shells.aws import client
from ...kcl.shells.lease_table import LeaseTable
from ...kcl.shells.manager import CycleReport, LeaseManager
from ...kcl.shells.shards import list_application_shards
from ...landing.fleet_view import lease_counts
from .resources import AwsResource, KinesisConsumerResource

log = logging.getLogger(__name__)

CONSUMER_SENSOR = "kinesis_consumer"  # the pipeline location's sensor: hosts (or observes) and reports windows
MEMBER_SENSOR = "kinesis_fleet_member"  # a fleet-member location's sensor: hosts workers, reports nothing
MEMBER_SUFFIX = "member"  # a member location's consumer name: `<KCL_PIPELINE_WORKER_ID>-member`
HOST_WORKERS_SETTING = "KCL_PIPELINE_HOST_WORKERS"  # true: this code server's sensor joins the fleet


def new_worker_id(role: str | None = None) -> str:
    return f"dagster-{socket.gethostname()}{'-' + role if role else ''}-{uuid.uuid4().hex[:8]}"


def consumer_name(worker_id: str) -> str:
    """The stable name of a consumer; its worker ids are `<name>#<incarnation>`, one per code-server process."""
    return worker_id.split("#", 1)[0]


def incarnation_id(name: str) -> str:
    return f"{name}#{uuid.uuid4().hex[:8]}"


# -- the hosted lease managers ------------------------------------------------------------------------------

@dataclass
class HostedConsumer:
    manager: LeaseManager
    worker_id: str


# Keyed by stream, application and the hosting sensor: one process may load both sensors (tests, or one
# code server serving both locations), and each is its own fleet member.
_REGISTRY: dict[tuple[str, str, str], HostedConsumer] = {}
_REGISTRY_LOCK = threading.Lock()


def registry_key(consumer: KinesisConsumerResource, sensor_name: str = CONSUMER_SENSOR) -> tuple[str, str, str]:
    return consumer.stream, consumer.application, sensor_name


def hosted_consumer(consumer: KinesisConsumerResource, aws: AwsResource, worker_id: str,
                    interval_seconds: float, sensor_name: str = CONSUMER_SENSOR) -> HostedConsumer:
    """This process's lease manager for the consumer, created (and started) on first use."""
    key = registry_key(consumer, sensor_name)
    with _REGISTRY_LOCK:
        hosted = _REGISTRY.get(key)
        if hosted is not None and hosted.worker_id == worker_id:
            return hosted
        if hosted is not None:  # the identity changed (cursor cleared and a new id set): hand over gracefully
            log.info("consumer id changed from %s to %s: stopping the old workers", hosted.worker_id, worker_id)
            hosted.manager.shutdown(timeout=min(20.0, interval_seconds))
            del _REGISTRY[key]
        settings = aws.settings()
        name = consumer_name(worker_id)
        manager = LeaseManager(consumer.consumer_config(settings, worker_id, float(interval_seconds)),
                               consumer.processor_spec(settings), keepalive_timeout=3.0 * interval_seconds,
                               predecessor=lambda owner: owner != worker_id and consumer_name(owner) == name)
        manager.start()  # a missing stream fails the tick here, with a message naming it
        hosted = _REGISTRY[key] = HostedConsumer(manager, worker_id)
        return hosted


def shutdown_hosted(timeout: float = 30.0) -> None:
    """Stop every hosted manager's workers (graceful: they release their leases). For tests and embedding."""
    with _REGISTRY_LOCK:
        for hosted in _REGISTRY.values():
            hosted.manager.shutdown(timeout=timeout)
        _REGISTRY.clear()


@dataclass(frozen=True)
class FleetCycle:
    """What one tick saw of the fleet: the cycle's lease counts, the leases and shards (named by lease key), and
    the hosting member's worker id (None: an observer, which hosts none)."""

    worker_id: str | None
    cycle: CycleReport
    leases: Sequence[Lease]
    shards: Sequence[Shard]


def hosted_cycle(consumer: KinesisConsumerResource, aws: AwsResource, remembered: str | None,
                 interval_seconds: float, sensor_name: str) -> FleetCycle:
    """One lease-manager cycle of this process's fleet member for the sensor (started on first use).
    `remembered`: the worker id in the sensor's cursor."""
    with _REGISTRY_LOCK:
        hosted = _REGISTRY.get(registry_key(consumer, sensor_name))
    # The consumer's name is stable (setting, cursor); its worker id is one per code-server process
    # incarnation, `<name>#<incarnation>`: a new process never shares its fencing identity with a zombie of the
    # old one, and it leaves an earlier incarnation's leases to expire rather than stealing them.
    configured = consumer.worker_id and (consumer.worker_id if sensor_name == CONSUMER_SENSOR
                                         else f"{consumer.worker_id}-{MEMBER_SUFFIX}")
    name = configured or (consumer_name(remembered) if remembered else None) \
        or (consumer_name(hosted.worker_id) if hosted else None) \
        or new_worker_id(None if sensor_name == CONSUMER_SENSOR else MEMBER_SUFFIX)
    worker_id = hosted.worker_id if hosted and consumer_name(hosted.worker_id) == name else incarnation_id(name)
    manager = hosted_consumer(consumer, aws, worker_id, interval_seconds, sensor_name).manager
    cycle = manager.run_cycle()
    return FleetCycle(worker_id, cycle, manager.leases, manager.shards)


def observe_fleet(consumer: KinesisConsumerResource, aws: AwsResource) -> FleetCycle | None:
    """The fleet as an observer sees it: the lease table and the stream's shards, without holding a lease.
    None when the lease table does not exist yet."""
    settings = aws.settings()
    try:
        leases = LeaseTable(consumer.lease_table, client("dynamodb", settings)).scan()
    except LeaseTableMissing:
        return None
    streams = consumer.streams
    shards = list_application_shards(client("kinesis", settings), streams, len(streams) > 1)
    return FleetCycle(None, lease_counts(leases, shards), leases, shards)
