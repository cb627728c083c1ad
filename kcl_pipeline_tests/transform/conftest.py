"""Transform fixtures: one local SparkSession per test session (starting one takes ~10 s and ~0.7 GB).

Other test packages reuse it with `from kcl_pipeline_tests.transform.conftest import spark  # noqa: F401`
in their conftest; every import hands out the same session and it is stopped once, at the end.
"""
from __future__ import annotations

import pytest

from kcl_pipeline.transform.job import build_local_session

_session = None


def shared_spark():
    global _session
    if _session is None or _session.sparkContext._jsc is None:  # not started, or stopped
        _session = build_local_session("local[2]", "kcl-pipeline-tests", **{"spark.driver.memory": "1g"})
    return _session


@pytest.fixture(scope="session")
def spark():
    session = shared_spark()
    yield session
    if session.sparkContext._jsc is not None:
        session.stop()
