"""A migration as asked for: the running pod ``workload`` (``namespace/name``) moved to
``targetNode`` with the class ``class``; the restored pod named ``name`` (by default the
source's own, once the source is gone); ``keepCheckpoint`` keeps its checkpoint in the
registry after the verified restore, whatever the class's retention; ``mode`` says how
memory moves (:mod:`controlplane.machines.config.modes`; default: the class's). A pod whose
controller (ReplicaSet, StatefulSet) names the restored pod moves as its successor and
takes no ``name``. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation
from controlplane.machines.base import requests as rq
from controlplane.machines.base.checks import (
    SubmissionRejected,
    check_destination,
    check_pod,
    check_same_path,
)
from controlplane.machines.base.specs import PodRef
from controlplane.machines.config.classes import parse_class
from controlplane.machines.config.modes import mode_refusal, parse_mode
from controlplane.machines.owners import BARE, controller_of, how_moved


@dataclass(frozen=True)
class MigrationRequest(rq.OnPod):
    target_node: str
    restore_name: str | None
    keep_checkpoint: bool
    mode: str | None = None

    def build(self, seen: rq.Seen) -> rq.Built:
        pod = self.pod(seen)
        rq.refuse_unmovable(pod, self.klass, verb="migration", fields=self.fields)
        pod_spec = pod.get("spec")
        spec: JsonObject = {
            "pod": rq.pod_ref_of(pod),
            "source_node": pod_spec.get("nodeName") if isinstance(pod_spec, dict) else None,
            "target_node": self.target_node, "template": rq.template_of(pod),
            "class": self.klass, "restore_name": self.restore_name or self.name}
        movable = parse_class(self.klass, field="class").movable_owners
        how = how_moved(pod, verb="migration", movable=movable)
        if self.keep_checkpoint:
            spec["keep_checkpoint"] = True
        if self.mode is not None:
            try:
                spec["mode"] = parse_mode(self.mode, field="mode").value
            except InvalidSpec as exc:
                raise self.fields.reject("mode", str(exc).removeprefix("mode "),
                                         hint="leave it out for the class's mode") from exc
        if how == BARE:
            spec["keep_name"] = True
        else:
            if self.restore_name not in (None, self.name):
                raise self.fields.reject(
                    "name", f"{self.restore_name!r}: pod {self.namespace}/{self.name} "
                            f"belongs to {controller_of(pod)}, which names the restored pod",
                    hint="leave it out; cpctl get prints the restored pod's name")
            spec["successor"] = how  # its controller (ReplicaSet, StatefulSet) names it
        return rq.Built(spec)


class MigrationRequests(rq.OnPodRequests):
    """The ``migration`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> MigrationRequest:
        ns, name, klass = rq.OnPod.named(fields)
        request = MigrationRequest(
            ns, name, klass, fields,
            target_node=fields.required("targetNode", "name the node to move the pod to"),
            restore_name=fields.text("name"), keep_checkpoint=fields.flag("keepCheckpoint"),
            mode=fields.text("mode"))
        fields.done()
        return request

    def interests(self, spec: JsonObject) -> Interests:
        nodes = {str(spec["target_node"])}
        if isinstance(spec.get("source_node"), str):
            nodes.add(str(spec["source_node"]))  # a rollback restores there
        return Interests(pods=super().interests(spec).pods, nodes=frozenset(nodes))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        current = check_pod(observation, PodRef(*rq.spec_pod(spec))).node
        target = str(spec["target_node"])
        path = check_destination(observation, target, field="spec.target_node",
                                 current=current, klass=spec.get("class"))
        klass = parse_class(spec.get("class"))
        check_same_path(observation, current, path, target, klass.runtime_paths())
        mode = parse_mode(spec["mode"], field="spec.mode") if "mode" in spec \
            else klass.migration_mode
        refusal = mode_refusal(mode, path, node=target, sealed=klass.encryption is not None)
        if refusal is not None:
            raise SubmissionRejected(f"spec.mode: {refusal}")
        if spec.get("source_node") != current:
            raise SubmissionRejected(
                f"spec.source_node {spec.get('source_node')!r} is not where the pod runs "
                f"({current!r}); resubmit with source_node {current!r}")

