"""Who owns a pod, and whether an operation that deletes it may move it. Pure.

A migration or a suspend deletes its source pod. A pod whose *controller* (the
``ownerReferences`` entry with ``controller: true``) is a ReplicaSet, a StatefulSet, a
Job or an operator's custom resource is recreated by that controller the moment it is
deleted: a cold copy beside the restored one, and for a StatefulSet a stolen identity.
Until a mechanism for that owner kind exists, such a pod is refused with a reason that
names its owner and says what would be needed; a bare pod (no controller) moves.

:func:`controller_of` reads the controller reference; :func:`why_not_movable` answers
the reason or ``None``. A checkpoint (which deletes nothing) is never refused for its
owner. Used by the verbs' specs (``app.specs``) and the drain planner.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

#: What moving a pod of each controller kind would need (the reason's second half).
NEEDS: Mapping[str, str] = {
    "ReplicaSet": "the restored pod adopted by the ReplicaSet while the source is scaled "
                  "away (pod-deletion-cost), so the controller never starts a cold copy",
    "StatefulSet": "the controller's own successor pod (same name and claims) held by a "
                   "scheduling gate until the restore request is on it",
    "Job": "the Job suspended (spec.suspend) and started again elsewhere: a Job's pods "
           "run to completion, they are not moved",
    "ReplicationController": "the same as a ReplicaSet's (adoption), not supported",
}


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    api_version: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def controller_of(pod: Mapping[str, Any]) -> Owner | None:
    """The pod's controller (``ownerReferences[].controller``), or ``None``: a bare pod."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(str(ref.get("kind") or "?"), str(ref.get("name") or "?"),
                         str(ref.get("apiVersion") or ""))
    return None


def why_not_movable(pod: Mapping[str, Any], *, verb: str = "migrate",
                    movable: Collection[str] = ()) -> str | None:
    """Why ``verb`` (an operation that deletes the source) may not take this pod, naming
    its owner and what would be needed; ``None`` when it may: a bare pod, or one whose
    owner kind the checkpoint class lists as ``movable`` (``owners: {Kind: "move"}``)."""
    owner = controller_of(pod)
    if owner is None or owner.kind in movable:
        return None
    meta = pod.get("metadata") or {}
    where = f"{meta.get('namespace', '?')}/{owner.name}"
    if owner.kind == "DaemonSet":
        return f"owned by DaemonSet {where}: it runs one pod on every node; nothing to move"
    needed = NEEDS.get(owner.kind, f"a handler for {owner.kind} ({owner.api_version or '?'}) "
                                   "that keeps its controller from recreating the pod")
    return (f"owned by {owner.kind} {where}, which recreates the pod as soon as it is "
            f"deleted: a {verb} would leave a cold copy beside the restored one. Moving it "
            f"needs {needed}. Checkpoint it instead (that deletes nothing), cordon the node "
            "and let the controller reschedule it, or, if its owner never recreates a "
            f"deleted pod, declare it in the checkpoint class: owners: {{{owner.kind}: move}}")
