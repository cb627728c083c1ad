"""The `kinesis_consumer` sensor's cursor: this host's consumer id and, per stream, the next window to report,
the windows asked for and not done yet, the last checkpoint report acted on, and when the fleet was last
observed (JSON, versioned).

Everything else that must outlive a tick is elsewhere (leases and progress in the lease table, data in the
landing zone), so a cleared cursor loses nothing: the sensor finds its first window again
(windows/tick/report_start.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..followup import Outstanding

CURSOR_VERSION = 1


class CursorError(ValueError):
    """The sensor cursor is not one this sensor wrote."""


@dataclass(frozen=True)
class Cursor:
    worker_id: str | None = None
    next_window_ms: int | None = None  # the first window not reported yet (None: not decided yet)
    observed_at_ms: int | None = None
    # windows asked for and not done yet -> their follow-up (requests so far, ...; windows/followup.py)
    outstanding: dict[int, Outstanding] = field(default_factory=dict)
    # A multi-stream deployment: each stream's own windows, by its Dagster prefix (the fields above unused)
    streams: dict[str, "Cursor"] = field(default_factory=dict)
    # the newest checkpoint record (its report id: windows/checkpoints/record.py) whose windows were asked
    # for: each report is acted on once, whatever the tick
    checkpoint_report: int | None = None
    rotation: int = 0  # which given-up windows the next tick looks at (window_followup.observation_slice)

    def __post_init__(self) -> None:
        # a plain request count is a window the sensor reported (the cursor's first format, and tests)
        object.__setattr__(self, "outstanding", {k: v if isinstance(v, Outstanding) else Outstanding(v)
                                                 for k, v in self.outstanding.items()})

    def to_json(self) -> str:
        return json.dumps(self._data(), sort_keys=True)

    def _data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"v": CURSOR_VERSION, "worker_id": self.worker_id,
                                "next_window_ms": self.next_window_ms, "observed_at_ms": self.observed_at_ms,
                                "outstanding": {str(k): v.to_json() for k, v in sorted(self.outstanding.items())}}
        if self.checkpoint_report is not None:
            data["checkpoint_report"] = self.checkpoint_report
        if self.rotation:
            data["rotation"] = self.rotation
        if self.streams:
            data["streams"] = {name: c._data() for name, c in sorted(self.streams.items())}
        return data

    @classmethod
    def parse(cls, text: str | None) -> "Cursor":
        if not text:
            return cls()
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
                raise ValueError(f"version {data.get('v') if isinstance(data, dict) else None!r}")
            return cls._from_data(data)
        except (ValueError, TypeError) as exc:
            raise CursorError(
                f"kinesis_consumer cursor {text[:200]!r} is not a v{CURSOR_VERSION} cursor ({exc}); clear the "
                f"cursor in the UI to start afresh (windows already reported are not reported twice: runs are "
                f"keyed by partition)") from None

    @classmethod
    def _from_data(cls, data: Any) -> "Cursor":
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {data!r}")
        streams = data.get("streams") or {}
        if not isinstance(streams, dict):
            raise TypeError(f"streams must be an object, got {streams!r}")
        return cls(worker_id=_opt(data.get("worker_id"), str), next_window_ms=_opt(data.get("next_window_ms"), int),
                   observed_at_ms=_opt(data.get("observed_at_ms"), int),
                   outstanding=_outstanding(data.get("outstanding")),
                   streams={str(name): cls._from_data(sub) for name, sub in streams.items()},
                   checkpoint_report=_opt(data.get("checkpoint_report"), int), rotation=_opt(data.get("rotation"), int)
                   or 0)


def _opt(value: Any, kind: type) -> Any:
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"expected an integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _outstanding(value: Any) -> dict[int, Outstanding]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"outstanding must be an object, got {value!r}")
    return {int(k): Outstanding.from_json(v) for k, v in value.items()}
