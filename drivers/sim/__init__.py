"""A simulated Kubernetes cluster for tests, demos and benchmarks (loopback only).

``SimCluster`` serves the core/v1 REST subset the control plane uses (namespaces, pods,
nodes, events, persistentvolumeclaims: get, list, watch, create, update, patch, delete,
the status subresource) and apps/v1 deployments, replicasets and statefulsets, with a
simulated scheduler and kubelets, the workload controllers and garbage collector, fault
hooks and a workload marker. See
``docs/simulator.md``. Run it as a process with ``cpctl sim up`` (``python -m drivers.sim
up`` is the same command).
"""

from drivers.sim.cluster import SimCluster
from drivers.sim.faults import Faults
from drivers.sim.objects import MARKER, ApiError

__all__ = ["MARKER", "ApiError", "Faults", "SimCluster"]
