"""A registered node as its kubelet states it: the one definition the simulator's
in-process nodes (:mod:`drivers.sim.kubelet`) and the kubelet role
(:mod:`drivers.kubelet.nodes`) both use. Pure: time comes in as an argument.

- :func:`node_object`: the Node a kubelet registers (labels ``kubernetes.io/hostname``,
  ``os``, ``arch``; capacity = allocatable; an ``InternalIP`` of ``10.0.0.<index>``;
  ``Ready``);
- :func:`node_status`: its sizes, addresses and ``nodeInfo`` (restated by heartbeats);
- :func:`ready_condition`: ``Ready=True`` with a heartbeat time and a transition time.
"""

from __future__ import annotations

from collections.abc import Mapping

from drivers.sim.objects import HOSTNAME_LABEL, Obj

KUBELET_VERSION = "v1.31.0-sim"


def ready_condition(now: str, since: str) -> Obj:
    return {"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
            "lastTransitionTime": since}


def node_status(name: str, index: int, *, cpu: str, memory: str, pods: int) -> Obj:
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return {"capacity": capacity, "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{index}"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION,
                         "containerRuntimeVersion": "sim://1", "operatingSystem": "linux",
                         "osImage": "simulated", "kernelVersion": "none",
                         "architecture": "amd64"}}


def node_object(name: str, index: int, *, cpu: str, memory: str, pods: int, now: str,
                labels: Mapping[str, str] | None = None) -> Obj:
    """The Node registered for ``name`` (``index``: its 1-based place among the nodes)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name,
                                                  "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64",
                                                  **(labels or {})}},
            "spec": {},
            "status": {**node_status(name, index, cpu=cpu, memory=memory, pods=pods),
                       "conditions": [ready_condition(now, now)]}}
