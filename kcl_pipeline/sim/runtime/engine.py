"""The simulation's machinery: virtual time, one event queue, hosts with drifting clocks, processes that can
be frozen or killed, and the driver that runs a shell's coroutines (the core's effects, the shells' handlers
and their transport steps) across virtual time.

Determinism: one `random.Random` per world (children derived from it), one heap ordered by (time, insertion
number); nothing reads a real clock. The same seed replays the same history, event for event.
"""
from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from types import GeneratorType
from typing import Any, Callable, Generator

from ...kcl.shells.transport import Exclusive


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


EPOCH = 1_700_000_000.0  # the true time 0 on wall clocks


class Host:
    """A machine: its monotonic clock runs at `rate` (drift) from `offset`; its wall clock is NTP-synced (true
    time within `skew`); its path to DynamoDB has its own faults."""

    def __init__(self, world: "Engine", name: str, rate: float, offset: float, faults: Any, skew: float = 0.0):
        self.world = world
        self.name = name
        self.rate = rate
        self.offset = offset
        self.faults = faults
        self.skew = skew

    def monotonic(self) -> float:
        return self.offset + self.world.now * self.rate

    def wall(self) -> float:
        return EPOCH + self.world.now + self.skew

    def true_delay(self, local_seconds: float) -> float:
        """How long `local_seconds` on this host's clock last in true time."""
        return max(0.0, local_seconds) / self.rate


class Later:
    """A handler's answer that takes time: after `delay` true seconds, `then()` gives the answer (or raises,
    or returns another Later, or a generator to run). With `waiters`, it may come early: when they are woken
    (a stop, a result, a changed hold). `counted`: the wait counts as a step of the system (an idle look
    that found nothing does not)."""

    __slots__ = ("delay", "then", "network", "waiters", "counted")

    def __init__(self, delay: float, then: Callable[[], Any], network: bool = False,
                 waiters: "Waiters | None" = None, counted: bool = True):
        self.delay = delay
        self.then = then
        self.network = network  # runs even while the process is frozen or dead (a request already on the wire)
        self.waiters = waiters
        self.counted = counted


class Waiters:
    """Tasks waiting for something that may come before their timeout (`wake`)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[list] = []  # [task, then, done]

    def wake(self, world: "Engine") -> None:
        entries, self.entries = self.entries, []
        for entry in entries:
            if not entry[2]:
                entry[2] = True
                task, then = entry[0], entry[1]
                world.schedule(0.0, lambda task=task, then=then: task.continue_with(then), task.scope)


class Lock:
    """A worker's write lock (fenced writes go one at a time)."""

    __slots__ = ("holder", "depth", "waiters")

    def __init__(self) -> None:
        self.holder = None
        self.depth = 0
        self.waiters: deque = deque()


class Task:
    """Runs one coroutine in virtual time: a shell's, yielding the core's effects and the transport's steps.
    `handle(task, item)` answers an item at once (a value, or an exception it raises), with a `Later`, or
    with a generator, run in place (a shell's handler). `Exclusive` steps run their body under `lock` (one
    task at a time, re-entrant). `on_done(value)` / `on_error(exc)` when the coroutine finishes; `exited`
    wakes whoever joins it."""

    __slots__ = ("world", "scope", "stack", "locked_levels", "handle", "lock", "on_done", "on_error", "name",
                 "finished", "kind", "exited")

    def __init__(self, world: "Engine", scope: Scope, coroutine: Generator, handle, *, lock: Lock | None = None,
                 on_done: Callable[[Any], None] | None = None, on_error: Callable[[BaseException], None] | None = None,
                 name: str = "", kind: str = ""):
        self.world = world
        self.scope = scope
        self.stack = [coroutine]
        self.locked_levels: list[int] = []
        self.handle = handle
        self.lock = lock
        self.on_done = on_done
        self.on_error = on_error
        self.name = name
        self.kind = kind  # what the transport knows the task as (a worker's "heartbeat", say)
        self.finished = False
        self.exited = Waiters()

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
            if type(effect) is Exclusive:
                if not self._lock_for(effect.body, queue_last=True):
                    return
                answer, error = None, None
                continue
            try:
                result = self.handle(self, effect)
            except Exception as exc:
                answer, error = None, exc
                continue
            kind = type(result)
            if kind is Later:
                world.defer(result, self)
                return
            if kind is GeneratorType:
                self.stack.append(result)
                answer, error = None, None
                continue
            answer, error = result, None

    def continue_with(self, then: Callable[[], Any]) -> None:
        """Evaluate a Later's continuation and resume with its answer (or chain another Later, or run the
        generator it gives)."""
        if self.finished:
            return
        try:
            result = then()
        except Exception as exc:
            self.resume(None, exc)
            return
        kind = type(result)
        if kind is Later:
            self.world.defer(result, self)
            return
        if kind is GeneratorType:
            self.stack.append(result)
            self.resume(None, None)
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
                    waiter, body = lock.waiters.popleft()
                    self.world.schedule(0.0, lambda: waiter._enter(body), waiter.scope)
        return not self.stack

    def _enter(self, body: Generator) -> None:
        if self.finished:
            return
        if self._lock_for(body, queue_last=False):
            self.resume(None, None)

    def _lock_for(self, body: Generator, queue_last: bool) -> bool:
        """Take the lock and push the locked body (True), or queue for the lock (False)."""
        lock = self.lock
        if lock is None:
            raise RuntimeError(f"{self.name}: an Exclusive step in a task without a lock")
        if lock.holder is not None and lock.holder is not self:
            if lock.holder.finished or not lock.holder.scope.alive():
                lock.holder, lock.depth = None, 0  # its process died holding it
            else:
                if queue_last:
                    lock.waiters.append((self, body))
                else:
                    lock.waiters.appendleft((self, body))  # woken but beaten to it: stay first in line
                return False
        lock.holder = self
        lock.depth += 1
        self.stack.append(body)
        self.locked_levels.append(len(self.stack) - 1)
        return True

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self.finished = True
        self.exited.wake(self.world)
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
        elif later.waiters is not None:
            entry = [task, later.then, False]
            waiters = later.waiters
            waiters.entries.append(entry)

            def timeout() -> None:
                if not entry[2]:
                    entry[2] = True
                    if entry in waiters.entries:
                        waiters.entries.remove(entry)
                    task.continue_with(later.then)
            self.schedule(later.delay, timeout, task.scope, counted=later.counted)
        else:
            self.schedule(later.delay, lambda: task.continue_with(later.then), task.scope, counted=later.counted)

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


__all__ = ["EPOCH", "Engine", "Host", "Later", "Lock", "Scope", "Task", "Violation", "Waiters"]
