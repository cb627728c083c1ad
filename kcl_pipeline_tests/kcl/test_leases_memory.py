"""`kcl-pipeline leases` reports this host's lease workers' memory on stderr; stdout keeps the table / JSON."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from kcl_pipeline.kcl.core.model import Checkpoint, Lease
from kcl_pipeline.kcl.shells.lease_table import LeaseTable
from kcl_pipeline.kcl.shells.workers.memory import lease_workers_memory
from kcl_pipeline.kcl.shells.workers.worker import WORKER_PROCESS_NAME

REPORT = re.compile(r"^\d+ lease workers? on this host: PSS \d+\.\d MiB in all, at most \d+\.\d MiB "
                    r"\(USS \d+\.\d MiB in all, at most \d+\.\d MiB\)")


def _leases(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "leases", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux 4.14+ /proc only")
def test_leases_reports_the_hosts_lease_workers_memory_on_stderr(emulators, dynamodb_client, unique_name):
    app = unique_name("memapp")
    table = LeaseTable(app, dynamodb_client)
    table.ensure_table()
    table.create(Lease("shardId-000000000000", Checkpoint("12345", 2), lease_owner="w1", lease_counter=3))
    worker = subprocess.Popen([sys.executable, "-c", f"open('/proc/self/comm','w').write({WORKER_PROCESS_NAME!r});"
                               "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while worker.pid not in {p.pid for p in lease_workers_memory().processes} and time.monotonic() < deadline:
            time.sleep(0.05)
        as_json = _leases("--application", app, "--json", env=emulators.env())
        assert as_json.returncode == 0, as_json.stderr
        assert [json.loads(line)["leaseKey"] for line in as_json.stdout.splitlines()] == ["shardId-000000000000"]
        assert REPORT.match(as_json.stderr.splitlines()[-1]), as_json.stderr
        text = _leases("--application", app, env=emulators.env())
        assert text.returncode == 0 and " on this host" not in text.stdout
        assert REPORT.match(text.stderr.splitlines()[-1]), text.stderr
    finally:
        worker.kill()
        worker.wait()
