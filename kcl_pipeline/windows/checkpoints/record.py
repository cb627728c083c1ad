"""The checkpoint record: what the last checkpoint run of a stream leaves for the next one and for the sensor, in
the output location beside the window commits (one object, one writer: `commit_checkpoints`).

    _checkpoints/record.json
        {"v": 1, "report": <id>, "written_at_ms": …, "requested_for": [t0, t1] | null,
         "frontier": {lease key: window start ms},
         "late": [{"window_start_ms": …, "batches": [batch keys]}], "uncommitted": [window start ms]}

* `frontier`: per shard the window the next run's listing may start at (scan.next_frontier); the next
  checkpoint run lists from it, and a fresh sensor cursor starts its reports from it (tick/report_start.py).
* `late` and `uncommitted`: the windows the checkpoints wait on (batches landed after the window's run; no
  commit at all); the sensor asks for each once per report and follows it (followup.track_reports).
* `report`: the record's id, increasing from one record to the next: the sensor acts on a report once, the
  first time it sees an id above the last one it acted on (its cursor keeps that id). Null: a frontier with
  no report (a migrated legacy frontier, or one a test or a benchmark stores).
* `requested_for`: the windows of the Dagster run that wrote it (the asset's partition, or a range); None
  outside Dagster.

It lives with the output it describes, so a fresh Dagster instance, a cleared cursor, and every checkpoint run
read the same one. Reading it is typed (`read_checkpoint_record`): an object that is not a record raises
CheckpointRecordError naming it and what is wrong; each caller says what it does then.

A location written before the record existed holds `_checkpoints/frontier.json` (`{"frontier": {…}}`) only.
It is read as a record with that frontier and no report (nothing for the sensor to act on), and the first
checkpoint run that writes the record deletes it: migrated once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ...zone.errors import ZoneNotFoundError
from ...zone.store import ZoneStore

RECORD_KEY = "_checkpoints/record.json"  # in the output location, beside the window commits
LEGACY_FRONTIER_KEY = "_checkpoints/frontier.json"  # the frontier alone, as locations written before hold it
RECORD_VERSION = 1
MAX_LATE_KEYS = 50  # per late window: the sensor keeps them in its cursor, as what the re-run's commit must name


class CheckpointRecordError(ValueError):
    """A stored object that is not a checkpoint record this code reads."""


@dataclass(frozen=True)
class CheckpointRecord:
    frontier: Mapping[str, int] = field(default_factory=dict)
    late: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # window start -> batches its commit lacks
    uncommitted: tuple[int, ...] = ()  # windows a shard is stopped on that have no commit
    report: int | None = None  # the record's id (None: read from a legacy frontier.json: no report)
    written_at_ms: int | None = None
    requested_for: tuple[int, int] | None = None  # the Dagster run's windows [t0, t1)

    @classmethod
    def of_run(cls, previous: "CheckpointRecord | None", *, frontier: Mapping[str, int],
               late: Mapping[int, Sequence[str]], uncommitted: Sequence[int], now_ms: int,
               requested_for: tuple[int, int] | None = None) -> "CheckpointRecord":
        """The record a checkpoint run writes after `previous` (the one it read)."""
        return cls(dict(sorted(frontier.items())),
                   {w: tuple(sorted(keys))[:MAX_LATE_KEYS] for w, keys in sorted(late.items())},
                   tuple(sorted(set(uncommitted))), next_report_id(previous, now_ms), now_ms, requested_for)

    def to_json(self) -> bytes:
        return json.dumps({
            "v": RECORD_VERSION, "report": self.report, "written_at_ms": self.written_at_ms,
            "requested_for": list(self.requested_for) if self.requested_for is not None else None,
            "frontier": dict(sorted(self.frontier.items())),
            "late": [{"window_start_ms": w, "batches": list(keys)} for w, keys in sorted(self.late.items())],
            "uncommitted": list(self.uncommitted),
        }, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str = RECORD_KEY) -> "CheckpointRecord":
        """The record in `raw`; CheckpointRecordError naming `where` when it is not one (or of another version)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CheckpointRecordError(f"{where}: not a checkpoint record (not JSON: {exc})") from exc
        if not isinstance(data, dict):
            raise CheckpointRecordError(f"{where}: not a checkpoint record (a JSON {type(data).__name__})")
        if data.get("v") != RECORD_VERSION:
            raise CheckpointRecordError(f"{where}: checkpoint record version {data.get('v')!r}, this code reads "
                                        f"version {RECORD_VERSION}")
        try:
            requested = data.get("requested_for")
            return cls(_frontier(data["frontier"]),
                       {_int(item["window_start_ms"]): tuple(_str(k) for k in _list(item["batches"]))
                        for item in _list(data["late"])},
                       tuple(_int(w) for w in _list(data["uncommitted"])),
                       _optional_int(data["report"]), _optional_int(data.get("written_at_ms")),
                       None if requested is None else (_int(_list(requested)[0]), _int(_list(requested)[1])))
        except (KeyError, IndexError, TypeError) as exc:
            raise CheckpointRecordError(f"{where}: not a checkpoint record ({type(exc).__name__}: {exc})") from exc

    def new_since(self, acted_on: int | None) -> bool:
        """Whether the sensor has a report to act on: one with an id above the last it acted on (`acted_on`)."""
        return self.report is not None and (acted_on is None or self.report > acted_on)


