"""How an operation is asked for: the fields a door read, what a request needs to see, and
what it becomes. Every kind's ``request.py`` builds on these; the use case
(``app.requests``) drives them. Pure.

A door (the CLI's flags, the HTTP API's JSON body, a custom resource's spec) only turns
its syntax into :class:`Fields`: plain values under the request's field names (the HTTP
API's, e.g. ``targetNode``), with how that door spells each one (``--to``,
``spec.targetNodeName``), so a bad value is refused naming the field the operator typed.

A kind's request then says, in order:

1. what it names in the store (:class:`Lookups`: a checkpoint operation, the newest
   suspension of a workload), resolved by the use case into :class:`Found`;
2. which pods it reads by GET, or whether it plans over the whole cluster (:class:`Reads`);
3. the spec it asks for, from what was read (:class:`Seen`), with the facts a dry run
   shows (:class:`Built`).

Beside the request, per kind and on the spec alone (a parent machine submits specs it
built itself, through the same checks): what a submission observes (``interests``), its
checks on that observation (``check``), and the workload and node it acts on
(``workload``): :class:`RequestKind`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, PodView, pod_key
from controlplane.machines.base.checks import SubmissionRejected, SubmissionUnverifiable, check_pod
from controlplane.machines.base.specs import PodRef
from controlplane.machines.config.classes import parse_class
from controlplane.machines.owners import why_not_movable

T = TypeVar("T")

__all__ = ["SubmissionRejected", "SubmissionUnverifiable"]


class Fields:
    """The plain values a door read, by field name, and how that door spells each name.

    Each getter refuses a bad value with :class:`SubmissionRejected` naming the field as
    the door spells it; :meth:`done` refuses a value no getter asked for (a typo is
    named, never ignored)."""

    def __init__(self, values: Mapping[str, object],
                 spelled: Mapping[str, str] | None = None) -> None:
        self._values = {k: v for k, v in values.items() if v is not None}
        self._spelled = dict(spelled or {})
        self._read: set[str] = set()

    def name(self, key: str) -> str:
        """``key`` as the door spells it (``--to``, ``spec.targetNodeName``)."""
        return self._spelled.get(key, key)

    def reject(self, key: str, message: str, hint: str | None = None) -> SubmissionRejected:
        return SubmissionRejected(f"{self.name(key)}: {message}", field=self.name(key),
                                  hint=hint)

    def _get(self, key: str) -> object:
        self._read.add(key)
        return self._values.get(key)

    def _given(self, key: str, required: str | None) -> object:
        """The value, or ``None`` when absent (``required``: the hint when it must be set)."""
        value = self._get(key)
        if (value is None or value == "") and required is not None:
            raise self.reject(key, "is required", hint=required)
        return None if value == "" else value

    def text(self, key: str, *, required: str | None = None) -> str | None:
        """A string, or ``None`` when absent (``required``: the hint when it must be set)."""
        return self._typed(key, required, str, "a string")

    def _typed(self, key: str, required: str | None, kind: type[T], what: str) -> T | None:
        value = self._given(key, required)
        if value is not None and not isinstance(value, kind):
            shown = repr(value) if kind is str else type(value).__name__
            raise self.reject(key, f"must be {what}, got {shown}")
        return value

    def required(self, key: str, hint: str) -> str:
        value = self.text(key, required=hint)
        assert value is not None
        return value

    def workload(self, key: str = "workload") -> tuple[str, str]:
        """``namespace/name``, split."""
        text = self.required(key, "name the pod as NAMESPACE/NAME, e.g. default/web")
        ns, sep, name = text.partition("/")
        if not sep or not ns or not name or "/" in name:
            raise self.reject(key, f"{text!r} is not NAMESPACE/POD", hint="e.g. default/web")
        return ns, name

    def flag(self, key: str) -> bool:
        value = self._get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.reject(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, key: str, *, default: int, low: int, high: int) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.reject(key, f"must be an integer from {low} to {high}, got {value!r}")
        return value

    def names(self, key: str) -> tuple[str, ...]:
        """A list of strings (empty when absent)."""
        value = self._get(key)
        if value is None:
            return ()
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.reject(key, f"must be a list of names, got {value!r}")
        return tuple(value)

    def object(self, key: str, *, required: str | None = None) -> JsonObject | None:
        """An object (a class's definition), or ``None`` when absent."""
        return self._typed(key, required, dict, "an object")

    def done(self) -> None:
        """Refuse a field no getter read: it means nothing to this request."""
        extra = sorted(set(self._values) - self._read)
        if extra:
            raise self.reject(extra[0], "is not a field of this request",
                              hint="known: " + ", ".join(sorted(self.name(k)
                                                                for k in self._read)))


@dataclass(frozen=True)
class Checkpoint:
    """A verified capture, as a restore or a resume needs it (found in the store)."""

    operation_id: str
    kind: str
    phase: str
    namespace: str
    name: str
    source_uid: str
    artifact: str  # pinned by digest: registry/repo@sha256:...
    verified_at: datetime
    template: JsonObject | None  # a suspend keeps the pod's spec; a checkpoint does not
    klass: JsonObject | None

    @property
    def checkpoint_id(self) -> str:
        return self.operation_id

    def candidate(self) -> JsonObject:
        """This checkpoint as a resume candidate."""
        return {"artifact": self.artifact, "checkpoint_id": self.checkpoint_id,
                "source_uid": self.source_uid}


@dataclass(frozen=True)
class Lookups:
    """What a request names in the store: a checkpoint (or suspend) operation by id, or
    the newest suspension of a workload (``namespace/name``)."""

    checkpoint: str | None = None
    suspension_of: tuple[str, str] | None = None


@dataclass(frozen=True)
class Found:
    """The :class:`Lookups`, resolved (the use case refuses what it cannot find)."""

    checkpoint: Checkpoint | None = None


@dataclass(frozen=True)
class Reads:
    """What a request reads of the cluster to build its spec: pods by GET (``ns/name``),
    or every node and pod listed (a drain's plan)."""

    pods: frozenset[str] = frozenset()
    cluster: bool = False


@dataclass(frozen=True)
class Seen:
    """What was read for a request: the found store records, each pod it named (``None``:
    not there), and the listed cluster (empty unless ``Reads.cluster``)."""

    found: Found = Found()
    pods: Mapping[str, JsonObject | None] = field(default_factory=dict)
    nodes: Sequence[JsonObject] = ()
    all_pods: Sequence[JsonObject] = ()

    def pod(self, namespace: str, name: str, fields: Fields, key: str = "workload"
            ) -> JsonObject:
        """The pod the request names, or a rejection saying it is not there."""
        pod = self.pods.get(pod_key(namespace, name))
        if pod is None:
            raise fields.reject(key, f"pod {namespace}/{name} not found",
                                hint=f"check it with kubectl get pod -n {namespace} {name}")
        return pod


@dataclass(frozen=True)
class Built:
    """A request's spec, and what its dry run shows beyond the generic plan."""

    spec: JsonObject
    shown: JsonObject = field(default_factory=dict)


#: What a request that captures says when it names no class.
CLASS_HINT = "say where checkpoints go: --repository or --class"


@dataclass(frozen=True)
class OnPod:
    """A request on a running pod (a checkpoint, suspension or migration): the workload it
    names, read by GET, and the class it captures with."""

    namespace: str
    name: str
    klass: JsonObject
    fields: Fields

    @staticmethod
    def named(fields: Fields) -> tuple[str, str, JsonObject]:
        """``workload`` and ``class``, as every request on a pod takes them."""
        ns, name = fields.workload()
        klass = fields.object("class", required=CLASS_HINT)
        assert klass is not None
        return ns, name, klass

    def lookups(self) -> Lookups:
        return Lookups()

    def reads(self, found: Found) -> Reads:
        return Reads(pods=frozenset({pod_key(self.namespace, self.name)}))

    def pod(self, seen: Seen) -> JsonObject:
        return seen.pod(self.namespace, self.name, self.fields)


class OnPodRequests:
    """What a spec on a running pod (``spec.pod``) is checked on: the pod, there with its
    UID and Running; its workload is the pod, on the node it was seen on."""

    def interests(self, spec: JsonObject) -> Interests:
        ns, name, _ = spec_pod(spec)
        return Interests(pods=frozenset({pod_key(ns, name)}))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        check_pod(observation, PodRef(*spec_pod(spec)))

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        return workload_on_pod(spec, observation)


class Request(Protocol):
    """One kind's typed request (its ``request.py``)."""

    def lookups(self) -> Lookups: ...

    def reads(self, found: Found) -> Reads: ...

    def build(self, seen: Seen) -> Built: ...


class RequestKind(Protocol):
    """A kind's requests: parsing one from fields, and the checks a spec of it passes."""

    def of(self, fields: Fields) -> Request:
        """The typed request; a bad or unknown field is refused, named as spelled."""
        ...

    def interests(self, spec: JsonObject) -> Interests:
        """What to observe before :meth:`check` (pods, nodes)."""
        ...

    def check(self, spec: JsonObject, observation: Observation) -> None:
        """Raise ``SubmissionRejected`` / ``SubmissionUnverifiable`` (``spec`` normalised)."""
        ...

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        """The workload it acts on (one live operation each) and its source node."""
        ...


def template_of(pod: Mapping[str, Any]) -> JsonObject:
    """The pod to restore from: its labels and spec, minus its node binding."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {"metadata": {"labels": dict(meta.get("labels") or {})}, "spec": spec}


def pod_ref_of(pod: Mapping[str, Any]) -> JsonObject:
    """``{namespace, name, uid}`` of a pod as the API server has it."""
    meta = pod["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


def spec_pod(spec: JsonObject) -> tuple[str, str, str]:
    """``(namespace, name, uid)`` of the pod a normalised spec names under ``pod``."""
    pod = spec["pod"]
    assert isinstance(pod, dict)
    return str(pod["namespace"]), str(pod["name"]), str(pod["uid"])


def workload_on_pod(spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
    """The workload of an operation on a running pod (``spec.pod``), and the node the pod
    was seen on."""
    ns, name, _ = spec_pod(spec)
    seen = observation.pods.get(pod_key(ns, name))
    return pod_key(ns, name), seen.node if isinstance(seen, PodView) else None


def refuse_unmovable(pod: Mapping[str, Any], klass: JsonObject, *, verb: str,
                     fields: Fields) -> None:
    """Refuse a pod its owner would replace behind our back (``machines.owners``)."""
    movable = parse_class(klass, field="class").movable_owners
    refusal = why_not_movable(pod, verb=verb, movable=movable)
    if refusal is not None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        raise fields.reject("workload", f"pod {key} cannot be moved: {refusal}",
                            hint=f"cpctl checkpoint {key} captures it without deleting it")
