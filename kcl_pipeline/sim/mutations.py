"""Seeded bugs: each re-introduces one lease-safety defect into the shipped code (or the requests it
sends), and the simulation must catch it within `within` seeds. A mutation the simulator stops catching
means its invariants or its faults have gone blind.

Every mutation patches the real modules for the length of one run (`active`), so what is tested is
exactly what ships minus one guard. Mutations of a request's condition rewrite what `LeaseTable` sent
before the simulated DynamoDB evaluates it, and only for our consumers (a Java peer's requests are its own).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from unittest import mock

from ..kcl.core import cycle, effects, lease_life, planner
from ..kcl.shells import lease_table
from ..landing import exclusion
from . import landing


@dataclass(frozen=True)
class Mutation:
    name: str
    defect: str     # what it re-introduces, in the words of the lease-safety issue
    within: int     # the simulator must catch it in fewer seeds than this (CI checks it)
    faults: tuple[str, ...] = ()  # the fault kinds its scenarios need (empty: all of them)


MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation("no-counter-fence", "writes fenced by leaseOwner only: the leaseCounter condition is dropped", 60),
    Mutation("ages-stamped-early", "lease ages stamped when the cycle started, not when the scan returned", 400,
             ("slow-dynamodb", "throttling", "crash")),
    Mutation("no-parent-gate", "children acquired and read before their parents finished", 400),
    Mutation("ambiguous-as-lost", "a write whose response was lost is reported as a lost race", 100,
             ("lost-responses", "throttling", "crash")),
    Mutation("land-without-fence", "landing ignores the zone: no resume after the last landed record, no "
             "exclusion of what landed batches hold", 60),
    Mutation("delete-foreign", "leases of other streams and applications treated as this stream's", 20),
    Mutation("validity-from-response", "validity measured from when a write's answer arrived, not when it "
             "was sent", 400, ("slow-dynamodb", "lost-responses", "throttling", "freeze-worker", "crash")),
    Mutation("acquire-ended", "an ended (SHARD_END) lease can be acquired", 500, ("reshard", "crash")),
    Mutation("handoff-without-wait", "a graceful hand-off's new owner delivers without waiting for the old "
             "holder to step aside", 60),
)}


class _Rewrite:
    """A condition rewrite applied to our consumers' requests (installed on the simulated service)."""

    def __init__(self, pattern: str, replacement: Callable[[re.Match], str]):
        self.pattern = re.compile(pattern)
        self.replacement = replacement

    def __call__(self, method: str, request: dict, actor: Any) -> dict:
        text = request.get("ConditionExpression")
        if not text or getattr(actor, "is_java_peer", False):
            return request
        return {**request, "ConditionExpression": self.pattern.sub(self.replacement, text)}


# `leaseCounter = :x` → `:x = :x`: the placeholder stays used (DynamoDB rejects unused ones), the guard goes.
_NO_COUNTER = _Rewrite(r"leaseCounter = (:\w+)", lambda m: f"{m.group(1)} = {m.group(1)}")
# The acquire's `checkpoint <> :SHARD_END` (heartbeats keep theirs: only the take is mutated).
_ACQUIRE_ENDED = _Rewrite(r"leaseCounter = :observed AND checkpoint <> :SHARD_END",
                          lambda m: "leaseCounter = :observed AND :SHARD_END = :SHARD_END")


def _settle_ambiguity_as_lost(self, write, exc):
    """LeaseTable._settle before the fix: a failed condition or a lost answer means "someone else won"."""
    if lease_table.is_condition_failure(exc) or isinstance(exc, lease_table.AMBIGUOUS_FAILURES):
        return lease_table.WriteResult(False)
    raise self._error(write.operation, exc) from exc


def _renewed_from_answer(original):
    def renewed(hold, outcome, sent_at, timing, now):
        return original(hold, outcome, now, timing, now)
    return renewed


def _handoff_without_wait(me, settings):
    """lease_life._await_handoff without the wait: asked, and taken as if the holder had stepped aside."""
    if (yield effects.InitiateHandoff()) is None:
        return None
    current = yield effects.GetLease()
    if current is None or current.lease_owner != me:
        return None
    return current, False


@contextlib.contextmanager
def active(name: str | None, world: Any) -> Iterator[None]:
    """Run `world` with mutation `name` (None: the shipped code as it is)."""
    if name is None:
        yield
        return
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r} (known: {', '.join(MUTATIONS)})")
    with contextlib.ExitStack() as stack:
        if name == "no-counter-fence":
            world.dynamodb.rewrite = _NO_COUNTER
        elif name == "acquire-ended":
            world.dynamodb.rewrite = _ACQUIRE_ENDED
        elif name == "ages-stamped-early":
            world.ages_stamped_at_cycle_start = True
        elif name == "no-parent-gate":
            never_blocked = lambda *args, **kwargs: []  # noqa: E731
            stack.enter_context(mock.patch.object(lease_life, "blocked_on_parents", never_blocked))
            stack.enter_context(mock.patch.object(planner, "blocked_on_parents", never_blocked))
        elif name == "ambiguous-as-lost":
            stack.enter_context(mock.patch.object(lease_table.LeaseTable, "_settle", _settle_ambiguity_as_lost))
        elif name == "land-without-fence":
            stack.enter_context(mock.patch.object(landing.SimLandingProcessor, "resume_position", lambda self: None))
            stack.enter_context(mock.patch.object(
                exclusion, "exclude_landed",
                lambda records, prev, landed: exclusion.Exclusion([exclusion.Run(prev, records)] if records else [],
                                                                  [], None)))
        elif name == "delete-foreign":
            stack.enter_context(mock.patch.object(cycle, "scoped_leases", lambda leases, shards: list(leases)))
        elif name == "handoff-without-wait":
            stack.enter_context(mock.patch.object(lease_life, "_await_handoff", _handoff_without_wait))
        elif name == "validity-from-response":
            stack.enter_context(mock.patch.object(lease_life, "renewed", _renewed_from_answer(lease_life.renewed)))
        try:
            yield
        finally:
            world.dynamodb.rewrite = None
            world.ages_stamped_at_cycle_start = False


__all__ = ["MUTATIONS", "Mutation", "active"]
