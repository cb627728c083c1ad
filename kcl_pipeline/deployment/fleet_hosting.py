"""The fleet member a sensor hosts: this code server's lease manager and its worker processes, one per held lease,
configured from the deployment's ConsumerSettings (no Dagster here: the sensors pass in the plain settings).

The manager lives in a module-level registry (keyed by stream, application and the hosting sensor) so its
workers survive from tick to tick inside the code server; everything that must outlive the process is
elsewhere: leases and progress in the lease table, data in the landing zone, and the consumer's name in the
sensor's cursor. When ticks stop (sensor off, code reloaded, server killed), the workers stop by themselves
after `keepalive` without a cycle (3 sensor intervals), or at once when the code server exits, and release
their leases; a new code server takes them over only once they are free or expired, so a reload never has
two workers on one lease.

A stopping code server (Ctrl-C of `dagster dev`) is bounded: as its interpreter begins to exit, its workers are
asked to release and given STOP_SECONDS; one that has not by then (its endpoints gone: the emulators stopped
first) is killed, saying so, and its lease expires by itself. A sensor tick still waiting on such an endpoint
(botocore's retries) would hold the exit for a minute or more: the server exits STOP_SECONDS + EXIT_GRACE_SECONDS
after it began to stop, whatever is in flight.

A sensor that hosts no workers (an observer) reads the fleet from the lease table instead (`observe_fleet`).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.fleet.cycle import CycleReport
from ..kcl.core.model import Lease, Shard
from ..kcl.core.table.lease_codec import LeaseTableMissing
from ..kcl.shells.aws import client
from ..kcl.shells.fleet.manager import LeaseManager, ManagerStalled, one_line
from ..kcl.shells.lease_table import LeaseTable
from ..kcl.shells.shards import list_application_shards
from ..windows.fleet_view import lease_counts
from .consumer import ConsumerSettings

log = logging.getLogger(__name__)

CONSUMER_SENSOR = "kinesis_consumer"  # the pipeline location's sensor: hosts (or observes) and reports windows
MEMBER_SENSOR = "kinesis_fleet_member"  # a fleet-member location's sensor: hosts workers, reports nothing
MEMBER_SUFFIX = "member"  # a member location's consumer name: `<KCL_PIPELINE_WORKER_ID>-member`
HOST_WORKERS_SETTING = "KCL_PIPELINE_HOST_WORKERS"  # true: this code server's sensor joins the fleet
# A stopping code server gives its workers this long to release their leases, then kills those that have not.
STOP_SECONDS = 10.0
# ... and exits this long after that, even with a sensor tick still waiting on an unreachable endpoint.
EXIT_GRACE_SECONDS = 5.0


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


def registry_key(consumer: ConsumerSettings, sensor_name: str = CONSUMER_SENSOR) -> tuple[str, str, str]:
    return consumer.stream, consumer.application, sensor_name


def hosted_consumer(consumer: ConsumerSettings, aws: AwsSettings, worker_id: str,
                    interval_seconds: float, sensor_name: str = CONSUMER_SENSOR) -> HostedConsumer:
    """This process's lease manager for the consumer, created (and started) on first use: its configuration
    and its landing sink's are the consumer settings'."""
    key = registry_key(consumer, sensor_name)
    with _REGISTRY_LOCK:
        hosted = _REGISTRY.get(key)
        if hosted is not None and hosted.worker_id == worker_id:
            return hosted
        if hosted is not None:  # the identity changed (cursor cleared and a new id set): hand over gracefully
            log.info("consumer id changed from %s to %s: stopping the old workers", hosted.worker_id, worker_id)
            hosted.manager.shutdown(timeout=min(20.0, interval_seconds))
            del _REGISTRY[key]
        name = consumer_name(worker_id)
        arn = consumer.stream_arn(aws)
        spec = consumer.processor_spec(aws, arn)
        # A directory whose chains are another stream's of the name fails the tick, before any worker is spawned
        # or anything written (each tick looks again until the zone is put right).
        consumer.check_stream_chains(aws, arn)
        manager = LeaseManager(consumer.consumer_config(aws, worker_id, float(interval_seconds)),
                               spec, keepalive_timeout=3.0 * interval_seconds,
                               predecessor=lambda owner: owner != worker_id and consumer_name(owner) == name)
        manager.start()  # a missing stream fails the tick here, with a message naming it
        hosted = _REGISTRY[key] = HostedConsumer(manager, worker_id)
        _stop_when_exiting()
        return hosted


def shutdown_hosted(timeout: float = 30.0) -> None:
    """Stop every hosted manager's workers (graceful: they release their leases, within `timeout`; those that
    have not by then are killed). For tests and embedding, and a stopping code server (`stop_hosted`)."""
    with _REGISTRY_LOCK:
        for hosted in _REGISTRY.values():
            hosted.manager.shutdown(timeout=timeout)
        _REGISTRY.clear()


_exit_armed = False


def _stop_when_exiting() -> None:
    """Arm `stop_hosted` for this process's exit, once (called with the registry lock held). It is registered
    with the interpreter's thread shutdown, which runs before it waits for the gRPC server's threads (a sensor
    tick among them), rather than with atexit, which runs after."""
    global _exit_armed
    if _exit_armed:
        return
    try:
        threading._register_atexit(stop_hosted)  # type: ignore[attr-defined]
    except RuntimeError:
        return  # the interpreter is exiting already
    _exit_armed = True


def stop_hosted(stop_seconds: float | None = None, exit_grace_seconds: float | None = None,
                exit: Callable[[int], None] = os._exit) -> None:
    """The code server is exiting: its workers release their leases within `stop_seconds` (STOP_SECONDS; those
    that have not are killed, their leases left to expire); `exit` ends the process `exit_grace_seconds`
    (EXIT_GRACE_SECONDS) later if something still holds it (a tick waiting on an endpoint that is gone)."""
    began = time.monotonic()
    stop_seconds = STOP_SECONDS if stop_seconds is None else stop_seconds
    exit_grace_seconds = EXIT_GRACE_SECONDS if exit_grace_seconds is None else exit_grace_seconds
    bound = stop_seconds + exit_grace_seconds
    with _REGISTRY_LOCK:
        hosted = list(_REGISTRY.values())
    if not hosted:
        return  # nothing hosted (stopped already): the exit is not this module's to bound
    watchdog = threading.Thread(target=_exit_after, args=(bound, exit), name="kcl-stop-bound", daemon=True)
    watchdog.start()
    log.info("code server stopping: %d lease manager(s) release their leases (at most %.0f s; the process exits "
             "within %.0f s)", len(hosted), stop_seconds, bound)
    for each in hosted:
        left = max(0.1, stop_seconds - (time.monotonic() - began))
        results = each.manager.shutdown(timeout=left)
        log.info("consumer %s stopped: %d worker(s) finished", each.worker_id, len(results))
    with _REGISTRY_LOCK:
        _REGISTRY.clear()


def _exit_after(seconds: float, exit: Callable[[int], None]) -> None:
    time.sleep(seconds)
    log.warning("code server still not exited %.0f s after it began to stop (a sensor tick waiting on an "
                "unreachable endpoint): exiting now; leases not released expire by themselves", seconds)
    logging.shutdown()
    exit(1)  # not a clean exit (and never one that hides a failure's exit code)


@dataclass(frozen=True)
class FleetCycle:
    """What one tick saw of the fleet: the cycle's lease counts, the leases and shards (named by lease key), and
    the hosting member's worker id (None: an observer, which hosts none)."""

    worker_id: str | None
    cycle: CycleReport
    leases: Sequence[Lease]
    shards: Sequence[Shard]
    # The hosted cycle failed (one line), not for long enough to give up: the tick says so and reports nothing.
    failure: str | None = None


