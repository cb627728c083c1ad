"""How lease worker processes start: forked from a preloaded server (`forkserver`, the default), or `spawn`.

One process per lease is the design (worker.py). Under `spawn` each worker is a fresh interpreter that
imports boto3, pyarrow and the landing sink and parses botocore's data again: about 55 MB of private memory
each before it reads a record. Under `forkserver` one server process loads all that once (`preload_modules`:
the worker, the landing sink, the processor's module, boto3/botocore, pyarrow, then the warm-up module,
which parses botocore's data for the services workers use, encodes one Parquet row and calls `gc.freeze()`
so a worker's garbage collector never writes to the pages it shares), and every worker is forked from it:
what is shared stays shared, copy-on-write. The server is a separate process, started with the manager's
sys.path before the first worker, that runs no thread of ours (pyarrow's allocator keeps one, which its fork
handlers account for); forking from it is safe wherever the manager runs, in a Dagster code server's threads
too (forking the threaded host itself would not be).

Nothing that talks to AWS crosses the fork: the server holds data only (botocore's models and endpoints,
read through aws.py's one loader); each worker builds its own sessions, credentials, clients and
connections after it starts, draws its own random numbers (Python reseeds `random` in a forked child;
uuid4 reads the OS) and its own lease claim.

What holds as under spawn:

* Parent death: a worker's parent is the server, and the server exits as soon as the process that started
  it is gone, whatever killed it (its "alive" pipe closes; every worker gives back the copy of that pipe
  multiprocessing hands it, `detach_from_server`, or the server would live on with its workers); the worker
  sees its parent change (worker.py `_should_stop`) and stops gracefully, so a killed or reloaded host leaves
  no worker behind. Killing the server alone stops its workers the same way; the next worker starts a new
  server (multiprocessing restarts it, with the same preloads).
* Keep-alive and results: the shared value and the queue reach a worker as before.
* Environment: a worker runs with its host's environment as of its start (WorkerProcess), not the server's.
* Names: the server is `kcl-forkserver`, the workers `kcl-lease` (worker.WORKER_PROCESS_NAME); workers are
  the server's children, so the host's grandchildren.

When the forkserver cannot be used (this platform has none, the server does not start, or a probe forked
from it does not come back), the manager falls back to spawn: it logs an error saying why, and its
`StartMethod` says spawn with the reason (the sensor's observation reports it: `readied_start_method`).
Consuming goes on; only memory grows. A server another part of the same process started earlier without
these preloads is used as it is (workers then load what they need themselves), with a warning.
Choose spawn outright with `ConsumerConfig(worker_start_method="spawn")`.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext, ForkServerProcess, SpawnContext
from typing import Callable, Sequence

from ...config import WORKER_START_METHODS

log = logging.getLogger(__name__)

Context = ForkServerContext | SpawnContext

FORKSERVER, SPAWN = WORKER_START_METHODS
START_METHODS = WORKER_START_METHODS

# The server's preloads: what every lease worker imports. The allocator module first (it chooses Arrow's memory
# pool, before pyarrow loads), the processor's module after them, the warm-up module last (it loads data through
# these modules, then freezes the heap).
PRELOAD = ("kcl_pipeline.kcl.shells.workers.forkserver_allocator", "boto3", "botocore", "pyarrow", "pyarrow.parquet",
           "kcl_pipeline.kcl.shells.workers.worker", "kcl_pipeline.zone.sink")
WARM_UP_MODULE = "kcl_pipeline.kcl.shells.workers.forkserver_warmup"
# The services a worker (or its landing sink) builds clients for: their data is parsed once, in the server.
WARM_SERVICES = ("kinesis", "dynamodb", "cloudwatch", "s3")
SERVER_PROCESS_NAME = "kcl-forkserver"
# A probe forked from a freshly started server waits for the server's imports (a few seconds on a busy host).
PROBE_TIMEOUT_SECONDS = 120.0
PROBE_NOT_PRELOADED = 3  # the probe's exit code when the server lacks the warm-up module


class WorkerProcess(ForkServerProcess):
    """A process forked from the server that runs with its host's environment as of `start()`, as a spawned one
    does (the server's own is the host's when the server started: a variable set since would be missing)."""

    _environ: dict[str, str] | None = None

    def start(self) -> None:
        self._environ = dict(os.environ)
        super().start()

    def run(self) -> None:
        if self._environ is not None and self._environ != dict(os.environ):
            os.environ.clear()
            os.environ.update(self._environ)
        super().run()


class WorkerContext(ForkServerContext):
    """The forkserver context whose processes carry their host's environment (WorkerProcess)."""

    Process = WorkerProcess


class WorkerStartError(RuntimeError):
    """The forkserver cannot start lease workers (the manager falls back to spawn)."""


