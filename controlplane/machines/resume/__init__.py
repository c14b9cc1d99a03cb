"""The ``resume`` kind: bring a suspended workload back, restored or cold-booted. Pure."""
