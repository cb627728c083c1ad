"""Metrics: snapshot values, publishing intervals and batches (unit), CloudWatch on moto over HTTP (integration)."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from kcl_pipeline.kcl.aws_settings import AwsSettings
from kcl_pipeline.kcl.shells.aws import client
from kcl_pipeline.kcl.shells.metrics import MAX_DATUMS_PER_CALL, Metrics


class FakeCloudWatch:
    """Records PutMetricData calls (unit tests only; the integration tests use moto over HTTP)."""

    def __init__(self, fail: bool = False):
        self.calls: list[dict] = []
        self.fail = fail

    def put_metric_data(self, **kwargs):
        if self.fail:
            raise RuntimeError("CloudWatch is down")
        self.calls.append(kwargs)

    def datums(self) -> list[dict]:
        return [d for call in self.calls for d in call["MetricData"]]

    def values(self) -> dict[tuple, float]:
        out = {}
        for d in self.datums():
            dims = {x["Name"]: x["Value"] for x in d["Dimensions"]}
            out[(d["MetricName"], dims.get("ShardId"))] = d["Value"]
        return out


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(cw=None, clock=None, namespace="kcl-test") -> Metrics:
    return Metrics(namespace if cw is not None else None, cw, "app", "worker-1", clock or Clock())


def test_snapshot_holds_latest_cycle_and_lease_totals():
    m = make()
    assert m.snapshot()["consumer"] == dict.fromkeys(["total_leases", "total_shards", "unclaimed_leases",
                                                      "worker_leases"])
    m.record_cycle(4, 5, 1, 2)
    m.record_cycle(5, 5, 0, 3)
    m.record_lease("shard-a", 1500, 100, 10)
    m.record_lease("shard-a", None, 50, 4)  # no successful call: the lag stays the last known
    m.record_lease("shard-b", 0, 0, 0)
    m.count("throttles", 2, shard_id="shard-a")
    m.count_many({"kpl_bad_aggregates": 1, "expired_iterators": 1}, shard_id="shard-b")
    m.count("list_shards_calls")
    snap = m.snapshot()
    assert snap["consumer"] == {"total_leases": 5, "total_shards": 5, "unclaimed_leases": 0, "worker_leases": 3}
    assert snap["cycles"] == 2
    a = snap["leases"]["shard-a"]
    assert (a["millis_behind_latest"], a["bytes"], a["records"], a["polls"]) == (1500, 150, 14, 2)
    assert a["counters"] == {"throttles": 2}
    assert snap["leases"]["shard-b"]["counters"] == {"kpl_bad_aggregates": 1, "expired_iterators": 1}
    assert snap["counters"] == {"throttles": 2, "kpl_bad_aggregates": 1, "expired_iterators": 1,
                                "list_shards_calls": 1}
    assert snap["published_datums"] == 0  # no namespace: kept locally only


def test_consumer_metrics_publish_every_cycle_and_lease_metrics_every_interval():
    cw, clock = FakeCloudWatch(), Clock()
    m = make(cw, clock)
    m.record_cycle(3, 4, 1, 2)
    m.record_lease("shard-a", 2000, 100, 10)
    assert m.flush_due() == 4  # the cycle's four values; the lease's 10 s have not passed
    assert {d["MetricName"] for d in cw.datums()} == {"total_leases", "total_shards", "unclaimed_leases",
                                                      "worker_leases"}
    assert m.flush_due() == 0  # nothing new
    clock.now += 9.9
    m.record_lease("shard-a", 500, 20, 2)
    assert m.flush_due() == 0
    clock.now += 0.1
    assert m.flush_due() == 3
    assert {k: v for k, v in cw.values().items() if k[1] == "shard-a"} == {
        ("millis_behind_latest", "shard-a"): 500.0, ("bytes", "shard-a"): 120.0, ("records", "shard-a"): 12.0}
    lease_datum = next(d for d in cw.datums() if d["MetricName"] == "bytes")
    assert lease_datum["Dimensions"] == [{"Name": "Application", "Value": "app"},
                                         {"Name": "WorkerId", "Value": "worker-1"},
                                         {"Name": "ShardId", "Value": "shard-a"}]
    assert lease_datum["Unit"] == "Bytes"
    assert lease_datum["Timestamp"] == datetime.fromtimestamp(clock.now, tz=timezone.utc)
    cycle_datum = next(d for d in cw.datums() if d["MetricName"] == "total_shards")
    assert [x["Name"] for x in cycle_datum["Dimensions"]] == ["Application", "WorkerId"]
    # The next interval starts from zero.
    clock.now += 1
    m.record_lease("shard-a", 0, 7, 1)
    clock.now += 10
    m.flush_due()
    assert cw.values()[("bytes", "shard-a")] == 7.0


def test_flush_publishes_partial_intervals_and_counters():
    cw = FakeCloudWatch()
    m = make(cw)
    m.record_lease("shard-a", None, 10, 1)
    m.count("throttles", shard_id="shard-a")
    m.count("list_shards_calls", 3)
    assert m.flush() == 4
    values = cw.values()
    assert ("millis_behind_latest", "shard-a") not in values  # unknown lag is not published as 0
    assert values[("throttles", "shard-a")] == 1.0 and values[("list_shards_calls", None)] == 3.0
    assert m.flush() == 0


def test_batches_of_at_most_1000_datums():
    cw = FakeCloudWatch()
    m = make(cw)
    for i in range(400):
        m.record_lease(f"shard-{i}", 0, 1, 1)  # 3 datums each
    assert m.flush() == 1200
    assert [len(c["MetricData"]) for c in cw.calls] == [MAX_DATUMS_PER_CALL, 200]
    assert all(c["Namespace"] == "kcl-test" for c in cw.calls)


def test_forget_lease_publishes_what_it_had_then_drops_it():
    cw = FakeCloudWatch()
    m = make(cw)
    m.record_lease("shard-a", 0, 5, 1)
    m.forget_lease("shard-a")
    assert cw.values()[("records", "shard-a")] == 1.0
    assert "shard-a" not in m.snapshot()["leases"]
    assert m.flush() == 0


def test_a_failing_cloudwatch_never_raises():
    cw = FakeCloudWatch(fail=True)
    m = make(cw)
    m.record_cycle(1, 1, 0, 1)
    m.record_lease("shard-a", 0, 5, 1)
    assert m.flush() == 0
    snap = m.snapshot()
    assert snap["publish_failures"] == 1 and "CloudWatch is down" in snap["last_publish_error"]
    cw.fail = False
    m.record_cycle(1, 1, 0, 1)
    assert m.flush() == 4 and m.snapshot()["published_datums"] == 4


def test_concurrent_recording_loses_nothing():
    cw = FakeCloudWatch()
    m = make(cw)

    def work(n):
        for _ in range(500):
            m.record_lease("shard-a", n, 2, 1)
            m.count("throttles", shard_id="shard-a")
            if n == 0:
                m.flush()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m.flush()
    lease = m.snapshot()["leases"]["shard-a"]
    assert (lease["records"], lease["bytes"], lease["counters"]["throttles"]) == (2000, 4000, 2000)
    published = [d for d in cw.datums() if d["MetricName"] == "records"]
    assert sum(d["Value"] for d in published) == 2000  # every interval published exactly once


@pytest.mark.parametrize("call, message", [
    (lambda m: m.record_lease("s", 0, -1, 0), "bytes and records"),
    (lambda m: m.record_cycle(1, -1, 0, 0), "total_shards"),
    (lambda m: m.count("records"), "clashes"),
    (lambda m: m.count(""), "empty"),
])
def test_invalid_values(call, message):
    with pytest.raises(ValueError, match=message):
        call(make())


def test_namespace_needs_a_client():
    with pytest.raises(ValueError, match="no CloudWatch client"):
        Metrics("kcl-test", None, "app", "w")


# -- integration: CloudWatch on moto over HTTP ----------------------------------------------------------
def test_published_metrics_read_back_from_cloudwatch(cloudwatch_client, unique_name):
    namespace = unique_name("kcl-metrics")
    m = Metrics(namespace, cloudwatch_client, "orders-app", "worker-7")
    m.record_cycle(6, 8, 2, 3)
    m.record_lease("shardId-000000000001", 1234, 4096, 40)
    m.record_lease("shardId-000000000001", 0, 1024, 10)
    m.count("kpl_bad_aggregates", 2, shard_id="shardId-000000000001")
    assert m.flush() == 8

    listed = cloudwatch_client.list_metrics(Namespace=namespace)["Metrics"]
    assert {x["MetricName"] for x in listed} == {"total_leases", "total_shards", "unclaimed_leases",
                                                 "worker_leases", "millis_behind_latest", "bytes", "records",
                                                 "kpl_bad_aggregates"}
    shard_dims = [{"Name": "Application", "Value": "orders-app"}, {"Name": "WorkerId", "Value": "worker-7"},
                  {"Name": "ShardId", "Value": "shardId-000000000001"}]
    consumer_dims = shard_dims[:2]
    queries = [("records", shard_dims), ("bytes", shard_dims), ("millis_behind_latest", shard_dims),
               ("kpl_bad_aggregates", shard_dims), ("total_shards", consumer_dims),
               ("unclaimed_leases", consumer_dims)]
    now = datetime.now(timezone.utc)
    resp = cloudwatch_client.get_metric_data(
        MetricDataQueries=[{"Id": f"q{i}", "MetricStat": {
            "Metric": {"Namespace": namespace, "MetricName": name, "Dimensions": dims},
            "Period": 60, "Stat": "Sum"}} for i, (name, dims) in enumerate(queries)],
        StartTime=now - timedelta(minutes=5), EndTime=now + timedelta(minutes=5))
    got = {r["Id"]: sum(r["Values"]) for r in resp["MetricDataResults"]}
    assert [got[f"q{i}"] for i in range(len(queries))] == [50, 5120, 0, 2, 8, 2]


def test_unreachable_cloudwatch_does_not_raise():
    cw = client("cloudwatch", AwsSettings(region="us-east-1", endpoint_urls={"cloudwatch": "http://127.0.0.1:9"}),
                max_attempts=1)
    m = Metrics("kcl-test", cw, "app", "w")
    m.record_cycle(1, 1, 0, 1)
    assert m.flush_due() == 0
    assert m.snapshot()["publish_failures"] == 1
    assert "127.0.0.1:9" in m.snapshot()["last_publish_error"]


def test_kcl_naming_publishes_java_kcl_names_and_dimensions(cloudwatch_client, unique_name):
    """A Java KCL dashboard (MillisBehindLatest by Operation=ProcessTask, ShardId) finds this consumer's data."""
    namespace = unique_name("orders-app")
    m = Metrics(namespace, cloudwatch_client, "orders-app", "worker-7", naming="kcl")
    m.record_cycle(6, 8, 2, 3)
    m.record_lease("shardId-000000000001", 1234, 4096, 40)
    assert m.flush() == 8  # the four cycle values, Success of the cycle (Java's TakeLeases), the lease's three
    listed = {(x["MetricName"],
               tuple((d["Name"], d["Value"]) for d in sorted(x["Dimensions"], key=lambda d: d["Name"])))
              for x in cloudwatch_client.list_metrics(Namespace=namespace)["Metrics"]}
    shard = ("ShardId", "shardId-000000000001")
    worker = ("WorkerIdentifier", "worker-7")
    for name in ("MillisBehindLatest", "RecordsProcessed", "DataBytesProcessed"):
        assert (name, (("Operation", "ProcessTask"), shard, worker)) in listed
    assert ("CurrentLeases", (("Operation", "RenewAllLeases"), worker)) in listed
    assert ("TotalLeases", (("Operation", "TakeLeases"), worker)) in listed
    assert ("Success", (("Operation", "TakeLeases"), worker)) in listed
    now = datetime.now(timezone.utc)
    resp = cloudwatch_client.get_metric_data(
        MetricDataQueries=[{"Id": "lag", "MetricStat": {"Metric": {
            "Namespace": namespace, "MetricName": "MillisBehindLatest",
            "Dimensions": [{"Name": "Operation", "Value": "ProcessTask"}, {"Name": "ShardId", "Value": shard[1]},
                           {"Name": "WorkerIdentifier", "Value": "worker-7"}]}, "Period": 60, "Stat": "Maximum"}}],
        StartTime=now - timedelta(minutes=5), EndTime=now + timedelta(minutes=5))
    assert resp["MetricDataResults"][0]["Values"] == [1234.0]


