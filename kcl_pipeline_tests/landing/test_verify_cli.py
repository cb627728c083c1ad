"""`kcl-pipeline landing verify`: the command's own options (the zone checks are test_verify*.py's)."""
from __future__ import annotations

import os
import uuid

from click.testing import CliRunner

from kcl_pipeline.cli import main


def test_verify_sweeps_what_killed_writers_left_when_asked(local_zone):
    uri, store = local_zone
    os.makedirs(os.path.join(uri, "orders", "dt=2026-11-22"))
    left = os.path.join(uri, "orders", "dt=2026-11-22", f".b.parquet.{uuid.uuid4().hex}.tmp")
    with open(left, "wb") as f:
        f.write(b"half a batch")
    os.utime(left, (0, 0))  # its writer was killed long ago
    kept = CliRunner().invoke(main, ["landing", "verify", "--landing", uri])
    assert kept.exit_code == 0, kept.output
    assert os.path.exists(left)  # verify alone changes nothing
    swept = CliRunner().invoke(main, ["landing", "verify", "--landing", uri, "--sweep-temporaries"])
    assert swept.exit_code == 0, swept.output
    assert not os.path.exists(left) and "swept 1 leftovers of killed writers" in swept.stderr
