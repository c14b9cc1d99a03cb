"""A suspension as asked for: the running pod ``workload`` (``namespace/name``) captured
with the class ``class`` and deleted; its spec is kept as the template a resume restores.
A pod whose owner would replace it behind our back is refused. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.machines.base import requests as rq


@dataclass(frozen=True)
class SuspendRequest(rq.OnPod):
    def build(self, seen: rq.Seen) -> rq.Built:
        pod = self.pod(seen)
        rq.refuse_unmovable(pod, self.klass, verb="suspend", fields=self.fields)
        return rq.Built({"pod": rq.pod_ref_of(pod), "template": rq.template_of(pod),
                         "class": self.klass})


class SuspendRequests(rq.OnPodRequests):
    """The ``suspend`` kind's requests (``Kind.request``)."""

    def of(self, fields: rq.Fields) -> SuspendRequest:
        request = SuspendRequest(*rq.OnPod.named(fields), fields)
        fields.done()
        return request
