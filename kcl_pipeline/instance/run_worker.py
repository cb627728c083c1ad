"""Is a run's worker still there? The decision, and the few reads it needs.

Dagster's default launcher starts each run in a process its code server spawns. While that code server lives, it
notices a run process that died and fails its run itself. When the code server goes too (a stop that killed
`dagster dev`'s process group, a host restart), nobody ever ends the run: it stays STARTED for good, and since
window runs queue behind one Spark slot, every later window waits behind it. Run monitoring asks the launcher
about each STARTED run (`check_run_worker_health`); `worker_health` is the answer, from what can be seen:

- the code server that launched the run (its address is in the run's tags) still runs it: running;
- the run worker's process (its pid is in the run's "Started process for run" event) is on this host: running
  while a process with that pid exists and started before the event (a pid reused since is not the worker);
- otherwise the worker cannot be seen, and it is taken as running: a code server on another host that does not
  answer may be restarting, and one that answers but does not run it may be a code-server proxy (`dagster dev`,
  `dagster code-server start`) answering for the server it reloaded to, while the runs of the one before go on.
  A wrong "gone" would fail a live run; Dagster's `dagster/max_runtime` tag bounds such a run if wanted.
"""
from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass
from pathlib import Path

STARTED_PROCESS_PREFIX = "Started process for run"  # the run worker's first engine event (it carries the pid)
# A process whose start time is later than the worker's own "started" event by more than this is another one
# (the clock ticks of /proc are 10 ms; the event is written after the process starts).
START_TOLERANCE_SECONDS = 2.0
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


class ServerAnswer(enum.Enum):
    RUNS_IT = "runs it"
    DOES_NOT_RUN_IT = "answers but does not run it"
    NO_ANSWER = "does not answer"


@dataclass(frozen=True)
class WorkerSight:
    """What could be seen of one STARTED run's worker."""

    server: str  # the code server's address, as the run's tags name it
    answer: ServerAnswer
    pid: int | None  # the run worker's pid (None: no "Started process" event, or the worker is on another host)
    pid_alive: bool | None  # None: not looked at (no pid, or not this host)


@dataclass(frozen=True)
class WorkerHealth:
    gone: bool
    reason: str


def worker_health(sight: WorkerSight) -> WorkerHealth:
    """The decision (module docstring): is the run's worker gone, and why we think so."""
    where = f"its code server {sight.server} {sight.answer.value}"
    if sight.answer is ServerAnswer.RUNS_IT:
        return WorkerHealth(False, where)
    if sight.pid_alive is True:
        return WorkerHealth(False, f"{where}; its run worker (pid {sight.pid}) is still running on this host")
    if sight.pid_alive is False:
        return WorkerHealth(True, f"its run worker (pid {sight.pid}) has exited without ending the run, and {where}")
    return WorkerHealth(False, f"{where}, and its run worker cannot be seen from this host: taken as still running")


def is_this_host(host: str | None, via_socket: bool) -> bool:
    """Does an address in a run's tags name this host (a unix socket always does)?"""
    if via_socket:
        return True
    if host is None:
        return False
    return host in LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}


def process_alive(pid: int, started_by: float, proc: Path = Path("/proc")) -> bool:
    """Is `pid` a live process that started no later than `started_by` (epoch seconds)? A zombie is not alive.
    Without /proc (not Linux) only existence is checked."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    stat = proc / str(pid) / "stat"
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        boot = next(int(line.split()[1]) for line in (proc / "stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        return True
    state, start_ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5), counted after the name
    if state in ("Z", "X"):
        return False
    started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    return started <= started_by + START_TOLERANCE_SECONDS
