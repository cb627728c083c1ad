"""A landing sink whose zone refuses every call while a marker file exists (S3 access denied, a full disk), and
that notes the first record each worker was delivered (where its reading resumed): for the retry tests."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kcl_pipeline.kcl.processor import ProcessRecordsInput
from kcl_pipeline.zone.sink import LandingProcessor


class FlakyLanding(LandingProcessor):
    def __init__(self, *, refuse_while: str, firsts: str, **kwargs: Any):
        super().__init__(**kwargs)
        self._refuse_while = Path(refuse_while)
        self._firsts = Path(firsts)
        self._first_seen = False

    def process_records(self, batch: ProcessRecordsInput) -> None:
        if batch.records and not self._first_seen:
            self._first_seen = True
            with self._firsts.open("a") as out:
                out.write(f"{os.getpid()} {batch.records[0].sequence_number}\n")
        if self._refuse_while.exists():
            raise PermissionError("AccessDenied: the zone refused the write")
        super().process_records(batch)
