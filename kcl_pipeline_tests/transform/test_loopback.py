"""A local Spark session the project builds listens on loopback only: its driver serves its RPC and block
manager unauthenticated, so on the host's external address anyone who reaches the host could talk to it.

Each session is started in a child process: the test run's shared session (conftest) lives in this one, and
getOrCreate would hand it back instead of the session under test."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap

import pytest

from kcl_pipeline.transform.job import loopback_conf

pytestmark = pytest.mark.slow
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp*

# The child builds the session as the named caller does, prints the JVM's pid, and keeps it until stdin closes.
_CHILD = textwrap.dedent("""
    import sys
    how = sys.argv[1]
    if how == "build_local_session":
        from kcl_pipeline.transform.job import build_local_session
        spark = build_local_session("local[1]")
    else:
        from datetime import datetime, timezone
        from dagster import build_resources
        from kcl_pipeline.defs.kinesis.resources import build_resources as pipeline_resources
        from kcl_pipeline.deployment.settings import PipelineSettings
        settings = PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": "local[1]",
                                              "KCL_PIPELINE_PARTITIONS_START": "2026-11-15"})
        resources = build_resources({"pyspark": pipeline_resources(settings, env={})["pyspark"]})
        spark = resources.__enter__().pyspark.spark_session
    spark.range(10).count()  # a job: the block manager and the Python workers are up
    print(spark._jvm.java.lang.ProcessHandle.current().pid(), flush=True)
    sys.stdin.read()
    spark.stop()
""")


def listening_addresses(pid: int) -> set[str]:
    """The addresses the process's TCP sockets in LISTEN state are bound to (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == _LISTEN and inode in inodes:
                    found.add(str(_address(local.split(":")[0], width)))
    return found


def _address(hex_text: str, width: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_text)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
    address = ipaddress.ip_address(words)
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


@pytest.mark.parametrize("how", ["build_local_session", "pipeline_resources"])
def test_a_local_session_listens_on_no_address_but_loopback(how):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        jvm = int(child.stdout.readline())
        addresses = listening_addresses(jvm)
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses


def test_a_local_session_keeps_bind_settings_the_user_gave():
    from kcl_pipeline.defs.kinesis.resources import spark_config
    from kcl_pipeline.deployment.settings import PipelineSettings

    settings = PipelineSettings.from_env({"KCL_PIPELINE_SPARK_MASTER": "local[2]",
                                          "KCL_PIPELINE_PARTITIONS_START": "2026-11-15",
                                          "KCL_PIPELINE_SPARK_CONF": '{"spark.driver.bindAddress": "0.0.0.0"}'})
    conf = spark_config(settings)
    assert conf["spark.driver.bindAddress"] == "0.0.0.0" and conf["spark.driver.host"] == "127.0.0.1"


@pytest.mark.parametrize("master", ["local", "local[*]", "local[4]", "local[4,2]", "local-cluster[2,1,1024]"])
def test_every_local_master_binds_to_loopback(master):
    conf = loopback_conf(master)
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"


@pytest.mark.parametrize("master", ["spark://h:7077", "yarn", "k8s://https://h:443", "localhost:7077"])
def test_a_cluster_master_binds_where_spark_decides(master):
    assert loopback_conf(master) == {}
