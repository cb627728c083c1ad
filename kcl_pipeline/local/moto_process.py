"""Entry point of the moto server child process (S3, CloudWatch, and DynamoDB as a second opinion).

`python -m kcl_pipeline.local.moto_process -H 127.0.0.1 -p PORT` runs moto's own server (a separate
process, never in-process) and exits when the parent named by KCL_PIPELINE_PARENT_PID is gone, so a killed
test session or CLI never leaves an orphaned server behind.
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


def main(argv: list[str] | None = None) -> None:
    parent_pid = int(os.environ.get("KCL_PIPELINE_PARENT_PID") or 0)
    if parent_pid > 0:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    from moto.server import main as moto_main

    moto_main(list(argv) if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
