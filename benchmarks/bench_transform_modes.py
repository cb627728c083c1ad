"""One window's transform in each place it can run, in one run: local[2] session (the peer), a standalone
cluster (a master and two 1-core workers from pyspark's own spark-class) and Spark Connect (pyspark's own
SparkConnectServer, local[2] behind it), all on loopback.

    .venv/bin/python benchmarks/bench_transform_modes.py [--records 300000] [--repeat 2]

Each mode runs benchmarks/bench_transform.py in its own process (one driver at a time, so the modes never
compete for the two cores) on the same generated window; the best warm records/s of each is printed with
its ratio to local[2]. Session start and the cold first run are printed by bench_transform itself.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks" / "bench_transform.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def start(cmd: list[str], log: Path, ready: str, limit_s: float = 120) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=spark_env())
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if ready in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not start: {log.read_text(errors='replace')[-2000:]}")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_bench(master: str, args, extra: list[str] | None = None) -> float:
    cmd = [sys.executable, str(BENCH), "--records", str(args.records), "--repeat", str(args.repeat),
           "--decoders", "json", "--master", master, *(extra or [])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=spark_env(), cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if not line.startswith("Using Spark")]
    print("\n".join(f"  {line}" for line in lines), flush=True)
    if done.returncode:
        raise RuntimeError(f"{master}: bench failed:\n{done.stderr[-3000:]}")
    match = re.search(r"best warm: json ([\d,]+) records/s", done.stdout)
    return float(match.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    rates: dict[str, float] = {}

    print("local[2] session (the peer)", flush=True)
    rates["local[2]"] = run_bench("local[2]", args)

    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    procs = [start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                    "--webui-port", str(free_port())], logs / "master.log", "I have been elected leader")]
    try:
        for i in range(2):
            procs.append(start([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                                "--work-dir", str(logs / f"work{i}")], logs / f"worker{i}.log",
                               "Successfully registered with master"))
        print(f"standalone cluster {url}, 2 workers x 1 core", flush=True)
        rates["standalone 2x1"] = run_bench(url, args)
    finally:
        stop(procs)

    port = free_port()
    server = start([str(SPARK_HOME / "bin" / "spark-submit"), "--class",
                    "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
                    "--conf", f"spark.connect.grpc.binding.port={port}",
                    "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
                    "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=2g", "spark-internal"],
                   logs / "connect.log", "Spark Connect server started")
    try:
        print(f"Spark Connect sc://127.0.0.1:{port} (local[2] behind it)", flush=True)
        rates["Spark Connect"] = run_bench(f"sc://127.0.0.1:{port}", args)
    finally:
        stop([server])

    peer = rates["local[2]"]
    print("\nbest warm records/s (ratio to the local[2] session, measured in this run):")
    for mode, rate in rates.items():
        print(f"  {mode:<16} {rate:>10,.0f}  {rate / peer:.2f}x")


if __name__ == "__main__":
    main()
