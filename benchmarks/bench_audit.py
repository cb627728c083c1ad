"""The lineage audit over a whole history in an S3 zone on the moto server (over HTTP on 127.0.0.1).

For each size (--windows, default 1,000 and 10,000 one-minute windows, measured in the same run): a landing
bucket holding one shard's chain — one batch a window, fenced by its link, as the sink writes them — and an
output bucket holding each window's two datasets (a file and a manifest each) and its commit: 7 objects a
window. Then, timed:

* full: `audit_history(..., full=True)`, every footer and commit read (the index ignored), the index written;
* unchanged: the next audit, nothing new (the listing, then the index alone);
* one new window: a window lands and commits, and the audit runs again (reads its footer and commit);
* peer: today's per-window path (`audit_window` for each window: list the window and the one before it, read
  its footers, HEAD its first batch's predecessor, read its commit), the one way the earlier code could cover a
  history (its default audited the newest 24 windows only); run on --peer-sample windows spread over the
  history and extrapolated to all of them (full at the smallest size), labelled so.

Per-window seconds show whether the cost stays flat as the history grows. Every audit must come out OK.

    .venv/bin/python benchmarks/bench_audit.py [--windows 1000,10000] [--peer-sample 500] [--workers 16]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kcl_pipeline.audit.history import audit_history  # noqa: E402
from kcl_pipeline.audit.lineage import audit_window, output_partition  # noqa: E402
from kcl_pipeline.kcl.core.model import Checkpoint, UserRecord  # noqa: E402
from kcl_pipeline.local.emulators import EmulatorStack  # noqa: E402
from kcl_pipeline.windows.manifest import WindowCommit, commit_key  # noqa: E402
from kcl_pipeline.zone.batch import encode_batch  # noqa: E402
from kcl_pipeline.zone.layout import MINUTE_MS, Zone, link_key  # noqa: E402
from kcl_pipeline.zone.store import S3Options, S3ZoneStore  # noqa: E402

T0 = 1_714_564_800_000  # 2024-05-01T12:00Z
STREAM = "bench"
SHARD = "shardId-000000000000"
RECORDS_PER_WINDOW = 20
W = MINUTE_MS


def records_of(window: int) -> list[UserRecord]:
    rnd = random.Random(window)
    start = T0 + window * W
    return [UserRecord(SHARD, f"4959{window * RECORDS_PER_WINDOW + i:052d}", 0, f"pk{i % 5}", None,
                       start + i * (W // (RECORDS_PER_WINDOW + 1)), b'{"n":%d,"v":"%s"}' % (i, b"x" * rnd.randrange(
                           40, 120))) for i in range(RECORDS_PER_WINDOW)]


def build(landing: S3ZoneStore, output: S3ZoneStore, windows: range, previous: tuple[Checkpoint, str] | None,
          workers: int) -> tuple[Checkpoint, str]:
    """Land `windows` (each: the batch's link, the batch, the window's commit) as the sink and the transform
    leave them; returns the chain's end (last position, last key)."""
    puts: list[tuple[S3ZoneStore, str, bytes]] = []
    prev, prev_key = previous if previous else (Checkpoint("TRIM_HORIZON"), None)
    for w in windows:
        batch = encode_batch(STREAM, SHARD, records_of(w), prev, prev_key=prev_key)
        key = batch.key.key()
        puts.append((landing, link_key(STREAM, batch.key.minute_ms, SHARD, prev), key.encode()))
        puts.append((landing, key, batch.body))
        datasets = {}
        for name, rows in (("transformed", RECORDS_PER_WINDOW - 1), ("quarantine", 1)):
            file = f"run=job-{w}/part-00000-0.parquet"
            datasets[name] = {"job_id": f"job-{w}", "run": f"run=job-{w}", "files": [file], "rows": rows}
            partition = f"{name}/{output_partition(T0 + w * W)}"
            puts.append((output, f"{partition}/{file}", b"PAR1" + b"\0" * 400 + b"PAR1"))
            puts.append((output, f"{partition}/_manifest.json", json.dumps(datasets[name]).encode()))
        commit = WindowCommit(T0 + w * W, T0 + (w + 1) * W, f"job-{w}", frozenset({key}), datasets)
        puts.append((output, commit_key(T0 + w * W), commit.to_json()))
        prev, prev_key = batch.key.last, key
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda p: p[0].put_if_absent(p[1], p[2]), puts))
    return prev, prev_key


