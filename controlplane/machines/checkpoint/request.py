"""A checkpoint as asked for: the running pod ``workload`` (``namespace/name``) captured
with the class ``class``, the workload left stopped when ``quiesce``. The pod is read by
GET: its UID pins the operation to it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.machines.base import requests as rq


@dataclass(frozen=True)
class CheckpointRequest(rq.OnPod):
    quiesce: bool

    def build(self, seen: rq.Seen) -> rq.Built:
        return rq.Built({"pod": rq.pod_ref_of(self.pod(seen)), "class": self.klass,
                         "quiesce": self.quiesce})


class CheckpointRequests(rq.OnPodRequests):
    """The ``checkpoint`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> CheckpointRequest:
        ns, name, klass = rq.OnPod.named(fields)
        request = CheckpointRequest(ns, name, klass, fields, quiesce=fields.flag("quiesce"))
        fields.done()
        return request
