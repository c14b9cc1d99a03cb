"""Adapters to the world (Kubernetes, OCI registries, the node agent, the simulator).

Each driver implements a port (a ``typing.Protocol``) defined by ``controlplane``.
"""
