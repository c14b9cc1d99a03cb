"""The kubelet role: nodes, a scheduler and kubelets for any API server, through the API.

``cpctl sim nodes --kubeconfig K --nodes node-1,node-2`` runs it (like kwok): against the
simulator with its in-process kubelets off, or against a real ``kube-apiserver`` that has
no nodes. Modules, leaves first: ``options`` (flags, checked), ``nodes`` (node bodies and
patches), ``decide`` (what to do next, pure; the simulator's scheduling and pod-status
rules), ``role`` (the watches and the writes).
"""

from drivers.kubelet.options import RoleInputError, RoleOptions
from drivers.kubelet.role import KubeletRole, RoleNotReady

__all__ = ["KubeletRole", "RoleInputError", "RoleNotReady", "RoleOptions"]