def test_unknown_metrics_naming_is_rejected():
    with pytest.raises(ValueError, match="naming must be one of pipeline, kcl"):
        Metrics(None, None, "app", "w", naming="java")


def test_failures_are_counted_and_leases_in_back_off_published_with_each_cycle():
    """An outage looked healthy: no metric counted failed cycles or failed workers."""
    cw, clock = FakeCloudWatch(), Clock()
    m = make(cw, clock)
    m.record_cycle_failure()
    m.record_cycle_failure()
    m.count("worker_failures", 3)
    m.record_cycle(2, 2, 0, 1, backing_off_leases=1)
    assert m.flush() == 7  # five values of the cycle, two counters
    assert {k[0]: v for k, v in cw.values().items()} == {
        "total_leases": 2.0, "total_shards": 2.0, "unclaimed_leases": 0.0, "worker_leases": 1.0,
        "backing_off_leases": 1.0, "cycle_failures": 2.0, "worker_failures": 3.0}
    assert "Success" not in {d["MetricName"] for d in cw.datums()}  # Java's name only under its naming
    assert m.snapshot()["counters"] == {"cycle_failures": 2, "worker_failures": 3}


def test_kcl_naming_reports_each_cycle_as_java_reports_take_leases_success_one_or_zero():
    cw, clock = FakeCloudWatch(), Clock()
    m = Metrics("kcl-test", cw, "app", "worker-1", clock, naming="kcl")
    m.record_cycle_failure()
    m.record_cycle(1, 1, 0, 1, backing_off_leases=0)
    m.flush()
    success = [d for d in cw.datums() if d["MetricName"] == "Success"]
    assert [d["Value"] for d in success] == [0.0, 1.0]
    assert success[0]["Dimensions"] == [{"Name": "Operation", "Value": "TakeLeases"},
                                        {"Name": "WorkerIdentifier", "Value": "worker-1"}]
    assert {"cycle_failures", "backing_off_leases"} <= {d["MetricName"] for d in cw.datums()}
