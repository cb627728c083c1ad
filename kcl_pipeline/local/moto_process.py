"""Entry point of the moto server child process (S3, CloudWatch, and DynamoDB as a second opinion).

`python -m kcl_pipeline.local.moto_process -H 127.0.0.1 -p PORT` runs moto's own server (a separate
process, never in-process) and exits when the parent named by KCL_PIPELINE_PARENT_PID is gone, so a killed
test session or CLI never leaves an orphaned server behind.

moto's server works out which service a request is for by listing its own package directory and testing each
entry with `isdir` (about 180 `stat` calls), twice per request: a third of its CPU per request (3.4 → 2.4 ms
of server CPU per S3 request, measured over 5,000; the full audit of benchmarks/bench_audit.py: 59 → 43.5 s).
The listing cannot change while the server runs, so it is taken once here (`_list_moto_modules_once`). Nothing
else of moto's is changed.
"""
from __future__ import annotations

import os
import sys
import threading
import time


def _exit_with_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(1.0)


def _list_moto_modules_once() -> tuple[str, ...]:
    """Replace moto's per-request listing of its package directory by the same listing taken once."""
    from moto import backends

    listing = getattr(backends, "list_of_moto_modules", None)
    if listing is None:  # a moto that no longer lists per request: nothing to take once
        return ()
    modules = tuple(listing())
    backends.list_of_moto_modules = lambda: iter(modules)
    return modules


def main(argv: list[str] | None = None) -> None:
    parent_pid = int(os.environ.get("KCL_PIPELINE_PARENT_PID") or 0)
    if parent_pid > 0:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    _list_moto_modules_once()
    from moto.server import main as moto_main

    moto_main(list(argv) if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
