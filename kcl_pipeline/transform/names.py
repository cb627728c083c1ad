"""Names the deployment's settings check without pyspark (on a core install, and in the code location before
Spark is imported): the registered decoders' names, and the forms of a Spark master URL."""
from __future__ import annotations

import re

JSON, JSON_SPARK = "json", "json_spark"
DECODERS = (JSON, JSON_SPARK)

# A local master: local, local[N], local[*], local[N,F], local[*,F], local-cluster[N,C,M] (every process of the
# session on this host).
LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|local-cluster\[[1-9][0-9]*(,[1-9][0-9]*){2}\]")
# Any master: a local one, a cluster manager's URL, or Spark Connect's sc://.
SPARK_MASTER = re.compile(LOCAL_MASTER.pattern + r"|yarn|(spark|k8s|mesos|sc)://[^\s/]+.*")
