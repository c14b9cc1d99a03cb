"""A pod's status from its real containers, as a kubelet's PLEG would report it. Pure.

:func:`pod_status` turns the runtime's view of a pod's containers
(:class:`~drivers.podman.podman.ContainerState` by container name; ``None``: not
created yet) into the status fields the kubelet role patches:

- a running container is ``running`` and ready;
- a container a quiesced checkpoint stopped is ``waiting`` (reason ``Checkpointed``) and
  not ready: it is held, not dead, and the pod stays ``Running`` (a restore in place
  resumes it);
- a container that exited on its own is ``terminated`` with its exit code; once every
  container has, the phase is ``Succeeded`` (all exit 0) or ``Failed``;
- a container not created yet is ``waiting`` (``ContainerCreating``).

``Ready``/``ContainersReady`` hold when every container is ready. Container IDs are
``podman://<id>``. :func:`changed` says whether a pod's status differs from what it
reports (so an unchanged pod is never written). Called by :mod:`drivers.kubelet.podman_nodes`.
"""

from __future__ import annotations

from collections.abc import Mapping

from drivers.podman.podman import ContainerState
from drivers.sim.objects import Obj, clone, set_condition


def _container_status(name: str, image: str, state: ContainerState | None) -> Obj:
    entry: Obj = {"name": name, "image": image, "restartCount": 0,
                  "imageID": f"podman://{state.image_id}" if state else ""}
    if state is None:
        return {**entry, "ready": False, "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}}}
    entry["containerID"] = f"podman://{state.id}"
    if state.running:
        return {**entry, "ready": True, "started": True,
                "state": {"running": {"startedAt": state.started_at}}}
    if state.checkpointed:
        return {**entry, "ready": False, "started": False, "state": {"waiting": {
            "reason": "Checkpointed",
            "message": "stopped by a quiesced checkpoint; a restore resumes it"}}}
    return {**entry, "ready": False, "started": False, "state": {"terminated": {
        "exitCode": state.exit_code, "reason": "Completed" if state.exit_code == 0 else "Error",
        "startedAt": state.started_at, "finishedAt": state.finished_at}}}


def pod_status(pod: Obj, states: Mapping[str, ContainerState | None]) -> Obj:
    """The status fields (``phase``, ``conditions``, ``containerStatuses``) of a started
    pod from its containers."""
    status = clone(pod.get("status") or {})
    spec = pod.get("spec") or {}
    entries = [_container_status(str(c["name"]), str(c.get("image") or ""),
                                 states.get(str(c["name"])))
               for c in spec.get("containers") or []]
    ready = bool(entries) and all(e["ready"] for e in entries)
    finished = bool(entries) and all("terminated" in e["state"] for e in entries)
    if finished:
        failed = any(e["state"]["terminated"]["exitCode"] != 0 for e in entries)
        phase = "Failed" if failed else "Succeeded"
    else:
        phase = "Running"
    for type_ in ("ContainersReady", "Ready"):
        set_condition(status, type_, ready)
    return {"phase": phase, "conditions": status.get("conditions") or [],
            "containerStatuses": entries}


def _comparable(status: Obj) -> object:
    conditions = sorted((str(c.get("type")), str(c.get("status")))
                        for c in status.get("conditions") or [])
    containers = sorted((str(c.get("name")), bool(c.get("ready")), str(c.get("containerID")),
                         tuple(sorted((c.get("state") or {}).keys())),
                         str(((c.get("state") or {}).get("waiting") or {}).get("reason")))
                        for c in status.get("containerStatuses") or [])
    return status.get("phase"), conditions, containers


def changed(pod: Obj, fields: Obj) -> bool:
    """Whether ``fields`` say something the pod's status does not say already."""
    return _comparable(pod.get("status") or {}) != _comparable(fields)
