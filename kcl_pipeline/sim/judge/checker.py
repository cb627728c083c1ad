"""The invariants, checked against the world's ground truth as the history unfolds and once it settles.

Ground truth the consumer cannot see: which process made every applied write, when it sent it, every
user record the stream holds, every delivery and every landed copy. Checked at every step:

* no two holders deliver a shard at once, counting Java KCL peers: once another holder (a worker of ours,
  or a Java peer's tenure of the lease) started delivering it, an earlier one never delivers it again. A
  new holder re-delivering what an earlier one delivered after its last checkpoint is the documented
  at-least-once window, not a violation. Stronger, for our workers: when one starts delivering a shard,
  no earlier holder could still deliver it (alive, not asked to stop, its hold valid on its own clock);
* a holder never delivers after its validity: its last check before a delivery happens, on its own clock,
  less than expiry − margin after it sent the last write of its own that DynamoDB applied (not the last
  it believes applied); the delivery itself follows that check within the pause the margin tolerates;
* the fencing token never goes back: a lease's counter only grows (a peer that saw a value before would
  take a live lease for expired);
* after a graceful stop, when the stopped consumer's process exits, none of its workers still holds a
  lease: each let go of what it held (released, ended or handed over), none left it to expire — unless
  the world froze it or cut its network during the stop;
* no checkpoint goes back; none passes an undelivered record; SHARD_END only after every record;
* no record of a child shard before every record of its parents;
* a write the table applied is never reported as not applied (ambiguous outcomes are read back);
* no record is landed twice; leases of other applications and streams, and non-lease items, never change;
* a Java KCL 2.x peer's lease listing never fails: every item of a table it shares is one its serializer reads
  (a non-lease item of ours would stop its taker, its failover and its shard sync);
* no lease stays owned but unworked for longer than one expiry plus one cycle (while a consumer could
  take it over).

Checked once the faults stopped and the fleet settled: every record delivered and landed, every lease of
an open shard owned and worked, and the live consumers balanced — by load within the stated tolerance
while leases report traffic (lease granularity permitting), else within one lease.

The checker is built from narrow inputs, not from the world: the stream, the landing store, the lease
table's items, the foreign items, and a view of the fleet (judge/fleet.py), plus the clock and the trace.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Mapping

from ...kcl.config import ConsumerConfig
from ...kcl.core.fleet.balance import imbalance, reported_load
from ...kcl.core.fleet.planner import START_PATIENCE_EXPIRIES
from ...kcl.core.model import LATEST, Checkpoint
from ...kcl.core.table.lease_codec import lease_from_item
from ...zone.layout import ends_empty, link_key, link_target, parse_batch_key
from ...zone.progress import progress_from_leases
from ..aws.kinesis import SimStream
from ..aws.landing import SimZone
from .fleet import FleetView


def _order(cp: Checkpoint) -> tuple:
    if cp.is_starting_sentinel:
        return (0,)
    if cp.is_shard_end:
        return (2,)
    return (1,) + cp.key()


class Checker:
    def __init__(self, *, stream: SimStream, zone: SimZone, items: Mapping[str, dict],
                 foreign: Mapping[str, dict], fleet: FleetView, config: ConsumerConfig, liveness_slack: float,
                 now: Callable[[], float], note: Callable[[str], None], validity_slack: float = 1e-9,
                 spawn_seconds: float = 0.0, start_seconds: float = 0.0):
        self.stream = stream
        self.zone = zone
        self.items = items          # the lease table's items, live (our leases and everyone else's)
        self.foreign = dict(foreign)  # items of other applications: never to be changed
        self.fleet = fleet
        self.config = config        # the fleet's timings: expiry, cycle, leases taken per cycle
        self.liveness_slack = liveness_slack
        self.spawn_seconds = spawn_seconds  # how long a spawn blocks its manager (slow spawns)
        self.start_seconds = start_seconds  # the longest a worker takes to start past its first start patience
        self.now = now
        self.note = note
        self.violations: list[str] = []
        self.delivered: dict[str, set] = {}
        self.prefix: dict[str, int] = {}
        self.started: set[str] = set()
        self.deliverers: dict[str, list[tuple[tuple[str, int | None], str]]] = {}  # holders, in order
        self.holder: dict[str, Any] = {}
        self.unworked_since: dict[str, tuple[float, tuple]] = {}
        # Lease → the workers of its owner the world froze before their take, seen so far (the liveness clock
        # restarts at each, and counts the manager's start patience: `audit`).
        self.frozen_takers: dict[str, set[int]] = {}
        self.able_before: frozenset[int] = frozenset()
        self.most_orphans = 0
        self.delivered_at: dict[str, float] = {}  # shard -> the last delivery, by anyone
        self.deliveries = 0
        self.redelivered = 0
        self.table_name = config.lease_table
        self.validity_slack = validity_slack
        self.applied_sent: dict[int, float] = {}  # worker serial → send time of its last applied hold write
        self.stops: dict[int, dict[str, Any]] = {}  # id(consumer) → lease → its worker, held when stopped
        self.let_go: dict[tuple[int, str], str] = {}  # (id(consumer), lease) → how its worker let it go
        self.late_owned: set[str] = set()  # leases owned by a write applied after its worker's process ended
        self.gave_up: set[int] = set()  # workers whose own applied write let their lease go: they deliver no more
        self.held_since: dict[int, int] = {}  # worker serial → the order in which it first became a holder
        # Our workers that held a lease when a Java KCL 2.x peer stole it: Java's steal waits for nothing, so the
        # old holder may deliver until its next heartbeat is refused (Java's own at-least-once overlap).
        self.java_stolen_from: set[int] = set()
        self._run_records: dict[str, list] = {}  # pipeline run → the records it transformed (ground truth)
        self.lost_after_commit: set[str] = set()  # batches the world deleted (or corrupted) after a commit named them
        # Those landed again (refilled), each with the shard's checkpoint then: what it had passed is still the
        # world's loss until a run of its window reads the batch again (seed 219).
        self.refilled_behind: dict[str, tuple] = {}
        # The application starts at LATEST (world.py): a shard without parents owes its records from the first
        # of the batch its start link names — what its chain began with — on; before that link, none.
        self.latest_start = False
        self._floors: dict[str, int] = {}

    def violation(self, message: str) -> None:
        if not self.violations:
            self.note(f"VIOLATION {message}")
        self.violations.append(f"t={self.now():.3f}: {message}")

    # -- the lease table -----------------------------------------------------------------------------------
    def on_write(self, table: str, key: str, before: dict | None, after: dict | None, actor: Any,
                 sent_at: float = 0.0) -> None:
        if table != self.table_name:
            return  # the worker metrics table: no lease in it
        if key in self.foreign:
            self.violation(f"{actor} changed {key}, an item this consumer does not own: {before} -> {after}")
            return
        old = lease_from_item(before) if before is not None else None
        new = lease_from_item(after) if after is not None else None
        if new is None:
            self.holder.pop(key, None)
            return
        shard = self.stream.shards.get(key)
        if shard is None:
            self.violation(f"{actor} wrote lease {key}, which is no shard of the stream")
            return
        worker = self.fleet.worker_of(actor)
        if (old is not None and old.is_ended and worker is not None and new.lease_owner == worker.worker_id
                and (old.lease_owner, old.lease_counter) != (new.lease_owner, new.lease_counter)):
            self.violation(f"{actor} acquired {key}, whose shard had already ended (SHARD_END)")
        if old is not None and _order(new.checkpoint) < _order(old.checkpoint):
            self.violation(f"{actor}: the checkpoint of {key} went back from {old.checkpoint} to {new.checkpoint}")
        if old is not None and new.lease_counter < old.lease_counter:
            self.violation(f"{actor}: the counter of {key} went back from {old.lease_counter} to {new.lease_counter} "
                           f"(a write sent at t={sent_at:.3f}): a peer that saw it before takes a live lease for "
                           f"expired")
        cp = new.checkpoint
        if cp.is_shard_end:
            if old is None or not old.checkpoint.is_shard_end:
                missing = len(shard.positions) - self._prefix(key)
                if shard.closed_at is None or missing:
                    self.violation(f"{actor} ended {key} with {missing} records undelivered"
                                   + ("" if shard.closed_at is not None else " (the shard is still open)"))
        elif not cp.is_starting_sentinel:
            if bisect.bisect_right(shard.positions, cp.key()) > self._prefix(key):
                self.violation(f"{actor} checkpointed {key} at {cp}, past an undelivered record")
        if worker is not None and (new.lease_owner != worker.worker_id or new.is_ended):
            # Its release, its end, its last write of a hand-off: a worker sends one only once done delivering
            # (its hold learns of it when the answer comes, which a lost response may delay).
            self.gave_up.add(worker.serial)
        if old is None or (old.lease_owner, old.lease_counter) != (new.lease_owner, new.lease_counter):
            previous = self.holder.get(key)
            if worker is not None and new.lease_owner == worker.worker_id:
                self.holder[key] = worker
                self.held_since.setdefault(worker.serial, len(self.held_since))
                if old is None or old.lease_counter != new.lease_counter:
                    # A write of its hold (acquire, heartbeat): its validity counts from when it was sent.
                    self.applied_sent[worker.serial] = max(sent_at, self.applied_sent.get(worker.serial, sent_at))
                if worker.finished:
                    self.late_owned.add(key)  # applied after its process ended: no stop could release it
                else:
                    self.late_owned.discard(key)
            else:
                # A worker writing a lease it does not own (its release, or its last write of a hand-off)
                # leaves nobody known to hold it until the owner's own write.
                self.holder[key] = actor if new.lease_owner is not None and worker is None else None
                self.late_owned.discard(key)
            self._note_let_go(key, previous, actor, new.lease_owner)

    # -- deliveries ----------------------------------------------------------------------------------------
    def on_deliver(self, worker: Any, shard_id: str, records, java: bool = False, tenure: int | None = None) -> None:
        """A delivery to a processor: one of our workers' (`worker.paused` seconds after its last check), or a
        Java peer's (`java`, in its `tenure` of the lease)."""
        now = self.now()
        positions = [r.position() for r in records] if not java else list(records)
        self.delivered_at[shard_id] = now
        if not java:
            self._check_validity(worker, shard_id, positions[0], now)
        who = ("java", tenure) if java else ("ours", worker.serial)
        deliverers = self.deliverers.setdefault(shard_id, [])
        if not deliverers or deliverers[-1][0] != who:
            if (not java and worker.serial in self.java_stolen_from
                    and any(seen[0] == "java" for seen, _ in deliverers)):
                # Not a new holder: the Java tenure stays the latest, which no earlier holder may follow.
                self.note(f"{worker!r} delivered {shard_id} after a Java KCL 2.x peer stole it (Java's steal "
                          f"waits for nothing; its holder learns at its next heartbeat)")
                who = deliverers[-1][0]
            elif any(seen == who for seen, _ in deliverers):
                self.violation(f"{worker!r} delivered {shard_id} {positions[0][1]}/{positions[0][2]} again after "
                               f"{deliverers[-1][1]} started delivering it: two holders delivered one shard at once")
            elif not java:
                self._check_no_earlier_holder_could_deliver(worker, shard_id)
            if not deliverers or deliverers[-1][0] != who:
                deliverers.append((who, repr(worker)))
        shard = self.stream.shards[shard_id]
        if shard_id not in self.started:
            self.started.add(shard_id)
            for parent_id in shard.parents:
                parent = self.stream.shards[parent_id]
                missing = len(parent.positions) - self._prefix(parent_id)
                if parent.closed_at is None or missing:
                    self.violation(f"{worker!r} delivered the first record of {shard_id} while its parent "
                                   f"{parent_id} has {missing} undelivered records")
        delivered = self.delivered.setdefault(shard_id, set())
        for p in positions:
            if p in delivered:
                self.redelivered += 1
            else:
                delivered.add(p)
        self.deliveries += len(positions)
        self._prefix(shard_id)  # walks the delivered prefix on

    def on_java_steal(self, shard_id: str) -> None:
        """A Java KCL 2.x peer stole `shard_id` (a take of a lease it did not see expire)."""
        self.java_stolen_from.update(worker.serial for worker in self.fleet.workers_by_key(shard_id))

    def on_java_listing_failed(self, peer: Any, key: str | None, why: str) -> None:
        """A Java KCL 2.x peer's listing threw on an item its serializer cannot read."""
        self.violation(f"{peer!r}'s lease listing failed on item {key!r} ({why}): KCL 2.x's "
                       f"DynamoDBLeaseSerializer cannot read it, so its taker, failover and shard sync stop")

    def _check_no_earlier_holder_could_deliver(self, worker: Any, shard_id: str) -> None:
        """A holder starts delivering a shard: no earlier holder of ours may still be able to deliver it —
        alive, not asked to stop, its hold neither lost nor ended and still valid on its own clock. A steal
        waits out the victim's validity, a take by expiry waits for it, a hand-off waits for the holder's last
        write: whether the earlier holder then happens to deliver in the overlap or not, it could have. (A
        later holder still waiting out its steal's expiry is what keeps the two apart, not a risk.)"""
        mine = self.held_since.get(worker.serial, len(self.held_since))
        for other in self.fleet.workers_by_key(shard_id):
            if (other is not worker and other.serial not in self.gave_up
                    and self.held_since.get(other.serial, mine) < mine):
                left = other.could_deliver()
                if left > 0.0:
                    self.violation(f"{worker!r} started delivering {shard_id} while {other!r} could still deliver it "
                                   f"for {left:.3f}s (its clock): its hold is valid and nobody told it otherwise")
                    return

    def _check_validity(self, worker: Any, shard_id: str, position: tuple, now: float) -> None:
        sent = self.applied_sent.get(worker.serial)
        timing = worker.timing
        decided = now - worker.paused  # its last check: the world paused it between that check and this call
        if sent is None:
            self.violation(f"{worker!r} delivered {shard_id} {position[1]}/{position[2]} without any write of its "
                           f"own applied")
            return
        elapsed = (decided - sent) * worker.host.rate  # on the holder's own clock
        validity = timing.expiry_seconds - timing.margin_seconds
        if elapsed >= validity + self.validity_slack:
            self.violation(f"{worker!r} delivered {shard_id} {position[1]}/{position[2]} after its validity: its "
                           f"last check came {elapsed:.3f}s (its clock) after it sent its last write DynamoDB applied "
                           f"(expiry {timing.expiry_seconds}s − margin {timing.margin_seconds}s = {validity}s)")

    # -- graceful stops --------------------------------------------------------------------------------------
    def on_graceful_stop(self, consumer: Any) -> None:
        """SIGTERM to `consumer`: what its workers hold now, and what its manager holds through a back-off, must be
        let go before it exits."""
        self.stops[id(consumer)] = {key: holder for key, holder in self.holder.items()
                                    if getattr(holder, "consumer", None) is consumer or holder is consumer}

    def _note_let_go(self, key: str, previous: Any, actor: Any, owner: str | None) -> None:
        # The holder is a worker of the stopping consumer, or its manager itself: it holds a lease its failed worker
        # kept through the back-off (kcl/core/fleet/retry.py), renewing it under its worker id.
        consumer = previous if any(previous is c for c in self.fleet.consumers) else getattr(previous, "consumer", None)
        if consumer is None or id(consumer) not in self.stops or key not in self.stops[id(consumer)]:
            return
        if (id(consumer), key) in self.let_go:
            return
        if owner == consumer.worker_id and (actor is consumer or getattr(actor, "consumer", None) is consumer):
            # The lease stays with the stopping consumer: its manager renews what a failed worker kept, or a worker
            # it spawned in a cycle the stop caught in flight (a retry, or the take after it killed a stuck worker)
            # takes it. Its release is judged when it comes, and its exit checks nothing of it is still held.
            return
        if actor is previous and previous is not consumer:
            self.let_go[(id(consumer), key)] = "released"
        elif actor is consumer and owner is None:  # its manager released what the stopped worker left in its name
            self.let_go[(id(consumer), key)] = "released by its manager"
        elif previous is consumer:
            self.let_go[(id(consumer), key)] = f"expired: taken by {actor!r} while its manager held it"
        elif previous.working():
            self.let_go[(id(consumer), key)] = f"taken by {actor!r} from its working holder"
        else:
            self.let_go[(id(consumer), key)] = f"expired: taken by {actor!r} after {previous!r} stopped"

    def on_consumer_exit(self, consumer: Any) -> None:
        """The stopped consumer's process exits: none of its workers may still hold a lease, and what they
        held at the stop went by their own writes (or to a taker while they still worked it), not by expiry."""
        held = self.stops.pop(id(consumer), None)
        if held is None or self._disturbed(consumer):
            return
        for key, holder in self.holder.items():
            if (getattr(holder, "consumer", None) is consumer or holder is consumer) and key not in self.late_owned:
                item = self.items.get(key)
                lease = lease_from_item(item) if item is not None else None
                if lease is not None and not lease.is_ended and lease.lease_owner == consumer.worker_id:
                    self.violation(f"{consumer!r} exited after a graceful stop with lease {key} still held by "
                                   f"{holder!r}: it was not released (peers wait for it to expire)")
                    return
        for key in held:
            how = self.let_go.pop((id(consumer), key), None)
            if how is not None and how.startswith("expired"):
                self.violation(f"{consumer!r} stopped gracefully, yet its lease {key} was not released: {how}")
                return

    def _disturbed(self, consumer: Any) -> bool:
        """The world froze the stopping consumer or one of its workers, cut its network, killed one of its
        workers at a landing step (a flush on the way out may be one) or paused one inside a put: a lease it could
        not release is the world's doing."""
        killed = {id(actor) for actor, _ in self.zone.crashed}
        # Paused inside a put (zombie-flush: a GC pause mid-flush, the host stalled): it cannot release meanwhile.
        killed |= {id(stall[0]) for stall in self.zone.stalled}
        if any(id(worker) in killed for worker in self.fleet.workers_of(consumer)):
            return True
        since = consumer.stopped_at
        faults = consumer.host.faults
        if not faults.healthy() or faults.healthy_since > since - 30.0:
            return True
        if max(consumer.group.frozen_until, consumer.manager_scope.frozen_until) > since:
            return True
        return any(worker.scope.frozen_until > since for worker in self.fleet.workers_of(consumer))

    def _floor(self, shard_id: str) -> int | None:
        """The index of the shard's first owed record: 0, or in a LATEST world (a shard without parents) the
        first of the batch its start link names; None while no holder has claimed that link (nothing owed); past its
        last record when the link says the shard ended with nothing landed after LATEST (its holder read LATEST
        after the shard had closed, and claimed the start for that: nothing of the shard is owed)."""
        if not self.latest_start:
            return 0
        floor = self._floors.get(shard_id)
        if floor is not None:
            return floor
        shard = self.stream.shards[shard_id]
        if shard.parents:
            return 0
        body = self.zone.store.get_optional(link_key(self.stream.name, 0, shard_id, Checkpoint(LATEST)))
        target = link_target(body) if body is not None else None
        if ends_empty(target):
            # Claimed at the shard's end (the shard had closed: its records are final), never to change.
            self._floors[shard_id] = floor = len(shard.positions)
            return floor
        first = parse_batch_key(target) if target is not None else None
        if first is None:
            return None
        self._floors[shard_id] = floor = bisect.bisect_left(shard.positions, first.first.key())
        return floor

    def _prefix(self, shard_id: str) -> int:
        """How many of the shard's records are owed-and-delivered or not owed, from its first on: every record
        before this index was delivered or is before the shard's first owed record. A record an operator's
        backfill landed counts as delivered (seed 9039 of the opt-in kinds: a refill of a minute landed a LATEST
        shard's first records, adopting the start link its dead first holder had claimed, before any holder
        delivered them; the window committed them and the pipeline's checkpoint passed them, as it must)."""
        floor = self._floor(shard_id)
        shard = self.stream.shards[shard_id]
        if floor is None:
            return len(shard.positions)  # nothing owed yet
        prefix = max(self.prefix.get(shard_id, 0), floor)
        delivered = self.delivered.get(shard_id, set())
        landed = self.zone.landed
        positions = shard.positions
        while prefix < len(positions) and (positions[prefix] in delivered or (shard_id, positions[prefix]) in landed):
            prefix += 1
        self.prefix[shard_id] = prefix
        return prefix

    def on_land(self, shard_id: str, positions) -> None:
        """No record in two batches of a shard's live chain (checked as each batch lands; a refill lands only
        what is missing)."""
        landed = self.zone.landed
        for p in positions:
            if landed[(shard_id, p)] > 1:
                self.violation(f"record {shard_id} {p[1]}/{p[2]} is in two batches of the shard's chain "
                               f"(landed twice)")
                return
        for name in self.lost_after_commit:
            if name in self.refilled_behind or name in self.zone.damaged or name not in self.zone.batches:
                continue
            if self.zone.batches[name].shard_id == shard_id and (item := self.items.get(shard_id)) is not None:
                cp = lease_from_item(item).checkpoint
                if not cp.is_sentinel:
                    self.refilled_behind[name] = cp.key()

    # -- the pipeline (sim/actors/pipeline.py) --------------------------------------------------------------------
    def _transformed(self, pipeline: Any, commit: Any) -> list[tuple[str, tuple[int, str, int]]]:
        """The records the run a commit names really transformed (its ground truth: the batches it read less the
        rows it dropped), cached per run."""
        cached = self._run_records.get(commit.run_id)
        if cached is None:
            names, dropped = pipeline.runs_read.get(commit.run_id, (commit.batches, frozenset()))
            cached = []
            for name in names:
                key = parse_batch_key(name)
                if key is not None:
                    cached += [(key.shard_id, p) for p in self.zone.positions(key) if (key.shard_id, p) not in dropped]
            self._run_records[commit.run_id] = cached
        return cached

    def on_batch_lost(self, name: str, pipeline: Any) -> None:
        """The world is about to delete or corrupt a landed batch: lost after a commit named it when a published
        commit names it (a corrupted batch is moved away later, lost then, perhaps after a re-run withdrew that
        commit: seed 3368), or a commit the world deleted before did (seed 6811: the checkpoints passed the window
        while its commit stood; the world deleted the commit, then lost the batch — the window's records are the world's
        loss, as when the batch goes first)."""
        if pipeline.named(name):
            self.lost_after_commit.add(name)

    def on_relanded(self, name: str) -> None:
        """A lost batch landed again under its own key (a refill, or a holder re-landing it) makes the claims the
        batch it replaces made: its footer names the same predecessor position, and the same predecessor key
        while the zone holds that batch (a refill looks it up; a predecessor lost too is named by position
        alone). The chain is followed back by those claims; a refill naming no predecessor where the live writer
        named one would leave the audit to judge the batch as a chain's start."""
        claims = self.zone.lost_claims.get(name)
        now = self.zone.claims(name) if name in self.zone.batches else None
        if claims is None or now is None:
            return
        (prev, prev_key), (now_prev, now_key) = claims, now
        if now_prev != prev:
            self.violation(f"lost batch {name} landed again naming predecessor {now_prev}, where the batch it "
                           f"replaces named {prev}")
        elif now_key != prev_key and (prev_key is None or prev_key in self.zone.batches):
            self.violation(f"lost batch {name} landed again naming predecessor key {now_key}, where the "
                           f"batch it replaces named {prev_key}"
                           + (", which the zone holds" if prev_key is not None else ""))

    def on_refilled(self, name: str) -> None:
        """After an operator's refill of the lost batch `name`: when the zone holds every record of it again, it
        holds the batch itself. The live link after its predecessor names that key; records landed again under
        other keys (a refill that started a chain of its own and cut where its buffer flushed: issue 20's unfenced
        refill) leave the chain broken for ever with no record missing, which the audit would report as damage
        nobody could repair."""
        key = parse_batch_key(name)
        if key is None or self.zone.damaged.get(name) != "lost":
            return
        positions = self.zone.positions(key)
        if positions and all((key.shard_id, p) in self.zone.landed for p in positions):
            others = sorted(other for other, k in self.zone.batches.items() if k.shard_id == key.shard_id
                            and k.first.key() <= key.last.key() and key.first.key() <= k.last.key())
            self.violation(f"a refill landed lost batch {name}'s records under other keys ({', '.join(others)}): "
                           f"the live link still names {name}, and the chain is broken with no record missing")

    def _exempt(self, pipeline: Any, commits: Mapping[int, Any]) -> set[tuple[str, tuple[int, str, int]]]:
        """Records whose window the world damaged after it was committed, and which no commit holds now: a
        deleted commit, a corrupted batch its re-run cannot read, a batch lost after the commit named it (the
        re-run no longer finds it; once refilled, what the checkpoint had passed by then, until a run reads it
        again). The shipped audit must fail those windows instead (`audit_at_end`). And
        records of a window whose re-run withdrew its commit and has not committed it again."""
        window_ms = pipeline.window_ms
        windows = {w for w in pipeline.deleted if w not in commits}
        # A re-run withdrew the window's commit before rewriting it (seed 353: it crashed after its datasets);
        # the sensor follows the window until a run commits it again, and the settling checks that one does.
        windows |= {w for w in pipeline.withdrawn if w not in commits}
        for name, kind in self.zone.damaged.items():
            key = parse_batch_key(name)
            if key is None:
                continue
            w = key.minute_ms - key.minute_ms % window_ms
            if w not in commits and (kind == "corrupt" or name in self.lost_after_commit):
                windows.add(w)
        # A batch lost after a commit named it, not repaired yet: its records are gone from the zone, even when a
        # later run of its window committed without them (seed 1394: a re-run for late batches); the audit must
        # fail the window until the batch is refilled and the window run again.
        lost = [k for name in self.lost_after_commit if name in self.zone.damaged
                and (k := parse_batch_key(name)) is not None]
        # Such a batch refilled stays the world's loss, as far as the checkpoint had passed it when it landed again,
        # until a run of its window reads it again (seed 219: lost after run 1 named it and the checkpoint passed
        # it, left out by run 2 — a re-run for late batches —, then refilled by an operator's backfill left to the
        # live side on another shard, which re-runs nothing: the window's next run waits on the sensor).
        behind = {(k.shard_id, p) for name, upto in self.refilled_behind.items()
                  if (k := parse_batch_key(name)) is not None for p in self.zone.positions(k) if p <= upto}
        if not windows and not lost:
            return behind
        keys = [k for k in self.zone.batches.values() if k.minute_ms - k.minute_ms % window_ms in windows]
        keys += [k for name in self.lost_after_commit if (k := parse_batch_key(name)) is not None
                 and k.minute_ms - k.minute_ms % window_ms in windows]
        return behind | {(k.shard_id, p) for k in (*keys, *lost) for p in self.zone.positions(k)}

    def on_pipeline_tick(self, pipeline: Any) -> None:
        """After each pipeline tick: every window the sensor reported complete holds every record that arrived in
        it, landed; every record at or below a shard's checkpoint is in exactly one committed window (transformed
        by the run a published commit names, output or quarantine alike — the run's ground truth, not the
        commit's word), and every window that failed for good is reported stalled once it is overdue."""
        reported, pipeline.reported = pipeline.reported, []
        for window, when in reported:
            missing = self._unlanded_in(window, window + pipeline.window_ms)
            if missing:
                shard_id, p = missing
                self.violation(f"the sensor reported window {window} complete at {when} while {shard_id}'s record "
                               f"{p[1]}/{p[2]}, which arrived in it, had not landed")
                return
        commits = pipeline.committed()
        copies: dict[tuple[str, tuple[int, str, int]], int] = {}
        for commit in commits.values():
            for record in self._transformed(pipeline, commit):
                copies[record] = copies.get(record, 0) + 1
        exempt: set[tuple[str, tuple[int, str, int]]] | None = None
        for shard_id, shard in self.stream.shards.items():
            item = self.items.get(shard_id)
            if item is None:
                continue
            cp = lease_from_item(item).checkpoint
            if cp.is_shard_end:
                # Ended, judged as it happens (not only on clean histories at the end): every record of a window
                # before the one holding the shard's last record is in a committed window. That last window may
                # wait for the children, born in it (windows/checkpoints/plan.py).
                upto = self._before_last_window(shard, pipeline.window_ms)
            elif cp.is_sentinel:
                continue
            else:
                upto = bisect.bisect_right(shard.positions, cp.key())
            for p in shard.positions[self._floor(shard_id) or 0:upto]:
                n = copies.get((shard_id, p), 0)
                if n == 0:
                    if exempt is None:
                        exempt = self._exempt(pipeline, commits)
                    if (shard_id, p) in exempt:
                        continue  # its window was damaged by the world: the audit must say so
                if n != 1:
                    if cp.is_shard_end:
                        what = (f"{shard_id} was ended (SHARD_END) while record {p[1]}/{p[2]}, of a window before "
                                f"its last record's,")
                    else:
                        what = (f"{shard_id}'s checkpoint {cp.sequence_number}/{cp.sub_sequence_number} passed "
                                f"record {p[1]}/{p[2]}, which")
                    self.violation(f"{what} is in {n} committed windows (must be exactly one)")
                    return
        for start, ok in pipeline.deleted_audits:
            if ok:
                self.violation(f"window {start}'s commit was deleted, and the shipped audit reports it OK")
                return
        now_ms = pipeline.now_ms
        for start in sorted(pipeline.failing_for_good()):
            due = pipeline.stall_report_due_ms(start)
            if due is None:
                continue  # not reported (complete) yet, or before the sensor's first window: never run (seed 278)
            if now_ms >= due and start not in pipeline.stalled and start not in commits:
                self.violation(f"window {start} failed for good and was not reported stalled {now_ms - start} ms "
                               f"after its start")
                return

    @staticmethod
    def _before_last_window(shard: Any, window_ms: int) -> int:
        """How many of the shard's positions arrived in windows before the window of its last record."""
        if not shard.records:
            return 0
        last_window_s = int(shard.records[-1].arrival * 1000) // window_ms * window_ms / 1000
        cut = bisect.bisect_left(shard.records, last_window_s, key=lambda r: r.arrival)
        return sum(len(record.positions) for record in shard.records[:cut])

    def _unlanded_in(self, t0: int, t1: int) -> tuple[str, tuple[int, str, int]] | None:
        """A record that arrived in [t0, t1) and is owed but not landed (the completeness rule's promise for a
        window it calls complete), or None. Not owed: a record before its shard's first owed one, or of a shard
        the stream no longer lists (the retention check judges those); a record of a batch the world damaged is
        the world's loss."""
        damaged: set[tuple[str, tuple[int, str, int]]] | None = None
        landed = self.zone.landed
        for shard_id, shard in self.stream.shards.items():
            floor = self._floor(shard_id)
            if shard.trimmed or floor is None:
                continue
            first_owed = shard.positions[floor] if floor < len(shard.positions) else None
            lo = bisect.bisect_left(shard.records, t0 / 1000, key=lambda r: r.arrival)
            hi = bisect.bisect_left(shard.records, t1 / 1000, key=lambda r: r.arrival)
            for record in shard.records[lo:hi]:
                for p in record.positions:
                    if (shard_id, p) in landed or first_owed is None or p < first_owed:
                        continue
                    if damaged is None:
                        damaged = {(k.shard_id, q) for name in self.zone.ever_damaged
                                   if (k := parse_batch_key(name)) is not None for q in self.zone.positions(k)}
                    if (shard_id, p) not in damaged:
                        return shard_id, p
        return None

    def _damaged_windows(self, window_ms: int, kind: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for name, what in self.zone.damaged.items():
            key = parse_batch_key(name)
            if key is not None and what == kind:
                out.setdefault(key.minute_ms - key.minute_ms % window_ms, []).append(name)
        return out

    def pipeline_settled(self, pipeline: Any) -> list[str]:
        """Once the faults stopped: every window overdue is committed, and each shard's checkpoint reaches its last
        landed record (or the shard ended). Exempt: a window holding a corrupted batch (no run can read it: the
        audit must fail it), a window whose commit the world deleted that holds no batch (nothing is owed, nothing
        runs it again and the audit passes it: seed 391), a shard with a lost batch not landed again (the
        checkpoint stops at the gap)."""
        problems: list[str] = []
        commits = pipeline.committed()
        now_ms = pipeline.now_ms
        corrupt = self._damaged_windows(pipeline.window_ms, "corrupt")
        holding = {k.minute_ms - k.minute_ms % pipeline.window_ms for k in self.zone.batches.values()}
        lost_shards = {k.shard_id for name in self._damaged_windows(pipeline.window_ms, "lost").values()
                       for n in name if (k := parse_batch_key(n)) is not None}
        start = max(pipeline.first_window_ms, pipeline.reports_from or pipeline.first_window_ms)
        while start + pipeline.window_ms + pipeline.overdue_ms <= now_ms:
            if start >= pipeline.cursor and start in holding:
                problems.append(f"window {start} holds landed batches and the sensor never reported it complete "
                                f"(its next window is {pipeline.cursor})")
            elif (start not in commits and start < pipeline.cursor and start not in corrupt
                    and (start in holding or start not in pipeline.deleted)):
                problems.append(f"window {start} is not committed"
                                + (" (reported stalled)" if start in pipeline.stalled else ""))
            start += pipeline.window_ms
        if any(w not in commits for w in corrupt):
            return problems  # every shard may wait behind the window no run can read
        for shard_id, shard in self.stream.shards.items():
            item = self.items.get(shard_id)
            if item is None or shard.trimmed or shard_id in lost_shards:
                continue
            cp = lease_from_item(item).checkpoint
            landed = [p for p in shard.positions if (shard_id, p) in self.zone.landed]
            if cp.is_shard_end or not landed:
                continue
            if cp.is_sentinel or cp.key() < landed[-1]:
                problems.append(f"{shard_id}'s checkpoint {cp.sequence_number} is before its last landed record "
                                f"{landed[-1][1]}")
        return problems

    def _shipped_audit(self, pipeline: Any, store: Any, directory: str, now_ms: int, grace_ms: int):
        """What `kcl-pipeline audit` runs (the whole history, incrementally: its index is kept in the output), the
        windowed audit over every window up to now's, and `landing verify`; verify must agree with the
        audit's chain check."""
        from ...audit.stream import audit
        from ...audit.verify import verify_zone

        window_ms = pipeline.window_ms
        leases = [lease_from_item(item) for key, item in self.items.items() if key in self.stream.shards]
        history = audit(store.uri, pipeline.output.uri, directory, window_ms, store=store, output=pipeline.output,
                        leases=leases, now_ms=now_ms, transform_grace_ms=grace_ms,
                        first_window_ms=pipeline.first_window_ms, workers=1)
        last = now_ms - now_ms % window_ms + window_ms  # every window up to now's
        windowed = audit(store.uri, pipeline.output.uri, directory, window_ms, store=store, output=pipeline.output,
                         leases=leases, now_ms=now_ms, transform_grace_ms=grace_ms,
                         window=(pipeline.first_window_ms, last))
        verified = verify_zone(store.uri, stream=directory, store=store)
        chain_ok = all(o.ok for o in history.outcomes if o.check == "chain")
        if verified.ok != chain_ok:
            self.violation(f"landing verify says {'OK' if verified.ok else 'BROKEN'}, the audit's chain check "
                           f"{'OK' if chain_ok else 'FAILED'}: " + "; ".join(
                               (verified.lines() if not verified.ok else history.lines())[:6]))
        return (("the whole-history audit", history), ("the windowed audit", windowed)), verified

    def audit_damage(self, pipeline: Any, store: Any, directory: str, now_ms: int, grace_ms: int) -> None:
        """Before the operator repairs damage: the shipped audit and verify report FAILED for every batch lost
        or corrupted, naming its window (or, for a loss, the window of the batch that follows it); a shard's last
        batch lost once a batch after it or its lease's landing progress names it."""
        audits, verified = self._shipped_audit(pipeline, store, directory, now_ms, grace_ms)
        if self.violations:
            return
        damaged = dict(self.zone.damaged)
        window_ms = pipeline.window_ms
        for name, report in audits:
            failed = {o.window_start_ms for o in report.outcomes if not o.ok and not o.whole_history}
            for key_name, kind in sorted(damaged.items()):
                key = parse_batch_key(key_name)
                if key is None:
                    continue
                named = {key.minute_ms - key.minute_ms % window_ms}
                after = [k for k in self.zone.batches.values()
                         if k.shard_id == key.shard_id and k.first.key() > key.last.key()]
                if kind == "lost" and after:
                    nxt = min(after, key=lambda k: k.first.key())
                    named.add(nxt.minute_ms - nxt.minute_ms % window_ms)
                elif kind == "lost" and not self._progress_reaches(key.shard_id, key.last):
                    # A shard's last batch lost before its holder reported it (a frozen holder's heartbeat): no
                    # footer and no landing progress names it, so no audit can yet. Judged again at the end,
                    # when a batch after it or the progress has shown, unless a refill brought it back.
                    continue
                if not failed & named:
                    self.violation(f"batch {key_name} is {kind}, and {name} does not fail its window "
                                   f"({'OK' if report.ok else 'failed: ' + str(sorted(failed))})")
                    return
        if damaged and verified.ok:
            self.violation(f"batches {sorted(damaged)} are lost or corrupted, and landing verify says OK")

    def _progress_reaches(self, shard_id: str, last: Checkpoint) -> bool:
        """Whether the shard's lease says its holder landed records up to `last` (its landing progress)."""
        item = self.items.get(shard_id)
        progress = progress_from_leases([lease_from_item(item)]).get(shard_id) if item is not None else None
        return progress is not None and progress.landed is not None and progress.landed.key() >= last.key()

    def audit_at_end(self, pipeline: Any, store: Any, directory: str, now_ms: int, grace_ms: int) -> None:
        """At the end of a seed: the shipped audit and verify OK on a clean history (every damage repaired:
        refilled batches included); FAILED naming the window of any damage the operator could not repair."""
        if self.zone.damaged:
            self.audit_damage(pipeline, store, directory, now_ms, grace_ms)
            return
        audits, verified = self._shipped_audit(pipeline, store, directory, now_ms, grace_ms)
        if self.violations:
            return
        for name, report in audits:
            if not report.ok:
                self.violation(f"{name} FAILED a clean history: " + "; ".join(
                    line for line in report.lines() if "FAILED" in line)[:600])
                return
        if not verified.ok:
            self.violation("landing verify reports a broken chain in a clean history: " + "; ".join(
                verified.lines())[:600])

    def verify_at_end(self, store: Any, directory: str) -> None:
        """A world without the pipeline (no damage struck): landing verify finds every chain unbroken."""
        from ...audit.verify import verify_zone

        verified = verify_zone(store.uri, stream=directory, store=store)
        if not verified.ok:
            self.violation("landing verify reports a broken chain in an undamaged zone: "
                           + "; ".join(line for line in verified.lines() if "BROKEN" in line or "gap" in line
                                       or "overlap" in line or "corrupt" in line)[:600])

    def on_trim(self, shard_id: str) -> None:
        shard = self.stream.shards[shard_id]
        missing = len(shard.positions) - self._prefix(shard_id)
        if missing:
            self.violation(f"{shard_id} left the stream (retention) with {missing} records never delivered")

    # -- liveness ------------------------------------------------------------------------------------------
    def owned_leases(self):
        for key, shard in self.stream.shards.items():
            item = self.items.get(key)
            if item is not None:
                yield key, shard, lease_from_item(item)

    def worked(self, key: str, owner: str) -> bool:
        for worker in self.fleet.workers_by_key(key):
            if worker.worker_id == owner and worker.working():
                return True
        # Its owner holds it through a back-off after its worker failed: a retry is due then, not a failover.
        if any(consumer.worker_id == owner and consumer.retrying(key) for consumer in self.fleet.consumers):
            return True
        return any(peer.works(key) for peer in self.fleet.java_peers)

    def audit(self) -> None:
        """Every few seconds: owned-but-unworked leases (a failover that does not happen)."""
        now = self.now()
        able_now = frozenset(id(c) for c in self.fleet.consumers if c.able())
        able = bool(able_now)
        # Under a KCL 3.x leader our consumers follow: the leader is the one that reassigns an expired lease, and
        # a restarted leader first watches each lease for an expiry of its own. Its crash restarts the clock.
        able_now |= frozenset(id(peer) for peer in self.fleet.java_peers if peer.leads())
        # A consumer that could take over and then could not (crashed, frozen, cut off) restarts the clock:
        # whoever takes over instead must first watch the lease unchanged for an expiry of its own.
        lost_taker = bool(self.able_before - able_now)
        self.able_before = able_now
        owned = list(self.owned_leases())
        # A consumer takes `leases_to_acquire` leases per cycle, and runs a cycle at each look between cycles
        # (every expiry/4) that finds an expired lease: many leases orphaned at once take a look each.
        # The queue is as long as the most orphans seen at once since the orphaning began.
        # Free leases compete for the same takes (children of a reshard, leases released by a graceful stop):
        # they count in the queue too, as long as they are takeable.
        orphans = sum(1 for key, shard, lease in owned if not lease.is_ended and not shard.trimmed and (
            (lease.lease_owner is not None and not self.worked(key, lease.lease_owner))
            or (lease.lease_owner is None and not self._blocked(lease))))
        self.most_orphans = max(self.most_orphans, orphans) if orphans else 0
        config = self.config
        queue = max(0, self.most_orphans - config.leases_to_acquire) * config.lease_expiry_seconds / 4
        # Slow spawns stretch a manager's cycle by its spawns (its takes and a steal), and a stuck worker is seen
        # one stretched cycle after its lease changed and abandoned the next.
        spawning = 2 * (config.leases_to_acquire + 1) * self.spawn_seconds
        # Worker starts longer than the first start patience: the first worker is killed once that has passed, the
        # next one (a cycle or so later, twice as patient) takes the lease once it has started.
        if self.start_seconds:
            spawning += (START_PATIENCE_EXPIRIES * config.lease_expiry_seconds + 2 * config.cycle_seconds
                         + self.start_seconds)
        bound = config.lease_expiry_seconds + config.cycle_seconds + self.liveness_slack + queue + spawning
        for key, shard, lease in owned:
            if lease.lease_owner is None or lease.is_ended or shard.trimmed or self.worked(key, lease.lease_owner):
                self.unworked_since.pop(key, None)
                self.frozen_takers.pop(key, None)
                continue
            # The bound counts from the last take: each new holder (itself frozen, say) gets its own.
            taker = (lease.lease_owner, getattr(self.holder.get(key), "serial", None))
            since, owner = self.unworked_since.get(key, (None, None))
            # Worked between two looks (a Java peer's short tenure, taken and lost again): its clock restarts.
            worked_since = since is not None and self.delivered_at.get(key, -1.0) >= since
            # A worker its owner spawned to take the lease over, frozen before its take (a frozen holder's
            # replacement): like a consumer that could take over and then could not, it
            # restarts the clock, and its manager kills it only once its start patience has passed (a worker may
            # take that long to start: planner.start_patience), not one expiry.
            frozen = {w.serial for w in self.fleet.workers_by_key(key)
                      if w.worker_id == lease.lease_owner and w.frozen_before_take()}
            seen = self.frozen_takers.setdefault(key, set())
            frozen_taker = bool(frozen - seen)
            seen |= frozen
            lease_bound = bound + (START_PATIENCE_EXPIRIES - 1) * config.lease_expiry_seconds if seen else bound
            if since is None or not able or lost_taker or owner != taker or worked_since or frozen_taker:
                self.unworked_since[key] = (now, taker)
                continue
            if now - since > lease_bound:
                self.violation(f"lease {key} owned by {lease.lease_owner} has not been worked for {now - since:.1f}s "
                               f"(bound: expiry + cycle + {self.liveness_slack:.0f}s"
                               + (f" + {queue:.1f}s for {self.most_orphans} orphaned leases" if queue else "")
                               + (f" + {spawning:.1f}s for slow spawns"
                                  + (" and starts" if self.start_seconds else "") if spawning else "")
                               + (f" + {lease_bound - bound:.0f}s of start patience for a worker frozen before its "
                                  f"take" if lease_bound > bound else "") + ")")
                self.unworked_since[key] = (now, taker)

    def settled(self) -> list[str]:
        """What still keeps the fleet from having settled (empty: it has)."""
        fleet = self.fleet
        problems: list[str] = []
        for shard_id, shard in self.stream.shards.items():
            missing = len(shard.positions) - self._prefix(shard_id)
            if missing:
                problems.append(f"{shard_id} has {missing} of {len(shard.positions)} records never delivered")
            if fleet.landing_checked():
                lost = self.zone.lost_positions() if self.zone.damaged else set()
                floor = self._floor(shard_id)
                unlanded = 0 if floor is None else sum(
                    1 for p in shard.positions[floor:] if (shard_id, p) not in self.zone.landed
                    and (shard_id, p) not in lost)
                if unlanded:
                    problems.append(f"{shard_id} has {unlanded} records never landed")
        live = fleet.live_worker_ids()
        counts = {worker_id: 0 for worker_id in live}
        held: dict[str, dict[str, float | None]] = {worker_id: {} for worker_id in live}
        for key, shard, lease in self.owned_leases():
            if shard.trimmed or lease.is_ended:
                continue
            read_to_end = shard.closed_at is not None and self._prefix(key) == len(shard.positions)
            if read_to_end and lease.lease_owner is None:
                continue  # read to its end; waits for its parents' or its own end
            if lease.lease_owner is None:
                if not self._blocked(lease):
                    problems.append(f"lease {key} is not owned by anyone")
                continue
            if lease.lease_owner in counts:
                counts[lease.lease_owner] += 1
                held[lease.lease_owner][key] = reported_load(lease)
            if not self.worked(key, lease.lease_owner):
                problems.append(f"lease {key} is owned by {lease.lease_owner} but nobody works it")
        if counts and not fleet.java_peers:
            problem = imbalance(held)
            if problem:
                problems.append(problem)
        return problems

    def _blocked(self, lease) -> bool:
        for parent in lease.parent_shard_ids:
            item = self.items.get(parent)
            if item is not None and lease_from_item(item).checkpoint.sequence_number != "SHARD_END":
                return True
        return False


__all__ = ["Checker"]
