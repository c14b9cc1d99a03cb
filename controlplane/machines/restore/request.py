"""A restore as asked for: the artifact of checkpoint (or suspend) operation
``checkpoint`` restored on ``node`` as the pod ``name`` (by default
``<pod>-restored-<id>``). A suspend kept the pod's spec; a checkpoint did not, so its pod
is read for one, and a checkpoint whose pod is gone cannot be restored. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import Interests, Observation, pod_key
from controlplane.machines.base import requests as rq
from controlplane.machines.base.checks import check_destination


@dataclass(frozen=True)
class RestoreRequest:
    checkpoint: str
    node: str
    name: str | None
    fields: rq.Fields

    def lookups(self) -> rq.Lookups:
        return rq.Lookups(checkpoint=self.checkpoint)

    def reads(self, found: rq.Found) -> rq.Reads:
        c = _found(found)
        return rq.Reads() if c.template is not None else rq.Reads(
            pods=frozenset({pod_key(c.namespace, c.name)}))

    def build(self, seen: rq.Seen) -> rq.Built:
        c = _found(seen.found)
        template = c.template
        if template is None:  # a checkpoint keeps no template: its pod's
            pod = seen.pods.get(pod_key(c.namespace, c.name))
            if pod is None:
                raise self.fields.reject(
                    "checkpoint", f"the pod {c.namespace}/{c.name} that checkpoint "
                                  f"{c.operation_id} captured is gone and the checkpoint "
                                  "kept no pod spec",
                    hint="restore from a suspend operation instead")
            template = rq.template_of(pod)
        return rq.Built({"artifact": c.artifact, "namespace": c.namespace,
                         "name": self.name or f"{c.name}-restored-{c.operation_id[:8]}",
                         "node": self.node, "template": template,
                         "checkpoint_id": c.checkpoint_id, "source_uid": c.source_uid,
                         "class": c.klass},
                        {"artifacts_read": [c.artifact]})


def _found(found: rq.Found) -> rq.Checkpoint:
    assert found.checkpoint is not None, "the use case resolves the checkpoint first"
    return found.checkpoint


class RestoreRequests:
    """The ``restore`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> RestoreRequest:
        checkpoint = fields.required("checkpoint", "name the checkpoint: cpctl checkpoints "
                                                   "lists them")
        node = fields.required("node", "name the node to restore on")
        request = RestoreRequest(checkpoint, node, fields.text("name"), fields)
        fields.done()
        return request

    def interests(self, spec: JsonObject) -> Interests:
        return Interests(nodes=frozenset({str(spec["node"])}))

    def check(self, spec: JsonObject, observation: Observation) -> None:
        check_destination(observation, str(spec["node"]), field="spec.node", current=None,
                          klass=spec.get("class"))

    def workload(self, spec: JsonObject, observation: Observation) -> tuple[str, str | None]:
        return pod_key(str(spec["namespace"]), str(spec["name"])), None
