"""A fleet-member code location (deploy/workspace-two-hosts.yaml): `defs` holds only the `kinesis_fleet_member`
sensor, which hosts lease workers beside the pipeline location's and reports nothing (defs/kinesis/definitions.py).
It hosts only where KCL_PIPELINE_HOST_WORKERS=true, like the pipeline location."""
from kcl_pipeline.defs import build_member_definitions

defs = build_member_definitions()