class Phase:
    """Wall seconds, and the CPU seconds of the moto server and of this process (the work, whatever else the
    machine runs: on a shared machine the wall time follows the load, the CPU seconds much less)."""

    server_pid: int = 0

    def __init__(self, wall: float, server_cpu: float, client_cpu: float, load: float):
        self.wall, self.server_cpu, self.client_cpu, self.load = wall, server_cpu, client_cpu, load

    @classmethod
    def server_seconds(cls) -> float:
        with open(f"/proc/{cls.server_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn):
    started, server, client = time.perf_counter(), Phase.server_seconds(), time.process_time()
    result = fn()
    return result, Phase(time.perf_counter() - started, Phase.server_seconds() - server,
                         time.process_time() - client, os.getloadavg()[0])


def measure(s3, n: int, peer_sample: int, workers: int) -> tuple:
    """Build a history of `n` windows in fresh buckets and time the audits; every one must come out OK."""
    for bucket in (f"landing-{n}", f"output-{n}"):
        s3.create_bucket(Bucket=bucket)
    landing = S3ZoneStore(Zone.parse(f"s3://landing-{n}/zone"), s3)
    output = S3ZoneStore(Zone.parse(f"s3://output-{n}/out"), s3, what="transform output")
    _, build_phase = timed(lambda: build(landing, output, range(n), None, workers))
    now = T0 + (n + 2) * W
    full, full_phase = timed(lambda: audit_history(landing, output, STREAM, W, now_ms=now, full=True,
                                                   workers=workers))
    same, same_phase = timed(lambda: audit_history(landing, output, STREAM, W, now_ms=now, workers=workers))
    build(landing, output, range(n, n + 1), _chain_end(n), workers)
    new, new_phase = timed(lambda: audit_history(landing, output, STREAM, W, now_ms=now + W, workers=workers))
    for report in (full, same, new):
        assert report.ok, "\n".join(report.lines()[-8:])
    assert new.scopes[0].read_batches == 1 and new.scopes[0].read_commits == 1, new.scopes[0]
    sample = min(n, peer_sample)
    picks = sorted(random.Random(n).sample(range(n), sample))

    def peer() -> bool:
        return all(o.ok for w in picks
                   for o in audit_window(landing, output, STREAM, T0 + w * W, T0 + (w + 1) * W, now_ms=now))

    peer_ok, peer_phase = timed(peer)
    assert peer_ok
    return n, build_phase, full_phase, same_phase, new_phase, peer_phase, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", default="1000,10000")
    parser.add_argument("--peer-sample", type=int, default=500)
    parser.add_argument("--workers", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    rows = []
    stack = EmulatorStack(tempfile.mkdtemp(prefix="bench-audit-"), services=("s3",))
    with stack as endpoints:
        Phase.server_pid = stack.pids()["moto"]
        s3 = S3Options(endpoint_url=endpoints.s3, region=endpoints.region).client()
        for n in (int(x) for x in args.windows.split(",")):
            row = measure(s3, n, args.peer_sample, args.workers)
            rows.append(row)
            n, build, full, same, new, peer, sample = row
            print(f"{n} windows (built in {build.wall:.0f} s): " + "; ".join(
                f"{name} {p.wall:.1f} s wall, {p.server_cpu:.1f} s moto CPU, {p.client_cpu:.1f} s audit CPU, load "
                f"{p.load:.1f}" for name, p in (("full", full), ("unchanged", same), ("one new window", new),
                                                 (f"peer ({sample} windows)", peer))), flush=True)
    print()
    print("| windows | full audit (every object read): wall / moto CPU / audit CPU | per window (wall / moto CPU) "
          "| unchanged | one new window | peer, per window (wall / moto CPU), and extrapolated to every window |")
    print("|---|---|---|---|---|---|")
    for n, _build, full, same, new, peer, sample in rows:
        print(f"| {n:,} | **{full.wall:.1f} s** / {full.server_cpu:.1f} s / {full.client_cpu:.1f} s (load "
              f"{full.load:.0f}) | {full.wall / n * 1000:.2f} ms / {full.server_cpu / n * 1000:.2f} ms | "
              f"{same.wall:.1f} s / {same.server_cpu:.1f} s | **{new.wall:.1f} s** / {new.server_cpu:.1f} s | "
              f"{peer.wall / sample * 1000:.0f} ms / {peer.server_cpu / sample * 1000:.0f} ms → "
              f"{peer.wall * n / sample:.0f} s ({sample} windows sampled) |")


def _chain_end(n: int) -> tuple[Checkpoint, str]:
    last = encode_batch(STREAM, SHARD, records_of(n - 1), None)
    return last.key.last, last.key.key()


if __name__ == "__main__":
    main()
