"""The code location Dagster loads (workspace.yaml): `defs`, built from the environment (deployment/settings.py)."""
from kcl_pipeline.defs import build_definitions

defs = build_definitions()
