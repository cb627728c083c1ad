"""The pure core of the lease protocol: state and observations in, decisions out (no clock, no I/O).

Nothing here imports a shell (`..shells`), boto3 or botocore; kcl_pipeline_tests/test_layers.py enforces it."""
