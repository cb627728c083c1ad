"""What this host's lease workers hold in memory: PSS and USS from /proc/<pid>/smaps_rollup (Linux).

RSS counts every page a process maps, shared or not, so forty workers forked from one preloaded server each
report the server's whole heap again. Two figures do not:

* USS (unique set size): the pages only this process maps (Private_Clean + Private_Dirty): what its exit
  gives back.
* PSS (proportional set size): its private pages plus, for each shared page, 1/n of it when n processes map
  it. Summed over processes, PSS is what they take together: the host figure.

Workers are found by their process name (`worker.WORKER_PROCESS_NAME`, in /proc/<pid>/comm). A process that
ended between the listing and the reading is skipped; one whose smaps_rollup cannot be read (another user's,
without the privilege) is counted as unreadable, never guessed. Elsewhere than Linux, or without
smaps_rollup (kernels before 4.14), the report says it is unavailable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable

PROC = "/proc"
KB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory, in bytes."""

    pid: int
    rss: int
    pss: int
    uss: int


def read_smaps_rollup(pid: int | str, proc: str = PROC) -> ProcessMemory:
    """One process's RSS, PSS and USS. FileNotFoundError / ProcessLookupError: it is gone; PermissionError:
    not readable by this user; ValueError: a file without the Rss and Pss lines."""
    fields: dict[str, int] = {}
    with open(os.path.join(proc, str(pid), "smaps_rollup")) as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                fields[name] = int(parts[0]) * KB
    if "Rss" not in fields or "Pss" not in fields:
        raise ValueError(f"{proc}/{pid}/smaps_rollup has no Rss or Pss line")
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0) + fields.get("Private_Hugetlb", 0)
    return ProcessMemory(int(pid), fields["Rss"], fields["Pss"], uss)


def process_name(pid: int | str, proc: str = PROC) -> str | None:
    """A process's short name (/proc/<pid>/comm); None when it is gone or unreadable."""
    try:
        with open(os.path.join(proc, str(pid), "comm")) as f:
            return f.read().strip()
    except OSError:
        return None


def processes_named(name: str, proc: str = PROC) -> list[int]:
    """The pids whose short name is `name` (at most 15 characters count, as the kernel keeps them)."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    return sorted(int(entry) for entry in entries if entry.isdigit() and process_name(entry, proc) == name[:15])


@dataclass(frozen=True)
class WorkersMemory:
    """The memory of a set of processes (a host's lease workers), in bytes."""

    available: bool
    processes: tuple[ProcessMemory, ...] = ()
    unreadable: int = 0  # processes found but not readable (another user's)
    reason: str = ""  # why unavailable, when it is
    pids_unreadable: tuple[int, ...] = field(default=(), repr=False)

    @property
    def count(self) -> int:
        return len(self.processes)

    @property
    def pss_sum(self) -> int:
        return sum(p.pss for p in self.processes)

    @property
    def pss_max(self) -> int:
        return max((p.pss for p in self.processes), default=0)

    @property
    def uss_sum(self) -> int:
        return sum(p.uss for p in self.processes)

    @property
    def uss_max(self) -> int:
        return max((p.uss for p in self.processes), default=0)

    @property
    def rss_max(self) -> int:
        return max((p.rss for p in self.processes), default=0)

    def as_metadata(self) -> dict[str, float | int | str]:
        """Flat, JSON-friendly figures (MiB, one decimal) for a report or a sensor's observation."""
        if not self.available:
            return {"workers": 0, "memory": f"unavailable: {self.reason}"}
        out: dict[str, float | int | str] = {
            "workers": self.count, "pss_sum_mib": _mib(self.pss_sum), "pss_max_mib": _mib(self.pss_max),
            "uss_sum_mib": _mib(self.uss_sum), "uss_max_mib": _mib(self.uss_max)}
        if self.unreadable:
            out["unreadable"] = self.unreadable
        return out

    def summary(self) -> str:
        """One line for an operator: `12 lease workers: PSS 410.2 MiB in all, at most 36.1 MiB (USS ...)`."""
        if not self.available:
            return f"lease workers' memory unavailable: {self.reason}"
        if not self.count and not self.unreadable:
            return "no lease workers on this host"
        text = (f"{self.count} lease worker{'s' if self.count != 1 else ''} on this host: "
                f"PSS {_mib(self.pss_sum):.1f} MiB in all, at most {_mib(self.pss_max):.1f} MiB "
                f"(USS {_mib(self.uss_sum):.1f} MiB in all, at most {_mib(self.uss_max):.1f} MiB)")
        if self.unreadable:
            text += f"; {self.unreadable} more not readable by this user"
        return text


def _mib(n: int) -> float:
    return round(n / MIB, 1)


def measure(pids: Iterable[int], proc: str = PROC) -> WorkersMemory:
    """The memory of these processes; gone ones are skipped, unreadable ones counted."""
    if not os.path.exists(os.path.join(proc, "self", "smaps_rollup")):
        return WorkersMemory(False, reason=f"no {proc}/self/smaps_rollup (Linux 4.14 or later only)")
    found: list[ProcessMemory] = []
    unreadable: list[int] = []
    for pid in pids:
        try:
            found.append(read_smaps_rollup(pid, proc))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        except (PermissionError, ValueError):
            unreadable.append(pid)
        except OSError:  # e.g. ESRCH while reading a process that is exiting
            continue
    return WorkersMemory(True, tuple(found), len(unreadable), pids_unreadable=tuple(unreadable))


def lease_workers_memory(proc: str = PROC, exclude: Iterable[int] = ()) -> WorkersMemory:
    """The memory of every lease worker on this host (processes named `kcl-lease`), whoever hosts them."""
    from .worker import WORKER_PROCESS_NAME

    skip = set(exclude)
    return measure([pid for pid in processes_named(WORKER_PROCESS_NAME, proc) if pid not in skip], proc)


def forkservers_memory(proc: str = PROC) -> WorkersMemory:
    """The memory of the servers lease workers fork from (`kcl-forkserver`): they hold what workers share."""
    from .worker_processes import SERVER_PROCESS_NAME

    return measure(processes_named(SERVER_PROCESS_NAME, proc), proc)


def host_report(proc: str = PROC) -> str:
    """One line: this host's lease workers' memory, and their forkservers' when there are any."""
    workers = lease_workers_memory(proc)
    text = workers.summary()
    servers = forkservers_memory(proc) if workers.available else None
    if servers is not None and servers.count:
        text += (f"; {servers.count} forkserver{'s' if servers.count != 1 else ''} (what they share): "
                 f"PSS {_mib(servers.pss_sum):.1f} MiB")
    return text


def host_metadata(proc: str = PROC) -> dict[str, float | int | str]:
    """Fixed keys for a sensor's observation (they plot over time): this host's lease workers' memory (MiB; -1
    when it cannot be read here) and how this process's workers start."""
    from .worker_processes import readied_start_method

    workers = lease_workers_memory(proc)
    method = readied_start_method()
    started = "-" if method is None else method.as_metadata()["start_method"] + (
        f" (fell back: {method.detail})" if method.fell_back else "")
    if not workers.available:
        return {"lease_workers_on_host": -1, "lease_workers_pss_mib": -1.0, "lease_worker_pss_max_mib": -1.0,
                "lease_worker_uss_max_mib": -1.0, "worker_start_method": started}
    return {"lease_workers_on_host": workers.count, "lease_workers_pss_mib": _mib(workers.pss_sum),
            "lease_worker_pss_max_mib": _mib(workers.pss_max), "lease_worker_uss_max_mib": _mib(workers.uss_max),
            "worker_start_method": started}
