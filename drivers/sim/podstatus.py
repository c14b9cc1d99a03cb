"""What a pod's status is once a kubelet runs it: one rule for the simulator and real servers.

:func:`running_status` is the status a kubelet reports when a bound, ``Pending`` pod's
containers start on a node: phase ``Running``, ``PodScheduled``/``Initialized``/
``ContainersReady``/``Ready`` true, one running ``containerStatuses`` entry per container,
``podIP``/``hostIP``/``startTime``. It keeps whatever else the status holds (``qosClass``,
which a real API server sets at creation and refuses to see changed).
:data:`RUNNING_FIELDS` are the fields it sets: what the kubelet role
(:mod:`drivers.kubelet`) sends in its ``pods/status`` patch.

Called by the simulator's in-process kubelets (:mod:`drivers.sim.kubelet`) and the kubelet
role, so there is one implementation of a running pod. Pure (the start time comes in).
"""

from __future__ import annotations

from drivers.sim.objects import Obj, clone, meta, set_condition

#: The status fields :func:`running_status` sets (and nothing else).
RUNNING_FIELDS = ("phase", "hostIP", "podIP", "startTime", "conditions", "containerStatuses")

DEFAULT_HOST_IP = "10.0.0.1"


def host_ip(node: Obj) -> str:
    """The node's ``InternalIP`` (what a pod on it reports as ``hostIP``)."""
    addresses = (node.get("status") or {}).get("addresses") or []
    return str(next((a.get("address") for a in addresses if a.get("type") == "InternalIP"),
                    DEFAULT_HOST_IP))


def pod_ip(host: str, uid: str) -> str:
    """A stable pod IP in the node's ``10.244.<n>.0/24`` range, derived from the UID."""
    third = host.rsplit(".", 1)[-1]
    return f"10.244.{third}.{int(uid.replace('-', '')[:4], 16) % 250 + 2}"


def may_start(pod: Obj) -> bool:
    """A pod starts only from ``Pending`` and never while it is being deleted."""
    return (pod.get("status") or {}).get("phase", "Pending") == "Pending" and \
        meta(pod).get("deletionTimestamp") is None


def running_status(pod: Obj, *, host: str, started: str) -> Obj | None:
    """The status of ``pod`` once running on the node at ``host``; ``None``: must not start."""
    if not may_start(pod):
        return None
    status = clone(pod.get("status") or {})
    uid = str(meta(pod)["uid"])
    status.update(phase="Running", hostIP=host, startTime=started, podIP=pod_ip(host, uid))
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        set_condition(status, type_, True)
    status["containerStatuses"] = [
        {"name": c["name"], "image": c["image"], "imageID": f"sim://{c['image']}",
         "containerID": f"sim://{uid[:8]}-{c['name']}",
         "ready": True, "started": True, "restartCount": 0,
         "state": {"running": {"startedAt": started}}}
        for c in (pod.get("spec") or {}).get("containers") or []]
    return status
