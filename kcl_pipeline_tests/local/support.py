"""What the local deployment's tests share: Dagster's GraphQL API read while a webserver may still be starting."""
from __future__ import annotations

from kcl_pipeline.local.dagster_client import DagsterApiError, graphql


def graphql_or_none(url: str, query: str) -> dict | None:
    """The answer, or None while the webserver is not serving yet."""
    try:
        return graphql(url, query, {})
    except DagsterApiError as exc:
        if str(exc).startswith("cannot reach"):
            return None
        raise
