"""Where landed batches live: the zone URI and the deterministic key scheme.

Layout (the same for S3 and a local directory; `/` separated, relative to the zone root):

    <stream>/dt=YYYY-MM-DD/hh=HH/mm=MM/<shard_id>/<firstSeq>_<firstSub>-<lastSeq>_<lastSub>.parquet

`<stream>` is the stream's directory (`landing_directory`, the one place that names it):

* `<name>@<region>@<account>` for a stream configured by its ARN: two streams of one name in other accounts
  or regions land side by side, never onto each other's chains;
* `<name>` for a stream configured by its name (the stream of that name in the consumer's own account and
  region: the layout zones were written in before stream identity, read and written as it was);
* `<name>@<creationEpoch>` for a stream incarnation of a multi-stream application.

Whichever the directory, every batch's footer records the stream's ARN (batch.py, `stream_arn`), so a
consumer refuses a chain of another stream's batches and `landing verify` reports them.

* grouped by the records' ApproximateArrivalTimestamp minute, so a batch's key never depends
  on when it was processed or on the window length: a window of any whole number of minutes is a set of
  minute prefixes, and re-landing the same records (restart, hand-over, backfill) yields the same key;
* a batch never spans two minutes (the writer flushes at every minute boundary);
* named by the first and last (sequence, sub-sequence) it holds, so a listing alone shows which ranges
  of a shard are landed (the sequence-range exclusion) without reading any object;
* fenced by its predecessor: before a batch is written its writer claims the link
  `<stream>/dt/hh/mm/<shard>/after=<prevSeq>_<prevSub>` (put-if-absent, body = the batch's key), so exactly
  one batch can ever follow a position, whoever writes it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Sequence
from urllib.parse import urlparse

from ..kcl.core.model import Checkpoint
from ..kcl.core.streams import (
    STREAM_ARN_RE,
    StreamArn,
    identifier_parts,
    parse_stream_arn,
    stream_name,
)

MINUTE_MS = 60_000
HOUR_MS = 3_600_000

_KEY_RE = re.compile(
    r"^(?P<stream>[^/]+)/dt=(?P<date>\d{4}-\d{2}-\d{2})/hh=(?P<hh>\d{2})/mm=(?P<mm>\d{2})/"
    r"(?P<shard>[^/]+)/(?P<fs>\d+)_(?P<fss>\d+)-(?P<ls>\d+)_(?P<lss>\d+)\.parquet$"
)


def stream_directory(identifier: str) -> str:
    """A multi-stream application's directory for one stream incarnation, `<StreamName>@<creationEpoch>`, from
    its identifier `account:name:epoch`: a re-created stream (same name, same shard ids) lands beside the old
    one, never onto its chains. ('@' is not allowed in stream names, so no single-stream directory looks alike.)"""
    _account, name, epoch = identifier_parts(identifier)
    return f"{name}@{epoch}"


IDENTITY_SEPARATOR = "@"  # never in a stream name, a region or an account


def identity_directory(arn: str | StreamArn) -> str:
    """The directory of a stream named by its ARN: `<name>@<region>@<account>`."""
    parts = arn if isinstance(arn, StreamArn) else parse_stream_arn(arn)
    return IDENTITY_SEPARATOR.join((parts.name, parts.region, parts.account))


def directory_identity(directory: str) -> tuple[str, str, str] | None:
    """(name, region, account) an identity directory names; None for a bare name or a multi-stream incarnation
    (`<name>@<creationEpoch>`, one separator)."""
    parts = directory.split(IDENTITY_SEPARATOR)
    if len(parts) != 3 or not all(parts) or not parts[2].isdigit() or parts[1].isdigit():
        return None
    name, region, account = parts
    return name, region, account


@lru_cache(maxsize=256)  # asked for every key a worker names
def landing_directory(stream: str, identifier: str | None = None) -> str:
    """Where a stream lands (its directory, the first segment of every key of it): the incarnation's directory of
    a multi-stream application (`identifier`); `<name>@<region>@<account>` for a stream named by its ARN; its
    name otherwise. A directory is its own directory, so every key builder takes a stream or a directory."""
    if identifier is not None:
        return stream_directory(identifier)
    if STREAM_ARN_RE.fullmatch(stream):
        return identity_directory(stream)
    return stream_name(stream)


def same_stream(a: str, b: str) -> bool:
    """Whether two stream ARNs name one stream (partition, region, account and name)."""
    return parse_stream_arn(a) == parse_stream_arn(b)


def foreign_stream(directory: str, found_arn: str | None, expected_arn: str | None) -> str | None:
    """Pure: why a batch of `directory` whose footer names the stream `found_arn` is not of the stream expected
    there (`expected_arn`, or the stream an identity directory names), or None when it is. A batch that names
    no stream (landed before stream identity) is attributed to none and refused by none."""
    if not found_arn:
        return None
    ident = directory_identity(directory)
    try:
        found = parse_stream_arn(found_arn)
    except ValueError:
        return f"its footer names {found_arn!r}, not a stream ARN"
    if ident is not None and (found.name, found.region, found.account) != ident:
        return f"it belongs to stream {found_arn}, but directory {directory} is stream " \
               f"{ident[0]} of account {ident[2]} in {ident[1]}"
    if expected_arn and not same_stream(found_arn, expected_arn):
        return f"it belongs to stream {found_arn}, not to {expected_arn}"
    return None


@dataclass(frozen=True)
class Zone:
    """A landing zone: `s3://bucket/prefix` or a local directory (path or file:// URI)."""

    uri: str
    scheme: str  # "s3" or "file"
    bucket: str | None
    root: str  # S3 key prefix without trailing '/', or an absolute local path

    @classmethod
    def parse(cls, uri: str) -> "Zone":
        if not uri:
            raise ValueError("landing zone URI is empty; use s3://bucket/prefix or a local directory")
        parsed = urlparse(uri)
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise ValueError(f"landing zone {uri!r} has no bucket; use s3://bucket/prefix")
            return cls(uri, "s3", parsed.netloc, parsed.path.strip("/"))
        if parsed.scheme in ("", "file"):
            path = parsed.path if parsed.scheme == "file" else uri
            return cls(uri, "file", None, str(Path(path).expanduser().resolve()))
        raise ValueError(f"landing zone {uri!r}: scheme {parsed.scheme!r} is not supported (s3:// or a directory)")

    def full_key(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key


@dataclass(frozen=True, order=True)
class BatchKey:
    stream: str
    shard_id: str
    minute_ms: int  # start of the arrival minute, epoch millis UTC
    first: Checkpoint
    last: Checkpoint

    def key(self) -> str:
        key = self.__dict__.get("_key")  # formatted once (the key is asked for again and again, and never changes)
        if key is None:
            key = f"{minute_prefix(self.stream, self.minute_ms)}{self.shard_id}/" \
                  f"{self.first.sequence_number}_{self.first.sub_sequence_number}-" \
                  f"{self.last.sequence_number}_{self.last.sub_sequence_number}.parquet"
            object.__setattr__(self, "_key", key)
        return key

    def overlaps(self, other: "BatchKey") -> bool:
        return self.shard_id == other.shard_id and not (
            self.last.key() < other.first.key() or other.last.key() < self.first.key()
        )


_EPOCH_DAY = date(1970, 1, 1).toordinal()


def path_minute_ms(day: str, hh: str, mm: str) -> int:
    """The epoch millis (UTC) of a key's `dt=YYYY-MM-DD/hh=HH/mm=MM`, from its digits (no strptime: a listing
    parses every key it holds). A date, hour or minute that does not exist (2023-02-29, hh=24, mm=60) is a
    ValueError, as strptime's."""
    hour, minute = int(hh), int(mm)
    if not (0 <= hour < 24 and 0 <= minute < 60):
        raise ValueError(f"no such time of day: {hh}:{mm}")
    days = date(int(day[:4]), int(day[5:7]), int(day[8:10])).toordinal() - _EPOCH_DAY
    return days * 86_400_000 + hour * HOUR_MS + minute * MINUTE_MS


# A listing parses every key it holds, and a writer lists its shard's current minute at every flush: the same
# keys again and again. Parsed keys are immutable (frozen), so the last few hundred are kept (~0.9 KB each with
# their key: about 1 MB per cache at most).
PARSED_KEYS_CACHED = 1024


@lru_cache(maxsize=PARSED_KEYS_CACHED)
def parse_batch_key(key: str) -> BatchKey | None:
    """The batch a relative key names, or None if the key is not a batch (e.g. a temporary object)."""
    m = _KEY_RE.match(key)
    if not m:
        return None
    return BatchKey(
        stream=m["stream"],
        shard_id=m["shard"],
        minute_ms=path_minute_ms(m["date"], m["hh"], m["mm"]),
        first=Checkpoint(m["fs"], int(m["fss"])),
        last=Checkpoint(m["ls"], int(m["lss"])),
    )


def overlapping_batches(batches: Sequence[BatchKey]) -> list[BatchKey]:
    """The batches whose range overlaps another's of the same shard (rows landed twice), grouped by shard in
    order of first appearance, each shard's in their given order. One sort and one sweep per shard, not a
    comparison of every pair (a window's thousands of batches): in order of first position, a batch overlaps
    another exactly when an earlier one ends at or after its first, or the next one begins at or before its last
    (a batch's first is never after its last: listings set such keys aside as malformed)."""
    by_shard: dict[str, list[BatchKey]] = {}
    for b in batches:
        by_shard.setdefault(b.shard_id, []).append(b)
    out: list[BatchKey] = []
    for mine in by_shard.values():
        if len(mine) < 2:
            continue
        spans = sorted(((b.first.key(), b.last.key(), i) for i, b in enumerate(mine)), key=lambda s: s[0])
        hit: set[int] = set()
        reach = spans[0][1]  # the furthest last position of the batches before
        for j, (first, last, i) in enumerate(spans):
            if (j > 0 and reach >= first) or (j + 1 < len(spans) and spans[j + 1][0] <= last):
                hit.add(i)
            reach = max(reach, last)
        out += [b for i, b in enumerate(mine) if i in hit]
    return out


LINK_PREFIX = "after="
START_DIR = "_start"


def link_key(stream: str, minute_ms: int, shard_id: str, prev: Checkpoint | None) -> str:
    """The key naming "the batch after `prev`" of a shard (see docs/landing.md, fencing).

    Its minute is the arrival minute of the record after `prev`, which every reader of the shard sees alike,
    so two writers of the batch after one position always meet on this one key. The link after a starting
    position (TRIM_HORIZON, LATEST, AT_TIMESTAMP) has a fixed key instead, `<stream>/_start/<shard>/after=…`,
    so a consumer can find where its chain begins without knowing when the first record arrived.
    """
    after = "none" if prev is None else f"{prev.sequence_number}_{prev.sub_sequence_number}"
    if prev is not None and prev.is_starting_sentinel:
        return f"{landing_directory(stream)}/{START_DIR}/{shard_id}/{LINK_PREFIX}{after}"
    return f"{minute_prefix(stream, minute_ms)}{shard_id}/{LINK_PREFIX}{after}"


_LINK_RE = re.compile(
    r"^(?P<stream>[^/]+)/(?:dt=(?P<date>\d{4}-\d{2}-\d{2})/hh=(?P<hh>\d{2})/mm=(?P<mm>\d{2})|" + START_DIR + r")/"
    r"(?P<shard>[^/]+)/" + LINK_PREFIX + r"(?P<seq>[0-9A-Z_]+?)_(?P<sub>\d+)$"
)


@dataclass(frozen=True)
class LinkName:
    """A link as its key names it: "the batch after `prev`" of a shard, claimed in `minute_ms` (None: a start link,
    whose predecessor is a starting position). The key alone says which position a batch follows, whichever batch
    the body names: the checkpoint plan reads predecessors from listings without a GET."""

    stream: str
    shard_id: str
    minute_ms: int | None
    prev: Checkpoint


@lru_cache(maxsize=PARSED_KEYS_CACHED)
def parse_link_key(key: str) -> LinkName | None:
    """The link a relative key names, or None if it is not a link key (`after=none` names no position: None too)."""
    m = _LINK_RE.match(key)
    if not m:
        return None
    try:
        prev = Checkpoint(m["seq"], int(m["sub"]))
    except ValueError:
        return None
    if m["date"] is None:
        return LinkName(m["stream"], m["shard"], None, prev) if prev.is_starting_sentinel else None
    if prev.is_sentinel:
        return None
    return LinkName(m["stream"], m["shard"], path_minute_ms(m["date"], m["hh"], m["mm"]), prev)


LINK_HOLDER = "holder="


def link_body(batch_key: str, holder: str | None = None) -> bytes:
    """A link's body: the key of the batch it names, then (new claims) who claimed it. Readers take the first line."""
    return (batch_key if holder is None else f"{batch_key}\n{LINK_HOLDER}{holder}").encode()


def link_target(body: bytes) -> str:
    """The batch key a link's body names (its first line)."""
    return body.decode("utf-8", "replace").split("\n", 1)[0].strip()


# A start link's first line when its claimer ended the shard having landed nothing after that start (a LATEST
# read of a shard that had closed): the shard's chain from that start is complete and empty. Never a batch key
# (those hold '/' and end in `.parquet`), so `parse_batch_key` of it is None; every reader of start links asks
# `ends_empty` first (sink, checkpoint plan, backfill, the simulation's checker).
ENDED_EMPTY = "ended-empty"


def ended_empty_body(holder: str | None = None) -> bytes:
    """The body of a start link claimed by a holder that ended the shard with nothing landed after that start."""
    return link_body(ENDED_EMPTY, holder)


def ends_empty(target: str | None) -> bool:
    """Whether a start link's first line (`link_target`) says the shard ended with nothing landed after the start."""
    return target == ENDED_EMPTY


@dataclass(frozen=True)
class BatchKeyListing:
    batches: list[BatchKey]  # in listing order
    malformed: list[str]  # `.parquet` objects whose names are not batch keys (or name first > last)


def split_batch_keys(keys) -> BatchKeyListing:
    """The one reading of a zone listing (sink, verify and the transform all use it).

    A `.parquet` object is landed data: a batch key, or malformed — reported to the caller, never skipped
    silently. Anything else (fencing links, temporaries, markers) is not landed data and is left out."""
    batches: list[BatchKey] = []
    malformed: list[str] = []
    for rel in keys:
        if not rel.endswith(".parquet"):
            continue
        key = _landed_batch(rel)
        if key is None:
            malformed.append(rel)
        else:
            batches.append(key)
    return BatchKeyListing(batches, malformed)


@lru_cache(maxsize=PARSED_KEYS_CACHED)
def _landed_batch(rel: str) -> BatchKey | None:
    """The batch a `.parquet` key names, None when malformed (not a batch key, or first after last)."""
    key = parse_batch_key(rel)
    return None if key is None or key.first.key() > key.last.key() else key


@dataclass(frozen=True)
class LandedListing:
    """A listing as the checkpoint plan reads it: the batches, the links (what each batch follows), the rest."""

    batches: list[BatchKey]
    links: list[LinkName]
    malformed: list[str]


def split_landed_keys(keys) -> LandedListing:
    """`split_batch_keys`, keeping the links' names too (links are not landed data, but their names are the
    chain: each batch's link is in its own minute and names its predecessor)."""
    keys = list(keys)
    listing = split_batch_keys(keys)
    marker = f"/{LINK_PREFIX}"
    links = [link for link in map(parse_link_key, (k for k in keys if marker in k)) if link is not None]
    return LandedListing(listing.batches, links, listing.malformed)


def minute_of(ms: int) -> int:
    return ms - ms % MINUTE_MS


@lru_cache(maxsize=4096)
def _minute_path(minute: int) -> str:
    """`dt=YYYY-MM-DD/hh=HH/mm=MM/` of the `minute`-th minute since the epoch (cached: a worker names the same
    few minutes for every batch and link it lands)."""
    dt = datetime.fromtimestamp(minute * 60, tz=timezone.utc)
    return f"dt={dt:%Y-%m-%d}/hh={dt:%H}/mm={dt:%M}/"


def minute_prefix(stream: str, minute_ms: int) -> str:
    return f"{landing_directory(stream)}/{_minute_path(minute_ms // MINUTE_MS)}"


def hour_prefix(stream: str, ms: int) -> str:
    return f"{landing_directory(stream)}/{_minute_path(ms // MINUTE_MS)[:-len('mm=MM/')]}"


def window_prefixes(stream: str, start_ms: int, end_ms: int) -> list[str]:
    """The fewest prefixes covering the minutes of [start_ms, end_ms): whole hours, else single minutes."""
    out: list[str] = []
    t = minute_of(start_ms)
    while t < end_ms:
        if t % HOUR_MS == 0 and t + HOUR_MS <= end_ms:
            out.append(hour_prefix(stream, t))
            t += HOUR_MS
        else:
            out.append(minute_prefix(stream, t))
            t += MINUTE_MS
    return out


def iso(ms: int) -> str:
    """An instant in milliseconds since the epoch as the zone's reports spell it (UTC, whole seconds)."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
