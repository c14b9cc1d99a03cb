"""A resume as asked for: the workload ``workload`` (``namespace/name``) back from its
newest suspension, on ``node`` (or where the scheduler puts it). Its checkpoint is where
the suspension put it: the suspension's class unless ``class`` says otherwise. It reads
only the store to build its spec. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, pod_key
from controlplane.machines.base import requests as rq
from controlplane.machines.base.checks import check_destination


@dataclass(frozen=True)
class ResumeRequest:
    namespace: str
    name: str
    node: str | None
    klass: JsonObject | None
    fields: rq.Fields

    def lookups(self) -> rq.Lookups:
        return rq.Lookups(suspension_of=(self.namespace, self.name))

    def reads(self, found: rq.Found) -> rq.Reads:
        return rq.Reads()

    def build(self, seen: rq.Seen) -> rq.Built:
        latest = seen.found.checkpoint
        assert latest is not None, "the use case resolves the suspension first"
        klass = self.klass if self.klass is not None else latest.klass
        if klass is None:
            raise self.fields.reject(
                "class", f"the suspension of {self.namespace}/{self.name} "
                         f"({latest.operation_id}) recorded no checkpoint class",
                hint="say where its checkpoint is: --repository or --class")
        return rq.Built({"namespace": self.namespace, "name": self.name, "node": self.node,
                         "template": latest.template, "class": klass,
                         "candidates": [latest.candidate()]},
                        {"checkpoint": latest.operation_id})


class ResumeRequests:
    """The ``resume`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> ResumeRequest:
        ns, name = fields.workload()
        request = ResumeRequest(ns, name, fields.text("node"), fields.object("class"), fields)
        fields.done()
        return request

    def interests(self, spec: JsonObject) -> Interests:
        node = spec.get("node")
        return Interests(nodes=frozenset({node} if isinstance(node, str) else ()))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        node = spec.get("node")
        if isinstance(node, str):
            check_destination(observation, node, field="spec.node", current=None,
                              klass=spec.get("class"))

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        return pod_key(str(spec["namespace"]), str(spec["name"])), None
