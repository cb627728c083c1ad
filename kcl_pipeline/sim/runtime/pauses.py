"""Pauses the world puts into our processes, as a garbage collector, a busy host or a slow processor would.

Where each goes, and how long it may be:

* between the last validity check and the delivery (the processor called): up to what the validity margin
  tolerates (core/tolerance.py: `tolerated_pause` at the world's clock drift). Nothing can notice such a
  pause, so the margin is all that keeps the delivery before a peer's take by expiry: a margin cut short
  (a mutation) delivers late;
* before a check, in the heartbeat, and between a holder reading a hand-off's ask and answering it:
  anything, up to and beyond the margin and the expiry: the next check must see it and stop the holder, an
  answer come too late must be refused;
* after a delivery (processing time): a little, so the next check comes later than the poll pacing says;
* inside a delivery, at the zone's put (`zombie-flush`, `InsideCall`): past the check, longer than the expiry:
  a zombie that goes on landing beside the lease's new holder.

`Pauses.none()` never pauses (the balance world, tests).
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ...kcl.core.lease.lease_hold import LeaseTiming
from ...kcl.core.tolerance import tolerated_pause


@dataclass
class Pauses:
    rng: random.Random | None
    rate_tolerance: float  # the world's clock drift: the bound before a delivery depends on it
    before_delivery_probability: float = 0.05
    before_check_probability: float = 0.01
    in_heartbeat_probability: float = 0.05
    processing_probability: float = 0.1
    # Once the faults stopped (the fleet must settle): only the pauses the protocol tolerates stay — before a
    # delivery within the bound, processing time; none of those that make a holder miss its validity.
    calm: bool = False

    @classmethod
    def none(cls) -> "Pauses":
        return cls(None, 0.0)

    def before_delivery(self, timing: LeaseTiming) -> float:
        """True seconds between the last check and the delivery: within the tolerance, often near it."""
        rng = self.rng
        if rng is None or rng.random() >= self.before_delivery_probability:
            return 0.0
        # Measured on the slowest clock the tolerance allows, so that the pause stays within it in any case.
        limit = tolerated_pause(timing.expiry_seconds, timing.margin_seconds, self.rate_tolerance)
        return limit * (1.0 - rng.random() ** 3) * 0.999  # skewed towards the limit

    def before_check(self) -> float:
        rng = self.rng
        if rng is None or self.calm or rng.random() >= self.before_check_probability:
            return 0.0
        if rng.random() < 0.8:
            return rng.uniform(0.05, 1.5)
        return rng.uniform(0.5, 1.5) * 10.0  # a pause past the margin and the validity: the check must stop it

    def before_answering_a_handoff(self) -> float:
        """Between a holder reading that a hand-off was asked of it and its answer: up to past the asker's
        patience (half an expiry)."""
        rng = self.rng
        if rng is None or self.calm or rng.random() >= 0.4:
            return 0.0
        return rng.uniform(0.5, 6.0)

    def in_heartbeat(self) -> float:
        rng = self.rng
        if rng is None or self.calm or rng.random() >= self.in_heartbeat_probability:
            return 0.0
        return rng.uniform(0.0, 6.0)

    def processing(self) -> float:
        rng = self.rng
        if rng is None or rng.random() >= self.processing_probability:
            return 0.0
        return rng.uniform(0.0, 0.3)


class InsideCall:
    """A call that can pause part-way and go on later: a GC pause inside a processor's call, past the validity
    check that let the call start (`zombie-flush`: a holder paused at the zone's put, in the middle of a
    flush, for longer than its lease's expiry, while another holder takes the lease).

    The call runs on a thread of its own, and it and the simulation take turns (two semaphores): never both at
    once, so the run stays deterministic. `pause(seconds)`, called on the call's thread (the store's put),
    hands the turn back: `step()` then answers ("pause", seconds); the simulation freezes the process and calls
    `step()` again at its thaw, or `abandon()` when the process died meanwhile (the pause raises `exc` on the
    call's thread, so the thread ends). `step()` answers ("done", value) when the call returned; what it raised
    is raised in the simulation's thread."""

    current: "InsideCall | None" = None  # the call that has the turn (set by the simulation's thread)

    def __init__(self, call: Callable[[], Any]) -> None:
        self._call = call
        self._turn = threading.Semaphore(0)  # the call's
        self._back = threading.Semaphore(0)  # the simulation's
        self._state: tuple[str, Any] = ("new", None)
        self._abandon: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="sim-inside-call")

    def _main(self) -> None:
        self._turn.acquire()
        try:
            self._state = ("done", self._call())
        except BaseException as exc:  # noqa: BLE001 - handed to the simulation's thread, raised there
            self._state = ("raised", exc)
        self._back.release()

    def step(self) -> tuple[str, Any]:
        if self._state[0] == "new":
            self._thread.start()
        outer, InsideCall.current = InsideCall.current, self
        self._turn.release()
        self._back.acquire()
        InsideCall.current = outer
        kind, value = self._state
        if kind == "raised":
            raise value
        return kind, value

    @property
    def paused(self) -> bool:
        return self._state[0] == "pause"

    def abandon(self, exc: BaseException) -> None:
        """The process died while paused: the call ends on its thread with `exc` (nothing after it runs)."""
        if not self.paused:
            return
        self._abandon = exc
        try:
            self.step()
        except BaseException as raised:  # noqa: BLE001 - the call ended as it was told to
            if raised is not exc:
                raise

    def pause(self, seconds: float) -> None:
        """On the call's thread: stop here for `seconds` of the process's time (the simulation decides when)."""
        self._state = ("pause", seconds)
        self._back.release()
        self._turn.acquire()
        if self._abandon is not None:
            raise self._abandon


__all__ = ["InsideCall", "Pauses"]
