"""A checkpoint as asked for: the running pod ``workload`` (``namespace/name``) captured
with the class ``class``, the workload left stopped when ``quiesce``. The pod is read by
GET: its UID pins the operation to it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, pod_key
from controlplane.machines.base.checks import check_pod
from controlplane.machines.base.requests import (
    Built,
    Fields,
    Found,
    Lookups,
    Reads,
    Seen,
    pod_ref_of,
    spec_pod,
    workload_on_pod,
)
from controlplane.machines.base.specs import PodRef

CLASS_HINT = "say where checkpoints go: --repository or --class"


@dataclass(frozen=True)
class CheckpointRequest:
    namespace: str
    name: str
    klass: JsonObject
    quiesce: bool
    fields: Fields

    def lookups(self) -> Lookups:
        return Lookups()

    def reads(self, found: Found) -> Reads:
        return Reads(pods=frozenset({pod_key(self.namespace, self.name)}))

    def build(self, seen: Seen) -> Built:
        pod = seen.pod(self.namespace, self.name, self.fields)
        return Built({"pod": pod_ref_of(pod), "class": self.klass, "quiesce": self.quiesce})


class CheckpointRequests:
    """The ``checkpoint`` kind's requests (``Kind.request``)."""

    def of(self, fields: Fields) -> CheckpointRequest:
        ns, name = fields.workload()
        klass = fields.object("class", required=CLASS_HINT)
        assert klass is not None
        request = CheckpointRequest(ns, name, klass, fields.flag("quiesce"), fields)
        fields.done()
        return request

    def interests(self, spec: JsonObject) -> Interests:
        ns, name, _ = spec_pod(spec)
        return Interests(pods=frozenset({pod_key(ns, name)}))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        check_pod(observation, PodRef(*spec_pod(spec)))

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        return workload_on_pod(spec, observation)

