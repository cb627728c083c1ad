"""The machine's process table and a process's descendants, for tests that find or stop what a command started."""
from __future__ import annotations

import subprocess


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    procs = {}
    for line in out.splitlines():
        parts = line.strip().split(None, 2)
        if len(parts) == 3:
            procs[int(parts[0])] = (int(parts[1]), parts[2])
    return procs


def descendants(root: int, procs: dict[int, tuple[int, str]] | None = None) -> list[int]:
    """Every descendant of `root` in `procs` (the table as it is now when not given)."""
    procs = process_table() if procs is None else procs
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _) in procs.items() if ppid == parent]
        found += children
        frontier += children
    return found


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
