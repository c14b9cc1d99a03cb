"""The ``steps`` kind: the engine's own test and benchmark workload. Pure."""
