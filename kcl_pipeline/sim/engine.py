"""The simulation's machinery: virtual time, one event queue, hosts with drifting clocks, processes that can
be frozen or killed, and the driver that runs a sans-I/O coroutine across virtual time.

Determinism: one `random.Random` per world (children derived from it), one heap ordered by (time, insertion
number); nothing reads a real clock. The same seed replays the same history, event for event.
"""
from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from typing import Any, Callable, Generator

from ..kcl.core.effects import Locked


class Violation(AssertionError):
    """An invariant was broken; the message says which, where and when."""


class Scope:
    """A process (or a process group) in the world: it can be frozen (SIGSTOP) and killed (SIGKILL).

    A frozen scope runs nothing until it thaws: its events wait. A dead one runs nothing ever again.
    Scopes nest (a worker process inside its consumer's process group)."""

    __slots__ = ("name", "parent", "dead", "frozen_until")

    def __init__(self, name: str, parent: "Scope | None" = None):
        self.name = name
        self.parent = parent
        self.dead = False
        self.frozen_until = 0.0

    def alive(self) -> bool:
        scope: Scope | None = self
        while scope is not None:
            if scope.dead:
                return False
            scope = scope.parent
        return True

    def thaw_time(self) -> float:
        t, scope = 0.0, self
        while scope is not None:
            t = max(t, scope.frozen_until)
            scope = scope.parent
        return t


class Host:
    """A machine: its clocks run at `rate` (drift) from `offset`; its path to DynamoDB has its own faults."""

    def __init__(self, world: "Engine", name: str, rate: float, offset: float, faults: Any):
        self.world = world
        self.name = name
        self.rate = rate
        self.offset = offset
        self.faults = faults

    def monotonic(self) -> float:
        return self.offset + self.world.now * self.rate

    def wall(self) -> float:
        return 1_700_000_000.0 + self.monotonic()

    def true_delay(self, local_seconds: float) -> float:
        """How long `local_seconds` on this host's clock last in true time."""
        return max(0.0, local_seconds) / self.rate


class Later:
    """A handler's answer that takes time: after `delay` true seconds, `then()` gives the answer (or raises,
    or returns another Later)."""

    __slots__ = ("delay", "then", "network")

    def __init__(self, delay: float, then: Callable[[], Any], network: bool = False):
        self.delay = delay
        self.then = then
        self.network = network  # runs even while the process is frozen or dead (a request already on the wire)


class Lock:
    """A worker's write lock (fenced writes go one at a time)."""

    __slots__ = ("holder", "depth", "waiters")

    def __init__(self) -> None:
        self.holder = None
        self.depth = 0
        self.waiters: deque = deque()


