"""Who owns a pod, and whether an operation that deletes it may move it. Pure.

A migration or a suspend deletes its source pod. A pod whose *controller* (the
``ownerReferences`` entry with ``controller: true``) is a ReplicaSet, a StatefulSet, a
Job or an operator's custom resource is recreated by that controller the moment it is
deleted: a cold copy beside the restored one, and for a StatefulSet a stolen identity.
Each owner kind has a mechanism or a refusal that names the owner and says what would
be needed (:func:`how_moved`):

- no controller (a bare pod): ``bare``: the source is deleted, then restored under its
  own name;
- a ReplicaSet (a Deployment's pods): ``adopt`` for a migration or a drain: the restored
  pod starts beside the quiesced source with its labels parked and is handed to the
  ReplicaSet once verified; the source goes only after the adoption (see the migration
  machine's ``Adopting``). A suspend is still refused: nothing would take the pod's place
  but a cold copy (scale the Deployment instead);
- a StatefulSet: ``gated`` for a migration or a drain: the source is deleted, the
  controller recreates the same name (same ordinal, same claims), the control plane's
  admission webhook holds that successor with a scheduling gate, and the migration
  claims it (node affinity to the target, the restore request) and lifts the gate. A
  suspend is refused (the controller would start the successor cold);
- a kind the checkpoint class declares (``owners: {Kind: move}``): ``bare``;
- anything else (Job, ReplicationController, unknown custom resources, DaemonSets):
  refused.

:func:`controller_of` reads the controller reference; :func:`why_not_movable` answers
the reason or ``None``. A checkpoint (which deletes nothing) is never refused for its
owner. Used by the requests (``migration/request.py``, ``suspend/request.py``) and
the drain planner.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

#: What moving a pod of each controller kind would need (the reason's second half).
NEEDS: Mapping[str, str] = {
    "ReplicaSet": "a replacement, which a suspend does not make: scale its Deployment or "
                  "ReplicaSet down instead, or migrate the pod (the ReplicaSet adopts the "
                  "restored one)",
    "StatefulSet": "a successor its controller would start cold, which a suspend cannot "
                   "hold: scale the StatefulSet down instead (its claims stay), or migrate "
                   "the pod (the successor is held by a scheduling gate and restored)",
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


#: How a pod moves: ``bare`` (delete, then restore), ``adopt`` (restore beside it, then
#: hand it to the ReplicaSet) or ``gated`` (delete, then claim the StatefulSet's gated
#: successor).
BARE, ADOPT, GATED = "bare", "adopt", "gated"
#: The mechanism for each controller kind that has one (for the restoring verbs).
MECHANISMS: Mapping[str, str] = {"ReplicaSet": ADOPT, "StatefulSet": GATED}
#: The verbs that restore the pod elsewhere (a suspend restores nothing).
RESTORING_VERBS = frozenset({"migrate", "migration", "drain"})


def how_moved(pod: Mapping[str, Any], *, verb: str = "migrate",
              movable: Collection[str] = ()) -> str:
    """``adopt`` for a ReplicaSet's pod and ``gated`` for a StatefulSet's that ``verb``
    restores elsewhere, else ``bare``; meaningful only when :func:`why_not_movable` is
    ``None``."""
    owner = controller_of(pod)
    if owner is not None and owner.kind not in movable and verb in RESTORING_VERBS:
        return MECHANISMS.get(owner.kind, BARE)
    return BARE


def why_not_movable(pod: Mapping[str, Any], *, verb: str = "migrate",
                    movable: Collection[str] = ()) -> str | None:
    """Why ``verb`` (an operation that deletes the source) may not take this pod, naming
    its owner and what would be needed; ``None`` when it may: a bare pod, or one whose
    owner kind the checkpoint class lists as ``movable`` (``owners: {Kind: "move"}``)."""
    owner = controller_of(pod)
    if owner is None or owner.kind in movable:
        return None
    if how_moved(pod, verb=verb, movable=movable) != BARE:
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
