"""Tests of the pure product machines (deciders), their parts and their safety properties."""