@dataclass(frozen=True)
class StartMethod:
    """How this manager's workers start, as readied before the first one."""

    requested: str
    method: str  # in effect
    preloaded: bool  # forked from a server holding the preloads
    detail: str = ""  # why not as requested, when so

    @property
    def fell_back(self) -> bool:
        return self.method != self.requested

    def as_metadata(self) -> dict[str, str]:
        out = {"start_method": self.method + ("" if self.preloaded or self.method == SPAWN else " (not preloaded)")}
        if self.detail:
            out["start_method_detail"] = self.detail
        return out


def preload_modules(processor_target: str | None = None) -> list[str]:
    """The server's preload list: PRELOAD, the processor's module (`module:attr`), the warm-up module last."""
    modules = list(PRELOAD)
    module = (processor_target or "").partition(":")[0]
    if module and module not in modules:
        modules.append(module)
    modules.append(WARM_UP_MODULE)
    return modules


class WorkerProcesses:
    """The multiprocessing context a manager starts its workers in, readied once (thread-safe) on first use.

    The results queue and the keep-alive value do not depend on the method (`ipc_context`): both methods
    hand them to a child the same way (named semaphores, file descriptors over the spawning pipe).
    """

    def __init__(self, method: str, preload: Sequence[str] = (), *,
                 probe_timeout: float = PROBE_TIMEOUT_SECONDS):
        if method not in START_METHODS:
            raise ValueError(f"worker start method must be one of {', '.join(START_METHODS)}, got {method!r}")
        self.requested = method
        self.preload = list(preload)
        self.probe_timeout = probe_timeout
        self._lock = threading.Lock()
        self._ready: tuple[Context, StartMethod] | None = None

    @property
    def ipc_context(self) -> Context:
        return multiprocessing.get_context("spawn")

    @property
    def start_method(self) -> StartMethod | None:
        """As readied; None before the first worker."""
        return self._ready[1] if self._ready is not None else None

    def context(self) -> Context:
        """The context to start a worker in: on the first call, starts and probes the forkserver (or falls
        back to spawn, see the module's docstring)."""
        global _last_readied
        with self._lock:
            if self._ready is None:
                self._ready = self._prepare()
                _last_readied = self._ready[1]
            return self._ready[0]

    def _prepare(self) -> tuple[Context, StartMethod]:
        if self.requested == SPAWN:
            return multiprocessing.get_context("spawn"), StartMethod(SPAWN, SPAWN, False)
        try:
            multiprocessing.get_context("forkserver")
        except ValueError as exc:
            return self._fall_back(f"this platform has no forkserver ({exc})")
        ctx = WorkerContext()
        ctx.set_forkserver_preload(self.preload)
        try:
            start_server()
            preloaded = probe(ctx, self.probe_timeout)
        except Exception as exc:
            return self._fall_back(f"{type(exc).__name__}: {exc}")
        if not preloaded:
            detail = ("a forkserver started earlier in this process without the lease workers' preloads is used: "
                      "each worker imports boto3 and pyarrow itself")
            log.warning("lease workers: %s", detail)
            return ctx, StartMethod(FORKSERVER, FORKSERVER, False, detail)
        log.info("lease workers fork from a preloaded server (%s)", ", ".join(self.preload))
        return ctx, StartMethod(FORKSERVER, FORKSERVER, True)

    def _fall_back(self, reason: str) -> tuple[Context, StartMethod]:
        log.error("lease workers start with spawn, not forkserver: %s. Each worker then loads boto3 and pyarrow "
                  "itself (about twice the memory); set worker_start_method='spawn' to choose spawn outright",
                  reason)
        return multiprocessing.get_context("spawn"), StartMethod(FORKSERVER, SPAWN, False, reason)


_last_readied: StartMethod | None = None


def readied_start_method() -> StartMethod | None:
    """How this process's lease workers start, as its last manager readied them (None before any worker)."""
    return _last_readied


def start_server() -> None:
    """Start this process's forkserver (multiprocessing keeps one per process) unless it runs already."""
    multiprocessing.forkserver.ensure_running()


def probe(ctx: Context, timeout: float) -> bool:
    """Fork one short-lived process from the server: True when the server holds the preloads, False when it
    runs without them; WorkerStartError when no process comes back."""
    proc = ctx.Process(target=_probe_main, name="kcl-forkserver-probe", daemon=True)
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join(5)
        raise WorkerStartError(f"a probe process forked from the server did not finish within {timeout:.0f}s")
    if proc.exitcode == 0:
        return True
    if proc.exitcode == PROBE_NOT_PRELOADED:
        return False
    raise WorkerStartError(f"a probe process forked from the server exited with code {proc.exitcode}")


