"""The landing zone in the simulation: the shipped in-memory store, watched, and the shipped landing sink on it.

Nothing of the sink is re-implemented here. Every worker process runs the shipped `LandingProcessor`
(zone/sink.py: cuts, exclusion, link fencing, resume discovery, checkpoint choice) over the shipped
`MemoryZoneStore` (zone/store/, `memory://`, which meets the put-if-absent contract the directory and S3
stores meet: one contract test suite runs against all three). What this module adds is what a world needs
around it and the consumers cannot see:

* `SimZone`: one world's zone (a memory store under a name of its own, dropped when the world ends) and the
  ground truth: per user record, how many stored batches hold it (a batch holds every record of its shard
  between its first and last, so the key alone says which), updated on every batch put and every deletion;
* `WatchedStore`: the store a process opens — the same memory zone (stores opened on one name share their
  objects, as processes share a bucket) — which tells the zone of each put, and lets the world kill its
  process at a chosen step of a landing: right after the link was claimed (`after-link`), while the batch
  was being uploaded (`mid-batch`: a multipart upload cut before its footer; the put never shows), or right
  after the batch was written (`after-batch`, before the sink learnt it landed). It also lets the world pause
a process at the put of a link or a batch, inside the flush, past the validity check that let the delivery
start (`zombie-flush`, `stalls`): a GC pause longer than the lease's expiry, after which the process goes on
with the flush it was in, beside the lease's new holder (sim/runtime/pauses.py `InsideCall`).

The world damages the zone too (`lose`, `corrupt`): a batch deleted after it landed, or its bytes altered in
place. `damaged` keeps what is damaged and not repaired (a refill that lands the lost batch again under its own
key repairs it): the shipped audit must fail for each, and the invariants that need the data exempt it.

A crash is the process dying: the store marks the process dead and raises `SimCrash`, which the simulated
worker process swallows where it called into the shell (nothing after it runs, no effect is answered).
"""
from __future__ import annotations

import bisect
import itertools
from typing import Any, Callable

from ...zone.batch import CorruptBatchError, read_batch_info
from ...zone.layout import BatchKey, parse_batch_key
from ...zone.store import MemoryZoneStore
from ..runtime.pauses import InsideCall

Position = tuple[int, str, int]
CRASH_POINTS = ("after-link", "mid-batch", "after-batch")
STALL_POINTS = ("link", "batch")  # paused right before claiming a batch's link, or before putting the batch
_ZONES = itertools.count()


class SimCrash(Exception):
    """The process was killed (SIGKILL) inside a store call: nothing after it runs."""


class ZoneRefused(PermissionError):
    """The zone refused a worker's write (`zone-refuses`): what S3's AccessDenied or a full disk is to a sink."""


