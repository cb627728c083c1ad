"""Fixtures of the mixed-fleet tests: the real Java KCL (kcl_pipeline_tests/java_peer, built once per session and
KCL version) beside `kcl-pipeline consume` on one stream and one lease table over the session's emulators.

- `java_peer_build(profile)` (session): the peer built with Maven (`kcl2`: KCL 2.7.2, `kcl3`: KCL 3.5.1) into a
  temporary directory; skips with one line when `java` or `mvn` is missing (CI has both).
- `kcl2_peer` (session): the KCL 2.7.2 build; `kcl3_peer` (session): the KCL 3.5.1 build.
- `mixed_fleet`: a fresh stream and application; starts our consumers and Java peers, stops (or kills) them,
  collects what they delivered; every process left running is stopped at teardown.
- `kcl3_fleet`: the same with the KCL 3.5.1 peer, and DynamoDB from the session's moto server for both kinds (KCL
  3.5.1 adds the leaseOwner index to the on-demand lease table, which dynalite refuses); Kinesis stays on
  kinesis-local.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

from kcl_pipeline.kcl.shells.shards import wait_stream_active

from ..kcl.fleet_support import consume_process
from .peer_support import (
    Deliveries,
    JavaPeer,
    KplProducer,
    LeaseWatch,
    PeerBuild,
    build_peer,
    missing_tools,
    start_peer,
)

# Our consumers' timings in a table shared with Java: a heartbeat well inside Java's failover time.
HEARTBEAT, EXPIRY, CYCLE = 2.0, 6.0, 2.0
# The Java peers': failoverTimeMillis (Java renews every third of it, takes every 2 x (it + 25 ms)).
FAILOVER_MS, SHARD_SYNC_MS = 6000, 5000


@pytest.fixture(scope="session")
def java_peer_build(tmp_path_factory) -> Callable[[str], PeerBuild]:
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("java-peer-build")
    builds: dict[str, PeerBuild | BaseException] = {}

    def get(profile: str) -> PeerBuild:
        if profile not in builds:
            try:
                builds[profile] = build_peer(profile, root)
            except BaseException as e:  # noqa: BLE001 - a failed build fails every test that needs it, once
                builds[profile] = e
        built = builds[profile]
        if isinstance(built, BaseException):
            raise built
        return built

    return get


@pytest.fixture(scope="session")
def kcl2_peer(java_peer_build) -> PeerBuild:
    return java_peer_build("kcl2")


@pytest.fixture(scope="session")
def kcl3_peer(java_peer_build) -> PeerBuild:
    return java_peer_build("kcl3")


@dataclass
class MixedFleet:
    """One stream and one lease table, shared by our consumers and Java peers."""

    env: dict
    directory: Path
    stream: str
    application: str
    kinesis: Any
    dynamodb: Any
    build: PeerBuild
    producer: KplProducer
    ours: dict[str, subprocess.Popen] = field(default_factory=dict)
    our_dirs: dict[str, Path] = field(default_factory=dict)
    java: dict[str, JavaPeer] = field(default_factory=dict)

    def start_ours(self, name: str, extra: Sequence[str] = ()) -> subprocess.Popen:
        out = self.directory / name
        self.our_dirs[name] = out
        self.ours[name] = consume_process(self.env, self.stream, self.application, name, out,
                                          self.directory / f"{name}.log", heartbeat=HEARTBEAT, expiry=EXPIRY,
                                          cycle=CYCLE, extra=extra)
        return self.ours[name]

    def start_java(self, worker_id: str, extra: Sequence[str] = ()) -> JavaPeer:
        self.java[worker_id] = start_peer(self.build, self.env, self.directory, stream=self.stream,
                                          application=self.application, worker_id=worker_id,
                                          failover_ms=FAILOVER_MS, shard_sync_ms=SHARD_SYNC_MS, extra=extra)
        return self.java[worker_id]

    def stop_ours(self, name: str, timeout: float = 40) -> int:
        """SIGTERM to the consumer's process group (as `kill` of a service), wait."""
        p = self.ours[name]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError(f"{name} did not stop within {timeout:.0f}s:\n{self.our_log(name)[-3000:]}") from None

    def kill_ours(self, name: str) -> None:
        """kill -9 of the consumer's whole process group (manager and workers), as a crashed host."""
        p = self.ours[name]
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def our_log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def deliveries(self) -> Deliveries:
        return Deliveries.collect(self.java.values(), self.our_dirs)

    def missing(self) -> list[int]:
        return self.deliveries().missing(self.producer.produced)

    def watch(self) -> LeaseWatch:
        return LeaseWatch(self.dynamodb, self.application)

    def logs(self) -> str:
        """Every member's log tail, for an assertion message."""
        parts = [f"--- {n} (ours)\n{self.our_log(n)[-2500:]}" for n in self.ours]
        parts += [f"--- {w} (Java)\n{p.log_tail(2500)}" for w, p in self.java.items()]
        return "\n".join(parts)

    def close(self) -> None:
        for p in self.ours.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGTERM)
        for peer in self.java.values():
            if peer.process.poll() is None:
                peer.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in [*self.ours.values(), *(peer.process for peer in self.java.values())]:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _fleets(prefix: str, emulators, kinesis_client, dynamodb, build: PeerBuild, unique_name, tmp_path,
            **env_extra: str):
    """Yield a maker of mixed fleets (a fresh stream of `shards` and application each) and close them after."""
    fleets: list[MixedFleet] = []

    def make(shards: int) -> MixedFleet:
        stream, app = unique_name(prefix), unique_name(f"{prefix}app")
        kinesis_client.create_stream(StreamName=stream, ShardCount=shards)
        wait_stream_active(kinesis_client, stream)
        env = {**os.environ, **emulators.env(), "PYTHONUNBUFFERED": "1", **env_extra}
        fleet = MixedFleet(env, tmp_path, stream, app, kinesis_client, dynamodb, build,
                           KplProducer(kinesis_client, stream))
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


@pytest.fixture
def mixed_fleet(emulators, kinesis_client, dynamodb_client, kcl2_peer, unique_name,
                tmp_path) -> Iterator[Callable[..., MixedFleet]]:
    yield from _fleets("mixed", emulators, kinesis_client, dynamodb_client, kcl2_peer, unique_name, tmp_path)


@pytest.fixture
def kcl3_fleet(emulators, moto_endpoints, kinesis_client, _moto_dynamodb_client, kcl3_peer, unique_name,
               tmp_path) -> Iterator[Callable[..., MixedFleet]]:
    """KCL 3.5.1 needs moto's DynamoDB (dynalite refuses its owner-index update): both kinds use it."""
    yield from _fleets("mixed3", emulators, kinesis_client, _moto_dynamodb_client, kcl3_peer, unique_name, tmp_path,
                       AWS_ENDPOINT_URL_DYNAMODB=moto_endpoints.dynamodb)