def _probe_main() -> None:
    detach_from_server()
    sys.exit(0 if WARM_UP_MODULE in sys.modules else PROBE_NOT_PRELOADED)


def detach_from_server() -> None:
    """First thing in a worker: give back the server's "alive" pipe, which multiprocessing hands every process
    forked from the server (so that one may start processes through it too). Held by a worker, it keeps the
    server alive after its host died, and with it the worker's parent: the worker's parent-death stop would
    never come. A no-op under spawn, and in the process that started the server."""
    server = multiprocessing.forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:
        return  # none inherited, or ours: this process started the server
    setattr(server, "_forkserver_alive_fd", None)  # noqa: B010 - a private attribute of multiprocessing
    try:
        os.close(fd)
    except OSError:
        pass


# glibc keeps a process's freed heap for reuse: after a backlog a worker held ~30 MB it no longer used.
TRIM_PERIOD_SECONDS = 60.0

# glibc serves a block of at least M_MMAP_THRESHOLD bytes with its own mmap and unmaps it on free. The threshold
# starts at 128 KiB but is dynamic: each freed mmapped block raises it to that block's size (up to 32 MiB). A
# worker's large blocks are transient — a GetRecords response (its HTTP body, its JSON), an encoded batch — so
# after the first few the threshold sat at several MiB and every later one was carved from the heap, where
# freed space fragments and the next response or flush could not reuse it in place: a worker draining a
# 100k-record backlog peaked ~7 MiB higher (119 vs 112 MiB RSS, benchmarks/bench_memory.py). Pinning it (which
# also stops the adjustment) gives each large block back to the OS the moment it is freed.
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, None elsewhere (musl, macOS)."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def pin_mmap_threshold(mallopt: Callable[[int, int], int] | None = None,
                       threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """First thing in a worker: a fixed mmap threshold (see above). True when set; False where glibc's mallopt is
    missing or refuses (the worker runs as before)."""
    set_option = mallopt if mallopt is not None else _mallopt()
    if set_option is None:
        return False
    return bool(set_option(M_MMAP_THRESHOLD, threshold))


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, None elsewhere (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrimmer:
    """Gives a worker's freed heap back to the OS while it is caught up (glibc's malloc_trim), at most once a
    period: cheap (a walk of the heap's free lists), and a worker idle after a backlog holds what idle needs."""

    def __init__(self, period: float = TRIM_PERIOD_SECONDS, trim: Callable[[int], int] | None = None):
        self.period = period
        self._trim = trim if trim is not None else _malloc_trim()
        self._last: float | None = None

    def caught_up(self, now: float) -> bool:
        """Called on each poll that found the shard caught up; True when it trimmed."""
        if self._trim is None or (self._last is not None and now - self._last < self.period):
            return False
        self._last = now
        self._trim(0)
        return True


def _name_process(name: str) -> None:
    """Best effort: this process's short name (/proc/self/comm, as worker.name_process does)."""
    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass


# -- the server's warm-up (forkserver_warmup.py runs it, in the server only) ---------------------------------

def warm_up() -> list[str]:
    """Load in the server what every worker would load for itself, then freeze the heap. Returns what could
    not be warmed (never raises: a worker loads whatever is missing itself)."""
    _name_process(SERVER_PROCESS_NAME)
    missed = []
    for name, step in (("botocore", _warm_botocore), ("pyarrow", _warm_pyarrow)):
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - a warm-up never stops the server
            missed.append(f"{name}: {type(exc).__name__}: {exc}")
    gc.collect()
    gc.freeze()  # a worker's collections never visit (nor write to) the objects it shares with the server
    return missed


def _warm_botocore() -> None:
    """botocore's endpoints, defaults and the workers' service models, parsed into aws.py's one loader.
    The clients are built with placeholder credentials (no credential lookup, nothing sent) and dropped."""
    from ..aws import boto3_session, compact_loaded_data

    for service in WARM_SERVICES:
        boto3_session().client(service, region_name="us-east-1", aws_access_key_id="warm-up",
                               aws_secret_access_key="warm-up")
        compact_loaded_data()  # before the next service's model: it reuses the space this frees


def _warm_pyarrow() -> None:
    """One record to Arrow and Parquet (zstd) in memory: the lazy imports and first-use setup of a flush."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ...core.model import UserRecord
    from ...records.record_batch import UserRecordBatch

    shard = "shardId-000000000000"
    table = UserRecordBatch.from_records(shard, [UserRecord(shard, "1", 0, "k", None, 0, b"{}")]).to_arrow("warm-up")
    with pq.ParquetWriter(pa.BufferOutputStream(), table.schema, compression="zstd") as writer:
        writer.write_table(table)
