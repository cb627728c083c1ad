"""A stream's lineage audit, the entry `kcl-pipeline audit` and the asset checks' callers use: a range of windows
(lineage.py, window by window) or the whole history incrementally (history.py, which builds on lineage.py)."""
from __future__ import annotations

import time
from typing import Sequence

from ..kcl.aws_settings import AwsSettings
from ..kcl.core.model import Lease
from ..kcl.core.streams import STREAM_ARN_RE
from ..zone.layout import landing_directory
from ..zone.store import ZoneStore, open_store
from .history import DEFAULT_WORKERS, audit_history
from .lineage import AuditReport, audit_window


def audit(zone_uri: str, output_uri: str, stream: str, window_ms: int, *,
          window: tuple[int, int] | None = None, application: str | None = None, aws: AwsSettings | None = None,
          store: ZoneStore | None = None, output: ZoneStore | None = None, leases: Sequence[Lease] | None = None,
          now_ms: int | None = None, transform_grace_ms: int = 300_000, full: bool = False,
          first_window_ms: int | None = None, workers: int | None = None,
          stream_arn: str | None = None) -> AuditReport:
    """Audit the windows of `window` (split into `window_ms` windows), or else the whole history of `stream`
    (its landing directory), incrementally (audit/history.py; `full`: read every object again, ignoring the
    index). Untransformed windows older than their end + `transform_grace_ms` at `now_ms` (default: now) fail.

    The lease table of `application` is scanned for the checkpoints check (read only); without an
    application (and no `leases`) that check is skipped.

    Stream identity, as `landing verify` checks it: every batch must be of its directory's stream — an identity
    directory's, the stream given by its ARN, or `stream_arn` (for a stream landing under its bare name) — and a
    directory's batches must name one stream.
    """
    if STREAM_ARN_RE.fullmatch(stream):
        stream_arn = stream_arn or stream
    if stream_arn is not None and not STREAM_ARN_RE.fullmatch(stream_arn):
        raise ValueError(f"stream ARN {stream_arn!r} is not one (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
    if transform_grace_ms < 0:
        raise ValueError(f"transform_grace_ms must be >= 0, got {transform_grace_ms}")
    stream = landing_directory(stream)  # a name, an ARN (its identity directory) or a directory
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if window_ms <= 0 or window_ms % 60_000:
        raise ValueError(f"window_ms must be a positive whole number of minutes, got {window_ms}")
    store = store or open_store(zone_uri, aws)
    output = output or open_store(output_uri, aws, what="transform output")
    store.ensure_zone(create=False)
    if window is not None:
        t0, t1 = window
        if t0 % window_ms or t1 % window_ms or t1 <= t0:
            raise ValueError(f"window [{t0}, {t1}) must be whole {window_ms // 60_000}-minute windows of the pipeline")
    if leases is None and application:
        from ..kcl.shells.aws import client
        from ..kcl.shells.lease_table import LeaseTable

        leases = LeaseTable(application, client("dynamodb", aws)).scan()
    if window is None:
        return audit_history(store, output, stream, window_ms, leases=leases, now_ms=now_ms,
                             transform_grace_ms=transform_grace_ms, full=full, first_window_ms=first_window_ms,
                             workers=workers or DEFAULT_WORKERS, stream_arn=stream_arn)
    report = AuditReport()
    for start in range(window[0], window[1], window_ms):
        report.outcomes += audit_window(store, output, stream, start, start + window_ms, leases=leases,
                                        now_ms=now_ms, transform_grace_ms=transform_grace_ms, stream_arn=stream_arn)
    return report
