"""What can go wrong in the landing zone. Every message names the zone URI (and the key, where one is involved).

A failed landing never loses records: nothing is checkpointed past what landed, so the next owner of
the lease re-reads them. These errors stop the worker with a reason an operator can act on.
"""
from __future__ import annotations


class LandingError(RuntimeError):
    """The landing zone could not be used."""


class ZoneNotFoundError(LandingError):
    """The bucket or directory of the zone does not exist (and creating it was not asked for)."""


class ZoneAccessError(LandingError):
    """The zone exists but this process may not read or write it (S3 AccessDenied, an unwritable directory)."""


class ZoneUnavailableError(LandingError):
    """The store did not answer (endpoint unreachable, still failing after the SDK's retries)."""


class CorruptBatchError(LandingError):
    """An object under the zone's batch keys is not a batch this code wrote (unreadable, or its content
    disagrees with its key). Landing stops rather than trust or overwrite it."""


class ForeignStreamError(LandingError):
    """A batch the consumer would follow or trust belongs to another stream of the same name (its footer's stream
    ARN is not the consumer's): its positions mean nothing in this stream, so landing stops, naming both."""


class ChainStartTaken(LandingError):
    """Another holder claimed the shard's start link (TRIM_HORIZON, LATEST, AT_TIMESTAMP) while this one read
    other first records. Not a fault of the zone: the lease is given back, and its next start follows (or
    completes) that chain. Nothing landed is lost."""


class StartEndedEmpty(ChainStartTaken):
    """This holder's claim of the shard's start link met another holder's "ended with nothing landed" claim
    (layout.ENDED_EMPTY): the shard ended, its chain from that start is complete and empty, and this holder —
    paused on its way to the link while its lease moved — lands nothing and stops (its buffer dropped)."""


class LandingConfigError(ValueError):
    """A landing setting is invalid; the message names it and says what is allowed."""
