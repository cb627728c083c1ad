"""Every effect a coroutine may yield has a handler in every driver of its family: a driver that leaves an
effect type unhandled fails here, not the first time a worker or a manager yields it."""
from __future__ import annotations

import dataclasses

import pytest

from kcl_pipeline.kcl.core import effects as fx
from kcl_pipeline.kcl.shells.manager import LeaseManager
from kcl_pipeline.kcl.shells.worker import LeaseWorker
from kcl_pipeline.sim.consumer import SimConsumer, SimWorker

# The simulation's Task takes the lease's write lock and runs a Locked body itself (sim/engine.py), so its
# worker's table has no entry for it.
RUN_BY_THE_ENGINE = frozenset({fx.Locked})


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


def unhandled(handlers, family: type[fx.Effect], exempt=frozenset()) -> set[type[fx.Effect]]:
    """The effects of `family` a handler table leaves out."""
    return {effect for effect in concrete_effects() if issubclass(effect, family)} - set(handlers) - exempt


def test_every_effect_belongs_to_a_family_and_is_an_effects_module_class():
    effects = concrete_effects()
    assert fx.Now in effects and fx.Spawn in effects and fx.Acquire in effects
    assert all(issubclass(effect, (fx.LifeEffect, fx.CycleEffect)) for effect in effects)
    assert {effect.__module__ for effect in effects} == {fx.__name__}


@pytest.mark.parametrize("driver, family, exempt", [
    (LeaseWorker, fx.LifeEffect, frozenset()),
    (SimWorker, fx.LifeEffect, RUN_BY_THE_ENGINE),
    (LeaseManager, fx.CycleEffect, frozenset()),
    (SimConsumer, fx.CycleEffect, frozenset()),
], ids=["worker", "sim-worker", "manager", "sim-consumer"])
def test_every_driver_handles_every_effect_of_its_family_and_nothing_else(driver, family, exempt):
    assert unhandled(driver.HANDLERS, family, exempt) == set()
    assert all(issubclass(effect, family) for effect in driver.HANDLERS)


def test_a_table_missing_an_effect_is_caught():
    handlers = {effect: handler for effect, handler in LeaseManager.HANDLERS.items() if effect is not fx.Spawn}
    assert unhandled(handlers, fx.CycleEffect) == {fx.Spawn}
