"""A deterministic simulation of the shipped consumer in a seeded virtual world (no dagster, no pyspark).

The consumer's own decisions run here unchanged: the lease-life and manager-cycle coroutines
(kcl/core/lease/lease_life.py, kcl/core/fleet/cycle.py), the planner, the real `LeaseTable` request builders
(evaluated by a simulated DynamoDB) and the real `ShardReader` (over a simulated Kinesis). `./run.sh simulate` runs it.

Rooms, lowest first: `runtime/` (the seeded scheduler, the scenario, pauses inside calls), `aws/` (simulated
DynamoDB, Kinesis and the landing zone's store), `judge/` (the invariant checker, the fleet view it reads, the
planted bugs), `actors/` (the shipped consumer and pipeline on the simulated services, and the Java peers), and
this package's modules (the world that wires them, the runner over seeds, the CLI).
"""
