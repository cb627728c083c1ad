"""One shell, two transports: every effect a coroutine may yield has a handler in its shell (worker.py's
`LeaseWorker`, manager.py's `LeaseManager`) — the one table production and the simulation both run — and
every transport step those handlers yield is answered by both transports (production's `Blocking`, the
simulation's processes). A shell or a transport that leaves one out fails here, not the first time a worker
or a manager meets it."""
from __future__ import annotations

import dataclasses
import inspect
import threading
from pathlib import Path

import pytest

from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.shells import transport
from kcl_pipeline.kcl.shells.fleet import manager as manager_shell
from kcl_pipeline.kcl.shells.fleet.manager import LeaseManager
from kcl_pipeline.kcl.shells.workers import worker as worker_shell
from kcl_pipeline.kcl.shells.workers.worker import LeaseWorker
from kcl_pipeline.sim.actors import consumer as sim_consumer

SIM = Path(sim_consumer.__file__).parent


def concrete_effects() -> set[type[fx.Effect]]:
    """Every effect class the package defines (the dataclasses under Effect; the families are abstract)."""
    found: set[type[fx.Effect]] = set()
    stack: list[type[fx.Effect]] = [fx.Effect]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if dataclasses.is_dataclass(sub) and sub.__module__.startswith("kcl_pipeline."):
                found.add(sub)
    return found


def unhandled(handlers, family: type[fx.Effect]) -> set[type[fx.Effect]]:
    """The effects of `family` a handler table leaves out."""
    return {effect for effect in concrete_effects() if issubclass(effect, family)} - set(handlers)


def test_every_effect_belongs_to_a_family_and_is_an_effects_module_class():
    effects = concrete_effects()
    assert fx.Now in effects and fx.Spawn in effects and fx.Acquire in effects
    assert all(issubclass(effect, (fx.LifeEffect, fx.CycleEffect)) for effect in effects)
    assert {effect.__module__ for effect in effects} == {fx.__name__}


@pytest.mark.parametrize("shell, family", [(LeaseWorker, fx.LifeEffect), (LeaseManager, fx.CycleEffect)],
                         ids=["worker", "manager"])
def test_every_shell_handles_every_effect_of_its_family_and_nothing_else(shell, family):
    assert unhandled(shell.HANDLERS, family) == set()
    assert all(issubclass(effect, family) for effect in shell.HANDLERS)


def test_every_effect_declares_the_answer_it_expects():
    """`answer = yield from effect.ask()` is typed by the parameter of the effect's family (`Check` is a
    `LifeEffect[Status]`): an effect subclassing its family bare would give its coroutines an answer mypy
    cannot check."""
    undeclared = {effect.__name__ for effect in concrete_effects()
                  if not any(getattr(base, "__args__", None) for base in vars(effect).get("__orig_bases__", ()))}
    assert undeclared == set()


def test_a_table_missing_an_effect_is_caught():
    handlers = {effect: handler for effect, handler in LeaseManager.HANDLERS.items() if effect is not fx.Spawn}
    assert unhandled(handlers, fx.CycleEffect) == {fx.Spawn}


def steps_yielded_by(module) -> set[str]:
    """The transport steps a shell module's handlers yield (by name, from its source)."""
    source = inspect.getsource(module)
    return {step.__name__ for step in transport.STEPS if f"{step.__name__}(" in source}


def test_the_shells_yield_only_steps_of_the_transport():
    used = steps_yielded_by(worker_shell) | steps_yielded_by(manager_shell)
    assert used == {step.__name__ for step in transport.STEPS}


def test_production_answers_every_transport_step():
    """Blocking (threads, real calls) answers each step; an unknown step is refused."""
    stop = threading.Event()
    results = __import__("queue").Queue()
    results.put("a result")
    driver = transport.Blocking(lambda effect: None, stop=stop, results=results)

    def body():
        return "locked"
        yield

    thread = driver.step(transport.Background(body(), "t"))
    driver.step(transport.Join(thread, 5))
    answers = [driver.step(transport.Call("x", lambda: 42)), driver.step(transport.Exclusive(body())),
               driver.step(transport.AwaitLoss(0.01, lambda: True)), driver.step(transport.NextResult(1, stop)),
               driver.step(transport.StartProcess("w", lambda: "started"))]
    stop.set()
    answers.append(driver.step(transport.Sleep(5)))
    assert answers == [42, "locked", None, "a result", "started", True]
    with pytest.raises(TypeError, match="no transport step"):
        driver.step(transport.Step())


def test_the_simulation_answers_every_transport_step():
    """The simulated processes answer the same steps (Exclusive is the engine task's own: its lock)."""
    answered = {step.__name__ for step in transport.STEPS
                if f"case {step.__name__}()" in inspect.getsource(sim_consumer.Process.step)}
    assert answered | {"Exclusive"} == {step.__name__ for step in transport.STEPS}
    from kcl_pipeline.sim.runtime.engine import Task
    assert "is Exclusive" in inspect.getsource(Task.resume)


def test_nothing_of_the_shells_is_re_implemented_in_the_simulation():
    """The simulation answers transport steps only: no effect handler of its own, no copy of a shell's."""
    for path in SIM.glob("*.py"):
        source = path.read_text()
        assert "HANDLERS" not in source or path.name == "judge/mutations.py", f"{path.name} has a handler table"
        for name in (".may_write(", ".after_renew(", ".after_release(", "LeaseHold.acquired("):
            assert name not in source, f"{path.name} re-implements the shell's fenced writes ({name})"
