"""What the validity margin absorbs: the documented tolerance of the lease protocol's timing.

A holder delivers only while `its clock < send time of its last applied write + expiry − margin`
(lease_hold.py). A peer takes a lease by expiry only once it has watched the lease unchanged for a whole
expiry on *its* clock, from when it observed the write (after the write was applied, so after it was
sent). Two things can make the holder deliver after that peer's take, and the margin must cover both:

* clock rates: the holder's clock running slow stretches its validity in true time; the peer's running
  fast shortens the expiry it waits. Hosts' monotonic clocks must run within `CLOCK_RATE_TOLERANCE` of true
  time (NTP-disciplined clocks are within a few parts per million; 2 % is a badly broken clock);
* the pause between the last validity check and the delivery (the processor called): a garbage
  collection, a busy host. It must stay under `tolerated_pause(...)`: with the default margin (a tenth of
  the expiry) and clocks at the tolerance, 6 % of the expiry (1.8 s of the default 30 s, 0.6 s of Java's
  10 s).

Longer pauses elsewhere (between a poll and the check, in the heartbeat) are no danger: the next check
sees them, and the holder stops. The simulation draws clock rates and pauses up to these bounds
(sim/world.py), and longer pauses where the protocol must notice them.
"""
from __future__ import annotations

CLOCK_RATE_TOLERANCE = 0.02  # |rate − 1| of every host's monotonic clock


def tolerated_pause(expiry_seconds: float, margin_seconds: float,
                    rate_tolerance: float = CLOCK_RATE_TOLERANCE) -> float:
    """The longest pause (true seconds) between a holder's last validity check and its delivery that the
    margin covers when every clock runs within `rate_tolerance`: the earliest take by expiry (a fast peer
    clock) less the latest end of the holder's validity (a slow holder clock), both from the write's send."""
    earliest_take = expiry_seconds / (1 + rate_tolerance)
    latest_validity = (expiry_seconds - margin_seconds) / (1 - rate_tolerance)
    return max(0.0, earliest_take - latest_validity)


__all__ = ["CLOCK_RATE_TOLERANCE", "tolerated_pause"]