class Task:
    """Runs one coroutine of effects in virtual time. `handle(task, effect)` answers an effect at once
    (a value, or an exception it raises) or with a `Later`. `Locked` effects run their body under
    `lock` (one task at a time). `on_done(value)` / `on_error(exc)` when the coroutine finishes."""

    __slots__ = ("world", "scope", "stack", "locked_levels", "handle", "lock", "on_done", "on_error", "name",
                 "finished")

    def __init__(self, world: "Engine", scope: Scope, coroutine: Generator, handle, *, lock: Lock | None = None,
                 on_done: Callable[[Any], None] | None = None, on_error: Callable[[BaseException], None] | None = None,
                 name: str = ""):
        self.world = world
        self.scope = scope
        self.stack = [coroutine]
        self.locked_levels: list[int] = []
        self.handle = handle
        self.lock = lock
        self.on_done = on_done
        self.on_error = on_error
        self.name = name
        self.finished = False

    def start(self, delay: float = 0.0) -> "Task":
        self.world.schedule(delay, lambda: self.resume(None, None), self.scope)
        return self

    def resume(self, answer: Any, error: BaseException | None) -> None:
        world = self.world
        while True:
            coroutine = self.stack[-1]
            try:
                effect = coroutine.throw(error) if error is not None else coroutine.send(answer)
            except StopIteration as stop:
                if self._pop():
                    self._finish(stop.value, None)
                    return
                answer, error = stop.value, None
                continue
            except Exception as exc:
                if self._pop():
                    self._finish(None, exc)
                    return
                answer, error = None, exc
                continue
            if type(effect) is Locked:
                if not self._lock_for(effect, queue_last=True):
                    return
                answer, error = None, None
                continue
            try:
                result = self.handle(self, effect)
            except Exception as exc:
                answer, error = None, exc
                continue
            if type(result) is Later:
                world.defer(result, self)
                return
            answer, error = result, None

    def continue_with(self, then: Callable[[], Any]) -> None:
        """Evaluate a Later's continuation and resume with its answer (or chain another Later)."""
        try:
            result = then()
        except Exception as exc:
            self.resume(None, exc)
            return
        if type(result) is Later:
            self.world.defer(result, self)
            return
        self.resume(result, None)

    def _pop(self) -> bool:
        """Pop the finished coroutine (releasing the lock its level held); True when it was the root."""
        level = len(self.stack) - 1
        self.stack.pop()
        if self.locked_levels and self.locked_levels[-1] == level:
            self.locked_levels.pop()
            lock = self.lock
            lock.depth -= 1
            if lock.depth == 0:
                lock.holder = None
                if lock.waiters:
                    waiter, effect = lock.waiters.popleft()
                    self.world.schedule(0.0, lambda: waiter._enter(effect), waiter.scope)
        return not self.stack

    def _enter(self, effect: Locked) -> None:
        if self._lock_for(effect, queue_last=False):
            self.resume(None, None)

    def _lock_for(self, effect: Locked, queue_last: bool) -> bool:
        """Take the lock and push the locked body (True), or queue for the lock (False)."""
        lock = self.lock
        if lock.holder is not None and lock.holder is not self:
            if queue_last:
                lock.waiters.append((self, effect))
            else:
                lock.waiters.appendleft((self, effect))  # woken but beaten to it: stay first in line
            return False
        lock.holder = self
        lock.depth += 1
        self.stack.append(effect.body)
        self.locked_levels.append(len(self.stack) - 1)
        return True

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self.finished = True
        if error is not None:
            if isinstance(error, Violation) or self.on_error is None:
                raise error
            self.on_error(error)
        elif self.on_done is not None:
            self.on_done(value)

    def abandon(self) -> None:
        """The process died: release the lock so nothing waits for a dead task forever."""
        if self.lock is not None and self.lock.holder is self:
            self.lock.holder = None
            self.lock.depth = 0
        self.finished = True


class Engine:
    """Virtual time and the event queue. An event belongs to a scope: it is dropped if the scope died and
    postponed while it is frozen."""

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self._queue: list = []
        self._order = itertools.count()
        self.steps = 0          # events run by the system under test
        self.trace: deque[str] = deque(maxlen=60)

    def child_rng(self) -> random.Random:
        return random.Random(self.rng.getrandbits(64))

    def schedule(self, delay: float, action: Callable[[], None], scope: Scope | None = None,
                 counted: bool = True) -> None:
        heapq.heappush(self._queue, (self.now + max(0.0, delay), next(self._order), action, scope, counted))

    def at(self, time: float, action: Callable[[], None], counted: bool = False) -> None:
        heapq.heappush(self._queue, (max(time, self.now), next(self._order), action, None, counted))

    def defer(self, later: Later, task: Task) -> None:
        if later.network:
            # The request is on the wire: it reaches the service whatever happens to its sender.
            self.schedule(later.delay, lambda: task.continue_with(later.then), None)
        else:
            self.schedule(later.delay, lambda: task.continue_with(later.then), task.scope)

    def note(self, text: str) -> None:
        self.trace.append(f"t={self.now:9.3f} {text}")

    def run_until(self, stop: Callable[[], bool]) -> None:
        queue = self._queue
        while queue and not stop():
            time, order, action, scope, counted = heapq.heappop(queue)
            if scope is not None:
                if not scope.alive():
                    continue
                thaw = scope.thaw_time()
                if thaw > time:
                    heapq.heappush(queue, (thaw, order, action, scope, counted))
                    continue
            self.now = time
            if counted:
                self.steps += 1
            action()

    def idle(self) -> bool:
        return not self._queue


__all__ = ["Engine", "Host", "Later", "Lock", "Scope", "Task", "Violation"]
