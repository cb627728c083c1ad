"""One checkpoint commit of a stream: the work of the `kinesis_checkpoints` asset, without Dagster.

List the landed batches from the stored frontier (`plan_listing_start`) to past the last materialised window
(`plan_listing_end`), plan per shard (checkpoint_plan.py), commit the plan with the lease table's conditional
writes (ending shards and creating their children's leases), and move the frontier on (`next_frontier`). The
report says what was committed, and what the next run and the sensor need: the frontier, and the windows that
received batches after their runs listed the zone (`late`: the sensor requests those windows again).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..kcl.core.model import Checkpoint
from ..transform.manifest import late_batches, read_materialised
from .checkpoint_plan import CheckpointPlan, Committed, apply_plan, plan_checkpoints
from .layout import BatchKey
from .progress import progress_from_leases
from .store import ZoneStore
from .stream_slice import StreamSlice
from .verify import list_batches
from .window_report import earliest_landed_minute, json_position
from .window_scan import next_frontier, plan_listing_end, plan_listing_start, window_floor


@dataclass(frozen=True)
class CheckpointReport:
    plan: CheckpointPlan
    committed: list[Committed]
    materialised_windows: int  # windows whose commit is in (a window counts once its commit is in)
    listed_from_ms: int | None  # where the listing of landed batches starts (None: nothing landed, or no lease)
    late: dict[int, list[str]]  # materialised window -> batches landed in it that its manifest does not name
    frontier: dict[str, int]  # per shard, the window the next run's listing may start at

    @property
    def before_start(self) -> dict[str, int]:
        """Per shard, the batches stepped over because they precede the first partition (never transformed)."""
        return {k: p.before_start for k, p in self.plan.shards.items() if p.before_start}

    @property
    def shard_ends(self) -> list[str]:
        return [c.shard_id for c in self.committed if c.ended]

    @property
    def commits(self) -> int:
        return sum(1 for c in self.committed if c.checkpointed)

    def committed_rows(self) -> list[dict[str, Any]]:
        """JSON-ready: per committed shard its checkpoint, whether it moved, ended, and the children created."""
        return [{"shard_id": c.shard_id,
                 "sequence_number": c.checkpoint.sequence_number if c.checkpoint else None,
                 "sub_sequence_number": c.checkpoint.sub_sequence_number if c.checkpoint else None,
                 "checkpointed": c.checkpointed, "shard_end": c.ended, "children_created": list(c.children_created)}
                for c in self.committed]

    def plan_rows(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: per shard what the plan decided, and why."""
        return {k: {"commit": json_position(p.commit), "end": p.end, "reason": p.reason}
                for k, p in sorted(self.plan.shards.items())}


def commit_checkpoints(lease_table: Any, view: StreamSlice, store: ZoneStore, output: ZoneStore,
                       previous_frontier: Mapping[str, int], *, window_ms: int, first_window_ms: int,
                       initial: Checkpoint, grace_ms: int) -> CheckpointReport:
    """Plan and commit the stream's checkpoints for what has materialised in `output`.

    `view`: the stream's leases and shards from the lease table's scan, named by lease key (a multi-stream
    key: stream + shard); `store`: the landing zone; `previous_frontier`: the last run's frontier;
    `first_window_ms`: the first partition's start; `initial`: where a child's new lease starts."""
    leases, shards = view.leases, view.shards
    committed = read_materialised(output)
    earliest = earliest_landed_minute(store, view.directory)
    zone_start = None if earliest is None else window_floor(earliest, window_ms)
    start = plan_listing_start(zone_start, previous_frontier, leases)
    progress = progress_from_leases(leases)
    end = plan_listing_end(committed.windows, progress, window_ms)
    batches: dict[str, list[BatchKey]] = {}
    if start is not None and end is not None and end > start:
        for b in list_batches(store, view.directory, start, end):
            batches.setdefault(view.lease_key(b.shard_id), []).append(b)
    plan = plan_checkpoints(committed, window_ms, batches, progress, leases, first_window_ms=first_window_ms)
    late = late_batches(committed, [(window_floor(b.minute_ms, window_ms), b.key())
                                    for listed in batches.values() for b in listed])
    written = apply_plan(plan, lease_table, shards=shards, initial=initial)
    frontier = next_frontier(previous_frontier, leases, batches,
                             {c.shard_id: c.checkpoint for c in written if c.checkpoint is not None},
                             progress, grace_ms, window_ms, [s.shard_id for s in shards])
    return CheckpointReport(plan, written, len(committed.windows), start, late, frontier)
