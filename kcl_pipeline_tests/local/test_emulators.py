"""The local emulator stack: every service answers real API calls, only on 127.0.0.1, and stops cleanly."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.local import emulators as emulators_module
from kcl_pipeline.local.emulators import (
    NODE_MODULES_ENV,
    EmulatorError,
    EmulatorStack,
    Endpoints,
    NodeModulesMissing,
    find_node_modules,
)
from kcl_pipeline_tests.process_tree import alive

REPO_ROOT = Path(__file__).resolve().parents[2]


def _wait_gone(pids, deadline_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not [p for p in pids if alive(p)]:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc (Linux)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                local, state, inode = parts[1], parts[3], parts[9]
                if state == "0A" and inode in inodes:  # 0A = LISTEN
                    address_hex, port_hex = local.split(":")
                    if len(address_hex) == 8:
                        address = socket.inet_ntop(socket.AF_INET, bytes.fromhex(address_hex)[::-1])
                    else:
                        raw = bytes.fromhex(address_hex)
                        address = socket.inet_ntop(
                            socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                    found.append((address, int(port_hex, 16)))
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- the session stack (the conftest fixtures other tests use) ----------------------------------------------

def test_session_stack_every_service_answers(emulators, aws_settings, kinesis_client, dynamodb_client, s3_client,
                                             cloudwatch_client, unique_name):
    assert {emulators.kinesis, emulators.dynamodb, emulators.s3, emulators.cloudwatch} <= {
        u for u in (emulators.kinesis, emulators.dynamodb, emulators.moto) if u.startswith("http://127.0.0.1:")}

    stream = unique_name("emu")
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    kinesis_client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
    seq = kinesis_client.put_record(StreamName=stream, Data=b"x", PartitionKey="p")["SequenceNumber"]
    assert len(seq) == 56  # kinesis-local, not moto (short integers)

    table = unique_name("emu")
    dynamodb_client.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                                 AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                                 KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}])
    assert table in dynamodb_client.list_tables()["TableNames"]

    bucket = unique_name("emu")
    s3_client.create_bucket(Bucket=bucket)
    s3_client.put_object(Bucket=bucket, Key="a", Body=b"1")
    assert s3_client.get_object(Bucket=bucket, Key="a")["Body"].read() == b"1"

    cloudwatch_client.put_metric_data(Namespace=bucket, MetricData=[{"MetricName": "m", "Value": 1.0}])
    assert [m["MetricName"] for m in cloudwatch_client.list_metrics(Namespace=bucket)["Metrics"]] == ["m"]


def test_moto_endpoints_serve_dynamodb_as_second_opinion(moto_settings, emulators, unique_name):
    ddb = client("dynamodb", moto_settings)
    table = unique_name("emu")
    ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                     AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                     KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}])
    assert table in ddb.list_tables()["TableNames"]
    # A different server from dynalite: the table exists only on moto.
    assert table not in client("dynamodb", emulators.aws_settings()).list_tables()["TableNames"]


# -- a private stack: binding, stopping, failure paths -----------------------------------------------------

def test_stack_binds_only_loopback_and_stop_leaves_no_process(tmp_path):
    stack = EmulatorStack(tmp_path / "logs")
    with stack as endpoints:
        pids = stack.pids()
        assert set(pids) == {"kinesis", "dynamodb", "moto"}
        ports = {int(url.rsplit(":", 1)[1]) for url in endpoints.endpoint_urls().values()}
        seen_ports = set()
        for name, pid in pids.items():
            addresses = _listening_addresses(pid)
            assert addresses, f"{name} listens on nothing"
            assert {a for a, _ in addresses} == {"127.0.0.1"}, (name, addresses)
            seen_ports |= {p for _, p in addresses}
        assert ports <= seen_ports
        assert all(_port_open(p) for p in ports)
        assert {p.name for p in (tmp_path / "logs").iterdir()} == {"kinesis-local.log", "dynalite.log", "moto.log"}
    assert not [p for p in pids.values() if alive(p)]  # stop() reaps them: no grace needed
    assert not [p for p in ports if _port_open(p)]
    assert stack.endpoints is None


def _stack_state(endpoints) -> tuple[list[str], list[str], list[dict]]:
    """The stream names, the records of stream `kept` (sequence numbers) and the items of table `kept-table`."""
    kinesis, dynamodb = client("kinesis", endpoints.aws_settings()), client("dynamodb", endpoints.aws_settings())
    streams = kinesis.list_streams()["StreamNames"]
    records: list[str] = []
    if "kept" in streams:
        iterator = kinesis.get_shard_iterator(StreamName="kept", ShardId="shardId-000000000000",
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = [r["SequenceNumber"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]]
    items = dynamodb.scan(TableName="kept-table")["Items"] if "kept-table" in dynamodb.list_tables()["TableNames"] \
        else []
    return streams, records, items


def _put_then_stop(stack: EmulatorStack) -> tuple[str, dict]:
    """A stream, a table, a record and an item; the stack is stopped the moment they are acknowledged."""
    endpoints = stack.start()
    kinesis, dynamodb = client("kinesis", endpoints.aws_settings()), client("dynamodb", endpoints.aws_settings())
    kinesis.create_stream(StreamName="kept", ShardCount=1)
    dynamodb.create_table(TableName="kept-table", KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                          BillingMode="PAY_PER_REQUEST")
    while kinesis.describe_stream_summary(StreamName="kept")["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        time.sleep(0.05)
    sequence = kinesis.put_record(StreamName="kept", Data=b"yesterday", PartitionKey="p")["SequenceNumber"]
    item = {"k": {"S": "leaseKey"}, "checkpoint": {"S": sequence}}
    dynamodb.put_item(TableName="kept-table", Item=item)
    stack.stop()
    return sequence, item


def test_a_stack_with_a_data_dir_keeps_the_stream_its_records_and_the_tables_across_a_restart(tmp_path):
    """Before: every start of the emulators began empty (the demo's second start had a new stream and lease table).
    With a data directory the record put and the item written just before the stop are there after a restart,
    and a record put then follows them."""
    sequence, item = _put_then_stop(EmulatorStack(tmp_path / "logs", services=("kinesis", "dynamodb"),
                                                  data_dir=tmp_path / "data"))
    again = EmulatorStack(tmp_path / "logs", services=("kinesis", "dynamodb"), data_dir=tmp_path / "data")
    with again as endpoints:
        streams, records, items = _stack_state(endpoints)
        assert streams == ["kept"] and records == [sequence] and items == [item]
        later = client("kinesis", endpoints.aws_settings()).put_record(StreamName="kept", Data=b"today",
                                                                       PartitionKey="p")["SequenceNumber"]
        assert int(later) > int(sequence)


def test_a_stack_without_a_data_dir_keeps_nothing(tmp_path):
    _put_then_stop(EmulatorStack(tmp_path / "logs", services=("kinesis", "dynamodb")))
    with EmulatorStack(tmp_path / "logs", services=("kinesis", "dynamodb")) as endpoints:
        assert _stack_state(endpoints) == ([], [], [])


def _libfaketime() -> str:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    assert found, "install Debian's faketime (apt-get install faketime): .ci/run does"
    return str(found[0])


def test_kinesis_stamps_records_with_the_wall_clock_after_the_machine_slept(tmp_path, monkeypatch):
    """Found by CI: after the machine was paused, kinesis-local's record timestamps lagged the wall clock by the
    pause (its clock of the day was the monotonic clock, which stops during a suspend), so every AT_TIMESTAMP read
    of records put after the timestamp came back empty. libfaketime gives the emulator a suspend's signature: its
    wall clock jumps ten minutes ahead while its monotonic clock does not."""
    wall_offset = tmp_path / "wall-offset"
    wall_offset.write_text("+0")
    for name, value in {"LD_PRELOAD": _libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(wall_offset),
                        "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}.items():
        monkeypatch.setenv(name, value)
    stack = EmulatorStack(tmp_path / "logs", services=["kinesis"])
    with stack as endpoints:
        for name in ("LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE"):
            monkeypatch.delenv(name)  # only the emulator's clock is faked
        kinesis = client("kinesis", endpoints.aws_settings())
        kinesis.create_stream(StreamName="slept", ShardCount=1)
        while kinesis.describe_stream_summary(StreamName="slept")["StreamDescriptionSummary"]["StreamStatus"] \
                != "ACTIVE":
            time.sleep(0.05)
        wall_offset.write_text("+600")  # ten minutes asleep
        put_at = time.time() + 600
        kinesis.put_record(StreamName="slept", Data=b"after the sleep", PartitionKey="p")
        iterator = kinesis.get_shard_iterator(StreamName="slept", ShardId="shardId-000000000000",
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        [record] = kinesis.get_records(ShardIterator=iterator)["Records"]
        stamped = record["ApproximateArrivalTimestamp"].timestamp()
        assert abs(stamped - put_at) < 5, f"stamped {put_at - stamped:.0f} s before the emulator's wall clock"
        iterator = kinesis.get_shard_iterator(StreamName="slept", ShardId="shardId-000000000000",
                                              ShardIteratorType="AT_TIMESTAMP",
                                              Timestamp=put_at - 2)["ShardIterator"]
        assert [r["Data"] for r in kinesis.get_records(ShardIterator=iterator)["Records"]] == [b"after the sleep"]


@pytest.mark.parametrize("service,target", [("dynamodb", "DynamoDB_20120810.ListTables"),
                                            ("kinesis", "Kinesis_20131202.ListStreams")])
def test_a_client_gone_mid_request_does_not_kill_the_emulator(tmp_path, service, target):
    """Found by CI: dynalite threw from a request's error handler when a client closed its connection before
    sending the whole body (a killed worker, a client timeout), exiting, and every later test failed."""
    import time

    stack = EmulatorStack(tmp_path, services=[service])
    with stack as endpoints:
        url = endpoints.endpoint_urls()[service]
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as cut:
            cut.sendall(f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-amz-json-1.0\r\n"
                        f"X-Amz-Target: {target}\r\nContent-Length: 100\r\n\r\n{{\"a\":".encode())
            time.sleep(0.3)
        time.sleep(0.5)
        assert alive(stack.pids()[service]) and _port_open(port), f"the {service} emulator exited"


def test_services_subset_starts_only_what_is_asked(tmp_path):
    with EmulatorStack(tmp_path, services=["dynamodb"]) as endpoints:
        assert endpoints.dynamodb and endpoints.kinesis is None and endpoints.s3 is None and endpoints.moto is None
        assert endpoints.endpoint_urls() == {"dynamodb": endpoints.dynamodb}


def test_unknown_service_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown emulator services \\['sqs'\\]"):
        EmulatorStack(tmp_path, services=["dynamodb", "sqs"])
    with pytest.raises(ValueError, match="no emulator services"):
        EmulatorStack(tmp_path, services=[])


def test_fixed_port_in_use_fails_with_the_emulator_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = EmulatorStack(tmp_path, services=["dynamodb"], ports={"dynamodb": port})
        with pytest.raises(EmulatorError, match=r"(?s)dynamodb emulator exited with code .*EADDRINUSE"):
            stack.start()
    assert stack.pids() and not [p for p in stack.pids().values() if alive(p)]


def test_random_port_taken_meanwhile_is_retried_on_another(tmp_path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real_free_port = emulators_module.free_port
        handed_out = []

        def first_busy_then_free() -> int:
            port = busy if not handed_out else real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(emulators_module, "free_port", first_busy_then_free)
        with EmulatorStack(tmp_path, services=["dynamodb"]) as endpoints:
            assert handed_out[0] == busy and len(handed_out) == 2
            assert endpoints.dynamodb == f"http://127.0.0.1:{handed_out[1]}"
            assert "EADDRINUSE" in (tmp_path / "dynalite.log").read_text()


def test_emulators_exit_when_their_parent_is_killed(tmp_path):
    code = (
        "import json, sys, time\n"
        "from kcl_pipeline.local.emulators import EmulatorStack\n"
        f"stack = EmulatorStack({str(tmp_path)!r})\n"
        "stack.start()\n"
        "print(json.dumps(stack.pids()), flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        pids = json.loads(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    assert set(pids) == {"kinesis", "dynamodb", "moto"}
    leftover = _wait_gone(pids.values())
    for pid in leftover:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert leftover == []


def test_foreground_runner_prints_exports_and_stops_on_sigterm(tmp_path):
    env_file = tmp_path / "emulators.env"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kcl_pipeline.local", "--services", "dynamodb,s3", "--log-dir", str(tmp_path / "logs"),
         "--env-file", str(env_file), "--region", "eu-west-1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("# Ctrl-C"):
                break
        exports = dict(line[len("export "):].split("=", 1) for line in lines if line.startswith("export "))
        assert set(exports) >= {"AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_S3", "AWS_REGION"}
        assert "AWS_ENDPOINT_URL_KINESIS" not in exports
        assert exports["AWS_REGION"] == "eu-west-1"
        assert env_file.read_text().splitlines() == [line for line in lines if line.startswith("export ")]
        ddb = client("dynamodb", Endpoints(None, exports["AWS_ENDPOINT_URL_DYNAMODB"], None, None,
                                           region="eu-west-1").aws_settings())
        assert ddb.list_tables()["TableNames"] == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    port = int(exports["AWS_ENDPOINT_URL_DYNAMODB"].rsplit(":", 1)[1])
    assert not _port_open(port)


def test_foreground_runner_reports_a_bad_service_list():
    result = subprocess.run([sys.executable, "-m", "kcl_pipeline.local", "--services", "sqs"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 2
    assert "unknown emulator services ['sqs']" in result.stderr


# -- pure parts: Endpoints, finding node_modules ---------------------------------------------------------

def test_endpoints_settings_and_env(monkeypatch):
    endpoints = Endpoints(kinesis="http://127.0.0.1:1", dynamodb="http://127.0.0.1:2", s3="http://127.0.0.1:3",
                          cloudwatch="http://127.0.0.1:3", region="eu-west-1")
    settings = endpoints.aws_settings()
    assert settings.region == "eu-west-1"
    assert {s: settings.endpoint_for(s) for s in ("kinesis", "dynamodb", "s3", "cloudwatch")} == {
        "kinesis": "http://127.0.0.1:1", "dynamodb": "http://127.0.0.1:2", "s3": "http://127.0.0.1:3",
        "cloudwatch": "http://127.0.0.1:3"}

    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    env = endpoints.env()
    assert env == {
        "AWS_ENDPOINT_URL_KINESIS": "http://127.0.0.1:1", "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:2",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:3", "AWS_ENDPOINT_URL_CLOUDWATCH": "http://127.0.0.1:3",
        "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
    }
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "mine")
    assert "AWS_ACCESS_KEY_ID" not in endpoints.env()  # never overrides the user's credentials
    assert endpoints.export_lines()[0] == "export AWS_ENDPOINT_URL_KINESIS=http://127.0.0.1:1"


def test_node_modules_found_from_the_package():
    """A checkout's node_modules when it holds the emulators (a developer's), else the user cache (a clean clone,
    an installed wheel)."""
    from kcl_pipeline.local.prerequisites import NODE_PACKAGES, has_packages

    found = find_node_modules()
    assert all((found / package / "package.json").is_file() for package in NODE_PACKAGES)
    if has_packages(REPO_ROOT / "node_modules"):
        assert found == REPO_ROOT / "node_modules"


def test_outside_a_checkout_without_npm_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(NODE_MODULES_ENV, raising=False)
    monkeypatch.setenv("KCL_PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # neither node nor npm
    with pytest.raises(NodeModulesMissing, match="node is not on PATH.*npm is not on PATH"):
        find_node_modules(tmp_path / "site-packages" / "kcl_pipeline" / "local" / "emulators.py")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_without_install_a_missing_cache_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv(NODE_MODULES_ENV, raising=False)
    monkeypatch.setenv("KCL_PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(NodeModulesMissing, match="not installed in .*cache"):
        find_node_modules(tmp_path / "site-packages" / "kcl_pipeline" / "local" / "emulators.py", install=False)


def test_env_var_overrides_and_is_checked(tmp_path, monkeypatch):
    real = find_node_modules()  # wherever the emulators are installed here
    monkeypatch.setenv(NODE_MODULES_ENV, str(real))
    assert find_node_modules(tmp_path / "x.py") == real.resolve()
    monkeypatch.setenv(NODE_MODULES_ENV, str(tmp_path))
    with pytest.raises(NodeModulesMissing, match="does not hold kinesis-local, dynalite: unset it"):
        find_node_modules()
    with pytest.raises(NodeModulesMissing):
        EmulatorStack(tmp_path / "logs", services=["kinesis"]).start()


def test_the_demo_partitions_start_in_the_window_its_stream_was_created(emulators, kinesis_client, unique_name,
                                                                        tmp_path):
    """`./run.sh demo` showed 1,086 "missing" partitions back to yesterday midnight: the demo's partitions start
    where its stream starts."""
    from datetime import datetime, timezone

    pytest.importorskip("dagster")  # the demo's settings are the Dagster deployment's: absent from a core install
    from kcl_pipeline.deployment.settings import PipelineSettings
    from kcl_pipeline.local.demo import DemoOptions, demo_env, ensure_stream, stream_start_window

    stream = unique_name("demo-start")
    before = datetime.now(timezone.utc)
    ensure_stream(kinesis_client, stream, 1)
    start = stream_start_window(kinesis_client, stream, 2)
    assert int(start.timestamp()) % 120 == 0
    assert 0 <= before.timestamp() - start.timestamp() < 120 + 5
    options = DemoOptions(state_dir=tmp_path, stream=stream)
    env = {k: v for k, v in demo_env(emulators, options, tmp_path, start).items() if k.startswith("KCL_PIPELINE_")}
    settings = PipelineSettings.from_env(env, now=datetime(2026, 12, 24, tzinfo=timezone.utc))
    assert settings.partitions_start == start


def test_moto_server_does_not_list_its_package_directory_on_every_request(monkeypatch):
    """moto finds a request's service by listing its package directory, twice per request (a third of its
    CPU); the launcher takes that listing once, and a later call must not touch the file system."""
    from moto import backends

    from kcl_pipeline.local.moto_process import _list_moto_modules_once

    monkeypatch.setattr(backends, "list_of_moto_modules", backends.list_of_moto_modules)  # restored after
    listed = list(backends.list_of_moto_modules())
    modules = _list_moto_modules_once()

    def listing(*args, **kwargs):
        raise AssertionError("moto listed its package directory again")

    monkeypatch.setattr(os, "listdir", listing)
    monkeypatch.setattr(os.path, "isdir", listing)
    assert list(backends.list_of_moto_modules()) == listed == list(modules)
    assert {"s3", "dynamodb", "cloudwatch"} <= set(modules)


def test_moto_launcher_starts_on_a_moto_without_the_per_request_listing(monkeypatch):
    from moto import backends

    from kcl_pipeline.local.moto_process import _list_moto_modules_once

    monkeypatch.delattr(backends, "list_of_moto_modules")
    assert _list_moto_modules_once() == ()
    assert not hasattr(backends, "list_of_moto_modules")
