"""Benchmarks: one command per scenario, machine-readable output. Never run in CI."""
