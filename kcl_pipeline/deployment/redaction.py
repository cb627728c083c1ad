"""Which settings are secret, told by their names: the one rule for everything Dagster shows of them.

A Spark setting (KCL_PIPELINE_SPARK_CONF) whose name contains `secret`, `password`, `passwd`, `token`,
`credential` or `access key` (`access.key`, `access_key`, `accesskey`, `access-key`), in any case, is secret:
Dagster shows its value as `***` and the Spark session still gets the value. The rule is Spark's own
(`spark.redaction.regex`: secret|password|token|access[.]?key) widened to the other spellings of the same
words, so a value Spark would hide in its UI is hidden in Dagster's too.
"""
from __future__ import annotations

import re
from typing import Mapping

SECRET_NAME = re.compile(r"secret|passw(or)?d|token|credential|access[._-]?key", re.IGNORECASE)
REDACTED = "***"


def looks_secret(name: str) -> bool:
    return SECRET_NAME.search(name) is not None


def redacted(settings: Mapping[str, str]) -> dict[str, str]:
    """`settings` with the values of secret-looking names replaced by `***`."""
    return {name: REDACTED if looks_secret(name) else value for name, value in settings.items()}


def secret_part(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings whose names look secret."""
    return {name: value for name, value in settings.items() if looks_secret(name)}
