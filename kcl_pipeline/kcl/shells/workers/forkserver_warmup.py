"""Imported by the lease workers' forkserver only, last of its preloads (worker_processes.preload_modules):
loads what every worker would load for itself, then freezes the server's heap (worker_processes.warm_up).
Importing it anywhere else would freeze that process's heap: nothing else imports it."""
from __future__ import annotations

from .worker_processes import warm_up

missed = warm_up()
