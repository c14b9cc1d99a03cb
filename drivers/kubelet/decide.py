"""What the kubelet role should do next, decided from what the watches show. Pure.

:func:`decide` looks at every pod and node (as the API server last showed them) and
answers with actions, the scheduler's and the kubelets':

- :class:`Bind` an unbound pending pod to the node :func:`drivers.sim.scheduling.choose`
  picks (the simulator's scheduling rules, the same code), or :class:`Refuse` it:
  ``PodScheduled=False/Unschedulable`` with the scheduler's message, only when that is not
  already what the pod says (so a refusal is written once, retried on every change);
- :class:`Start` a pending pod bound to one of the role's nodes (after the start delay);
- :class:`Finish` a terminating pod on one of the role's nodes (after
  ``min(stop delay, grace period)``): the kubelet's final delete.

``assumed`` holds bindings sent but not yet seen in a watch event (kube-scheduler's
"assume"): those pods count as bound, so two passes never place one pod twice nor
overfill a node. Called by :mod:`drivers.kubelet.role`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from drivers.kube.client import KubeObject
from drivers.sim import podstatus, scheduling
from drivers.sim.objects import condition, meta

SCHEDULER_NAME = "default-scheduler"


@dataclass(frozen=True)
class Bind:
    pod: KubeObject
    node: str


@dataclass(frozen=True)
class Refuse:
    pod: KubeObject
    message: str


@dataclass(frozen=True)
class Start:
    pod: KubeObject
    node: KubeObject
    delay: float


@dataclass(frozen=True)
class Finish:
    pod: KubeObject
    delay: float


Action: TypeAlias = Bind | Refuse | Start | Finish


def uid(obj: KubeObject) -> str:
    return str(meta(obj).get("uid") or "")


def key(action: Action) -> tuple[str, ...]:
    """What the role tracks as sent or due: the kind, the pod's UID and, for a refusal,
    its message (a new reason is a new write)."""
    detail = action.message if isinstance(action, Refuse) else ""
    return type(action).__name__, uid(action.pod), detail


def waits_for_node(pod: KubeObject) -> bool:
    """Pending, unbound, ungated, not deleting, and for the default scheduler."""
    spec = pod.get("spec") or {}
    return (not spec.get("nodeName") and not spec.get("schedulingGates")
            and spec.get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
            and meta(pod).get("deletionTimestamp") is None
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending")


def _refused_already(pod: KubeObject, message: str) -> bool:
    found = condition(pod, "PodScheduled")
    return found is not None and found.get("status") == "False" and \
        found.get("reason") == "Unschedulable" and found.get("message") == message


def _as_bound(pods: Iterable[KubeObject], assumed: Mapping[str, str]) -> list[KubeObject]:
    out = []
    for pod in pods:
        node = assumed.get(uid(pod))
        if node and not (pod.get("spec") or {}).get("nodeName"):
            pod = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
        out.append(pod)
    return out


def decide(pods: Collection[KubeObject], nodes: Collection[KubeObject], *,
           ours: Collection[str], assumed: Mapping[str, str], start_seconds: float,
           stop_seconds: float, schedule: bool = True) -> list[Action]:
    """Every action due or pending now, pods in (namespace, name) order. ``schedule``
    off: no binds or refusals (a real kube-scheduler places the pods), kubelets only."""
    by_name = {str(meta(n).get("name")): n for n in nodes}
    node_list = [by_name[name] for name in sorted(by_name)]
    used = scheduling.usage(_as_bound(pods, assumed))
    actions: list[Action] = []
    for pod in sorted(pods, key=lambda p: (str(meta(p).get("namespace")),
                                           str(meta(p).get("name")))):
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        m = meta(pod)
        if node_name in ours:
            if m.get("deletionTimestamp") is not None:
                grace = m.get("deletionGracePeriodSeconds")
                actions.append(Finish(pod, min(stop_seconds,
                                               grace if isinstance(grace, int) else 0)))
            elif podstatus.may_start(pod) and node_name in by_name:
                actions.append(Start(pod, by_name[node_name], start_seconds))
        elif schedule and not node_name and uid(pod) not in assumed and waits_for_node(pod):
            chosen, why = scheduling.choose(pod, node_list, used)
            if chosen is None:
                if not _refused_already(pod, why):
                    actions.append(Refuse(pod, why))
                continue
            actions.append(Bind(pod, chosen))
            slot = used.setdefault(chosen, {"cpu": 0.0, "memory": 0.0, "pods": 0.0})
            for resource, value in scheduling.pod_requests(pod).items():
                slot[resource] += value
            slot["pods"] += 1
    return actions
