"""The plan of an operation, and nothing else: ``--dry-run`` and the API's ``dryRun``.

The same checks as a real submission — the spec through the kind's ``validate_spec``,
the pod and node through :func:`~controlplane.machines.submission.validate_submission`
on a fresh observation, the admission rules over the live operations — but only reads:
API GETs, a registry probe of the artifact a restore needs, one SELECT. It prints which
pod, which target and why, which artifacts would be written and deleted, what the
operation would do to the cluster, and what would be refused. Called by the CLI's verbs
(which print it: ``cli.dryrun``) and the HTTP API (which returns it).
"""

from __future__ import annotations

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.jsonvalue import JsonObject, JsonValue
from controlplane.engine.observation import (
    Interests,
    NodeView,
    Observation,
    ProbeError,
    TagView,
)
from controlplane.errors import ControlPlaneError
from controlplane.machines.config.classes import parse_class
from controlplane.machines.config.runtimes import RestorePath, restore_path
from controlplane.machines.submission import (
    ActiveOperation,
    Limits,
    OperationRequest,
    Queue,
    Reject,
    SubmissionUnverifiable,
    admission,
    submission_interests,
    validate_submission,
)
from controlplane.store.admission import live_operations_txn
from controlplane.store.database import Database
from controlplane.store.session import read_txn
from controlplane.worker.ports import Observer

ID = "<operation-id>"


def planned_artifact(klass: JsonValue, namespace: str, pod: str) -> str:
    """``repository:tag`` a new checkpoint would push (the id is only known at submit)."""
    cls = parse_class(klass)
    tag = cls.tag_scheme.format_map({"checkpoint_id": ID, "namespace": namespace, "pod": pod})
    return f"{cls.repository}:{tag}"


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


def _steps(kind: str, spec: JsonObject, observation: Observation) -> JsonObject:
    """Which pod, which target and why, the artifacts, the cluster writes."""
    if kind == "restore":
        node = str(spec["node"])
        artifact = str(spec["artifact"])
        return {"pod": f"{spec['namespace']}/{spec['name']}", "target_node": node,
                "why": f"node {node} exists, is Ready and not cordoned",
                "artifacts_read": [artifact], "artifacts_written": [], "artifacts_deleted": [],
                "would": [f"create pod {spec['namespace']}/{spec['name']} with required "
                          f"affinity to {node}, restored from {artifact}"]}
    pod = spec["pod"]
    assert isinstance(pod, dict)
    key = f"{pod['namespace']}/{pod['name']}"
    seen = observation.pods.get(key)
    source = seen.node if not isinstance(seen, ProbeError) and seen is not None else None
    artifact = planned_artifact(spec.get("class"), str(pod["namespace"]), str(pod["name"]))
    if kind == "migration":
        target = str(spec["target_node"])
        return {"pod": key, "uid": pod["uid"], "source_node": source, "target_node": target,
                "why": f"node {target} exists, is Ready, not cordoned, and is not the "
                       f"source {source}",
                "artifacts_written": [artifact],
                "artifacts_deleted": [f"{artifact} (after the restored pod is verified)"],
                "would": [f"annotate {key} to request a capture", f"delete {key} (uid "
                          f"{pod['uid']}) once the artifact is verified",
                          f"create {key} on {target} from the artifact",
                          "delete the artifact after the restore is verified"]}
    return {"pod": key, "uid": pod["uid"], "source_node": source,
            "artifacts_written": [artifact], "artifacts_deleted": [],
            "would": [f"annotate {key} to request a capture",
                      f"delete {key} (uid {pod['uid']}) once the artifact is verified; "
                      "its spec and checkpoint are kept for resume"]}


async def plan_operation(db: Database, observer: Observer, *, kind: str, spec: JsonObject,
                         limits: Limits) -> JsonObject:
    """Validate and plan; ``refused`` says why it would not be accepted (``None``: it
    would). Raises ``ControlPlaneError`` when the cluster or registry did not answer."""
    interests = submission_interests(kind, spec)
    artifact = spec.get("artifact") if kind == "restore" else None
    if isinstance(artifact, str):
        interests = Interests(pods=interests.pods, nodes=interests.nodes,
                              tags=frozenset({artifact}))
    observation = await observer.observe(interests)
    doc: JsonObject = {"dry_run": True, "operation": kind}
    try:
        normal = validate_submission(kind, spec, observation)
        tag = observation.tags.get(artifact) if isinstance(artifact, str) else None
        if isinstance(artifact, str) and not isinstance(tag, TagView):
            if isinstance(tag, ProbeError):
                raise SubmissionUnverifiable(f"could not read {artifact}: {tag.message}")
            raise InvalidSpec(f"artifact {artifact} is not in the registry")
    except SubmissionUnverifiable as exc:
        raise ControlPlaneError(f"cannot check the {kind} request now: {exc}",
                                hint="the cluster or registry did not answer; retry") from None
    except InvalidSpec as exc:
        doc["refused"] = str(exc)
        return doc
    doc.update(_steps(kind, normal, observation))
    path = restore_path_text(observation, doc.get("target_node") or doc.get("source_node"))
    if path:
        doc["restore_path"] = path
    workload = str(doc["pod"])
    source = doc.get("source_node")
    async with read_txn(db) as conn:
        live = await live_operations_txn(conn)
    verdict = admission(
        OperationRequest(kind, workload, source if isinstance(source, str) else None),
        [ActiveOperation(o.machine_id, o.kind, o.workload, o.source_node, queued=o.held)
         for o in live], limits)
    if isinstance(verdict, Reject):
        doc["refused"] = verdict.reason
        return doc
    doc["admission"] = f"queued: {verdict.reason}" if isinstance(verdict, Queue) else \
        "would start now"
    doc["refused"] = None
    return doc
