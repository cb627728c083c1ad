"""The transform on a Spark standalone cluster (a master and two workers from pyspark's own `spark-class`,
on loopback) writes the same bytes as the local session for the same window."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from kcl_pipeline.transform.job import read_partition, transform_window

from .landing_batches import MINUTE, SHARD0, SHARD1, T0, Rec, seq, write_local

pytestmark = pytest.mark.slow

SPARK_HOME = Path(pyspark.__file__).parent
REPO = Path(__file__).resolve().parents[2]
WINDOW = (T0, T0 + 2 * MINUTE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env() -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def start(args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")
    return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out, stderr=subprocess.STDOUT,
                            env=spark_env())


def wait_for(log: Path, text: str, proc: subprocess.Popen, what: str, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not start: {log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []
    try:
        master = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(free_port())], logs / "master.log")
        procs.append(master)
        wait_for(logs / "master.log", "I have been elected leader", master, "the Spark master")
        for i in range(2):
            log = logs / f"worker{i}.log"
            worker = start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                            "--memory", "1g", "--webui-port", str(free_port()),
                            "--work-dir", str(logs / f"work{i}")], log)
            procs.append(worker)
            wait_for(log, "Successfully registered with master", worker, f"Spark worker {i}")
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


CLUSTER_RUN = """
import json, sys
from kcl_pipeline.transform.job import build_local_session, transform_window
master, zone, out, t0, t1 = sys.argv[1:6]
spark = build_local_session(master, "kcl-pipeline-cluster-test", **{
    "spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m", "spark.executor.cores": "1",
    "spark.cores.max": "2"})
report = transform_window(spark, zone=zone, stream="s1", window_start_ms=int(t0), window_end_ms=int(t1),
                          output_uri=out)
print(json.dumps(report.as_dict()))
spark.stop()
"""


@pytest.fixture
def zone(tmp_path):
    root = tmp_path / "zone"
    for k in range(6):
        write_local(root, "s1", [Rec(SHARD0, seq(100 * k + i), b'{"i":%d}' % i, T0 + 1000 * k + i)
                                 for i in range(50)])
    write_local(root, "s1", [Rec(SHARD1, seq(9000 + i), b"poison" if i % 7 == 0 else b'{"j":%d}' % i,
                                 T0 + MINUTE + i) for i in range(80)])
    return root


def dataset_bytes(out: Path, dataset: str) -> list[bytes]:
    _table, manifest = read_partition(str(out), dataset, T0)
    part = out / dataset / f"window={manifest['partition'].split('=', 1)[1]}"
    return [(part / name).read_bytes() for name in manifest["files"]]


def test_standalone_cluster_writes_the_local_sessions_bytes(spark, standalone_cluster, zone, tmp_path):
    local_out, cluster_out = tmp_path / "local", tmp_path / "cluster"
    local = transform_window(spark, zone=str(zone), stream="s1", window_start_ms=WINDOW[0],
                             window_end_ms=WINDOW[1], output_uri=str(local_out))
    done = subprocess.run([sys.executable, "-c", CLUSTER_RUN, standalone_cluster, str(zone), str(cluster_out),
                           str(WINDOW[0]), str(WINDOW[1])], env=spark_env(), capture_output=True, timeout=600,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    cluster = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert {k: cluster[k] for k in ("rows_in", "rows_out", "quarantined")} == {
        "rows_in": local.rows_in, "rows_out": local.rows_out, "quarantined": local.quarantined}
    for dataset in ("transformed", "quarantine"):
        assert dataset_bytes(cluster_out, dataset) == dataset_bytes(local_out, dataset), dataset


# ------------------------------------------------------------------ Spark Connect

@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server (pyspark's own SparkConnectServer, what sbin/start-connect-server.sh runs) on
    loopback, its Python workers running this interpreter with this repository importable."""
    logs = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    log = logs / "connect.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-submit"),
             "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.memory=1g", "spark-internal"],
            stdout=out, stderr=subprocess.STDOUT, env=spark_env())
    try:
        wait_for(log, "Spark Connect server started", proc, "the Spark Connect server", limit_s=120)
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_spark_connect_writes_the_local_sessions_bytes(spark, connect_server, zone, tmp_path):
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark's [connect] dependencies")
    for reader in ("native", "datasource"):  # each read path against the local session's, same path
        local_out, out = tmp_path / "local" / reader, tmp_path / "connect" / reader
        local = transform_window(spark, zone=str(zone), stream="s1", window_start_ms=WINDOW[0],
                                 window_end_ms=WINDOW[1], output_uri=str(local_out), landing_reader=reader)
        done = subprocess.run([sys.executable, "-c", CLUSTER_RUN.replace("output_uri=out)", f"output_uri=out, "
                                                                         f"landing_reader={reader!r})"),
                               connect_server, str(zone), str(out), str(WINDOW[0]), str(WINDOW[1])],
                              env=spark_env(), capture_output=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
        remote = json.loads(done.stdout.decode().strip().splitlines()[-1])
        assert {k: remote[k] for k in ("rows_in", "rows_out", "quarantined")} == {
            "rows_in": local.rows_in, "rows_out": local.rows_out, "quarantined": local.quarantined}
        for dataset in ("transformed", "quarantine"):
            assert dataset_bytes(out, dataset) == dataset_bytes(local_out, dataset), (reader, dataset)
