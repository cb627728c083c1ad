"""What the worker's and the manager's shells ask of the machinery they run on: a few *steps*, and the
driver that runs them in production.

The shells (worker.py: `LeaseWorker`; manager.py: `LeaseManager`) answer the core's effects (effects.py)
once, for production and for the deterministic simulation alike. Where an answer needs the outside world in
a way that differs between the two — a request to a service, a sleep, the lease's write lock, a concurrent
activity, a worker process — a handler is a generator and yields one of the steps below instead of doing
it; the shell's *transport* answers the step. In production `run_steps` answers them with real clients,
threads and processes (its answers are in each step's docstring); the simulation (sim/actors/consumer.py)
answers the same steps with simulated services, engine tasks and virtual time. Nothing else differs.

A handler may also yield effects (a `Locked` body yields the life's own effects), which the driver hands
back to the shell's handler table; a handler's result that is a generator is run as a sub-step.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from types import GeneratorType
from typing import Any, Callable, Generator, Protocol

from ..core.lease.effects import Effect

DYNAMODB = "dynamodb"
KINESIS = "kinesis"


class Step:
    """Something a shell's handler needs its transport to do."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Call(Step):
    """A blocking request to a service (`service`: DYNAMODB or KINESIS), `what` naming it for logs, the
    simulation's ledgers and its coverage. → what `request()` returns, or the exception it raised"""

    what: str
    request: Callable[[], Any]
    service: str = DYNAMODB


@dataclass(frozen=True, slots=True)
class StartProcess(Step):
    """Start a process on this host (a lease worker), blocking the caller until it is started: seconds on a busy
    host, or for the first worker of a consumer (its worker server starts first). → what `start()` returns"""

    what: str
    start: Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Sleep(Step):
    """Sleep `seconds` on this process's clock, waking early once the process is asked to stop.
    → bool: asked to stop"""

    seconds: float


@dataclass(frozen=True, slots=True)
class AwaitLoss(Step):
    """Wait up to `seconds` until `lost()` holds (woken when the hold changes). → None"""

    seconds: float
    lost: Callable[[], bool]


@dataclass(frozen=True, slots=True)
class Exclusive(Step):
    """Run `body` (a generator of steps and effects) under the lease's write lock (re-entrant). → its value"""

    body: Generator[Any, Any, Any]


@dataclass(frozen=True, slots=True)
class Background(Step):
    """Run `body` concurrently with the caller (a thread of this process). → a handle for `Join`"""

    body: Generator[Any, Any, Any]
    name: str


@dataclass(frozen=True, slots=True)
class Join(Step):
    """Wait up to `seconds` for a concurrent activity or a worker process to finish. → None"""

    handle: Any
    seconds: float


@dataclass(frozen=True, slots=True)
class NextResult(Step):
    """Wait up to `seconds` for a worker's result, returning early once `stop` is set. → the result, or None"""

    seconds: float
    stop: Any


def returning(fn: Callable[[], Any]) -> Generator[Any, Any, Any]:
    """`fn()` as a step body that yields nothing (for `Exclusive` around a read)."""
    return fn()
    yield  # pragma: no cover - makes this a generator


class StopFlag(Protocol):
    """How a process is asked to stop: `threading.Event` in production."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...


class Guard(Protocol):
    """A re-entrant lock's context manager (`threading.RLock` in production)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class WorkerHandle(Protocol):
    """A worker process as its manager sees it (`multiprocessing.Process` in production)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


# -- production's driver ---------------------------------------------------------------------------------

class Blocking:
    """Runs a shell's generators synchronously: steps with real calls, threads, a re-entrant lock.

    `lock` is the lease's write lock (a worker's), its `changed` condition woken when the hold changes;
    `stop` the process's stop event; `results` a queue of worker results (a manager's)."""

    def __init__(self, handle: Callable[[Effect], Any], *, stop: threading.Event | None = None,
                 lock: threading.RLock | None = None, results: Any = None,
                 monotonic: Callable[[], float] | None = None):
        import time

        self.handle = handle
        self.stop = stop
        self.lock = lock if lock is not None else threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.results = results
        self.monotonic = monotonic or time.monotonic

    def run(self, coroutine: Generator[Any, Any, Any]) -> Any:
        """Drive `coroutine` to its end: each effect by the shell's handler, each step here; an exception
        either raises is thrown into the coroutine (which decides what it means)."""
        answer: Any = None
        error: BaseException | None = None
        while True:
            try:
                item = coroutine.throw(error) if error is not None else coroutine.send(answer)
            except StopIteration as stop:
                return stop.value
            try:
                answer, error = self.answer(item), None
            except Exception as exc:
                answer, error = None, exc

    def answer(self, item: Any) -> Any:
        if isinstance(item, Step):
            return self.step(item)
        result = self.handle(item)
        return self.run(result) if type(result) is GeneratorType else result

    def step(self, step: Step) -> Any:
        match step:
            case Call():
                return step.request()
            case StartProcess():
                return step.start()
            case Exclusive():
                with self.lock:
                    return self.run(step.body)
            case Sleep():
                if self.stop is None:
                    raise RuntimeError("this process has no stop event to sleep on")
                return self.stop.wait(step.seconds)
            case AwaitLoss():
                with self.changed:
                    if not step.lost():
                        self.changed.wait(step.seconds)
                return None
            case Background():
                thread = threading.Thread(target=self.run, args=(step.body,), name=step.name, daemon=True)
                thread.start()
                return thread
            case Join():
                step.handle.join(step.seconds)
                return None
            case NextResult():
                return self._next_result(step.seconds, step.stop)
        raise TypeError(f"no transport step {step!r}")

    def hold_changed(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _next_result(self, seconds: float, stop: Any) -> Any:
        import queue

        # A multiprocessing queue cannot be woken by the stop event: look at it every half second.
        deadline = self.monotonic() + seconds
        while True:
            try:
                return self.results.get(timeout=min(0.5, max(0.01, deadline - self.monotonic())))
            except queue.Empty:
                if stop.is_set() or self.monotonic() >= deadline:
                    return None


STEPS: tuple[type[Step], ...] = (Call, Sleep, AwaitLoss, Exclusive, Background, Join, NextResult, StartProcess)

__all__ = ["AwaitLoss", "Background", "Blocking", "Call", "DYNAMODB", "Exclusive", "Guard", "Join", "KINESIS",
           "NextResult", "STEPS", "Sleep", "StartProcess", "Step", "StopFlag", "WorkerHandle", "returning"]
