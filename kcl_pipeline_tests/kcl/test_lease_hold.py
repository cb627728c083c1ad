"""The pure state of one held lease: the fencing counter and the right to deliver."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.core.lease_hold import LeaseHold, LeaseTiming, Outcome
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
