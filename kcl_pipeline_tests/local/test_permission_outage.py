"""A permission removed mid-run, end to end: `kcl-pipeline local up` and `dagster dev` as the README runs them, with
every DynamoDB request of the stack passing a proxy on loopback that, for a while, answers as IAM does when the
role's DynamoDB permission is taken away (AccessDeniedException, nothing applied).

While it is away, the consumer sensor says each failed lease-manager cycle and then its ticks fail with the line
`consume` exits with (read through Dagster's GraphQL API, as the UI shows them); records keep being produced. Once
it is back, the pipeline recovers by itself: every record produced before, during and after lands exactly once,
every window is transformed and checkpointed, and the output holds every record exactly once.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kcl_pipeline.deployment.settings import PipelineSettings
from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.shards import wait_stream_active
from kcl_pipeline.local.demo import ENV_FILE
from kcl_pipeline.local.emulators import free_port
from kcl_pipeline.local.producer import produce
from kcl_pipeline.windows.keys import partition_key
from kcl_pipeline.zone.chain import list_batches, read_batches
from kcl_pipeline.zone.store import S3Options, open_store
from kcl_pipeline_tests.fault_proxy import Fault, FaultKind, FaultProxy, Switch
from kcl_pipeline_tests.kcl.fleet_support import wait_until
from kcl_pipeline_tests.local.support import (
    REPO_ROOT,
    clean_environ,
    env_file,
    graphql_or_none,
    kill_all,
    materialised,
    start_logged,
    stop_group,
)

pytestmark = [pytest.mark.slow, pytest.mark.beside]

# Two-minute windows: the outage and the recovery fit in few window runs (one Spark run at a time).
WINDOW_MS = 120_000
# Short enough that the outage below outlasts it several times over.
STALL_SECONDS = 20
OUTAGE_SECONDS = 75
RATE = 10.0
TICKS = """{ sensorOrError(sensorSelector: {repositoryLocationName: "kcl_pipeline", repositoryName: "__repository__",
  sensorName: "%s"}) { __typename
  ... on Sensor { sensorState { ticks(limit: 500, afterTimestamp: %f) { status timestamp skipReason
  error { message causes { message } } } } } } }"""


def _ticks(url: str, after: float) -> list[dict]:
    """The consumer sensor's ticks since `after` (a bound also makes Dagster read every status: its batch loader,
    which answers an unbounded query, leaves out the skipped ticks, where the failed cycles are said)."""
    from kcl_pipeline.deployment.fleet_hosting import CONSUMER_SENSOR

    data = graphql_or_none(url, TICKS % (CONSUMER_SENSOR, after))
    if data is None or data["sensorOrError"]["__typename"] != "Sensor":
        return []
    return data["sensorOrError"]["sensorState"]["ticks"]


# The whole stack, its first window, an outage past the stall time and the recovery's windows: about 8 minutes
# alone, more on a loaded two-core machine (window runs of 3-5 min each at a load average of 20); its own waits
# bound each step.
@pytest.mark.timeout(1800)
def test_a_permission_removed_mid_run_fails_the_sensors_ticks_and_the_pipeline_recovers_losing_nothing(tmp_path):
    pytest.importorskip("dagster_webserver")
    state = tmp_path / "state"
    home = state / "dagster_home"
    procs: list[subprocess.Popen] = []
    proxy: FaultProxy | None = None
    try:
        flags = ["--state-dir", str(state), "--window-minutes", str(WINDOW_MS // 60_000), "--shards", "2"]
        up = start_logged(procs, [sys.executable, "-m", "kcl_pipeline.cli", "local", "up", "--no-producer", *flags],
                          tmp_path / "local-up.out", tmp_path)
        wait_until(lambda: (state / ENV_FILE).exists() or up.poll() is not None, 180, "local up's env file", 0.5)
        assert up.poll() is None, (tmp_path / "local-up.out").read_text()
        env = env_file(state / ENV_FILE)
        deny = Switch(Fault(FaultKind.DENY))
        proxy = FaultProxy(env["AWS_ENDPOINT_URL_DYNAMODB"], policy=deny).start()
        stack_env = {**clean_environ(), **env, "AWS_ENDPOINT_URL_DYNAMODB": proxy.url,
                     "KCL_PIPELINE_STALL_SECONDS": str(STALL_SECONDS)}
        settings = PipelineSettings.from_env(stack_env)
        aws = AwsSettings(region=env["AWS_REGION"], endpoint_urls={
            s: env[f"AWS_ENDPOINT_URL_{s.upper()}"] for s in ("kinesis", "dynamodb", "s3", "cloudwatch")})
        kinesis = client("kinesis", aws)
        wait_stream_active(kinesis, settings.stream)

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        dagster = Path(sys.executable).with_name("dagster")
        dev = start_logged(procs, [str(dagster), "dev", "-h", "127.0.0.1", "-p", str(port)], tmp_path / "dagster.out",
                           REPO_ROOT, env=stack_env)

        produced: list[int] = []

        def produce_ids(first: int, count: int) -> None:
            produce(kinesis, settings.stream, count=count, rate=RATE, aggregate=5, payload=None, first_id=first)
            produced.extend(range(first, first + count))

        # Before: records flow and the first window is checkpointed.
        produce_ids(0, 200)
        wait_until(lambda: materialised(home, "kinesis_checkpoints") or dev.poll() is not None, 720,
                   "the first window checkpointed", 3)
        assert dev.poll() is None, (tmp_path / "dagster.out").read_text()[-3000:]

        # The permission goes: every DynamoDB request of the stack is refused, while records keep coming.
        deny.on = True
        denied_at = time.time()
        during = threading.Thread(target=produce_ids, args=(200, int(RATE * OUTAGE_SECONDS // 2)))
        during.start()

        def failed_tick() -> dict | None:
            return next((t for t in _ticks(url, denied_at) if t["status"] == "FAILURE"), None)

        failure = wait_until(failed_tick, OUTAGE_SECONDS + 240, "a failed consumer-sensor tick", 2)
        said = [t["skipReason"] for t in _ticks(url, denied_at) if t["status"] == "SKIPPED" and t["skipReason"]]
        wait_until(lambda: time.time() - denied_at >= OUTAGE_SECONDS, OUTAGE_SECONDS + 5, "the outage's end", 1)
        during.join(120)
        denied_requests = sum(proxy.faults.values())
        deny.on = False
        restored_at = time.time()

        # After: the permission is back; more records, and the pipeline catches up by itself.
        produce_ids(10_000, 100)
        store = open_store(settings.landing_uri, aws)

        def landed_ids() -> list[int]:
            return [json.loads(d)["id"] for d in read_batches(store, settings.stream).column("data").to_pylist()]

        wait_until(lambda: set(produced) <= set(landed_ids()), 480, "every record landed", 5)
        windows = sorted({b.minute_ms - b.minute_ms % WINDOW_MS for b in list_batches(store, settings.stream)})
        keys = {partition_key(w) for w in windows}
        wait_until(lambda: all(keys <= materialised(home, asset) for asset in ("transformed_records",
                                                                             "kinesis_checkpoints")),
                   1200, f"windows {min(keys)}..{max(keys)} transformed and checkpointed", 3)
        recovered = [t for t in _ticks(url, restored_at) if t["status"] != "FAILURE"]
        stop_group(dev, 120)

        # Dagster showed the outage: ticks that said a failed cycle, then failed with the consumer's one line.
        # (the tick's error is Dagster's SensorExecutionError; the consumer's line is its cause)
        message = " | ".join([failure["error"]["message"], *(c["message"] for c in failure["error"]["causes"])])
        assert "no lease-manager cycle succeeded for " in message, message
        assert any("lease-manager cycle failed" in s and "AccessDenied" in s for s in said), said[-5:]
        assert recovered, "the sensor's ticks succeed again once the permission is back"
        assert denied_requests > 0
        # Nothing lost, nothing twice: landed exactly once, transformed exactly once.
        ids = landed_ids()
        assert len(ids) == len(set(ids)) and set(ids) == set(produced), (len(ids), len(set(ids)), len(produced))
        from kcl_pipeline.transform.job import read_output  # here: a core install (no pyspark) collects this file

        s3 = S3Options.from_aws_settings(aws, env_credentials=True)
        good = [json.loads(p)["id"] for w in windows
                for p in read_output(None, settings.output_uri, w, s3=s3).transformed.column("payload").to_pylist()]
        assert sorted(good) == sorted(produced)
        print(f"outage {OUTAGE_SECONDS}s: {denied_requests} DynamoDB requests refused; first failed tick "
              f"{failure['timestamp'] - denied_at:.0f}s after the permission went; caught up "
              f"{time.time() - restored_at:.0f}s after it came back; {len(produced)} records, {len(windows)} windows")
        subprocess.run([sys.executable, "-m", "kcl_pipeline.cli", "local", "down", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=120)
        up.wait(60)
    finally:
        if proxy is not None:
            proxy.stop()
        kill_all(procs)
