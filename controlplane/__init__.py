"""The control plane core: pure machines, the event store, workers, replay and the CLI.

Drivers (Kubernetes, registry, node agent, simulator) live in the sibling package
``drivers`` and implement the ports this package defines; the core never imports them.
"""
