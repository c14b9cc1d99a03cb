"""The plan of an operation, and nothing else: ``--dry-run`` and the API's ``dryRun``.

The request is prepared exactly as a submission prepares it (``app.requests.prepare``:
the same checks on the same one look at the cluster); then, instead of creating the
machine, its decider makes its first decision on that observation (plus the registry
tags it asks for), and the plan shows what that decision would do: the actions the
machine itself would take first, said from the actions (never restated in prose that
could drift from them), the events it would record, the checkpoint it would write, and
whether admission would start it now, queue it or refuse it. Only reads: API GETs,
registry probes, one SELECT. Called by the CLI's verbs (which print it: ``cli.dryrun``)
and the HTTP API (which returns it).
"""

from __future__ import annotations

import collections
from datetime import datetime

from controlplane.app.drains import parallelism
from controlplane.app.ports import ClusterAccess
from controlplane.app.requests import Asked, Prepared, RequestRefused, prepare_asked
from controlplane.engine.decider import Action, Decision
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.observation import Interests, NodeView, Observation, TagView
from controlplane.errors import ControlPlaneError
from controlplane.machines.base.requests import Found
from controlplane.machines.catalog import kind as kind_named
from controlplane.machines.config.runtimes import RestorePath, restore_path
from controlplane.machines.contract.actions import ActionType
from controlplane.machines.submission import (
    ActiveOperation,
    Limits,
    OperationRequest,
    Queue,
    Reject,
    admission,
)
from controlplane.store.admission import live_operations_txn
from controlplane.store.database import Database
from controlplane.store.session import read_txn
from controlplane.worker.ports import Observer

#: The machine id a plan decides under (the real one is only made at submit).
ID = "OPERATION-ID"


def restore_path_text(observation: Observation, node: JsonValue) -> str | None:
    """How ``node`` captures and restores, from the runtime it reports (None: not read)."""
    fact = observation.nodes.get(node) if isinstance(node, str) else None
    if not isinstance(fact, NodeView):
        return None
    path = restore_path(fact.runtime)
    runtime = fact.runtime or "no runtime reported"
    if path is RestorePath.RUNTIME:
        return (f"cri-o on {node} ({runtime}): the kubelet's checkpoint API captures each "
                "container; CRI-O restores it from its checkpoint image")
    if path is RestorePath.AGENT:
        return f"agent on {node} ({runtime}): the node agent captures and restores"
    return f"none: {path}"


#: What each action does, said from its parameters (``pod``, ``keys`` and ``verb`` are
#: derived: see :func:`describe`).
SAID = {
    ActionType.ANNOTATE_POD: "annotate pod {pod} (uid {uid}): {keys}",
    ActionType.REMOVE_POD_ANNOTATIONS: "remove annotations from pod {pod} (uid {uid})",
    ActionType.DELETE_POD: "delete pod {pod} (uid {uid}): {reason}",
    ActionType.CREATE_POD: "create pod {pod} on {node}",
    ActionType.CLAIM_POD: "claim pod {pod} (uid {uid}) for {node}",
    ActionType.DELETE_MANIFEST: "delete {repository}@{digest} from the registry",
    ActionType.EMIT_EVENT: "record a {type} event {reason}: {message}",
    ActionType.SET_NODE_UNSCHEDULABLE: "{verb} node {node}",
    ActionType.SUBMIT_OPERATION: "submit {kind} {machine_id}",
}


def describe(action: Action) -> str:
    """One line saying what ``action`` does, from its type and parameters."""
    p = action.params
    annotations = p.get("annotations")
    words = collections.defaultdict(lambda: "?", {
        **p, "pod": f"{p.get('namespace')}/{p.get('name')}",
        "keys": ", ".join(sorted(annotations)) if isinstance(annotations, dict) else "",
        "verb": "uncordon" if p.get("unschedulable") is False else "cordon",
        "node": p.get("node") or "the node the scheduler picks"})
    said = SAID.get(ActionType(action.type)) if action.type in set(ActionType) else None
    return said.format_map(words) if said else f"{action.type} {action.key}"


async def _first_decision(observer: Observer, prepared: Prepared, now: datetime
                          ) -> tuple[Decision, JsonObject, Observation]:
    """The decider's first decision on the prepared observation (plus what it asks for)."""
    decider = kind_named(prepared.kind).decider
    state = decider.initial_state(ID, prepared.spec)
    observation = await _more(observer, prepared.observation, decider.interests(state))
    decision = decider.decide(state, observation, now)
    if decision.needs_tags:  # as the worker does: read the tags, decide again
        observation = await _more(observer, observation, Interests(tags=decision.needs_tags))
        decision = decider.decide(state, observation, now)
    return decision, state.to_json(), observation


