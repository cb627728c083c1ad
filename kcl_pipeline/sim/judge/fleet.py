"""What the checker sees of the fleet: narrow, read-only views the world provides (world.py implements them).

The checker judges the fleet by ground truth the consumers cannot see (which process is which, who works a
lease now), but it needs no more of the world than these few questions; the consumers, workers and Java
peers answer them by what they are. Keeping them here, apart from the classes that implement them, lets the
checker be built from the stream, the store, the table and this view alone, importing none of the cast.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from ...kcl.config import ConsumerConfig
    from ...kcl.core.lease.lease_hold import LeaseTiming
    from ..runtime.engine import Host, Scope


class ConsumerView(Protocol):
    worker_id: str
    host: Host
    group: Scope
    manager_scope: Scope
    stopped_at: float | None        # when it was asked to stop gracefully (true time)

    def able(self) -> bool:
        """Could take over a lease now (alive, not frozen or stopping, reaching DynamoDB long enough)."""
        ...

    def retrying(self, key: str) -> bool:
        """Holds the lease through the back-off after its worker failed, not over yet on its own clock."""
        ...


class WorkerView(Protocol):
    """One of our lease worker processes, as the checker follows it."""

    serial: int                     # this process's number in the world (a restarted worker gets a new one)
    paused: float                   # true seconds the world paused it between its last check and this delivery
    finished: bool                  # its process has ended
    host: Host                      # its clock's rate
    scope: Scope
    consumer: ConsumerView

    @property
    def worker_id(self) -> str: ...

    @property
    def config(self) -> ConsumerConfig: ...

    @property
    def timing(self) -> LeaseTiming: ...

    def working(self) -> bool:
        """Alive, not frozen, and holding its lease as far as it knows."""
        ...

    def could_deliver(self) -> float:
        """How much longer (its clock) it could still deliver: its hold valid and nobody told it to stop (0:
        it cannot)."""
        ...

    def frozen_before_take(self) -> bool:
        """Alive and frozen by the world before it took its lease (its manager waits out its start patience)."""
        ...


class PeerView(Protocol):
    """A Java KCL peer: its leases are its own business, but it works them."""

    def works(self, key: str) -> bool: ...

    def leads(self) -> bool:
        """Alive and assigning the application's leases (a KCL 3.x leader in a 3.x client version)."""
        ...


class FleetView(Protocol):
    @property
    def consumers(self) -> Sequence[ConsumerView]: ...

    @property
    def java_peers(self) -> Sequence[PeerView]: ...

    def workers_by_key(self, key: str) -> Sequence[WorkerView]:
        """Our unfinished workers of lease `key` (several at once during a hand-off, a steal or a zombie)."""
        ...

    def worker_of(self, actor: object) -> WorkerView | None:
        """`actor` (who made a write) as one of our workers; None for a manager, the pipeline, a Java peer."""
        ...

    def workers_of(self, consumer: ConsumerView) -> Sequence[WorkerView]:
        """Every worker process `consumer` ever started."""
        ...

    def live_worker_ids(self) -> set[str]:
        """The worker ids of our consumers alive and not stopping."""
        ...

    def landing_checked(self) -> bool:
        """Whether every record must land (not beside a Java peer, which delivers without landing)."""
        ...


__all__ = ["ConsumerView", "FleetView", "PeerView", "WorkerView"]
