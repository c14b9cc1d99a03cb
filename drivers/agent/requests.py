"""Reading the control plane's requests off a pod, and judging them. Pure.

:func:`capture_request` reads the capture request (protocol v1, see
:mod:`controlplane.machines.contract.protocol`) and :func:`judge_capture` decides whether this
agent may act on it — the UID provenance check (gate 4): the request must name this
pod's UID (a pod recreated under the same name, or one created from a template that
copied the annotations, is not the source) and, when the request names a node
(``capture-node``, an optional v1 key), this node; the protocol version must be one the
agent speaks; the artifact must be a tag reference. :func:`restore_request` reads a
restore request. Used by :mod:`drivers.agent.agent`.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.engine.decider import InvalidSpec
from controlplane.engine.observation import PodView
from controlplane.machines.base.refs import ArtifactRef, parse_digest_ref, parse_tag_ref
from controlplane.machines.contract import protocol
from drivers.agent.errors import RequestRefused

#: Optional (v1): the node the control plane saw the source on when it asked. An agent
#: refuses a request naming another node. Older control planes do not send it.
CAPTURE_NODE = protocol.PREFIX + "capture-node"
SUPPORTED_VERSIONS = frozenset({protocol.PROTOCOL_VERSION})


@dataclass(frozen=True)
class CaptureRequest:
    checkpoint_id: str
    artifact: str  # registry/repo:tag
    source_uid: str
    containers: tuple[str, ...]  # empty: all
    quiesce: bool
    saver: str
    version: str
    node: str  # "" when the request does not name one


def capture_request(pod: PodView) -> CaptureRequest | None:
    """The pod's capture request, or ``None`` when it carries none (or it was withdrawn)."""
    a = pod.annotations
    checkpoint_id = a.get(protocol.CAPTURE_CHECKPOINT_ID, "")
    if not checkpoint_id:
        return None
    listed = a.get(protocol.CAPTURE_CONTAINERS, "")
    return CaptureRequest(
        checkpoint_id=checkpoint_id, artifact=a.get(protocol.CAPTURE_ARTIFACT, ""),
        source_uid=a.get(protocol.CAPTURE_SOURCE_UID, ""),
        containers=tuple(c.strip() for c in listed.split(",") if c.strip()),
        quiesce=a.get(protocol.CAPTURE_QUIESCE, "false").lower() == "true",
        saver=a.get(protocol.CAPTURE_SAVER, ""), version=a.get(protocol.PROTOCOL, ""),
        node=a.get(CAPTURE_NODE, ""))


def judge_capture(request: CaptureRequest, pod: PodView, *, node: str) -> ArtifactRef:
    """The artifact to push to, or :class:`RequestRefused` saying why not."""
    if request.version not in SUPPORTED_VERSIONS:
        raise RequestRefused(f"protocol version {request.version or '(none)'!r} is not "
                             f"supported by this agent (it speaks "
                             f"{', '.join(sorted(SUPPORTED_VERSIONS))})")
    if request.source_uid != pod.uid:
        raise RequestRefused(f"the request names pod uid {request.source_uid or '(none)'!r} "
                             f"but {pod.namespace}/{pod.name} is uid {pod.uid!r}: not the "
                             "source (recreated, or created from a copied template)")
    if pod.node != node:
        raise RequestRefused(f"pod {pod.namespace}/{pod.name} runs on {pod.node!r}, not on "
                             f"this agent's node {node!r}")
    if request.node and request.node != node:
        raise RequestRefused(f"the request names node {request.node!r} but the pod runs on "
                             f"{node!r}")
    try:
        return parse_tag_ref(request.artifact, field="capture-artifact")
    except InvalidSpec as exc:
        raise RequestRefused(str(exc)) from exc


@dataclass(frozen=True)
class RestoreRequest:
    artifact: ArtifactRef  # pinned by digest
    checkpoint_id: str
    loader: str
    unseal: str = ""  # where the key that unseals a sealed checkpoint is (its class says)


def restore_request(pod: PodView) -> RestoreRequest | None:
    """The pod's restore request (``None``: not a restore); ``RequestRefused`` if malformed."""
    a = pod.annotations
    raw = a.get(protocol.RESTORE_ARTIFACT, "")
    if not raw:
        return None
    version = a.get(protocol.PROTOCOL, protocol.PROTOCOL_VERSION)
    if version not in SUPPORTED_VERSIONS:
        raise RequestRefused(f"protocol version {version!r} is not supported by this agent")
    try:
        ref = parse_digest_ref(raw, field="restore-artifact")
    except InvalidSpec as exc:
        raise RequestRefused(str(exc)) from exc
    return RestoreRequest(ref, a.get(protocol.RESTORE_CHECKPOINT_ID, ""),
                          a.get(protocol.RESTORE_LOADER, ""),
                          a.get(protocol.RESTORE_UNSEAL, ""))


def restore_done(pod: PodView) -> bool:
    """This pod already carries this agent's restore marks (not ones copied from a template).

    The agent's instance id starts with the pod's own UID, which no template can know.
    """
    instance = pod.annotations.get(protocol.INSTANCE_ID, "")
    return instance.startswith(pod.uid + ".") and bool(
        pod.annotations.get(protocol.RESTORED_FROM_DIGEST) or
        pod.annotations.get(protocol.RESTORED_FROM_HANDOFF))
