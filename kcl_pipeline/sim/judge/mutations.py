"""Seeded bugs: each re-introduces one lease-safety defect into the shipped code (or the requests it
sends), and the simulation must catch it within `within` seeds. A mutation the simulator stops catching
means its invariants or its faults have gone blind.

Every mutation patches the real modules for the length of one run (`active`), so what is tested is
exactly what ships minus one guard. Most are single-point edits of the shipped source (`_edited`: one
fragment of one function replaced, the function recompiled in its module's namespace), in the pure core
or in the shells alike; a shell handler is patched in its handler table. Mutations of a request's
condition rewrite what `LeaseTable` sent before the simulated DynamoDB evaluates it, and only for our
consumers (a Java peer's requests are its own).

The classes, as the issue that asked for them names them: fencing (`no-counter-fence`, `acquire-ended`,
`ambiguous-as-lost`), late writes (`heartbeat-fenced-by-owner`), validity and its margin
(`validity-from-response`, `shell-validity-from-response`, `shell-acquire-validity-from-response`,
`deliver-until-full-expiry`, `no-check-before-delivery`), steals (`steal-waits-a-heartbeat`,
`shell-spawn-forgets-steal`), hand-offs (`handoff-without-wait`, `handoff-timeout-taken-warm`), release and
shutdown (`shutdown-without-release`, `shell-shutdown-without-terminate`), and the manager's and the
landing's own (`ages-stamped-early`, `start-patience-never-grows`,
`no-parent-gate`, `land-without-fence`,
`delete-foreign`), and the table a KCL 2.x fleet shares (`metrics-in-a-2x-table`). The pipeline's,
as issue 20 names them: the audit trusting manifests (`audit-trusts-manifest`), the checkpoint plan past a
missing batch (`plan-past-missing-batch`), the plan ending a shard before its earlier windows committed
(`end-before-earlier-windows`), the plan stepping over an unmaterialised window
(`plan-past-unmaterialised-window`), the stale predecessor (`stale-predecessor`), a dead holder's start
link (`dead-start-link`), rows_reconcile publishing before its check (`reconcile-publishes-unchecked`), a
refill under an unfenced start chain (`unfenced-refill`), a refill naming no predecessor key
(`refill-forgets-predecessor-key`) and a window failing for good that nothing flags
(`stall-unreported`). The sensor's: the completeness rule taking a shard caught up before the window's end for
one that has passed it (`completeness-caught-up-any-time`), or a shard holding a record of the window for one
past it (`completeness-any-held-record`).
"""
from __future__ import annotations
import __future__

import contextlib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterator
from unittest import mock

from ...audit import lineage, reconcile
from ...kcl.core.fleet import cycle, planner
from ...kcl.core.lease import effects, lease_hold, lease_life
from ...kcl.shells import lease_table
from ...kcl.shells.fleet import manager
from ...kcl.shells.workers import worker
from ...windows import backfill, completeness, followup, scan
from ...windows.checkpoints import plan as checkpoint_plan
from ...windows.tick import decisions
from ...zone import exclusion, sink


@dataclass(frozen=True)
class Mutation:
    name: str
    defect: str     # what it re-introduces, in the words of the lease-safety issue
    within: int     # the simulator must catch it in fewer seeds than this (CI checks it)
    faults: tuple[str, ...] = ()  # the fault kinds its scenarios need (empty: all of them)
    steps: int = 1000  # the fewest steps a history needs to show it (a mutation run never takes fewer)


MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    # -- fencing
    Mutation("no-counter-fence", "writes fenced by leaseOwner only: the leaseCounter condition is dropped", 60),
    Mutation("acquire-ended", "an ended (SHARD_END) lease can be acquired", 500, ("reshard", "crash")),
    Mutation("ambiguous-as-lost", "a write whose response was lost is reported as a lost race", 100,
             ("lost-responses", "throttling", "crash")),
    # -- late writes
    Mutation("heartbeat-fenced-by-owner", "heartbeats fenced by leaseOwner only (the counter fence of the "
             "heartbeat alone dropped): a heartbeat applied late takes the counter back", 200,
             ("late-writes", "slow-dynamodb", "lost-responses")),
    # -- validity and its margin
    Mutation("validity-from-response", "validity measured from when a write's answer arrived, not when it "
             "was sent (in the core's transition)", 400,
             ("slow-dynamodb", "lost-responses", "throttling", "freeze-worker", "crash")),
    Mutation("shell-validity-from-response", "the worker shell's fenced write takes its send time after the "
             "answer (HeldLease)", 400),
    Mutation("shell-acquire-validity-from-response", "the worker shell's acquire takes its send time after the "
             "answer", 400),
    Mutation("deliver-until-full-expiry", "the validity margin ignored: a holder delivers until the whole "
             "expiry after its last write", 400),
    Mutation("no-check-before-delivery", "validity checked before the poll only, not again right before "
             "delivering what it returned", 400),
    # -- steals
    Mutation("steal-waits-a-heartbeat", "a stealer waits one heartbeat before delivering instead of one expiry",
             400),
    Mutation("shell-spawn-forgets-steal", "the worker shell reads a stolen lease's spawn as if the lease were "
             "free (no wait)", 400),
    # -- hand-offs
    Mutation("handoff-without-wait", "a graceful hand-off's new owner delivers without waiting for the old "
             "holder to step aside", 60),
    Mutation("handoff-timeout-taken-warm", "a hand-off the holder did not answer in time is taken warm (no "
             "wait), as if the holder had stepped aside", 400),
    # -- release and shutdown
    Mutation("shutdown-without-release", "a worker asked to stop says it released its lease without "
             "releasing it", 100, ("graceful-stop", "crash")),
    Mutation("shell-shutdown-without-terminate", "the manager shell's shutdown never asks its workers to stop: "
             "they are killed at the timeout, holding their leases", 100, ("graceful-stop", "crash")),
    # -- the manager and the landing
    Mutation("ages-stamped-early", "lease ages stamped when the cycle started, not when the scan returned", 400),
    Mutation("start-patience-never-grows", "a worker killed before its take leaves the lease's next worker as "
             "patient as it was (planner.start_patience ignores the kills): on a host whose worker starts outlast the "
             "patience every respawn is killed the same way and the lease is never worked", 400, ("slow-spawns",)),
    Mutation("no-parent-gate", "children acquired and read before their parents finished", 400),
    Mutation("land-without-fence", "landing ignores the zone: no resume after the last landed record, no "
             "exclusion of what landed batches hold", 60),
    Mutation("delete-foreign", "leases of other streams and applications treated as this stream's", 20),
    Mutation("metrics-in-a-2x-table", "worker metrics written (and read) whatever the migration state: the "
             "manager's first cycle puts a non-lease item into a lease table a KCL 2.x fleet shares", 100,
             ("java-peer",)),
    # -- the pipeline (issue 20's classes)
    Mutation("audit-trusts-manifest", "the audit judges a window by its datasets' manifests when its commit is "
             "gone, not by the commit", 100, ("deleted-commit",)),
    Mutation("plan-past-missing-batch", "the checkpoint plan never checks that a shard's batches are contiguous: "
             "it commits past a batch missing before its window ran", 100, ("lost-batch",)),
    Mutation("stale-predecessor", "a flush that learns mid-poll that another writer landed past it keeps the rest "
             "of the poll buffered, and the next poll moves on past the other's batch while that buffer stays: the "
             "next batch takes its predecessor from the stale buffer", 400,
             ("zombie-flush", "short-reads", "mixed-batch-sizes")),
    Mutation("plan-past-unmaterialised-window", "the checkpoint plan steps over a batch whose window has not "
             "materialised and commits the batches after it: a window whose run failed is passed by the checkpoint "
             "once a later window commits", 100, ("transform-fails",)),
    Mutation("end-before-earlier-windows", "the checkpoint plan ends a shard (SHARD_END) whatever its earlier "
             "windows' commits say: a shard is ended while a window before its last one has no commit", 400),
    Mutation("stall-unreported", "the sensor's follow-up never names a window stalled: a window whose runs fail for "
             "good is asked again until given up, and nothing flags it (checkpoints stop silently)", 100,
             ("transform-fails",), steps=2000),  # a window is overdue 120 s after its end: longer histories
    Mutation("dead-start-link", "a holder that claimed a shard's start link and died before its batch was written "
             "blocks every later holder (the start link's unwritten batch not adopted)", 100,
             ("latest-start", "landing-crash")),
    Mutation("reconcile-publishes-unchecked", "rows_reconcile publishes the window's commit whatever its check "
             "says (the commit before the check)", 100, ("transform-drops-rows",)),
    Mutation("unfenced-refill", "a backfill's first batch never goes through the live link (`_start_sink` without "
             "`live_predecessor`): a refill of a batch that starts its minute lands under a start chain of its own, "
             "which no live link fences", 100, ("refill",)),
    Mutation("refill-forgets-predecessor-key", "a refill looks for the batch before a lost one in the lost batch's "
             "own minute only: a lost batch that starts its minute is refilled naming no predecessor key where the "
             "live writer named one", 200, ("refill",)),
    # -- the sensor's window decisions
    Mutation("completeness-caught-up-any-time", "the completeness rule counts a shard caught up at any time as done "
             "with the window (windows/completeness.py without `caught_up >= t1 + grace_ms`): a shard idle before "
             "the window's end has not passed it, and the window is reported before its records land", 100),
    Mutation("completeness-any-held-record", "the completeness rule counts a shard holding any record read after "
             "its last landed one as done with the window, wherever that record arrived (windows/completeness.py "
             "`p.next_arrival_ms >= t1` made `>= window_start_ms`): a shard whose held records arrived in the "
             "window has not landed them, and the window is reported before they land", 100),
)}


