"""A headless consumer: one lease manager driven on its own timer until SIGTERM/SIGINT.

Shutdown: stop cycling, ask every worker to stop (each checkpoints what it processed and releases its
lease), wait for them (killing those still running after `manager.shutdown_timeout`), exit 0. A consumer none of
whose cycles succeeded for `stall_seconds` shuts down the same way and raises `ManagerStalled`, whose one line the
command line prints (exit 2).
"""
from __future__ import annotations

import logging
import threading

from ...config import ConsumerConfig
from ..signals import stop_on_signals
from ..workers.worker import ProcessorSpec
from .manager import LeaseManager

log = logging.getLogger(__name__)


def run_consumer(config: ConsumerConfig, spec: ProcessorSpec, stop: threading.Event | None = None,
                 install_signal_handlers: bool = True) -> int:
    stop = stop or threading.Event()
    if install_signal_handlers:
        stop_on_signals(stop, lambda name: log.info("signal %s: stopping consumer %s", name, config.worker_id))
    manager = LeaseManager(config, spec)
    # Start, cycles until stopped, shutdown (ask, then kill past its timeout): the simulation runs these steps.
    results = manager.transport.run(manager.consume(stop))
    for r in results:
        log.info("worker %s stopped: %s %s", r.lease_key, r.outcome, r.detail)
    return 0
