"""Real Kubernetes nodes on this host: a kubelet v1.36 and CRI-O 1.36 per node, for the
tests and for ``cpctl sim nodes --real`` (docs/realnode.md).

Modules, leaves first: ``config`` (every file a node runs with, pure), ``runc_wrapper``
(the runtime CRI-O runs: runc after fitting the bundle to this host), ``pki`` (the CA and
the kubelets' certificates), ``host`` (slots, sysctls, cgroups, bridges: taken and given
back), ``images`` (pause, busybox and checkpoint images pushed to a loopback registry),
``registry`` (that registry), ``kubeapi`` (Node reads), ``node`` (one node's processes),
``world`` (N nodes against one API server), ``lazy`` (post-copy through the kubelet's
checkpoint API and CRI-O's restore, by way of ``runc_wrapper``; driver level).
"""

from drivers.realnode.node import NodeFailed, RealNode
from drivers.realnode.world import HOW_TO_ENABLE, RealNodes, binaries_folder

__all__ = ["HOW_TO_ENABLE", "NodeFailed", "RealNode", "RealNodes", "binaries_folder"]
