"""The audit's index: what the whole-history audit learnt from each object, kept in the output zone so the next
audit reads only the objects that are new or replaced.

    <output>/_audit/<stream directory>.json.gz    {"format", "zone", "directory", "audited_at_ms",
                                                   "batches": {key: [tag, prev, prev_key, rows, error,
                                                                     stream_arn]},
                                                   "commits": {key: [tag, [batch keys], transformed,
                                                                     quarantined, error, [output files]]}}

Per object, the facts its audit needs — a batch's footer (its predecessor position and key, its rows, the
stream it names, or why it is unreadable), a window commit's named batches and row counts (or why it cannot be
read) — under the object's version tag (store.list_versions: an ETag, a file's inode and modification time).
A fact is reused only while the listed tag is the same; an object replaced, added or removed is seen in the
listing, so every check is re-judged on the whole history each run, from facts that are each read once.
Nothing is trusted beyond the tag: `kcl-pipeline audit --full` ignores the index and reads every object again.

An index that cannot be read (truncated, another format, another zone's) is ignored with a note, and the
audit reads everything: it is a cache, never a source of truth. It is written whole (`put`): two audits at
once each write an index of facts true under their tags, and whichever is written last serves the next.
"""
from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field

INDEX_PREFIX = "_audit"
INDEX_FORMAT = 2  # 2: a batch's facts name its stream (stream identity); an index of 1 is read anew


def index_key(directory: str) -> str:
    """The index of one stream directory, relative to the output root."""
    return f"{INDEX_PREFIX}/{directory}.json.gz"


class IndexFormatError(ValueError):
    """An index this code cannot use (the audit then reads every object)."""


@dataclass(frozen=True)
class BatchFacts:
    """A landed batch's footer as the audit uses it."""

    tag: str
    prev: str = ""  # the predecessor position, `<sequence>_<sub>` ("" unknown)
    prev_key: str = ""  # the key of the batch ending there ("" unknown, or a starting position)
    rows: int = 0
    error: str = ""  # why the batch could not be read ("" when it was)
    stream_arn: str = ""  # the stream its footer names ("" none: landed before stream identity)


@dataclass(frozen=True)
class CommitFacts:
    """A window commit as the audit uses it."""

    tag: str
    batches: frozenset[str] = frozenset()
    transformed: int = 0
    quarantined: int = 0
    error: str = ""  # why the commit could not be read ("" when it was)
    files: frozenset[str] = frozenset()  # the datasets' files it names, keys relative to the output root


@dataclass
class AuditIndex:
    zone: str
    directory: str
    batches: dict[str, BatchFacts] = field(default_factory=dict)
    commits: dict[str, CommitFacts] = field(default_factory=dict)
    audited_at_ms: int = 0

    def to_bytes(self) -> bytes:
        body = {
            "format": INDEX_FORMAT, "zone": self.zone, "directory": self.directory,
            "audited_at_ms": self.audited_at_ms,
            "batches": {k: [f.tag, f.prev, f.prev_key, f.rows, f.error, f.stream_arn]
                        for k, f in sorted(self.batches.items())},
            "commits": {k: [f.tag, sorted(f.batches), f.transformed, f.quarantined, f.error, sorted(f.files)]
                        for k, f in sorted(self.commits.items())},
        }
        # mtime=0: the same index always compresses to the same bytes
        return gzip.compress(json.dumps(body, separators=(",", ":")).encode(), compresslevel=6, mtime=0)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> "AuditIndex":
        try:
            body = json.loads(gzip.decompress(raw))
            if body.get("format") != INDEX_FORMAT:
                raise IndexFormatError(f"{where}: index format {body.get('format')!r}, this audit reads "
                                       f"{INDEX_FORMAT}")
            batches = {str(k): BatchFacts(str(v[0]), str(v[1]), str(v[2]), int(v[3]), str(v[4]), str(v[5]))
                       for k, v in body["batches"].items()}
            commits = {str(k): CommitFacts(str(v[0]), frozenset(str(b) for b in v[1]), int(v[2]), int(v[3]),
                                           str(v[4]), frozenset(str(f) for f in v[5]))
                       for k, v in body["commits"].items()}
            return cls(str(body["zone"]), str(body["directory"]), batches, commits, int(body["audited_at_ms"]))
        except IndexFormatError:
            raise
        except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise IndexFormatError(f"{where}: not an audit index ({type(exc).__name__}: {exc})") from exc
