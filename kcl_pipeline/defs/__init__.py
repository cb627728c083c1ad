"""Dagster wiring only: every module here is Dagster code (definitions, resources, sensors, assets, checks).

The logic it wires lives below: the consumer in kcl/, the landing zone in zone/, the sensor's decisions in
windows/, the deployment's plain settings in deployment/, the transform in transform/."""
from .kinesis.definitions import build_definitions, build_member_definitions

__all__ = ["build_definitions", "build_member_definitions"]
