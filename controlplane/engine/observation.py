"""What a worker saw just before deciding: pods, registry tags and nodes that matter.

A machine states its :class:`Interests` (a pure function of its state); the worker's
observer port (implemented by drivers) answers with an :class:`Observation`. A probe that
failed is a :class:`ProbeError`, never "absent": safety gate 3 depends on telling the two
apart. Observations serialise to JSON so that replay can re-run ``decide`` on exactly
what the worker saw (``to_json`` / ``from_json`` round-trip, pinned by tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from controlplane.engine.jsonvalue import JsonObject, JsonValue


def pod_key(namespace: str, name: str) -> str:
    """The key of a pod in :class:`Interests` and :class:`Observation`: ``namespace/name``."""
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class ProbeError:
    """A probe failed: the truth is unknown. Never treat it as "absent"."""

    error_class: str
    message: str
    retryable: bool = True

    def to_json(self) -> JsonObject:
        return {"error": {"class": self.error_class, "message": self.message,
                          "retryable": self.retryable}}


@dataclass(frozen=True)
class PodView:
    """The facts of one pod that machines decide on (a subset of the Kubernetes object)."""

    namespace: str
    name: str
    uid: str
    node: str | None
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool = False
    deleting: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    #: ``Kind/name`` of the pod's controller (the ``ownerReferences`` entry with
    #: ``controller: true``); empty for a bare pod.
    controller: str = ""
    #: The names in ``spec.schedulingGates``: the scheduler leaves the pod alone while any
    #: is there.
    gates: tuple[str, ...] = ()

    def to_json(self) -> JsonObject:
        pod: JsonObject = {
            "namespace": self.namespace, "name": self.name, "uid": self.uid,
            "node": self.node, "phase": self.phase, "ready": self.ready,
            "deleting": self.deleting, "annotations": dict(self.annotations),
            "labels": dict(self.labels), "resource_version": self.resource_version,
        }
        if self.controller:  # only when set: older recorded inputs read the same
            pod["controller"] = self.controller
        if self.gates:
            pod["gates"] = list(self.gates)
        return {"pod": pod}


@dataclass(frozen=True)
class TagView:
    """A registry tag resolved to a manifest digest, with the manifest's annotations."""

    ref: str
    digest: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: The manifest's signature as the observer checked it: ``""`` not checked (no trusted
    #: key configured), ``"verified"``, or ``"refused: <why>"`` (docs/security.md).
    signature: str = ""

    def to_json(self) -> JsonObject:
        out: JsonObject = {"ref": self.ref, "digest": self.digest,
                           "annotations": dict(self.annotations)}
        if self.signature:
            out["signature"] = self.signature
        return {"tag": out}


@dataclass(frozen=True)
class NodeView:
    """The facts of one node: is it there, ready, schedulable, which runtime it runs."""

    name: str
    ready: bool
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: str = ""  # status.nodeInfo.containerRuntimeVersion, e.g. "cri-o://1.36.3"

    def to_json(self) -> JsonObject:
        node: JsonObject = {"name": self.name, "ready": self.ready,
                            "unschedulable": self.unschedulable, "labels": dict(self.labels)}
        if self.runtime:
            node["runtime"] = self.runtime
        return {"node": node}


@dataclass(frozen=True)
class MachineView:
    """Another machine as the store has it (a drain observes its child migrations)."""

    id: str
    kind: str
    phase: str
    terminal: bool
    reason: str = ""  # why it ended, when the state says (``failure.reason``)

    def to_json(self) -> JsonObject:
        return {"machine": {"id": self.id, "kind": self.kind, "phase": self.phase,
                            "terminal": self.terminal, "reason": self.reason}}


PodFact: TypeAlias = PodView | ProbeError | None
TagFact: TypeAlias = TagView | ProbeError | None
NodeFact: TypeAlias = NodeView | ProbeError | None
MachineFact: TypeAlias = MachineView | ProbeError | None


@dataclass(frozen=True)
class Interests:
    """What a machine needs observed before its next decision.

    ``pods`` are ``namespace/name`` keys (see :func:`pod_key`); a machine compares UIDs
    itself, so a pod recreated under the same name is never mistaken for the source.
    """

    pods: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()
    #: Machine ids, answered from the store (not the cluster): a drain's children.
    machines: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.pods or self.tags or self.nodes or self.machines)