def hosted_cycle(consumer: ConsumerSettings, aws: AwsSettings, remembered: str | None,
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
    try:
        cycle = manager.run_cycle()
    except ManagerStalled:
        raise  # no cycle succeeded for the stall time: the tick fails, saying so
    except Exception as exc:
        return FleetCycle(worker_id, CycleReport(), manager.leases, manager.shards,
                          failure=f"lease-manager cycle failed ({stall_note(manager)}): {one_line(exc)}")
    return FleetCycle(worker_id, cycle, manager.leases, manager.shards)


def stall_note(manager: LeaseManager) -> str:
    """How long the hosted manager has failed, and when its ticks will fail for it."""
    seconds = manager.config.stall_seconds
    failing = manager.clock() - manager.health.since
    return (f"none succeeded for {failing:.0f} s; the ticks fail from {seconds:g} s" if seconds > 0
            else f"none succeeded for {failing:.0f} s")


def observe_fleet(consumer: ConsumerSettings, aws: AwsSettings) -> FleetCycle | None:
    """The fleet as an observer sees it: the lease table and the stream's shards, without holding a lease.
    None when the lease table does not exist yet."""
    try:
        leases = LeaseTable(consumer.lease_table, client("dynamodb", aws)).scan()
    except LeaseTableMissing:
        return None
    streams = consumer.streams
    shards = list_application_shards(client("kinesis", aws), streams, len(streams) > 1)
    return FleetCycle(None, lease_counts(leases, shards), leases, shards)
