"""This consumer's KCL 3.x worker metrics item: format, bad values, and a 3.x worker's attributes kept."""
from __future__ import annotations

import pytest

from kcl_pipeline.kcl.worker_metrics import metrics_update, publish, worker_metrics_table


def test_the_update_sets_only_lut_and_sts_with_the_most_recent_values_last():
    update = metrics_update("me#1", 1732441200, [float(i) for i in range(15)])
    assert update["Key"] == {"wid": {"S": "me#1"}}
    assert update["UpdateExpression"] == "SET lut = :lut, sts = :sts"
    values = update["ExpressionAttributeValues"]
    assert values[":lut"] == {"N": "1732441200"}
    assert values[":sts"]["M"]["THROUGHPUT"]["L"][-1] == {"N": "14.0"}
    assert len(values[":sts"]["M"]["THROUGHPUT"]["L"]) == 10


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "12"])
def test_a_bad_metric_value_is_a_specific_error(bad):
    with pytest.raises(ValueError, match="THROUGHPUT: values must be finite numbers >= 0"):
        metrics_update("me", 1, [1.0, bad])


def test_a_worker_id_is_required():
    with pytest.raises(ValueError, match="worker id"):
        metrics_update("", 1, [])


@pytest.mark.emulator
def test_publish_creates_the_table_and_keeps_attributes_it_does_not_manage(dynamodb_client, unique_name):
    app = unique_name("wm")
    publish(dynamodb_client, app, "me#1", 1732441200, [5.0])
    table = worker_metrics_table(app)
    # A KCL 3.x worker's attributes on the same item must survive our next write.
    dynamodb_client.update_item(TableName=table, Key={"wid": {"S": "me#1"}},
                                UpdateExpression="SET opr = :opr, sup = :sup, slu = :slu",
                                ExpressionAttributeValues={":opr": {"M": {"C": {"L": [{"N": "100"}]}}},
                                                           ":sup": {"N": "1"}, ":slu": {"N": "1732441100"}})
    publish(dynamodb_client, app, "me#1", 1732441260, [5.0, 7.5])
    item = dynamodb_client.get_item(TableName=table, Key={"wid": {"S": "me#1"}}, ConsistentRead=True)["Item"]
    assert item == {"wid": {"S": "me#1"}, "lut": {"N": "1732441260"},
                    "sts": {"M": {"THROUGHPUT": {"L": [{"N": "5"}, {"N": "7.5"}]}}},
                    "opr": {"M": {"C": {"L": [{"N": "100"}]}}}, "sup": {"N": "1"}, "slu": {"N": "1732441100"}}
