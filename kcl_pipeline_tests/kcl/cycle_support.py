"""Driving one manager cycle (`core.cycle.manager_cycle`) over in-memory answers, for the pure core's tests."""
from __future__ import annotations

import random
from typing import Any, Callable, Collection, Sequence

from kcl_pipeline.kcl.core.fleet import cycle as cyc
from kcl_pipeline.kcl.core.lease import effects as fx
from kcl_pipeline.kcl.core.model import Lease


def drive_cycle(state: cyc.ManagerState, settings: cyc.CycleSettings, leases: Sequence[Lease], now: float, *,
                locally_worked: Collection[str] = frozenset(),
                seen: Callable[[Any], None] = lambda effect: None) -> cyc.CycleResult:
    """One cycle at `now`: the scan returns `leases` (returned at `now`), the listing the state's shards, every
    delete applies; `seen` sees each other effect, which is answered with None."""
    def handle(effect: Any) -> Any:
        if isinstance(effect, fx.Now):
            return now
        if isinstance(effect, fx.ScanTable):
            return fx.Scanned(list(leases), now, now)
        if isinstance(effect, fx.ListShards):
            return state.shards
        if isinstance(effect, fx.Delete):
            return True
        seen(effect)
        return None
    return fx.drive(cyc.manager_cycle(state, settings, locally_worked, random.Random(0)), handle)
