"""The observed facts every event carries to justify itself (``Event.facts``): one pod,
registry reference or node each (:func:`pod_facts`, :func:`tag_facts`, :func:`node_facts`),
or the whole observation (:func:`with_facts`). Facts explain; ``evolve`` never reads them.
Pure.
"""

from __future__ import annotations

from controlplane.engine.decider import Decision, Event
from controlplane.engine.jsonvalue import JsonObject
from controlplane.engine.observation import (
    NodeFact,
    NodeView,
    Observation,
    PodFact,
    ProbeError,
    TagFact,
)


def pod_facts(key: str, fact: PodFact) -> JsonObject:
    """The facts of one observed pod, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"pod": key, "pod_error_class": fact.error_class, "pod_error": fact.message}
    if fact is None:
        return {"pod": key, "pod_present": False}
    return {"pod": key, "pod_present": True, "pod_uid": fact.uid, "pod_phase": fact.phase,
            "pod_node": fact.node, "pod_deleting": fact.deleting}


def tag_facts(ref: str, fact: TagFact) -> JsonObject:
    """The facts of one observed registry reference, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"tag": ref, "tag_error_class": fact.error_class, "tag_error": fact.message}
    if fact is None:
        return {"tag": ref, "tag_present": False}
    out: JsonObject = {"tag": ref, "tag_present": True, "tag_digest": fact.digest,
                       "tag_annotations": dict(fact.annotations)}
    if fact.signature:
        out["tag_signature"] = fact.signature
    return out


def node_facts(name: str, fact: NodeFact) -> JsonObject:
    """The facts of one observed node, for ``Event.facts``."""
    if isinstance(fact, ProbeError):
        return {"node": name, "node_error_class": fact.error_class}
    if fact is None:
        return {"node": name, "node_present": False}
    return {"node": name, "node_present": True, "node_ready": fact.ready,
            "node_unschedulable": fact.unschedulable}


def merge_facts(*parts: JsonObject) -> JsonObject:
    out: JsonObject = {}
    for part in parts:
        out.update(part)
    return out


def node_problem(fact: NodeFact) -> str | None:
    """Why a node cannot take a pod now (missing, NotReady, cordoned), or ``None``."""
    if isinstance(fact, ProbeError):
        return None
    if fact is None:
        return "node does not exist"
    if not isinstance(fact, NodeView):
        return None
    if fact.unschedulable:
        return "node is cordoned (unschedulable)"
    if not fact.ready:
        return "node is NotReady"
    return None


def observation_facts(obs: Observation) -> JsonObject:
    """Everything a decision was taken on, as facts (for events that name nothing finer)."""
    out: JsonObject = {}
    for key, pod in sorted(obs.pods.items()):
        out[f"pod {key}"] = pod_facts(key, pod)
    for ref, tag in sorted(obs.tags.items()):
        out[f"tag {ref}"] = tag_facts(ref, tag)
    for name, node in sorted(obs.nodes.items()):
        out[f"node {name}"] = node_facts(name, node)
    return out


def with_facts(decision: Decision, obs: Observation) -> Decision:
    """Give every event without facts the facts of the observation it was decided on."""
    if not decision.events or all(e.facts for e in decision.events):
        return decision
    summary = observation_facts(obs)
    events = tuple(e if e.facts else Event(e.type, e.data, dict(summary))
                   for e in decision.events)
    return Decision(events, decision.actions, decision.wake_at, decision.needs_tags,
                    decision.confirm)
