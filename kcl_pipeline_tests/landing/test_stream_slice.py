"""One stream's slice of a multi-stream lease table: the pipeline plans in lease keys, the landing zone and the
audit name shards by id; a slice never mixes two streams or two incarnations of one stream."""
from __future__ import annotations

from kcl_pipeline.deployment.streams import PipelineStream, pipeline_streams, stream_prefix
from kcl_pipeline.kcl.core.model import Checkpoint, Lease, Shard
from kcl_pipeline.kcl.core.streams import StreamScope
from kcl_pipeline.zone.stream_slice import slice_of

ORDERS = "123456789012:orders:1700000000"
ORDERS_BEFORE = "123456789012:orders:1600000000"  # the same stream before it was deleted and re-created
CLICKS = "123456789012:clicks:1700000001"


def _lease(key: str, parents=()) -> Lease:
    return Lease(key, Checkpoint("TRIM_HORIZON"), parent_shard_ids=tuple(parents))


def test_a_slice_holds_only_its_stream_incarnations_leases_and_shards():
    leases = [_lease(f"{ORDERS}:shardId-000000000001", [f"{ORDERS}:shardId-000000000000"]),
              _lease(f"{ORDERS_BEFORE}:shardId-000000000001"), _lease(f"{CLICKS}:shardId-000000000001")]
    shards = [Shard(f"{ORDERS}:shardId-000000000001"), Shard(f"{CLICKS}:shardId-000000000001")]
    view = slice_of(StreamScope("orders", ORDERS), leases, shards)
    assert [lease.lease_key for lease in view.leases] == [f"{ORDERS}:shardId-000000000001"]
    assert [shard.shard_id for shard in view.shards] == [f"{ORDERS}:shardId-000000000001"]
    assert view.directory == "orders@1700000000"
    assert view.lease_key("shardId-000000000001") == f"{ORDERS}:shardId-000000000001"
    (by_shard_id,) = view.leases_by_shard_id()
    assert by_shard_id.lease_key == "shardId-000000000001"
    assert by_shard_id.parent_shard_ids == ("shardId-000000000000",)
    assert view.leases[0].lease_key == f"{ORDERS}:shardId-000000000001"  # the slice itself is unchanged


def test_a_single_stream_slice_is_the_whole_table_named_by_shard_id():
    leases = [_lease("shardId-000000000000")]
    view = slice_of(StreamScope("arn:aws:kinesis:eu-west-1:123456789012:stream/orders"), leases,
                    [Shard("shardId-000000000000")])
    assert view.leases == leases and view.leases_by_shard_id() == leases
    assert view.directory == "orders@eu-west-1@123456789012"  # named by its ARN: the identity is in the layout
    assert view.lease_key("shardId-000000000000") == "shardId-000000000000"


def test_dagster_names_keep_a_single_stream_plain_and_prefix_each_of_several():
    (single,) = pipeline_streams(["orders"])
    assert single == PipelineStream() and single.job("kinesis_window_job") == "kinesis_window_job"
    assert single.output_uri("s3://b/out") == "s3://b/out" and single.run_key("k") == "k"
    orders, clicks = pipeline_streams(["orders", "arn:aws:kinesis:eu-west-1:123456789012:stream/click.stream"])
    assert clicks.prefix == stream_prefix("click.stream") == "click_stream"
    assert clicks.job("kinesis_window_job") == "kinesis_window_job__click_stream"
    assert clicks.output_uri("s3://b/out/") == "s3://b/out/click.stream"
    assert orders.run_key("2026-11-25-10:00") != clicks.run_key("2026-11-25-10:00")


def test_unfinished_leases_of_an_earlier_incarnation_are_found_and_finished_or_other_streams_are_not():
    from kcl_pipeline.zone.stream_slice import earlier_incarnations

    ended = Lease(f"{ORDERS_BEFORE}:shardId-000000000002", Checkpoint("SHARD_END"))
    leases = [_lease(f"{ORDERS}:shardId-000000000000"), _lease(f"{ORDERS_BEFORE}:shardId-000000000001"), ended,
              _lease(f"{CLICKS}:shardId-000000000000")]
    assert earlier_incarnations(StreamScope("orders", ORDERS), leases) == [ORDERS_BEFORE]
    assert earlier_incarnations(StreamScope("orders", ORDERS), [leases[0], ended, leases[3]]) == []
    assert earlier_incarnations(StreamScope("clicks", CLICKS), leases) == []
    assert earlier_incarnations(StreamScope("orders"), leases) == []  # a single stream has no incarnations
