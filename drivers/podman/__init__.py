"""Real containers for emulated nodes: one podman storage root per node, CRIU underneath.

:mod:`drivers.podman.podman` drives a node's podman (run, inspect, remove, checkpoint,
restore); :mod:`drivers.podman.workload` builds the small images the real-checkpoint
tests, the demo and the benchmark run. Used by the kubelet role's runtime-backed nodes
(:mod:`drivers.kubelet.podman_nodes`) and the ``criu`` dumper (:mod:`drivers.agent.criu`).
"""

from drivers.podman.podman import ContainerState, PodmanNode, RuntimeFailed, container_name

__all__ = ["ContainerState", "PodmanNode", "RuntimeFailed", "container_name"]