def next_report_id(previous: CheckpointRecord | None, now_ms: int) -> int:
    """The id of the record written after `previous`: the time in millis, and above the previous id whatever the
    writers' clocks say. Millis keep it above any id a sensor cursor acted on before the record existed (the
    event storage id of a kinesis_checkpoints materialisation: a small count)."""
    last = previous.report if previous is not None and previous.report is not None else 0
    return max(now_ms, last + 1)


def read_checkpoint_record(output: ZoneStore) -> CheckpointRecord | None:
    """The stream's checkpoint record (None: no checkpoint run has written one, or no output location yet); a
    location holding only the legacy frontier.json gives a record with its frontier and no report.
    CheckpointRecordError when the stored object is not a record (one GET; two on a legacy location)."""
    try:
        raw = output.get_optional(RECORD_KEY)
        if raw is not None:
            return CheckpointRecord.from_json(raw, f"{output.uri}/{RECORD_KEY}")
        legacy = output.get_optional(LEGACY_FRONTIER_KEY)
    except ZoneNotFoundError:
        return None
    if legacy is None:
        return None
    where = f"{output.uri}/{LEGACY_FRONTIER_KEY}"
    try:
        data = json.loads(legacy)
        return CheckpointRecord(_frontier(data["frontier"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointRecordError(f"{where}: not a checkpoint frontier ({type(exc).__name__}: {exc})") from exc


def write_checkpoint_record(output: ZoneStore, record: CheckpointRecord, *, replaces_legacy: bool) -> None:
    """Store the record (one PUT); `replaces_legacy`: no record was read before it, so a legacy frontier.json
    may be there: it goes (its frontier is in the record). A stale run writing last only makes the next listing
    start earlier and leaves the sensor an older report until the next run writes a newer one: both safe. No
    output location yet: nothing has materialised, nothing to remember."""
    try:
        output.put(RECORD_KEY, record.to_json())
        if replaces_legacy:
            output.delete([LEGACY_FRONTIER_KEY])
    except ZoneNotFoundError:
        pass


def _frontier(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise TypeError(f"frontier must be an object, got {value!r}")
    return {str(k): _int(v) for k, v in value.items()}


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


__all__ = ["LEGACY_FRONTIER_KEY", "MAX_LATE_KEYS", "RECORD_KEY", "RECORD_VERSION", "CheckpointRecord",
           "CheckpointRecordError", "next_report_id", "read_checkpoint_record", "write_checkpoint_record"]
