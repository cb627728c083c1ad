"""The Dagster deployment's configuration in plain Python, readable without Dagster (the CLI's defaults on a
core install): the consumer it hosts (actors/consumer.py), the settings read from the environment (settings.py), its
streams' Dagster names (streams.py), the instance's DAGSTER_HOME (home.py), and which settings are
secret (redaction.py)."""
