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

from kcl_pipeline.local.spark_connect import SparkConnectServer
from kcl_pipeline.transform.job import read_partition, transform_window
from kcl_pipeline.zone.store import S3Options

from .landing_batches import MINUTE, SHARD0, SHARD1, T0, Rec, seq, write_local, write_s3

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
    """The Spark Connect server the demo and `local up` start (local/spark_connect.py: pyspark's own
    SparkConnectServer on loopback), its Python workers running this interpreter with this repository importable."""
    server = SparkConnectServer(tmp_path_factory.mktemp("spark-connect"), master="local[2]", driver_memory="1g")
    server.start()
    try:
        server.wait_ready(timeout=180)
        yield server.url
    finally:
        server.stop()


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


# ------------------------------------------------------------------ the warm server and the cold fallback

WINDOW_RUN = """
import json, sys
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.transform.job import build_local_session, transform_window
from kcl_pipeline.zone.store import S3Options
master, fallback, s3_endpoint, zone, out, t0, t1 = sys.argv[1:8]
spark = build_local_session(master, "kcl-pipeline-warm-test", fallback_master=fallback,
                            **{"spark.driver.memory": "1g"})
s3 = S3Options.from_aws_settings(AwsSettings(endpoint_urls={"s3": s3_endpoint}), env_credentials=True)
report = transform_window(spark, zone=zone, stream="s1", window_start_ms=int(t0), window_end_ms=int(t1),
                          output_uri=out, s3_options=s3)
print(json.dumps({**report.as_dict(), "session": type(spark).__module__}))
spark.stop()
"""


def _rows(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: (r["shard_id"], len(r["sequence_number"]), r["sequence_number"],
                                                    r["sub_sequence_number"]))


