"""The lease workers' memory as a host reports it: PSS and USS from /proc/<pid>/smaps_rollup."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcl_pipeline.kcl.shells.workers import memory
from kcl_pipeline.kcl.shells.workers.memory import (
    ProcessMemory,
    WorkersMemory,
    host_report,
    lease_workers_memory,
    measure,
    processes_named,
    read_smaps_rollup,
)
from kcl_pipeline.kcl.shells.workers.worker import WORKER_PROCESS_NAME

ROLLUP = """55d0c0a00000-7ffd3c3f1000 ---p 00000000 00:00 0                          [rollup]
Rss:               98304 kB
Pss:               30720 kB
Pss_Anon:          20480 kB
Shared_Clean:      60000 kB
Shared_Dirty:       8000 kB
Private_Clean:      1024 kB
Private_Dirty:     13312 kB
Swap:                  0 kB
"""


def fake_proc(tmp_path: Path, processes: dict[int, tuple[str, str | None]]) -> str:
    """A /proc with `self` and, per pid, its comm and smaps_rollup (None: no rollup file)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "smaps_rollup").write_text(ROLLUP)
    for pid, (comm, rollup) in processes.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "comm").write_text(comm + "\n")
        if rollup is not None:
            (proc / str(pid) / "smaps_rollup").write_text(rollup)
    return str(proc)


def test_a_rollup_gives_rss_pss_and_uss_in_bytes(tmp_path):
    proc = fake_proc(tmp_path, {41: (WORKER_PROCESS_NAME, ROLLUP)})
    assert read_smaps_rollup(41, proc) == ProcessMemory(41, 98304 * 1024, 30720 * 1024, (1024 + 13312) * 1024)


def test_workers_are_found_by_name_and_summed(tmp_path):
    other = ROLLUP.replace("30720", "40960").replace("13312", "23552")
    proc = fake_proc(tmp_path, {41: (WORKER_PROCESS_NAME, ROLLUP), 42: (WORKER_PROCESS_NAME, other),
                                43: ("python3", ROLLUP), 44: ("kcl-forkserver", ROLLUP)})
    assert processes_named(WORKER_PROCESS_NAME, proc) == [41, 42]
    report = lease_workers_memory(proc)
    assert report.available and report.count == 2 and report.unreadable == 0
    assert report.pss_sum == (30720 + 40960) * 1024 and report.pss_max == 40960 * 1024
    assert report.uss_max == (1024 + 23552) * 1024
    assert report.as_metadata() == {"workers": 2, "pss_sum_mib": 70.0, "pss_max_mib": 40.0, "uss_sum_mib": 38.0,
                                    "uss_max_mib": 24.0}
    assert report.summary() == ("2 lease workers on this host: PSS 70.0 MiB in all, at most 40.0 MiB "
                                "(USS 38.0 MiB in all, at most 24.0 MiB)")
    assert lease_workers_memory(proc, exclude=[42]).count == 1


def test_a_process_gone_meanwhile_is_skipped_and_an_unreadable_one_counted(tmp_path, monkeypatch):
    proc = fake_proc(tmp_path, {41: (WORKER_PROCESS_NAME, ROLLUP), 42: (WORKER_PROCESS_NAME, None),
                                43: (WORKER_PROCESS_NAME, "Rss: 1 kB\n"), 44: (WORKER_PROCESS_NAME, ROLLUP)})
    real_open = open

    def guarded(path, *args, **kwargs):  # root reads everything: say no as the kernel would to another user
        if str(path).endswith(os.path.join("44", "smaps_rollup")):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(memory, "open", guarded, raising=False)
    report = lease_workers_memory(proc)
    assert report.count == 1 and report.unreadable == 2 and report.pids_unreadable == (43, 44)
    assert report.as_metadata()["unreadable"] == 2
    assert report.summary().endswith("; 2 more not readable by this user")


def test_without_smaps_rollup_the_report_says_unavailable(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    report = measure([1], str(proc))
    assert not report.available and "smaps_rollup" in report.reason
    assert report.as_metadata()["memory"].startswith("unavailable: ")
    assert report.summary().startswith("lease workers' memory unavailable")


def test_no_workers_is_a_report_of_zero(tmp_path):
    report = lease_workers_memory(fake_proc(tmp_path, {}))
    assert report == WorkersMemory(True) and report.pss_max == 0
    assert report.summary() == "no lease workers on this host"


def test_the_host_report_names_the_forkservers_too(tmp_path):
    proc = fake_proc(tmp_path, {41: (WORKER_PROCESS_NAME, ROLLUP), 44: ("kcl-forkserver", ROLLUP)})
    assert host_report(proc) == ("1 lease worker on this host: PSS 30.0 MiB in all, at most 30.0 MiB (USS 14.0 MiB "
                                 "in all, at most 14.0 MiB); 1 forkserver (what they share): PSS 30.0 MiB")
    assert host_report(fake_proc(tmp_path / "none", {})) == "no lease workers on this host"


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux 4.14+ /proc only")
def test_a_live_process_named_as_a_lease_worker_is_measured():
    child = subprocess.Popen([sys.executable, "-c", f"open('/proc/self/comm','w').write({WORKER_PROCESS_NAME!r});"
                              "data = bytearray(20 * 1024 * 1024); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        found = None
        while time.monotonic() < deadline:
            found = next((p for p in lease_workers_memory().processes if p.pid == child.pid), None)
            if found is not None and found.uss >= 20 * 1024 * 1024:
                break
            time.sleep(0.1)
        assert found is not None, "the named child was not found"
        assert found.uss >= 20 * 1024 * 1024 and found.pss >= found.uss and found.rss >= found.pss
    finally:
        child.kill()
        child.wait()


def test_the_sensors_observation_keys_are_fixed_and_say_how_workers_start(tmp_path, monkeypatch):
    from kcl_pipeline.kcl.shells.workers import worker_processes
    from kcl_pipeline.kcl.shells.workers.memory import host_metadata
    from kcl_pipeline.kcl.shells.workers.worker_processes import StartMethod

    keys = {"lease_workers_on_host", "lease_workers_pss_mib", "lease_worker_pss_max_mib", "lease_worker_uss_max_mib",
            "worker_start_method"}
    monkeypatch.setattr(worker_processes, "_last_readied", None)
    proc = fake_proc(tmp_path, {41: (WORKER_PROCESS_NAME, ROLLUP)})
    assert host_metadata(proc) == {"lease_workers_on_host": 1, "lease_workers_pss_mib": 30.0,
                                   "lease_worker_pss_max_mib": 30.0, "lease_worker_uss_max_mib": 14.0,
                                   "worker_start_method": "-"}
    monkeypatch.setattr(worker_processes, "_last_readied", StartMethod("forkserver", "spawn", False, "OSError: x"))
    unavailable = host_metadata(str(tmp_path / "nowhere"))
    assert set(unavailable) == keys and unavailable["lease_workers_on_host"] == -1
    assert unavailable["worker_start_method"] == "spawn (fell back: OSError: x)"
    monkeypatch.setattr(worker_processes, "_last_readied", StartMethod("forkserver", "forkserver", True))
    assert host_metadata(proc)["worker_start_method"] == "forkserver"
