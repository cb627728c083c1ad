"""What the cast — our consumers and their workers (consumer.py), a Java KCL peer (java.py) — sees of the world
it runs in: the engine's time and events, the services, the landing store, the checker it reports to, and
the world's ledgers. World (world.py) is the one stage; the cast names this base instead, so that the world
can import the cast without the cast importing the world back.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from .checker import Checker
from .dynamodb import SimDynamoDB, SimDynamoDBClient
from .engine import Engine
from .kinesis import SimStream
from .landing import SimZoneStore
from .scenario import Scenario


class Stage(Engine):
    scenario: Scenario
    table_name: str                 # the lease table
    dynamodb: SimDynamoDB
    reader: SimDynamoDBClient       # instant, faultless reads (the simulation's own, not a process's)
    stream: SimStream
    store: SimZoneStore
    checker: Checker                # deliveries and unsound answers are reported to it as they happen
    stats: Counter
    workers: list[Any]              # every worker process ever spawned (consumer.SimWorker), in spawn order
    steal_times: list[float]        # when a manager planned a steal (virtual seconds)
    worker_metrics: dict[str, float]  # the worker metrics table: worker id → last update (true time)
    ages_stamped_at_cycle_start: bool  # set by a mutation (mutations.py)

    def next_serial(self) -> int:
        """A new process number (the checker tells worker processes apart by it)."""
        raise NotImplementedError


__all__ = ["Stage"]
