"""The pure state of one held lease: the fencing counter and the right to deliver."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.lease.lease_hold import LeaseHold, LeaseTiming, Outcome
from kcl_pipeline.kcl.core.model import Checkpoint, Lease

TIMING = LeaseTiming(expiry_seconds=30.0, margin_seconds=3.0)


def held(sent_at: float = 100.0) -> LeaseHold:
    return LeaseHold.acquired(Lease("s", Checkpoint("1"), "me", 8), sent_at, TIMING)


def test_validity_counts_from_when_the_write_was_sent_minus_the_margin():
    hold = held(sent_at=100.0)  # its answer may have come back much later: that does not extend it
    assert hold.valid_until == 127.0
    assert hold.may_deliver(126.99) and not hold.may_deliver(127.0)
    assert hold.held(127.0).lost is not None


def test_a_slow_renewal_extends_from_its_send_time_and_moves_the_counter():
    hold = held().after_renew(Outcome.APPLIED, sent_at=120.0, timing=TIMING, now=125.0)
    assert (hold.counter, hold.valid_until) == (9, 147.0)
    # An answer that arrives after an older one never shortens the validity.
    assert hold.after_renew(Outcome.APPLIED, sent_at=110.0, timing=TIMING, now=126.0).valid_until == 147.0


def test_a_refused_write_loses_the_lease_and_an_error_keeps_it_until_the_validity_passes():
    assert held().after_renew(Outcome.REFUSED, 110.0, TIMING, 111.0).lost
    errored = held().after_renew(Outcome.ERROR, 110.0, TIMING, 111.0)
    assert errored.lost is None and errored.counter == 8 and errored.may_deliver(126.0)
    assert held().after_renew(Outcome.ERROR, 130.0, TIMING, 131.0).lost  # past the validity


def test_end_and_release_move_the_counter_and_stop_delivery():
    ended = held().after_end(Outcome.APPLIED)
    assert ended.ended and ended.counter == 9 and not ended.may_deliver(101.0)
    released = held().after_release(Outcome.APPLIED)
    assert released.lost == "released" and released.counter == 9
    assert held().after_end(Outcome.REFUSED).lost


def test_timing_rejects_a_margin_as_long_as_the_expiry():
    with pytest.raises(ValueError):
        LeaseTiming(10.0, 10.0)
    with pytest.raises(ValueError):
        LeaseHold.acquired(Lease("s", Checkpoint("1")), 0.0, TIMING)


def test_a_write_judged_after_an_unanswered_one_at_its_counter_counts_validity_from_the_earliest_send():
    """The table cannot tell a later write's success from an earlier unanswered one's (its response lost):
    validity counts from the earliest unanswered send at the counter, then from each answered write's own."""
    hold = held(sent_at=100.0)
    hold = hold.after_renew(Outcome.ERROR, sent_at=105.0, timing=TIMING, now=106.0)
    hold = hold.after_renew(Outcome.ERROR, sent_at=110.0, timing=TIMING, now=111.0)
    assert hold.unanswered_since == 105.0 and hold.counter == 8
    applied = hold.after_renew(Outcome.APPLIED, sent_at=115.0, timing=TIMING, now=116.0)
    assert (applied.counter, applied.valid_until, applied.unanswered_since) == (9, TIMING.valid_until(105.0), None)
    assert applied.after_renew(Outcome.APPLIED, 120.0, TIMING, 121.0).valid_until == TIMING.valid_until(120.0)
    refused = hold.after_renew(Outcome.REFUSED, sent_at=115.0, timing=TIMING, now=116.0)
    assert refused.lost and refused.unanswered_since is None


def test_a_hold_past_its_validity_may_not_write_and_a_lost_or_ended_one_stops_its_heartbeats():
    hold = held(sent_at=100.0)
    assert hold.may_write(126.9) and not hold.may_write(127.0)
    assert hold.heartbeats_continue() and not hold.after_end(Outcome.APPLIED).heartbeats_continue()
    assert not hold.after_renew(Outcome.REFUSED, 110.0, TIMING, 111.0).heartbeats_continue()


def test_a_refused_checkpoint_is_reinstated_only_while_the_table_shows_our_owner_and_counter():
    hold = held().after_renew(Outcome.REFUSED, 110.0, TIMING, 111.0)
    assert hold.reinstated(Lease("s", Checkpoint("5"), "me", 8)) == held()
    assert hold.reinstated(Lease("s", Checkpoint("5"), "me", 9)) is None
    assert hold.reinstated(Lease("s", Checkpoint("5"), "thief", 8)) is None
    assert hold.reinstated(None) is None


def test_a_hand_off_asked_of_this_holder_keeps_the_hold_handing_to_the_asker_until_its_last_write():
    refused = held().after_renew(Outcome.REFUSED, 110.0, TIMING, 111.0)
    asked = Lease("s", Checkpoint("5"), "taker", 8, extra={"checkpointOwner": "me"})
    handing = refused.handing_off(asked)
    assert handing is not None and handing.lost is None and handing.handing_to == "taker"
    assert not handing.may_deliver(101.0)
    assert refused.handing_off(Lease("s", Checkpoint("5"), "taker", 9, extra={"checkpointOwner": "me"})) is None
    assert handing.handed_off().lost == "handed off to taker"


def test_the_current_hold_tells_its_driver_of_each_change():
    from kcl_pipeline.kcl.core.lease.lease_hold import CurrentHold

    changes: list[int] = []
    current = CurrentHold(lambda: changes.append(1))
    assert not current.acquired
    with pytest.raises(RuntimeError):
        _ = current.hold
    current.move(held())
    current.move(held())  # the same hold: nothing changed
    current.move(current.hold.after_end(Outcome.APPLIED))
    assert current.acquired and current.hold.ended and len(changes) == 2