@dataclass(frozen=True)
class Observation:
    """The answers to :class:`Interests`; a key missing from a mapping was not asked."""

    pods: Mapping[str, PodFact] = field(default_factory=dict)
    tags: Mapping[str, TagFact] = field(default_factory=dict)
    nodes: Mapping[str, NodeFact] = field(default_factory=dict)
    machines: Mapping[str, MachineFact] = field(default_factory=dict)

    def failed_probes(self) -> list[str]:
        """The keys whose probe failed, sorted: what this observation could not see."""
        return sorted(key for facts in (self.pods, self.tags, self.nodes, self.machines)
                      for key, fact in facts.items() if isinstance(fact, ProbeError))

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "pods": {k: _fact_json(v) for k, v in sorted(self.pods.items())},
            "tags": {k: _fact_json(v) for k, v in sorted(self.tags.items())},
            "nodes": {k: _fact_json(v) for k, v in sorted(self.nodes.items())},
        }
        if self.machines:  # only drains ask; older recorded observations stay byte-identical
            out["machines"] = {k: _fact_json(v) for k, v in sorted(self.machines.items())}
        return out

    @staticmethod
    def from_json(data: JsonObject) -> Observation:
        return Observation(
            pods={k: _pod_fact(v) for k, v in _object(data.get("pods")).items()},
            tags={k: _tag_fact(v) for k, v in _object(data.get("tags")).items()},
            nodes={k: _node_fact(v) for k, v in _object(data.get("nodes")).items()},
            machines={k: _machine_fact(v) for k, v in _object(data.get("machines")).items()},
        )


EMPTY_OBSERVATION = Observation()


def _fact_json(fact: PodView | TagView | NodeView | MachineView | ProbeError | None,
               ) -> JsonValue:
    return None if fact is None else fact.to_json()


def _object(value: JsonValue) -> dict[str, JsonValue]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _str_map(value: JsonValue) -> dict[str, str]:
    return {k: str(v) for k, v in _object(value).items()}


def _probe_error(body: JsonValue) -> ProbeError:
    err = _object(body)
    return ProbeError(str(err["class"]), str(err["message"]), bool(err.get("retryable", True)))


def _pod_fact(value: JsonValue) -> PodFact:
    if value is None:
        return None
    obj = _object(value)
    if "error" in obj:
        return _probe_error(obj["error"])
    p = _object(obj["pod"])
    node = p.get("node")
    return PodView(
        namespace=str(p["namespace"]), name=str(p["name"]), uid=str(p["uid"]),
        node=None if node is None else str(node), phase=str(p["phase"]),
        ready=bool(p.get("ready", False)), deleting=bool(p.get("deleting", False)),
        annotations=_str_map(p.get("annotations")), labels=_str_map(p.get("labels")),
        resource_version=str(p.get("resource_version", "")),
        controller=str(p.get("controller", "")),
        gates=tuple(str(g) for g in _list(p.get("gates"))),
    )


def _tag_fact(value: JsonValue) -> TagFact:
    if value is None:
        return None
    obj = _object(value)
    if "error" in obj:
        return _probe_error(obj["error"])
    t = _object(obj["tag"])
    return TagView(ref=str(t["ref"]), digest=str(t["digest"]),
                   annotations=_str_map(t.get("annotations")),
                   signature=str(t.get("signature") or ""))


def _node_fact(value: JsonValue) -> NodeFact:
    if value is None:
        return None
    obj = _object(value)
    if "error" in obj:
        return _probe_error(obj["error"])
    n = _object(obj["node"])
    return NodeView(name=str(n["name"]), ready=bool(n["ready"]),
                    unschedulable=bool(n.get("unschedulable", False)),
                    labels=_str_map(n.get("labels")), runtime=str(n.get("runtime") or ""))


def _machine_fact(value: JsonValue) -> MachineFact:
    if value is None:
        return None
    obj = _object(value)
    if "error" in obj:
        return _probe_error(obj["error"])
    m = _object(obj["machine"])
    return MachineView(id=str(m["id"]), kind=str(m["kind"]), phase=str(m["phase"]),
                       terminal=bool(m["terminal"]), reason=str(m.get("reason", "")))