class MutationStale(RuntimeError):
    """A mutation's fragment is no longer in the shipped source: update the mutation with the code."""


def _edited(func: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """`func` with one single-point edit of its source (`old`, which must occur exactly once, replaced by
    `new`), compiled in its module's namespace: the shipped code with one bug planted."""
    source = textwrap.dedent(inspect.getsource(func))
    if source.count(old) != 1:
        raise MutationStale(f"{func.__qualname__}: the fragment {old!r} occurs {source.count(old)} times")
    namespace = dict(vars(sys.modules[func.__module__]))
    code = compile(source.replace(old, new), inspect.getsourcefile(func) or func.__module__, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the shipped source with one planted edit, for one simulated run
    return namespace[func.__name__]


class _Rewrite:
    """A condition rewrite applied to our consumers' requests (installed on the simulated service)."""

    def __init__(self, pattern: str, replacement: Callable[[re.Match], str],
                 only: Callable[[dict], bool] | None = None):
        self.pattern = re.compile(pattern)
        self.replacement = replacement
        self.only = only

    def __call__(self, method: str, request: dict, actor: Any) -> dict:
        text = request.get("ConditionExpression")
        if not text or getattr(actor, "is_java_peer", False) or (self.only is not None and not self.only(request)):
            return request
        return {**request, "ConditionExpression": self.pattern.sub(self.replacement, text)}


# `leaseCounter = :x` → `:x = :x`: the placeholder stays used (DynamoDB rejects unused ones), the guard goes.
_NO_COUNTER = _Rewrite(r"leaseCounter = (:\w+)", lambda m: f"{m.group(1)} = {m.group(1)}")
# The acquire's `checkpoint <> :SHARD_END` (heartbeats keep theirs: only the take is mutated).
_ACQUIRE_ENDED = _Rewrite(r"leaseCounter = :observed AND checkpoint <> :SHARD_END",
                          lambda m: "leaseCounter = :observed AND :SHARD_END = :SHARD_END")


def _is_heartbeat(request: dict) -> bool:
    """A holder's heartbeat (its checkpoint riding along or not): the counter moves on, the owner stays."""
    update = request.get("UpdateExpression", "")
    return (update.startswith("SET leaseCounter = :next") and "leaseOwner" not in update
            and "checkpointOwner" not in update)


_HEARTBEAT_BY_OWNER = _Rewrite(r"leaseCounter = :mine", lambda m: ":mine = :mine", only=_is_heartbeat)


def _settle_ambiguity_as_lost(self, write, exc):
    """LeaseTable._settle before the fix: a failed condition or a lost answer means "someone else won"."""
    if lease_table.is_condition_failure(exc) or isinstance(exc, lease_table.AMBIGUOUS_FAILURES):
        return lease_table.WriteResult(False)
    raise self._error(write.operation, exc) from exc


def _renewed_from_answer(original):
    def after_renew(hold, outcome, sent_at, timing, now, *args):
        return original(hold, outcome, now, timing, now, *args)
    return after_renew


def _handoff_without_wait(me, settings):
    """lease_life._await_handoff without the wait: asked, and taken as if the holder had stepped aside."""
    if (yield effects.InitiateHandoff()) is None:
        return None
    current = yield effects.GetLease()
    if current is None or current.lease_owner != me:
        return None
    return current, False


def _patch(stack: contextlib.ExitStack, owner: Any, name: str, old: str, new: str) -> None:
    """Plant an edit of `owner.name` (a module's function or a class's method)."""
    stack.enter_context(mock.patch.object(owner, name, _edited(getattr(owner, name), old, new)))


def _patch_handler(stack: contextlib.ExitStack, shell: Any, effect: type, old: str, new: str) -> None:
    """Plant an edit of the shell's handler of `effect` (its handler table is built at class creation)."""
    stack.enter_context(mock.patch.dict(shell.HANDLERS, {effect: _edited(shell.HANDLERS[effect], old, new)}))


def _plant(name: str, stack: contextlib.ExitStack, world: Any) -> None:
    if name == "no-counter-fence":
        world.dynamodb.rewrite = _NO_COUNTER
    elif name == "acquire-ended":
        world.dynamodb.rewrite = _ACQUIRE_ENDED
    elif name == "heartbeat-fenced-by-owner":
        world.dynamodb.rewrite = _HEARTBEAT_BY_OWNER
    elif name == "ambiguous-as-lost":
        stack.enter_context(mock.patch.object(lease_table.LeaseTable, "_settle", _settle_ambiguity_as_lost))
    elif name == "validity-from-response":
        stack.enter_context(mock.patch.object(lease_hold.LeaseHold, "after_renew",
                                              _renewed_from_answer(lease_hold.LeaseHold.after_renew)))
    elif name == "shell-validity-from-response":
        _patch(stack, worker.HeldLease, "_renew",
               "        outcome = Outcome.APPLIED if (yield send(hold.counter)) else Outcome.REFUSED\n",
               "        outcome = Outcome.APPLIED if (yield send(hold.counter)) else Outcome.REFUSED\n"
               "        sent_at = self._monotonic()\n")
    elif name == "shell-acquire-validity-from-response":
        _patch_handler(stack, worker.LeaseWorker, effects.Acquire,
                       "    if lease is not None:\n",
                       "    sent_at = self.monotonic()\n    if lease is not None:\n")
    elif name == "deliver-until-full-expiry":
        _patch(stack, lease_hold.LeaseTiming, "valid_until", "sent_at + self.expiry_seconds - self.margin_seconds",
               "sent_at + self.expiry_seconds")
    elif name == "no-check-before-delivery":
        _patch(stack, lease_life, "lease_life",
               "            status = yield from Check().ask()  # checked again right before",
               "            pass  # checked again right before")
    elif name == "steal-waits-a-heartbeat":
        _patch(stack, lease_life, "lease_life", "deliver_from = status.now + settings.timing.expiry_seconds",
               "deliver_from = status.now + settings.heartbeat_seconds")
    elif name == "shell-spawn-forgets-steal":
        _patch(stack, worker.LeaseWorker, "__init__", "config.parent_drained_attribute, spawn.stolen,",
               "config.parent_drained_attribute, False,")
    elif name == "handoff-without-wait":
        stack.enter_context(mock.patch.object(lease_life, "_await_handoff", _handoff_without_wait))
    elif name == "handoff-timeout-taken-warm":
        _patch(stack, lease_life, "_await_handoff", "return current, True  # no answer",
               "return current, False  # no answer")
    elif name == "shutdown-without-release":
        _patch(stack, lease_life, "_shutdown", "released = yield from Release(unsettled).ask()", "released = True")
    elif name == "shell-shutdown-without-terminate":
        _patch(stack, manager.LeaseManager, "stopping", "proc.terminate()", "pass")
    elif name == "ages-stamped-early":
        _patch(stack, cycle, "manager_cycle",
               "older than they are.\n    state.ages.observe(leases, scanned.returned_at)",
               "older than they are.\n    state.ages.observe(leases, result.started_at)")
    elif name == "start-patience-never-grows":
        _patch(stack, planner, "start_patience",
               "START_PATIENCE_EXPIRIES * 2 ** min(max(slow_starts, 0), START_PATIENCE_DOUBLINGS)",
               "START_PATIENCE_EXPIRIES")
    elif name == "end-before-earlier-windows":
        _patch(stack, checkpoint_plan, "_may_end", "    if missing:\n        return False",
               "    if False:\n        return False")
    elif name == "no-parent-gate":
        never_blocked = lambda *args, **kwargs: []  # noqa: E731
        stack.enter_context(mock.patch.object(lease_life, "blocked_on_parents", never_blocked))
        stack.enter_context(mock.patch.object(planner, "blocked_on_parents", never_blocked))
    elif name == "land-without-fence":
        # The shipped sink with its three fences gone: no resume after the last landed record, no exclusion of
        # what landed batches hold, and every link claim taken for won (a link replaced, never read back).
        stack.enter_context(mock.patch.object(sink.LandingProcessor, "resume_position", lambda self: None))
        stack.enter_context(mock.patch.object(
            sink, "exclude_landed",
            lambda records, prev, landed: exclusion.Exclusion([exclusion.Run(prev, records)] if records else [],
                                                              [], None)))
        _patch(stack, sink.LandingProcessor, "_land_after",
               "if store.put_if_absent(link, link_body(encoded.key.key(), self._holder if starts else None)):",
               "if store.put(link, link_body(encoded.key.key(), self._holder if starts else None)) or True:")
    elif name == "audit-trusts-manifest":
        _patch(stack, lineage, "read_output_counts", "    if raw is None:\n        return None\n",
               "    if raw is None:\n        return OutputCounts(*(__import__('json').loads(output.get(f'{name}/"
               "{output_partition(window_start_ms)}/{MANIFEST}'))['rows'] for name in (TRANSFORMED, QUARANTINE)))\n")
    elif name == "plan-past-missing-batch":
        _patch(stack, checkpoint_plan, "_chain_break",
               "why = None if chain is None else _unproven(shard, current, previous, b, chain)", "why = None")
    elif name == "reconcile-publishes-unchecked":
        _patch(stack, reconcile, "reconcile_window", "if pending is not None and all(o.ok for o in outcomes):",
               "if pending is not None:")
    elif name == "stale-predecessor":
        # Both halves of the fix: either alone keeps the buffer consecutive.
        stack.enter_context(mock.patch.object(sink.LandingProcessor, "_overtaken", lambda self, records, pos: False))
        _patch(stack, sink.LandingProcessor, "_drop_landed",
               "if self._buffer_count and delivered is not None and floor > delivered:",
               "if False:")
    elif name == "stall-unreported":
        unreported = _edited(followup.follow_up, "            stalled.append(start)\n", "            pass\n")
        stack.enter_context(mock.patch.object(followup, "follow_up", unreported))
        stack.enter_context(mock.patch.object(decisions, "follow_up", unreported))  # the sensor tick's name for it
    elif name == "completeness-caught-up-any-time":
        # scan.py's name for the rule is what the sensor's scan calls
        stack.enter_context(mock.patch.object(scan, "window_complete", _edited(
            completeness.window_complete,
            "(caught_up := p.caught_up_at()) is not None and caught_up >= t1 + grace_ms",
            "(caught_up := p.caught_up_at()) is not None")))
    elif name == "completeness-any-held-record":
        stack.enter_context(mock.patch.object(scan, "window_complete", _edited(
            completeness.window_complete, "and p.next_arrival_ms >= t1)", "and p.next_arrival_ms >= window_start_ms)")))
    elif name == "dead-start-link":
        _patch(stack, sink.LandingProcessor, "_follow_chain", "        self._adopt = claim\n", "        pass\n")
    elif name == "plan-past-unmaterialised-window":
        _patch(stack, checkpoint_plan, "_plan_shard", "            blocked = w\n            break\n",
               "            blocked = w\n            continue\n")
    elif name == "refill-forgets-predecessor-key":
        _patch(stack, backfill, "_batch_ending_at",
               "        if batches and max(b.last.key() for b in batches) < position.key():\n            return None",
               "        return None")
    elif name == "unfenced-refill":
        _patch(stack, backfill, "_start_sink", "found = live_predecessor(store, directory, shard_id, first)",
               "found = None")
    elif name == "metrics-in-a-2x-table":
        _patch(stack, cycle, "manager_cycle", "publishing = fleet_mode.publishes_worker_metrics(state.fleet)",
               "publishing = True")
    elif name == "delete-foreign":
        stack.enter_context(mock.patch.object(cycle, "scoped_leases", lambda leases, shards: list(leases)))
    else:
        raise ValueError(f"mutation {name!r} has no planting")


def check_planted(name: str) -> None:
    """Plant mutation `name` once, outside any world: MutationStale when its fragment left the source (a
    mutation that no longer applies must fail loudly, never pass for caught)."""
    world = SimpleNamespace(dynamodb=SimpleNamespace(rewrite=None))
    with contextlib.ExitStack() as stack:
        _plant(name, stack, world)


@contextlib.contextmanager
def active(name: str | None, world: Any) -> Iterator[None]:
    """Run `world` with mutation `name` (None: the shipped code as it is)."""
    if name is None:
        yield
        return
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r} (known: {', '.join(MUTATIONS)})")
    with contextlib.ExitStack() as stack:
        _plant(name, stack, world)
        try:
            yield
        finally:
            world.dynamodb.rewrite = None


__all__ = ["MUTATIONS", "Mutation", "MutationStale", "active", "check_planted"]
