"""SIGTERM and SIGINT as a stop request: the handler only writes to a pipe; a watcher thread sets the event.

`threading.Event.set()` takes the event's lock. Called inside a signal handler (which runs in the main thread,
between two bytecodes) it deadlocks for ever when the signal lands while the main thread is inside
`Event.wait()`, between taking that lock and waiting on it: a lease worker, which sleeps in `stop.wait()` between
polls, then never stops and its lease stays owned until it is killed (CI caught one). `os.write` takes no lock.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: threading.Event, said: Callable[[str], None] | None = None) -> None:
    """From now on SIGTERM and SIGINT set `stop` (after `said(<signal name>)`, in the watcher thread)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum, _frame) -> None:
        try:
            os.write(write_fd, bytes([signum]))
        except BlockingIOError:  # 64 KiB of unread signals: the stop is requested already
            pass

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if said is not None:
                    said(signal.Signals(signum).name)
                stop.set()

    threading.Thread(target=watch, name="stop-on-signal", daemon=True).start()
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
