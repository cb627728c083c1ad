"""Which Spark a window run uses when its master is a Spark Connect server: the decision (pure) and its probe."""
from __future__ import annotations

import socket

import pytest

from kcl_pipeline.transform.connect import (
    DEFAULT_CONNECT_PORT,
    RETRY_POLICY,
    MasterChoice,
    SparkUnreachable,
    choose_master,
    connect_address,
    probe,
    resolve_master,
    server_gone,
)


def test_an_answering_server_is_used_without_a_word():
    assert choose_master("sc://h:15002", "local[*]", None) == MasterChoice("sc://h:15002")


def test_a_server_that_does_not_answer_is_replaced_by_the_fallback_with_one_warning():
    choice = choose_master("sc://h:15002", "local[*]", "h:15002: Connection refused")
    assert choice.master == "local[*]"
    assert choice.warning == ("the Spark Connect server sc://h:15002 is unreachable (h:15002: Connection refused): "
                              "this run transforms in a cold local[*] session (KCL_PIPELINE_SPARK_FALLBACK_MASTER)")


def test_a_server_that_does_not_answer_without_a_fallback_fails_at_once_naming_the_setting():
    with pytest.raises(SparkUnreachable, match=r"^the Spark Connect server sc://h:15002 is unreachable \(gone\); "
                                               r"start it, or set KCL_PIPELINE_SPARK_FALLBACK_MASTER"):
        choose_master("sc://h:15002", None, "gone")


def test_masters_that_are_not_spark_connect_are_used_as_they_are_and_never_probed():
    for master in ("local[*]", "spark://h:7077", "yarn"):
        assert resolve_master(master, None, probe_fn=lambda url: pytest.fail(f"probed {url}")) == MasterChoice(master)


@pytest.mark.parametrize("url,address", [
    ("sc://h:15003", ("h", 15003)),
    ("sc://h", ("h", DEFAULT_CONNECT_PORT)),
    ("sc://h:15003/;token=abc;use_ssl=true", ("h", 15003)),
    ("sc://127.0.0.1:4000;user_id=x", ("127.0.0.1", 4000)),
])
def test_the_server_address_is_read_from_the_connect_url(url, address):
    assert connect_address(url) == address


@pytest.mark.parametrize("url", ["local[*]", "sc://", "sc://:15002"])
def test_a_url_without_a_server_is_refused(url):
    with pytest.raises(ValueError, match="sc://host:port"):
        connect_address(url)


def test_the_probe_sees_a_listening_server_and_names_a_refused_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert probe(f"sc://127.0.0.1:{port}") is None
    refused = probe(f"sc://127.0.0.1:{port}")  # closed now
    assert refused is not None and refused.startswith(f"127.0.0.1:{port}: ") and "refused" in refused.lower()


class _Code:
    def __init__(self, name: str) -> None:
        self.name = name


class _GrpcError(Exception):
    """The shape of pyspark's SparkConnectGrpcException: its gRPC status behind getGrpcStatusCode()."""

    def __init__(self, code: str | None) -> None:
        super().__init__(code)
        self.code = code

    def getGrpcStatusCode(self):  # noqa: N802 - pyspark's name
        if self.code is None:
            raise AttributeError("no status")
        return _Code(self.code)


@pytest.mark.parametrize("error,gone", [
    (_GrpcError("UNAVAILABLE"), True),  # the server stopped answering: the client's retries are spent
    (_GrpcError("INTERNAL"), False),  # the server answered with the transform's own failure
    (_GrpcError("INVALID_ARGUMENT"), False),
    (_GrpcError(None), False),
    (ValueError("UNAVAILABLE"), False),  # an error that merely says the word
    (ConnectionResetError(), False),
])
def test_only_a_server_that_stopped_answering_counts_as_gone_not_the_transforms_own_errors(error, gone):
    assert server_gone(error) is gone


def test_a_runs_connect_client_gives_up_on_a_silent_server_in_about_25_seconds_not_pyspark_s_ten_minutes():
    policy = RETRY_POLICY
    waits, wait = [], policy["initial_backoff"]
    for _ in range(policy["max_retries"]):
        waits.append(min(wait, policy["max_backoff"]))
        wait *= policy["backoff_multiplier"]
    assert 15_000 <= sum(waits) <= 40_000, waits  # pyspark's own default: at least 600,000 ms
