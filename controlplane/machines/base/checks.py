"""The checks a submission passes against the cluster as observed: the pod exists with
the given UID and is Running; a target node exists, is Ready, is not cordoned and is not
the pod's current node; the nodes a restore may run on report a runtime that can restore
(containerd cannot), and a migration's source and target restore the same way
(``config.runtimes``). Each kind's ``request.py`` composes them. A wrong request raises
:class:`SubmissionRejected` naming the field and the fix; a failed probe
:class:`SubmissionUnverifiable` (retry: an error is not an answer). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonValue
from controlplane.engine.observation import NodeView, Observation, PodView, ProbeError
from controlplane.machines.base.specs import PodRef
from controlplane.machines.config.classes import parse_class
from controlplane.machines.config.runtimes import RestorePath, paths_agree, restore_path


class SubmissionRejected(InvalidSpec):
    """The request is wrong; the message names the field and the fix."""

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None
                 ) -> None:
        super().__init__(message)
        self.field = field
        self.hint = hint


class SubmissionUnverifiable(Exception):
    """A probe needed to validate the request failed; retry (it is not a rejection)."""


def check_restore_path(node: NodeView, *, field: str,
                       overrides: Mapping[str, str] | None = None) -> RestorePath:
    """How ``node`` restores; a runtime that cannot is refused, naming it."""
    path = restore_path(node.runtime, overrides)
    if not isinstance(path, RestorePath):
        raise SubmissionRejected(f"{field}: node {node.name!r} cannot restore: {path}")
    return path


def check_same_path(observation: Observation, source: str | None, target_path: RestorePath,
                    target: str, overrides: Mapping[str, str] | None = None) -> None:
    """A migration's source captures what its target can restore (and a rollback to the
    source restores it there)."""
    fact = observation.nodes.get(source) if source else None
    if not isinstance(fact, NodeView):
        return  # not observed: the restore step decides per attempt
    source_path = check_restore_path(fact, field="spec.source_node", overrides=overrides)
    if not paths_agree(source_path, target_path):
        raise SubmissionRejected(
            f"spec.target_node: node {target!r} restores by {_how(target_path)}, but the "
            f"source node {source!r} captures for {_how(source_path)} "
            f"({fact.runtime or 'no runtime reported'}): a checkpoint moves only between "
            "nodes of one kind; pick a target that runs the source's runtime")


def _how(path: RestorePath) -> str:
    return "CRI-O (checkpoint images)" if path is RestorePath.RUNTIME else "the node agent"


def check_pod(observation: Observation, ref: PodRef, *, field: str = "spec.pod") -> PodView:
    """The pod exists, is the one with ``ref.uid``, and is Running."""
    fact = observation.pods.get(ref.key)
    if isinstance(fact, ProbeError):
        raise SubmissionUnverifiable(f"could not read pod {ref.key} ({fact.error_class}: "
                                     f"{fact.message}); retry")
    if ref.key not in observation.pods or fact is None:
        raise SubmissionRejected(f"{field}: unknown pod {ref.key}; check the namespace and "
                                 "name (kubectl get pod -n NAMESPACE)")
    if fact.uid != ref.uid:
        raise SubmissionRejected(f"{field}.uid {ref.uid!r} does not match pod {ref.key} "
                                 f"(uid {fact.uid!r}): it was recreated; resubmit with the "
                                 "current uid if this is the pod you mean")
    if fact.deleting:
        raise SubmissionRejected(f"{field}: pod {ref.key} is terminating; nothing to capture")
    if fact.phase != "Running":
        raise SubmissionRejected(f"{field}: pod {ref.key} is {fact.phase}, not Running; wait "
                                 "until it runs")
    return fact


def check_target_node(observation: Observation, node: str, *, field: str,
                      current: str | None) -> NodeView:
    """The node exists, is Ready, is not cordoned, and is not ``current``."""
    if current is not None and node == current:
        raise SubmissionRejected(f"{field} {node!r} is the node the pod already runs on; "
                                 "pick another node")
    fact = observation.nodes.get(node)
    if isinstance(fact, ProbeError):
        raise SubmissionUnverifiable(f"could not read node {node} ({fact.error_class}: "
                                     f"{fact.message}); retry")
    if fact is None:
        raise SubmissionRejected(f"{field}: unknown node {node!r}; list nodes with "
                                 "kubectl get nodes")
    if fact.unschedulable:
        raise SubmissionRejected(f"{field}: node {node!r} is cordoned; uncordon it or pick "
                                 "another node")
    if not fact.ready:
        raise SubmissionRejected(f"{field}: node {node!r} is NotReady; pick a Ready node")
    return fact


def check_destination(observation: Observation, node: str, *, field: str,
                      current: str | None, klass: JsonValue) -> RestorePath:
    """A node a restore runs on: there, Ready, not cordoned, not ``current``, and with a
    runtime that restores (by the class's ``runtimes`` overrides first)."""
    fact = check_target_node(observation, node, field=field, current=current)
    return check_restore_path(fact, field=field, overrides=parse_class(klass).runtime_paths())