async def _more(observer: Observer, seen: Observation, interests: Interests) -> Observation:
    """``seen`` plus what ``interests`` name that it has not read."""
    rest = Interests(pods=frozenset(k for k in interests.pods if k not in seen.pods),
                     tags=frozenset(k for k in interests.tags if k not in seen.tags),
                     nodes=frozenset(k for k in interests.nodes if k not in seen.nodes),
                     machines=frozenset(k for k in interests.machines
                                        if k not in seen.machines))
    if not (rest.pods or rest.tags or rest.nodes or rest.machines):
        return seen
    more = await observer.observe(rest)
    return Observation(pods={**seen.pods, **more.pods}, tags={**seen.tags, **more.tags},
                       nodes={**seen.nodes, **more.nodes},
                       machines={**seen.machines, **more.machines})


async def plan(db: Database, observer: Observer, prepared: Prepared, *, limits: Limits,
               now: datetime, parallel_given: bool = True) -> JsonObject:
    """What ``prepared`` would do; ``refused`` says why it would not be accepted
    (``None``: it would). Raises ``ControlPlaneError`` when the registry did not answer.
    ``parallel_given``: the request named its parallelism (a default capped by an
    admission limit is said in the plan, not warned about)."""
    spec = prepared.spec
    doc: JsonObject = {"dry_run": True, "operation": prepared.kind}
    pod = spec.get("pod")
    on_pod = isinstance(spec.get("namespace"), str)  # a restore or resume names its pod
    if isinstance(pod, dict) or on_pod:  # not a drain: its workload is its node
        doc["pod"] = prepared.workload
    if isinstance(pod, dict):
        doc["uid"] = pod.get("uid")
    doc["source_node"] = prepared.source_node
    # Where it restores: a migration's target, a restore's or a resume's node (a drain's
    # ``node`` is the one it empties).
    target = spec.get("target_node") or (spec.get("node") if on_pod else None)
    if isinstance(target, str):
        doc["target_node"] = target
    doc.update(prepared.shown)
    asked = spec.get("max_parallel")
    if isinstance(asked, int):  # an operation that runs others: how many at once
        run = parallelism(asked, limits)
        doc.update(max_parallel=asked, effective_parallel=run.effective,
                   capped_by=run.capped_by,
                   warnings=[run.warning] if run.warning and parallel_given else [])
    for ref in _strings(prepared.shown.get("artifacts_read")):
        tag = (await _more(observer, Observation(), Interests(tags=frozenset({ref})))
               ).tags.get(ref)
        if not isinstance(tag, TagView):
            if tag is not None:
                raise ControlPlaneError(f"cannot check the {prepared.kind} request now: "
                                        f"could not read {ref}",
                                        hint="the cluster or registry did not answer; retry")
            doc["refused"] = f"artifact {ref} is not in the registry"
            return doc
    decision, state, observation = await _first_decision(observer, prepared, now)
    made = kind_named(prepared.kind).view.checkpoint(state)
    if made is not None:
        doc["artifacts_written"] = [made["artifact"]]
    doc["would"] = [describe(a) for a in decision.actions]
    doc["records"] = [e.type for e in decision.events]
    path = restore_path_text(observation, doc.get("target_node") or doc.get("source_node"))
    if path:
        doc["restore_path"] = path
    source = prepared.source_node
    async with read_txn(db) as conn:
        live = await live_operations_txn(conn)
    verdict = admission(
        OperationRequest(prepared.kind, prepared.workload, source),
        [ActiveOperation(o.machine_id, o.kind, o.workload, o.source_node, queued=o.held)
         for o in live], limits)
    if isinstance(verdict, Reject):
        doc["refused"] = verdict.reason
        return doc
    doc["admission"] = f"queued: {verdict.reason}" if isinstance(verdict, Queue) else \
        "would start now"
    doc["refused"] = None
    return doc


def _strings(value: JsonValue) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


async def plan_request(db: Database, access: ClusterAccess, asked: Asked, *,
                       limits: Limits, now: datetime, found: Found | None = None,
                       parallel_given: bool = True) -> JsonObject:
    """Prepare the request as a submission would and plan it; a refused request is a plan
    whose ``refused`` says why (and ``field`` names the field)."""
    kind = asked.kind
    try:
        prepared = await prepare_asked(db, access, asked, found)
    except RequestRefused as exc:
        doc: JsonObject = {"dry_run": True, "operation": kind, "refused": str(exc)}
        if exc.field:
            doc["field"] = exc.field
        return doc
    return await plan(db, access.observer, prepared, limits=limits, now=now,
                      parallel_given=parallel_given)
