"""Which Spark a window run uses when its master is a Spark Connect server (sc://): the server, or a cold session.

A long-lived Spark Connect server keeps one JVM warm for every run; a run attaches to it instead of starting
a driver of its own. When the server does not answer, a run with a fallback master configured
(KCL_PIPELINE_SPARK_FALLBACK_MASTER, e.g. local[*]) starts that cold session instead, with one WARNING line;
without one the run fails at once, naming the server and the setting. The fallback is opt-in because a cold
session runs on the run's own host: a deployment sized for a remote cluster may not want windows transformed
in its run workers' memory (docs/deployment.md).

The decision (`choose_master`) is a pure function of the configured masters and what the probe saw; `probe`
is the I/O (one TCP connection, a few seconds at most): the Spark Connect client itself retries an
unreachable server with backoff for at least 10 minutes (pyspark's default retry policy) before it gives up.
A server that stops answering during a run is met by the client: a run's session retries it for about 25 s
(`RETRY_POLICY`), then the run transforms its window again in the fallback session, or fails naming the server
(`server_gone` tells that error from the transform's own).
No pyspark here: the code location and the CLI decide before Spark is imported.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

CONNECT_SCHEME = "sc://"
DEFAULT_CONNECT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)
PROBE_TIMEOUT_SECONDS = 3.0


# The Spark Connect client's retries of a server that stopped answering, in pyspark's DefaultPolicy terms: waits
# of 0.05, 0.2, 0.8, 3.2 s, then 5 s four times (about 25 s with jitter). pyspark's own policy waits at least
# 10 minutes, which a window's run whose server died would spend before its fallback or its failure; a server
# restarted in place (`local up` again) answers within these retries.
RETRY_POLICY = {"max_retries": 8, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 5000}


class SparkUnreachable(RuntimeError):
    """The configured Spark Connect server does not answer and no fallback master is configured."""


def is_connect(master: str) -> bool:
    return master.strip().startswith(CONNECT_SCHEME)


def connect_address(url: str) -> tuple[str, int]:
    """(host, port) of an sc://host[:port][/;params] URL (the port defaults to Spark Connect's 15002)."""
    if not is_connect(url):
        raise ValueError(f"not a Spark Connect URL (sc://host:port): {url!r}")
    parts = urlsplit("http://" + url.strip()[len(CONNECT_SCHEME):].split("/", 1)[0].split(";", 1)[0])
    if not parts.hostname:
        raise ValueError(f"a Spark Connect URL names a host (sc://host:port): {url!r}")
    return parts.hostname, parts.port or DEFAULT_CONNECT_PORT


@dataclass(frozen=True)
class MasterChoice:
    master: str  # the master the run's session is built with
    warning: str | None = None  # the one line a fallback logs


def choose_master(master: str, fallback: str | None, unreachable: str | None) -> MasterChoice:
    """The master a run uses. `unreachable`: why the probe of an sc:// master failed (None: it answered, or
    the master is not sc:// and was not probed). Raises SparkUnreachable when it failed and there is no
    fallback."""
    if not is_connect(master) or unreachable is None:
        return MasterChoice(master)
    if not fallback:
        raise SparkUnreachable(
            f"the Spark Connect server {master} is unreachable ({unreachable}); start it, or set "
            f"KCL_PIPELINE_SPARK_FALLBACK_MASTER (e.g. local[*]) to transform in a cold session instead")
    return MasterChoice(fallback, f"the Spark Connect server {master} is unreachable ({unreachable}): this run "
                                  f"transforms in a cold {fallback} session (KCL_PIPELINE_SPARK_FALLBACK_MASTER)")


def probe(url: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """None when the server at `url` accepts a connection; otherwise why not, in a few words."""
    host, port = connect_address(url)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def resolve_master(master: str, fallback: str | None,
                   probe_fn: Callable[[str], str | None] = probe) -> MasterChoice:
    """choose_master with an sc:// master probed (the only I/O); other masters are used as they are."""
    return choose_master(master, fallback, probe_fn(master) if is_connect(master) else None)


def server_gone(error: BaseException) -> bool:
    """Did a Spark Connect call fail because its server stopped answering (gRPC UNAVAILABLE once the client's
    retries were spent), rather than on the transform's own account? Read off the error pyspark raises
    (`SparkConnectGrpcException.getGrpcStatusCode`), so no pyspark import is needed to ask."""
    status = getattr(error, "getGrpcStatusCode", None)
    if not callable(status):
        return False
    try:
        code = status()
    except Exception:  # noqa: BLE001 - an error without a status is not the server's absence
        return False
    return getattr(code, "name", None) == "UNAVAILABLE"
