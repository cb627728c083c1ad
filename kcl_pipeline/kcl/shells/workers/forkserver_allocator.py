"""Imported by the lease workers' forkserver first of its preloads (worker_processes.PRELOAD), before pyarrow:
Arrow picks its memory pool once, when pyarrow loads, from ARROW_DEFAULT_MEMORY_POOL. The server and every
worker forked from it use the system allocator (glibc, whose mmap threshold each worker pins at 128 KiB), so a
flushed batch's Arrow and Parquet buffers go back to the system when freed; Arrow's default (mimalloc) keeps
them for reuse, and a worker draining a backlog peaked ~6 MiB higher (docs/memory.md). A pool the environment
names is left as it is. Nothing else imports this module: elsewhere it would choose the pool of that process."""
from __future__ import annotations

import os

ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
WORKER_ARROW_POOL = "system"

os.environ.setdefault(ARROW_POOL_VARIABLE, WORKER_ARROW_POOL)
