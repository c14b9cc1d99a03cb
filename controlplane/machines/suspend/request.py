"""A suspension as asked for: the running pod ``workload`` (``namespace/name``) captured
with the class ``class`` and deleted; its spec is kept as the template a resume restores.
A pod whose owner would replace it behind our back is refused. Pure."""

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
    refuse_unmovable,
    spec_pod,
    template_of,
    workload_on_pod,
)
from controlplane.machines.base.specs import PodRef
from controlplane.machines.checkpoint.request import CLASS_HINT


@dataclass(frozen=True)
class SuspendRequest:
    namespace: str
    name: str
    klass: JsonObject
    fields: Fields

    def lookups(self) -> Lookups:
        return Lookups()

    def reads(self, found: Found) -> Reads:
        return Reads(pods=frozenset({pod_key(self.namespace, self.name)}))

    def build(self, seen: Seen) -> Built:
        pod = seen.pod(self.namespace, self.name, self.fields)
        refuse_unmovable(pod, self.klass, verb="suspend", fields=self.fields)
        return Built({"pod": pod_ref_of(pod), "template": template_of(pod),
                      "class": self.klass})


class SuspendRequests:
    """The ``suspend`` kind's requests (``Kind.request``)."""

    def of(self, fields: Fields) -> SuspendRequest:
        ns, name = fields.workload()
        klass = fields.object("class", required=CLASS_HINT)
        assert klass is not None
        fields.done()
        return SuspendRequest(ns, name, klass, fields)

    def interests(self, spec: JsonObject) -> Interests:
        ns, name, _ = spec_pod(spec)
        return Interests(pods=frozenset({pod_key(ns, name)}))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        check_pod(observation, PodRef(*spec_pod(spec)))

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        return workload_on_pod(spec, observation)
