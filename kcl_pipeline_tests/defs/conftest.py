"""Dagster tests reuse the transform tests' session-wide SparkSession (one per test run)."""
from kcl_pipeline_tests.transform.conftest import spark  # noqa: F401
