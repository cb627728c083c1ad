"""A deterministic simulation of the shipped consumer in a seeded virtual world (no dagster, no pyspark).

The consumer's own decisions run here unchanged: the lease-life and manager-cycle coroutines
(kcl/lease_life.py, kcl/cycle.py), the planner, the real `LeaseTable` request builders (evaluated by a
simulated DynamoDB) and the real `ShardReader` (over a simulated Kinesis). `./run.sh simulate` runs it.
"""
