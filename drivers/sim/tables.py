"""The ``Table`` format of the simulated API server: what ``kubectl get`` prints.

``kubectl get`` asks for ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and
prints the server's columns (``-o wide`` adds those of priority 1). :func:`wanted` reads
that header; :func:`table` turns objects into a ``meta.k8s.io`` ``Table`` with the columns
and cells kube-apiserver's printers give pods, nodes, events and namespaces
(``pkg/printers/internalversion/printers.go``: ``printPod``, ``printNode``,
``printEvent``, ``printNamespace``), compared with the real server's answers by
``tests/drivers/test_sim_table.py``; a custom resource's columns are its CRD's
``additionalPrinterColumns`` (:mod:`drivers.sim.custom`). Other resources have no table
here: the server answers them with the plain list, which the same ``Accept`` header also
allows (kubectl then prints ``NAME AGE`` itself).

``includeObject`` (``Metadata``, the default; ``Object``; ``None``) says what each row
carries beside its cells, as on a real server. Pure: ``now`` comes in as an argument.
Called by :mod:`drivers.sim.server`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from drivers.sim import custom
from drivers.sim.objects import Obj, Resource, meta

Printer = Callable[[Obj, datetime], list[Any]]

NONE = "<none>"
UNKNOWN = "<unknown>"


def wanted(accept: str) -> str | None:
    """The ``Table`` version the ``Accept`` header asks for first (``v1``, ``v1beta1``),
    or ``None`` when it asks for plain objects before (or instead of) a table."""
    for media in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in media.split(";")[1:])
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and \
                params.get("v") in ("v1", "v1beta1"):
            return params["v"]
        if media.split(";")[0].strip() in ("application/json", "*/*"):
            return None
    return None


def _column(name: str, description: str, priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": "string", "format": fmt, "description": description,
            "priority": priority}


_NAME = _column("Name", "Name must be unique within a namespace.", fmt="name")
_AGE = _column("Age", "CreationTimestamp is a timestamp representing the server time when "
               "this object was created.")


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration``: ``5s``, ``3m20s``, ``47m``, ``5h3m``, ``3d``, ``2y``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def since(stamp: object, now: datetime) -> str:
    """``translateTimestampSince``: how long ago an RFC 3339 time was; ``<unknown>`` if unset."""
    if not isinstance(stamp, str) or not stamp:
        return UNKNOWN
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return UNKNOWN
    return human_duration((now - at).total_seconds())


def _status(obj: Obj) -> Obj:
    status = obj.get("status")
    return status if isinstance(status, dict) else {}


def _pod_cells(pod: Obj, now: datetime) -> list[Any]:
    status, spec = _status(pod), pod.get("spec") or {}
    reason = str(status.get("reason") or status.get("phase") or "")
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
           for c in status.get("conditions") or []):
        reason = "SchedulingGated"
    restarts, ready, last_restart = 0, 0, ""
    has_running = False
    # printPod walks the containers last to first: the first container's state wins.
    for c in reversed(status.get("containerStatuses") or []):
        restarts += int(c.get("restartCount") or 0)
        finished = ((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if isinstance(finished, str) and finished > last_restart:
            last_restart = finished
        state = c.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = str(waiting["reason"])
        elif terminated and terminated.get("reason"):
            reason = str(terminated["reason"])
        elif terminated:
            reason = (f"Signal:{terminated['signal']}" if terminated.get("signal")
                      else f"ExitCode:{terminated.get('exitCode', 0)}")
        elif c.get("ready") and state.get("running") is not None:
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        ready_condition = any(c.get("type") == "Ready" and c.get("status") == "True"
                              for c in status.get("conditions") or [])
        reason = "Running" if ready_condition else "NotReady"
    if meta(pod).get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    restarts_text = str(restarts)
    if restarts and last_restart:
        restarts_text = f"{restarts} ({since(last_restart, now)} ago)"
    ips = status.get("podIPs") or []
    ip = (ips[0].get("ip") if ips else None) or status.get("podIP") or NONE
    gates = spec.get("readinessGates") or []
    gates_text = NONE
    if gates:
        true = {c.get("type") for c in status.get("conditions") or []
                if c.get("status") == "True"}
        gates_text = f"{sum(g.get('conditionType') in true for g in gates)}/{len(gates)}"
    return [meta(pod).get("name"), f"{ready}/{len(spec.get('containers') or [])}", reason,
            restarts_text, since(meta(pod).get("creationTimestamp"), now), ip,
            spec.get("nodeName") or NONE, status.get("nominatedNodeName") or NONE, gates_text]


def _address(node: Obj, kind: str) -> str:
    return next((str(a["address"]) for a in _status(node).get("addresses") or []
                 if a.get("type") == kind and a.get("address")), NONE)


def _node_cells(node: Obj, now: datetime) -> list[Any]:
    status = _status(node)
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    words = ["Unknown" if ready is None else
             "Ready" if ready.get("status") == "True" else "NotReady"]
    if (node.get("spec") or {}).get("unschedulable"):
        words.append("SchedulingDisabled")
    roles = sorted({k.removeprefix("node-role.kubernetes.io/")
                    for k in meta(node).get("labels") or {}
                    if k.startswith("node-role.kubernetes.io/")} |
                   {v for k, v in (meta(node).get("labels") or {}).items()
                    if k == "kubernetes.io/role" and v})
    info = status.get("nodeInfo") or {}
    kernel = info.get("kernelVersion") or UNKNOWN
    if info.get("architecture"):
        kernel = f"{kernel} ({info['architecture']})"
    return [meta(node).get("name"), ",".join(words), ",".join(roles) or NONE,
            since(meta(node).get("creationTimestamp"), now), info.get("kubeletVersion", ""),
            _address(node, "InternalIP"), _address(node, "ExternalIP"),
            info.get("osImage") or UNKNOWN, kernel,
            info.get("containerRuntimeVersion") or UNKNOWN]


def _event_cells(event: Obj, now: datetime) -> list[Any]:
    first = since(event.get("firstTimestamp"), now) if event.get("firstTimestamp") \
        else since(event.get("eventTime"), now)
    last = since(event.get("lastTimestamp"), now) if event.get("lastTimestamp") else first
    count = int(event.get("count") or 0)
    series = event.get("series")
    if isinstance(series, dict):
        last = since(series.get("lastObservedTime"), now)
        count = int(series.get("count") or 0)
    elif count == 0:
        count = 1  # a singleton event of the events.k8s.io API has no count
    involved = event.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    instance = source.get("host") or event.get("reportingInstance") or ""
    return [last, event.get("type", ""), event.get("reason", ""), target,
            involved.get("fieldPath", ""), f"{component}, {instance}" if instance else component,
            str(event.get("message") or "").strip(), first, count, meta(event).get("name")]


def _namespace_cells(namespace: Obj, now: datetime) -> list[Any]:
    return [meta(namespace).get("name"), _status(namespace).get("phase") or "Active",
            since(meta(namespace).get("creationTimestamp"), now)]


#: plural -> (column definitions, printer): kube-apiserver's, as ``-o wide`` asks for.
TABLES: dict[str, tuple[Sequence[Obj], Printer]] = {
    "pods": ([
        _NAME,
        _column("Ready", "The aggregate readiness state of this pod for accepting traffic."),
        _column("Status", "The aggregate status of the containers in this pod."),
        _column("Restarts", "The number of times the containers in this pod have been "
                "restarted and when the last container in this pod has restarted."),
        _AGE,
        _column("IP", "podIP address allocated to the pod.", 1),
        _column("Node", "NodeName indicates in which node this pod is scheduled.", 1),
        _column("Nominated Node", "nominatedNodeName is set only when this pod preempts "
                "other pods on the node.", 1),
        _column("Readiness Gates", "If specified, all readiness gates will be evaluated for "
                "pod readiness.", 1),
    ], _pod_cells),
    "nodes": ([
        _NAME,
        _column("Status", "The status of the node"),
        _column("Roles", "The roles of the node"),
        _AGE,
        _column("Version", "Kubelet Version reported by the node."),
        _column("Internal-IP", "List of addresses reachable to the node.", 1),
        _column("External-IP", "List of addresses reachable to the node.", 1),
        _column("OS-Image", "OS Image reported by the node from /etc/os-release.", 1),
        _column("Kernel-Version", "Kernel Version reported by the node from 'uname -r'.", 1),
        _column("Container-Runtime", "ContainerRuntime Version reported by the node through "
                "runtime remote API.", 1),
    ], _node_cells),
    "events": ([
        _column("Last Seen", "The time at which the most recent occurrence of this event "
                "was recorded."),
        _column("Type", "Type of this event (Normal, Warning), new types could be added in "
                "the future"),
        _column("Reason", "This should be a short, machine understandable string that gives "
                "the reason for the transition into the object's current status."),
        _column("Object", "The object that this event is about."),
        _column("Subobject", "If referring to a piece of an object instead of an entire "
                "object, this string should contain a valid JSON/Go field access statement.",
                1),
        _column("Source", "The component reporting this event.", 1),
        _column("Message", "A human-readable description of the status of this operation."),
        _column("First Seen", "The time at which the event was first recorded.", 1),
        _column("Count", "The number of times this event has occurred.", 1),
        {**_NAME, "priority": 1},
    ], _event_cells),
    "namespaces": ([_NAME, _column("Status", "The status of the namespace"), _AGE],
                   _namespace_cells),
}

_ROW_CONDITIONS = {
    "Succeeded": {"type": "Completed", "status": "True", "reason": "Succeeded",
                  "message": "The pod has completed successfully."},
    "Failed": {"type": "Completed", "status": "True", "reason": "Failed",
               "message": "The pod failed."},
}


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": meta(obj)}


def table(resource: Resource, items: list[Obj], *, version: str, list_metadata: Obj,
          include: str | None, now: datetime) -> Obj | None:
    """The ``Table`` of ``items`` of ``resource``, or ``None`` when it has no table here.

    ``include``: the ``includeObject`` query parameter (``Metadata`` when unset)."""
    plural = resource.plural
    columns: Sequence[Obj]
    printer: Printer
    if resource.custom:
        columns = custom.column_definitions(resource)

        def printer(obj: Obj, now: datetime) -> list[Any]:
            return custom.cells(resource, obj, lambda stamp: since(stamp, now))
    elif plural in TABLES:
        columns, printer = TABLES[plural]
    else:
        return None
    rows: list[Obj] = []
    for obj in items:
        row: Obj = {"cells": printer(obj, now),
                    "object": _row_object(obj, include or "Metadata")}
        condition = _ROW_CONDITIONS.get(_status(obj).get("phase", "")) \
            if plural == "pods" else None
        if condition is not None:
            row["conditions"] = [condition]
        rows.append(row)
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}",
            "metadata": list_metadata, "columnDefinitions": [dict(c) for c in columns],
            "rows": rows}


def watch_rows(resource: Resource, version: str, include: str | None,
               clock: Callable[[], datetime]) -> Callable[[Obj], Obj] | None:
    """For a watch whose ``Accept`` asks for a table (``kubectl get -w``): each event's
    object as a one-row ``Table``, the column definitions on the first only (as the real
    server's watch encoder sends them); bookmarks and errors as they are. ``None``: the
    resource has no table here."""
    if not resource.custom and resource.plural not in TABLES:
        return None
    first = True

    def transform(event: Obj) -> Obj:
        nonlocal first
        obj = event.get("object")
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj,
                                                                                         dict):
            return event
        rows = table(resource, [obj], version=version, include=include, now=clock(),
                     list_metadata={"resourceVersion": str(meta(obj).get("resourceVersion"))})
        assert rows is not None
        if not first:
            rows["columnDefinitions"] = None
        first = False
        return {"type": event["type"], "object": rows}
    return transform
