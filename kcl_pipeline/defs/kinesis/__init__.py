"""Dagster wiring of the Kinesis pipeline (resources, sensor, assets, checks, schedule)."""
