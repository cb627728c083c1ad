"""The Dagster instance's own parts that dagster.yaml names (not the code location's): the run launcher whose run
workers run monitoring can see."""
