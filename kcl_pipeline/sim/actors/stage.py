"""What the cast — our consumers and their workers (consumer.py), a Java KCL peer (java.py) — sees of the world
it runs in: the engine's time and events, the services, the landing store, the checker it reports to, and
the world's ledgers. World (world.py) is the one stage; the cast names this base instead, so that the world
can import the cast without the cast importing the world back.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

from ..aws.dynamodb import SimDynamoDB, SimDynamoDBClient
from ..aws.kinesis import SimStream
from ..aws.landing import SimZone
from ..judge.checker import Checker
from ..runtime.engine import Engine
from ..runtime.pauses import Pauses
from ..runtime.scenario import Scenario


class Stage(Engine):
    scenario: Scenario
    table_name: str                 # the lease table
    dynamodb: SimDynamoDB
    reader: SimDynamoDBClient       # instant, faultless reads (the simulation's own, not a process's)
    stream: SimStream
    zone: SimZone
    checker: Checker                # deliveries and unsound answers are reported to it as they happen
    stats: Counter
    effects_handled: Counter        # (driver, effect type) answered by the shells: the coverage's effects
    workers: list[Any]              # every worker process ever spawned (consumer.SimWorkerProcess), in spawn order
    steal_times: list[float]        # when a manager planned a steal (virtual seconds)
    pauses: Pauses                  # the pauses the world puts into processes

    def next_serial(self) -> int:
        """A new process number (the checker tells worker processes apart by it)."""
        raise NotImplementedError

    def apply_later(self, delay: float, apply: Callable[[], None]) -> None:
        """DynamoDB applies a request its client gave up on, `delay` seconds from now."""
        raise NotImplementedError

    def consumer_exited(self, consumer: Any) -> None:
        """A consumer's process exited after its graceful stop."""
        raise NotImplementedError

    def consumer_failed(self, consumer: Any) -> None:
        """A consumer's process died of an error."""
        raise NotImplementedError

    def stop_while_taking(self, consumer: Any, within: float, probability: float) -> None:
        """Maybe stop `consumer` gracefully within `within` seconds (it just started to take a lease)."""
        raise NotImplementedError

    def freeze_allowance(self, victims: Iterable[Any], seconds: float) -> float:
        """How long the world may freeze these consumers from now, at most `seconds` (0: not at all): the fleet
        must run for a while within the stream's retention."""
        raise NotImplementedError


__all__ = ["Stage"]