def test_a_window_through_the_warm_server_and_through_the_cold_fallback_is_the_same_row_for_row(
        connect_server, emulators, s3_client, unique_name):
    """The demo's shape: an s3:// zone on the emulator, read by the Python data source in the server's Python
    workers; then the same window with the server gone, in the cold session the fallback starts."""
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark's [connect] dependencies")
    bucket = unique_name("warm")
    s3_client.create_bucket(Bucket=bucket)
    for k in range(4):
        write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD0, seq(100 * k + i), b'{"i":%d}' % i, T0 + 1000 * k + i)
                                                   for i in range(40)])
    write_s3(s3_client, bucket, "zone", "s1", [Rec(SHARD1, seq(9000 + i), b"poison" if i % 7 == 0 else b'{"j":%d}' % i,
                                                   T0 + MINUTE + i) for i in range(60)])
    gone = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**spark_env(), **emulators.env()}
    runs = {}
    for name, master in (("warm", connect_server), ("cold", gone)):
        done = subprocess.run([sys.executable, "-c", WINDOW_RUN, master, "local[2]", emulators.s3,
                               f"s3://{bucket}/zone", f"s3://{bucket}/{name}", str(WINDOW[0]), str(WINDOW[1])],
                              env=env, capture_output=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
        runs[name] = (json.loads(done.stdout.decode().strip().splitlines()[-1]), done.stderr.decode(errors="replace"))
    (warm, warm_log), (cold, cold_log) = runs["warm"], runs["cold"]
    assert warm["session"].startswith("pyspark.sql.connect") and not cold["session"].startswith("pyspark.sql.connect")
    assert "Spark Connect server" not in warm_log
    fallback_lines = [line for line in cold_log.splitlines() if "Spark Connect server" in line]
    assert fallback_lines == [f"the Spark Connect server {gone} is unreachable (127.0.0.1:{gone.rsplit(':', 1)[1]}: "
                              f"Connection refused): this run transforms in a cold local[2] session "
                              f"(KCL_PIPELINE_SPARK_FALLBACK_MASTER)"]
    assert (warm["rows_in"], warm["rows_out"], warm["duplicates_dropped"], warm["quarantined"]) == (220, 211, 0, 9)
    for key in ("rows_in", "rows_out", "duplicates_dropped", "quarantined", "schema", "per_shard"):
        assert warm[key] == cold[key], key
    s3 = S3Options.from_aws_settings(emulators.aws_settings(), env_credentials=True)
    for dataset in ("transformed", "quarantine"):
        warm_table, _ = read_partition(f"s3://{bucket}/warm", dataset, T0, s3)
        cold_table, _ = read_partition(f"s3://{bucket}/cold", dataset, T0, s3)
        assert warm_table.schema == cold_table.schema, dataset
        assert _rows(warm_table) == _rows(cold_table), dataset
        assert warm_table.num_rows > 0, dataset


DYING_SERVER_RUN = """
import json, os, sys
from dagster import build_resources
from kcl_pipeline.defs.kinesis.resources import SparkResource
from kcl_pipeline.transform.connect import server_gone
from kcl_pipeline.transform.job import transform_window
url, pid, zone, out, t0, t1 = sys.argv[1:7]
warnings = []

class RunLog:  # the run's log as the resource sees it (Dagster's context.log)
    def warning(self, message):
        warnings.append(message)

def window(name):
    return lambda session: transform_window(session, zone=zone, stream="s1", window_start_ms=int(t0),
                                            window_end_ms=int(t1), output_uri=os.path.join(out, name)).as_dict()

# Two runs' resources on one server (one session: pyspark keeps one Spark Connect session per process): one
# with a fallback, one without.
with_fallback = SparkResource(spark_config={"spark.remote": url}, fallback_spark_config={"spark.master": "local[2]"})
alone = SparkResource(spark_config={"spark.remote": url})
reports, error = {}, None
with build_resources({"fallback": with_fallback, "alone": alone}) as resources:
    reports["warm"] = resources.fallback.run(RunLog(), window("warm"))
    os.kill(int(pid), 9)  # the server dies; the runs go on to their next window
    try:
        resources.alone.run(RunLog(), window("alone"))
    except Exception as exc:
        error = {"type": type(exc).__name__, "server_gone": server_gone(exc), "warnings": len(warnings)}
    reports["cold"] = resources.fallback.run(RunLog(), window("cold"))
    session = type(resources.fallback.spark_session).__module__
print(json.dumps({"reports": reports, "warnings": warnings, "error": error, "session": session}))
"""


def test_a_run_whose_spark_connect_server_dies_midway_transforms_its_window_again_in_the_cold_fallback(
        zone, tmp_path):
    """The server killed between two windows of a run: with a fallback, the second window is transformed in the
    cold session, with one WARNING, row for row as the server transformed the first; without one, the run fails
    on the server's error. Both clients gave up on the dead server within the runs' retries (pyspark's own would
    wait ten minutes: the subprocess's timeout would cut it). In a process of its own: a Spark Connect client
    cannot start beside this process's local session."""
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark's [connect] dependencies")
    server = SparkConnectServer(tmp_path / "spark-connect", master="local[1]", driver_memory="1g")
    server.start()
    try:
        server.wait_ready(timeout=180)
        done = subprocess.run([sys.executable, "-c", DYING_SERVER_RUN, server.url, str(server.pid), str(zone),
                               str(tmp_path / "out"), str(WINDOW[0]), str(WINDOW[1])],
                              env=spark_env(), capture_output=True, timeout=600, cwd=REPO)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])

    assert seen["error"] == {"type": "SparkConnectGrpcException", "server_gone": True, "warnings": 0}
    assert seen["session"] == "pyspark.sql.session"  # the cold, classic one
    (warning,) = seen["warnings"]
    assert warning.startswith("the Spark Connect server sc://127.0.0.1:") and "stopped answering during this run" \
        in warning and warning.endswith("cold local[2] session (KCL_PIPELINE_SPARK_FALLBACK_MASTER)")
    warm, cold = seen["reports"]["warm"], seen["reports"]["cold"]
    paths = {"output_path": "", "quarantine_path": ""}
    assert {**cold, **paths} == {**warm, **paths} and warm["rows_in"] > 0
    for dataset in ("transformed", "quarantine"):
        assert _rows(read_partition(str(tmp_path / "out" / "cold"), dataset, T0)[0]) \
            == _rows(read_partition(str(tmp_path / "out" / "warm"), dataset, T0)[0])