class SimZone:
    """One world's landing zone and its ground truth (see the module docstring)."""

    def __init__(self, stream, tag: str = "") -> None:
        self.stream = stream  # the simulated stream: which records lie between a batch's first and last
        self.name = f"sim-zone-{tag}-{next(_ZONES)}"
        self.store = MemoryZoneStore(self.name)
        self.store.ensure_zone(create=True)
        self.landed: dict[tuple[str, Position], int] = {}  # (shard, position) -> stored batches holding it
        self.batches: dict[str, BatchKey] = {}  # stored batch keys
        self.puts = 0
        self.on_land: Callable[[str, tuple[Position, ...]], None] | None = None
        self.on_relanded: Callable[[str], None] | None = None  # a lost batch landed again under its own key
        self.crashes: dict[Any, str] = {}  # actor -> the landing step at which the world kills it
        self.crashed: list[tuple[Any, str]] = []
        # actor -> (the put it pauses at, for how long, whether its whole consumer pauses (a host's stall),
        # whether the pause ends when the lease's new holder starts reading)
        self.stalls: dict[Any, tuple[str, float, bool, bool]] = {}
        self.stalled: list[tuple[Any, str, float, bool, bool]] = []
        self.zombies: dict[str, tuple] = {}  # lease key -> the paused (worker, scope, until, waiters)
        self.inside: list[InsideCall] = []  # calls paused at a put (abandoned when the world ends)
        self.damaged: dict[str, str] = {}  # batch key -> "lost" | "corrupt", while not repaired
        self.ever_damaged: dict[str, str] = {}  # every batch the world damaged (repaired or not)
        # A lost batch's footer claims (its predecessor's position and key), read before the world deleted it:
        # whoever lands it again must make the same claims (Checker.on_relanded).
        self.lost_claims: dict[str, tuple[Any, str | None]] = {}
        # `zone-refuses`: until then (the world's clock) every write of a lease worker is refused.
        self.refusing_until = 0.0
        self.clock: Callable[[], float] = lambda: 0.0

    def refuses(self, actor: Any) -> bool:
        """Whether a write of `actor` is refused now: a worker's (a process), while the zone refuses writes. The
        pipeline's, the auditor's and a refill's (named by a string) are the operator's and go through."""
        return not isinstance(actor, str) and actor is not None and self.clock() < self.refusing_until

    def view(self, actor: Any = None, kill: Callable[[], None] | None = None) -> "WatchedStore":
        return WatchedStore(self, actor, kill)

    def positions(self, key: BatchKey) -> tuple[Position, ...]:
        shard = self.stream.shards.get(key.shard_id)
        if shard is None:
            return ()
        ps = shard.positions
        lo = bisect.bisect_left(ps, key.first.key())
        hi = bisect.bisect_right(ps, key.last.key())
        return tuple(ps[lo:hi])

    def stored(self, name: str) -> None:
        key = parse_batch_key(name)
        if key is None:
            return
        if name in self.batches:
            self.removed(name)  # replaced whole
        self.puts += 1
        self.batches[name] = key
        relanded = self.damaged.get(name) == "lost"
        if relanded:
            del self.damaged[name]  # landed again (a refill): repaired
        positions = self.positions(key)
        landed = self.landed
        for p in positions:
            landed[(key.shard_id, p)] = landed.get((key.shard_id, p), 0) + 1
        if self.on_land is not None:
            self.on_land(key.shard_id, positions)
        if relanded and self.on_relanded is not None:
            self.on_relanded(name)

    def removed(self, name: str) -> None:
        key = self.batches.pop(name, None)
        if key is None:
            return
        landed = self.landed
        for p in self.positions(key):
            n = landed.get((key.shard_id, p), 0) - 1
            if n > 0:
                landed[(key.shard_id, p)] = n
            else:
                landed.pop((key.shard_id, p), None)

    def lose(self, name: str) -> None:
        """The world deletes a landed batch (its links stay, as they would: a lifecycle rule, a person)."""
        self._keep_claims(name)
        self.store.delete([name])
        self.removed(name)
        self.damaged[name] = self.ever_damaged[name] = "lost"

    def corrupt(self, name: str) -> None:
        """The world alters a landed batch's bytes in place, its tail (footer, lengths, magic) among them: the
        records stay, unreadable (its ground truth keeps them). Bytes altered in the data alone, the footer
        intact, are not this fault: the audit reads footers (docs/simulation.md, what it does not cover)."""
        self._keep_claims(name)  # before its footer is altered: a corrupted batch moved away is refilled
        body = self.store.get(name)
        cut = max(0, len(body) - 16)
        self.store.put(name, body[:cut] + bytes(b ^ 0x5A for b in body[cut:]))
        self.damaged[name] = self.ever_damaged[name] = "corrupt"

    def claims(self, name: str) -> tuple[Any, str | None] | None:
        """What the stored batch `name` says of its predecessor (its footer's position and key); None for a
        name that is no batch key, and for an unreadable batch, which makes no claims."""
        key = parse_batch_key(name)
        if key is None:
            return None
        try:
            info = read_batch_info(self.store, key)
        except CorruptBatchError:
            return None
        return info.prev, info.prev_key

    def _keep_claims(self, name: str) -> None:
        if name not in self.lost_claims and (claims := self.claims(name)) is not None:
            self.lost_claims[name] = claims

    def lost_positions(self) -> set[tuple[str, Position]]:
        """The records of the batches lost and not landed again (at settling and the end of a seed only)."""
        out: set[tuple[str, Position]] = set()
        for name, kind in self.damaged.items():
            key = parse_batch_key(name) if kind == "lost" else None
            if key is not None:
                out.update((key.shard_id, p) for p in self.positions(key) if (key.shard_id, p) not in self.landed)
        return out

    def drop(self) -> None:
        for call in self.inside:
            call.abandon(SimCrash("the world ended"))  # a call paused for good ends on its thread
        self.inside.clear()
        self.store.drop()


class WatchedStore(MemoryZoneStore):
    """A process's handle on the zone: the shipped memory store, telling the zone what it stored, and dying
    at the landing step the world chose for its process."""

    def __init__(self, zone: SimZone, actor: Any = None, kill: Callable[[], None] | None = None) -> None:
        super().__init__(zone.name)
        self.sim_zone = zone
        self.actor = actor
        self.kill = kill

    def _crash_at(self, point: str) -> None:
        zone = self.sim_zone
        if self.actor is not None and zone.crashes.get(self.actor) == point:
            del zone.crashes[self.actor]
            zone.crashed.append((self.actor, point))
            if self.kill is not None:
                self.kill()
            raise SimCrash(f"killed {point}")

    def _stall_at(self, point: str) -> None:
        zone = self.sim_zone
        armed = zone.stalls.get(self.actor) if self.actor is not None else None
        call = InsideCall.current
        if armed is not None and armed[0] == point and call is not None:
            del zone.stalls[self.actor]
            zone.stalled.append((self.actor, *armed))
            call.pause(armed[1])

    def _refuse(self, key: str) -> None:
        if self.sim_zone.refuses(self.actor):
            raise ZoneRefused(f"AccessDenied: the zone refuses the write of {key} (zone-refuses)")

    def put_if_absent(self, key: str, body: bytes) -> bool:
        self._refuse(key)
        batch = key.endswith(".parquet")
        if zone_stalls := self.sim_zone.stalls:
            if self.actor in zone_stalls:
                self._stall_at("batch" if batch else "link" if "/after=" in key else "")
        if batch:
            self._crash_at("mid-batch")
        done = super().put_if_absent(key, body)
        if done and batch:
            self.sim_zone.stored(key)
            self._crash_at("after-batch")
        elif done and "/after=" in key:
            self._crash_at("after-link")
        return done

    def put(self, key: str, body: bytes) -> None:
        self._refuse(key)
        super().put(key, body)
        if key.endswith(".parquet"):
            self.sim_zone.stored(key)

    def delete(self, keys: list[str]) -> None:
        super().delete(keys)
        for key in keys:
            self.sim_zone.removed(key)


__all__ = ["CRASH_POINTS", "STALL_POINTS", "SimCrash", "SimZone", "WatchedStore", "ZoneRefused"]
