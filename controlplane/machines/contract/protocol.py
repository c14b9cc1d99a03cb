"""The data plane protocol, version ``v1``: annotation keys shared with the node agent.

The control plane asks, the node agent does, the registry proves:

1. **Capture request** (control plane -> agent) on the source pod, written with a UID
   precondition: ``capture-checkpoint-id``, ``capture-artifact`` (tag reference to push),
   ``capture-source-uid``, ``capture-containers`` (comma-separated, empty = all),
   ``capture-quiesce`` (``true``: leave the workload stopped after capture), ``capture-saver``
   (the saver container, JSON) and ``protocol-version``. Removing the request keys
   *withdraws* it: the agent aborts an unfinished capture and resumes the workload.
2. **Capture report** (agent -> control plane) on the source pod: ``report-checkpoint-id``
   binds the report to one request; ``report-state`` is ``Capturing``, ``Pushed`` or
   ``Failed``; ``report-digest`` and ``report-reason`` detail it. A report is a hint: only
   the registry proves completion.
3. **Artifact provenance** (agent -> registry) in the OCI manifest annotations:
   ``checkpoint-id``, ``source-pod-uid``, ``node``, ``format`` and ``protocol-version``. A tag
   whose provenance names another checkpoint or pod is stale and never trusted (gate 1).
   An archive a container runtime can restore by itself (CRI-O's) is also pushed as one
   checkpoint image per container, listed in ``container-images``.
4. **Restore request** (control plane -> agent) on a pod the control plane creates with
   required node affinity: ``restore-artifact`` (``registry/repo@sha256:...``),
   ``restore-key`` (which machine and attempt made the pod), ``restore-checkpoint-id`` and
   ``restore-loader`` (the loader container, JSON).
5. **Restore report** (agent -> control plane) on the restored pod: ``restored-from-digest``
   and ``instance-id`` (a fresh identity for every restore), or ``restore-failure``.
6. **Handoff** (agent -> agent; a streamed migration asks for it): a
   capture asked with ``capture-handoff`` is also offered to the target node's agent,
   which the source announces in ``report-handoff``; a pod created with
   ``restore-handoff`` is restored from that stream and marked ``restored-from-handoff``.
   The manifest of such a capture lists ``archive-digests``.
7. **Lazy handoff** (agent -> agent; a migration in mode ``lazy``): a capture
   asked with mode ``lazy`` and ``capture-handoff`` hands over everything but the memory;
   ``report-handoff`` then names the page server (``pages``), nothing is pushed, and the
   source reports ``Transferred`` with ``report-pages`` once every page was served; the
   restored pod gets ``pages-received`` once every page arrived (:func:`pages_served`,
   :func:`pages_arrived`).

Used by the capture and restore steps, the actions and the node agent. Pure constants and
parsers; the node agent imports the same names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from controlplane.engine.observation import PodView, TagView
from controlplane.machines.base.refs import is_digest

PROTOCOL_VERSION = "v1"
PREFIX = "checkpoint.controlplane.dev/"

PROTOCOL = PREFIX + "protocol-version"

CAPTURE_CHECKPOINT_ID = PREFIX + "capture-checkpoint-id"
CAPTURE_ARTIFACT = PREFIX + "capture-artifact"
CAPTURE_SOURCE_UID = PREFIX + "capture-source-uid"
CAPTURE_CONTAINERS = PREFIX + "capture-containers"
CAPTURE_QUIESCE = PREFIX + "capture-quiesce"
CAPTURE_SAVER = PREFIX + "capture-saver"
#: Sealed classes only: JSON ``{"checkpoint", "recipients", "required"}`` — the public keys
#: the layers are encrypted for. It names its checkpoint, so a seal left on the pod by an
#: earlier request never applies to a later one (docs/security.md).
CAPTURE_SEAL = PREFIX + "capture-seal"
#: A migration mode other than stop-and-copy: JSON ``{"checkpoint", "mode"}``, bound to
#: its checkpoint like the seal (:mod:`controlplane.machines.config.modes`). An agent
#: refuses a mode it cannot perform before anything is frozen.
CAPTURE_MODE = PREFIX + "capture-mode"
#: A capture also handed straight to the target node's agent: JSON ``{"checkpoint",
#: "target"}``, bound to its checkpoint like the seal (a streamed or lazy migration).
CAPTURE_HANDOFF = PREFIX + "capture-handoff"
CAPTURE_REQUEST_KEYS = (CAPTURE_CHECKPOINT_ID, CAPTURE_ARTIFACT, CAPTURE_SOURCE_UID,
                        CAPTURE_CONTAINERS, CAPTURE_QUIESCE, CAPTURE_SAVER, PROTOCOL)

REPORT_CHECKPOINT_ID = PREFIX + "report-checkpoint-id"
REPORT_STATE = PREFIX + "report-state"
REPORT_DIGEST = PREFIX + "report-digest"
REPORT_REASON = PREFIX + "report-reason"
#: The source agent's offer of a handed-off capture: JSON ``{"checkpoint", "address",
#: "archives": {container: "sha256:..."}}`` (the plain archives' digests); a lazy capture
#: adds ``"pages": "host:port"``, its page server.
REPORT_HANDOFF = PREFIX + "report-handoff"
#: A lazy capture's end on the source: JSON ``{"checkpoint", "pages", "bytes", "seconds"}``
#: (``seconds``: the source frozen -> its last page served; ``null`` if CRIU did not say).
REPORT_PAGES = PREFIX + "report-pages"

MANIFEST_CHECKPOINT_ID = PREFIX + "checkpoint-id"
MANIFEST_SOURCE_POD_UID = PREFIX + "source-pod-uid"
MANIFEST_NODE = PREFIX + "node"
MANIFEST_FORMAT = PREFIX + "format"
MANIFEST_PROTOCOL = PREFIX + "protocol-version"
MANIFEST_ARCHIVE_BYTES = PREFIX + "archive-bytes"  # bytes of the checkpoint archives
#: Sealed checkpoints: the key ids the layers are encrypted for, comma-separated.
MANIFEST_SEALED_FOR = PREFIX + "sealed-for"
#: Per-container checkpoint images a container runtime restores itself (CRI-O): the pod
#: manifest lists them as ``container=sha256:...`` pairs, comma-separated, each a
#: manifest in the same repository (see :func:`container_images`).
MANIFEST_CONTAINER_IMAGES = PREFIX + "container-images"
#: Handed-off captures: JSON ``{container: "sha256:..."}`` of each PLAIN archive, so what a
#: target restored from the stream can be compared with what the registry holds.
MANIFEST_ARCHIVE_DIGESTS = PREFIX + "archive-digests"

RESTORE_ARTIFACT = PREFIX + "restore-artifact"
RESTORE_KEY = PREFIX + "restore-key"
RESTORE_CHECKPOINT_ID = PREFIX + "restore-checkpoint-id"
RESTORE_LOADER = PREFIX + "restore-loader"
#: Sealed classes only: where the key that unseals the layers is (``secret:NAME/KEY`` or
#: ``file:/path``, resolved by the agent on its node).
RESTORE_UNSEAL = PREFIX + "restore-unseal"
#: Instead of ``restore-artifact``: restore from the source agent's stream, JSON
#: ``{"checkpoint", "source": "namespace/name", "uid"}`` (the source pod and its UID).
RESTORE_HANDOFF = PREFIX + "restore-handoff"

RESTORED_FROM_DIGEST = PREFIX + "restored-from-digest"
INSTANCE_ID = PREFIX + "instance-id"
RESTORE_FAILURE = PREFIX + "restore-failure"
#: Restored from a handoff: JSON ``{"checkpoint", "archives": {container: "sha256:..."}}``,
#: the digests the target received and verified.
RESTORED_FROM_HANDOFF = PREFIX + "restored-from-handoff"
#: Restored lazily: JSON ``{"checkpoint", "pages", "expected"}`` once every page the
#: restored tasks left to CRIU's lazy-pages daemon arrived (a lost transfer is a
#: ``restore-failure`` ``PagesLost: ...`` instead).
PAGES_RECEIVED = PREFIX + "pages-received"
#: The scheduling gate the control plane's admission webhook puts on a StatefulSet's
#: successor pod while a migration of that pod is in flight; the migration removes it
#: when the restore request is on the pod (``steps.restore``, claim mode).
RESTORE_GATE = PREFIX + "restore"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "checkpoint-controlplane"


class ReportState(StrEnum):
    CAPTURING = "Capturing"
    PUSHED = "Pushed"
    FAILED = "Failed"
    #: A lazy capture: every page reached the target, the source is gone (nothing pushed).
    TRANSFERRED = "Transferred"


#: The ``capture-mode`` of a post-copy migration (``capture-handoff`` required): the agents
#: hand the workload over without its memory, which the target then fetches page by page.
LAZY = "lazy"


def capture_request(*, checkpoint_id: str, artifact: str, source_uid: str,
                    containers: tuple[str, ...], quiesce: bool, saver: str,
                    seal: str = "", mode: str = "", handoff_to: str = "") -> dict[str, str]:
    """The annotations that ask the node agent for one capture (``seal``: the class's
    :meth:`~controlplane.machines.config.classes.Encryption.seal_annotation`, sealed only;
    ``mode``: a migration mode other than stop-and-copy; ``handoff_to``: the node whose
    agent the archives are also streamed to)."""
    out = {
        CAPTURE_CHECKPOINT_ID: checkpoint_id,
        CAPTURE_ARTIFACT: artifact,
        CAPTURE_SOURCE_UID: source_uid,
        CAPTURE_CONTAINERS: ",".join(containers),
        CAPTURE_QUIESCE: "true" if quiesce else "false",
        CAPTURE_SAVER: saver,
        PROTOCOL: PROTOCOL_VERSION,
    }
    if seal:
        out[CAPTURE_SEAL] = json.dumps({"checkpoint": checkpoint_id, **json.loads(seal)},
                                       sort_keys=True, separators=(",", ":"))
    if mode:
        out[CAPTURE_MODE] = json.dumps({"checkpoint": checkpoint_id, "mode": mode},
                                       sort_keys=True, separators=(",", ":"))
    if handoff_to:
        out[CAPTURE_HANDOFF] = _json({"checkpoint": checkpoint_id, "target": handoff_to})
    return out


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _object(key: str, raw: str, fields: tuple[str, ...]) -> dict[str, object]:
    """``raw`` as a JSON object whose ``fields`` are strings; ``ValueError`` naming ``key``."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(data.get(f), str) and data.get(f)
                                             for f in fields):
        raise ValueError(f"{key} {raw[:200]!r} is not a JSON object with the string "
                         f"field(s) {', '.join(fields)}")
    return data


def _digests(key: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not value or not all(
            isinstance(k, str) and k and isinstance(v, str) and is_digest(v)
            for k, v in value.items()):
        raise ValueError(f"{key}: the archives must be a non-empty object of container -> "
                         "sha256 digest")
    return dict(value)


def capture_handoff(annotations: Mapping[str, str], checkpoint_id: str) -> str:
    """The node this checkpoint's capture is also handed to (``""``: none); one naming
    another checkpoint does not apply. Unreadable: ``ValueError`` naming the key."""
    raw = annotations.get(CAPTURE_HANDOFF, "")
    if not raw:
        return ""
    data = _object(CAPTURE_HANDOFF, raw, ("checkpoint", "target"))
    return str(data["target"]) if data["checkpoint"] == checkpoint_id else ""


@dataclass(frozen=True)
class HandoffReport:
    """The source agent's offer: where the target fetches, and the plain archives' digests."""

    checkpoint_id: str
    address: str  # host:port of the source agent's handoff server
    archives: Mapping[str, str]  # container -> sha256 of the plain archive
    pages: str = ""  # lazy: host:port of the source's page server (the memory is there)

    def annotation(self) -> dict[str, str]:
        value: dict[str, object] = {"checkpoint": self.checkpoint_id, "address": self.address,
                                    "archives": dict(self.archives)}
        if self.pages:
            value["pages"] = self.pages
        return {REPORT_HANDOFF: _json(value)}


def handoff_report(annotations: Mapping[str, str], checkpoint_id: str) -> HandoffReport | None:
    """The offer of ``checkpoint_id`` on the source pod (``None``: none, or another
    checkpoint's); unreadable: ``ValueError`` naming the key."""
    raw = annotations.get(REPORT_HANDOFF, "")
    if not raw:
        return None
    data = _object(REPORT_HANDOFF, raw, ("checkpoint", "address"))
    if data["checkpoint"] != checkpoint_id:
        return None
    pages = data.get("pages", "")
    if not isinstance(pages, str) or (pages and not _host_port(pages)):
        raise ValueError(f"{REPORT_HANDOFF}: pages {pages!r} is not host:port")
    return HandoffReport(checkpoint_id, str(data["address"]),
                         _digests(REPORT_HANDOFF, data.get("archives")), pages)


def _host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(host and sep and port.isdigit() and 0 < int(port) < 65536)


def host_port(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) of a ``pages`` address; ``ValueError`` if it is not."""
    if not _host_port(text):
        raise ValueError(f"{text!r} is not host:port")
    host, _, port = text.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def pages_report(checkpoint_id: str, *, pages: int, size: int,
                 seconds: float | None) -> dict[str, str]:
    """The source's ``report-pages`` once a lazy capture served every page."""
    return {REPORT_PAGES: _json({"checkpoint": checkpoint_id, "pages": pages, "bytes": size,
                                 "seconds": None if seconds is None else round(seconds, 3)})}


def pages_received(checkpoint_id: str, *, pages: int, expected: int) -> dict[str, str]:
    """The target's ``pages-received`` once every page of a lazy restore arrived."""
    return {PAGES_RECEIVED: _json({"checkpoint": checkpoint_id, "pages": pages,
                                   "expected": expected})}


@dataclass(frozen=True)
class PagesCount:
    """A lazy transfer's count, as one side reported it: the source's ``report-pages``
    (``pages`` served, ``bytes``, ``seconds`` frozen -> last page) or the target's
    ``pages-received`` (``pages`` received of ``expected``)."""

    pages: int
    expected: int | None = None
    bytes: int | None = None
    seconds: float | None = None


def _count(key: str, raw: str, checkpoint_id: str, fields: tuple[str, ...]) -> PagesCount | None:
    if not raw:
        return None
    data = _object(key, raw, ("checkpoint",))
    if data["checkpoint"] != checkpoint_id:
        return None  # an earlier checkpoint's
    if not all(type(data.get(f)) is int and int(str(data.get(f))) >= 0 for f in fields):
        raise ValueError(f"{key} {raw[:200]!r}: {', '.join(fields)} must be counts")
    seconds = data.get("seconds")
    if seconds is not None and (isinstance(seconds, bool)
                                or not isinstance(seconds, int | float)):
        raise ValueError(f"{key} {raw[:200]!r}: seconds must be a number or null")
    return PagesCount(int(str(data["pages"])),
                      int(str(data["expected"])) if "expected" in fields else None,
                      int(str(data["bytes"])) if "bytes" in fields else None,
                      None if seconds is None else float(seconds))


def pages_served(annotations: Mapping[str, str], checkpoint_id: str) -> PagesCount | None:
    """The source's ``report-pages`` for this checkpoint (``None``: none yet, or an
    earlier checkpoint's); ``ValueError`` if malformed."""
    return _count(REPORT_PAGES, annotations.get(REPORT_PAGES, ""), checkpoint_id,
                  ("pages", "bytes"))


def pages_arrived(annotations: Mapping[str, str], checkpoint_id: str) -> PagesCount | None:
    """The target's ``pages-received`` for this checkpoint (``None``: not yet);
    ``ValueError`` if malformed."""
    return _count(PAGES_RECEIVED, annotations.get(PAGES_RECEIVED, ""), checkpoint_id,
                  ("pages", "expected"))


@dataclass(frozen=True)
class RestoreHandoff:
    """A restore from the source agent's stream: which checkpoint, from which pod."""

    checkpoint_id: str
    namespace: str
    name: str
    source_uid: str


def restore_handoff(annotations: Mapping[str, str]) -> RestoreHandoff | None:
    """The pod's ``restore-handoff`` request (``None``: none); ``ValueError`` if malformed."""
    raw = annotations.get(RESTORE_HANDOFF, "")
    if not raw:
        return None
    data = _object(RESTORE_HANDOFF, raw, ("checkpoint", "source", "uid"))
    namespace, _, name = str(data["source"]).partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"{RESTORE_HANDOFF}: source {data['source']!r} is not namespace/name")
    return RestoreHandoff(str(data["checkpoint"]), namespace, name, str(data["uid"]))


def restore_handoff_request(*, checkpoint_id: str, source: str, source_uid: str,
                            restore_key: str, loader: str | None) -> dict[str, str]:
    """The annotations of a pod restored from the source agent's stream (``source``:
    ``namespace/name`` of the source pod) instead of the registry."""
    out = {RESTORE_KEY: restore_key, PROTOCOL: PROTOCOL_VERSION,
           RESTORE_HANDOFF: _json({"checkpoint": checkpoint_id, "source": source,
                                   "uid": source_uid})}
    if loader is not None:
        out[RESTORE_LOADER] = loader
    return out


def restored_from_handoff(checkpoint_id: str, archives: Mapping[str, str]) -> dict[str, str]:
    """The target's mark: the checkpoint and the digests it received and verified."""
    return {RESTORED_FROM_HANDOFF: _json({"checkpoint": checkpoint_id,
                                          "archives": dict(archives)})}


def handoff_restored(annotations: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
    """``(checkpoint, archives)`` the pod was restored from by handoff, or ``None``."""
    raw = annotations.get(RESTORED_FROM_HANDOFF, "")
    if not raw:
        return None
    data = _object(RESTORED_FROM_HANDOFF, raw, ("checkpoint",))
    return str(data["checkpoint"]), _digests(RESTORED_FROM_HANDOFF, data.get("archives"))


def format_archive_digests(digests: Mapping[str, str]) -> str:
    """``{"app": "sha256:..."}`` as the manifest's ``archive-digests`` value."""
    return _json(dict(digests))


def archive_digests(annotations: Mapping[str, str]) -> dict[str, str]:
    """The plain archives' digests a manifest lists (empty: none, or malformed)."""
    try:
        return _digests(MANIFEST_ARCHIVE_DIGESTS,
                        json.loads(annotations.get(MANIFEST_ARCHIVE_DIGESTS, "")))
    except ValueError:
        return {}


def capture_mode(annotations: Mapping[str, str], checkpoint_id: str) -> str:
    """The mode this checkpoint's request asks for (``""``: stop-and-copy); one naming
    another checkpoint (left by an earlier request) does not apply. Unreadable: raises
    ``ValueError`` naming the key."""
    raw = annotations.get(CAPTURE_MODE, "")
    if not raw:
        return ""
    try:
        data = json.loads(raw)
        named, mode = data["checkpoint"], data["mode"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{CAPTURE_MODE} {raw!r} is not a mode this agent reads") from exc
    if not isinstance(mode, str):
        raise ValueError(f"{CAPTURE_MODE} {raw!r}: the mode must be a string")
    return mode if named == checkpoint_id else ""


def has_capture_request(pod: PodView, checkpoint_id: str) -> bool:
    """The pod carries the capture request of this checkpoint."""
    return pod.annotations.get(CAPTURE_CHECKPOINT_ID) == checkpoint_id


@dataclass(frozen=True)
class CaptureReport:
    """The agent's report for one checkpoint, read from the source pod's annotations."""

    state: ReportState
    digest: str
    reason: str


def capture_report(pod: PodView, checkpoint_id: str) -> CaptureReport | None:
    """The agent's report for ``checkpoint_id``; reports for other checkpoints are ignored."""
    annotations = pod.annotations
    if annotations.get(REPORT_CHECKPOINT_ID) != checkpoint_id:
        return None
    try:
        state = ReportState(annotations.get(REPORT_STATE, ""))
    except ValueError:
        return None
    return CaptureReport(state, annotations.get(REPORT_DIGEST, ""),
                         annotations.get(REPORT_REASON, ""))


def provenance_problem(tag: TagView, *, checkpoint_id: str, source_uid: str) -> str | None:
    """Why the manifest behind ``tag`` is not this checkpoint's artifact, or ``None``.

    Gate 1: a digest alone proves nothing; the manifest must name this checkpoint id and
    this source pod UID, or it is a leftover of an earlier checkpoint. Where the observer
    checks signatures, a manifest no trusted key signed is never this checkpoint's (a
    forged push under the right tag, with the right annotations).
    """
    if not is_digest(tag.digest):
        return f"digest {tag.digest!r} is not a sha256 digest"
    if tag.signature.startswith("refused"):
        return f"the manifest's signature did not verify ({tag.signature})"
    seen_id = tag.annotations.get(MANIFEST_CHECKPOINT_ID)
    if seen_id is None:
        return (f"the manifest {tag.digest[:19]}... is not a checkpoint artifact (it carries "
                f"no {MANIFEST_CHECKPOINT_ID} annotation); something else owns this tag")
    if seen_id != checkpoint_id:
        return f"manifest names checkpoint {seen_id!r}, not {checkpoint_id!r}"
    seen_uid = tag.annotations.get(MANIFEST_SOURCE_POD_UID)
    if seen_uid != source_uid:
        return f"manifest names source pod uid {seen_uid!r}, not {source_uid!r}"
    return None


def archive_bytes(tag: TagView) -> int | None:
    """The checkpoint archives' size the manifest declares, or ``None`` if it does not."""
    text = tag.annotations.get(MANIFEST_ARCHIVE_BYTES, "")
    return int(text) if text.isdigit() else None


def format_container_images(images: dict[str, str]) -> str:
    """``{"app": "sha256:..."}`` as the ``container-images`` annotation's value."""
    return ",".join(f"{name}={digest}" for name, digest in sorted(images.items()))


def container_images(annotations: Mapping[str, str]) -> dict[str, str]:
    """The per-container checkpoint images a manifest lists (container -> digest);
    empty when it lists none or the value is malformed (a runtime then cannot restore it)."""
    out: dict[str, str] = {}
    for item in annotations.get(MANIFEST_CONTAINER_IMAGES, "").split(","):
        name, _, digest = item.partition("=")
        if not name or not is_digest(digest) or name in out:
            return {}
        out[name] = digest
    return out


def container_image_refs(artifact: str, images: Mapping[str, str]) -> dict[str, str]:
    """``registry/repo@sha256:...`` per container, in the repository of ``artifact``."""
    repository = artifact.split("@", 1)[0]
    return {name: f"{repository}@{digest}" for name, digest in images.items()}


def restore_request(*, artifact: str | None, restore_key: str, checkpoint_id: str | None,
                    loader: str | None, unseal: str = "") -> dict[str, str]:
    """The annotations of a pod the control plane creates (``artifact`` None: cold boot)."""
    out = {RESTORE_KEY: restore_key, PROTOCOL: PROTOCOL_VERSION}
    if artifact is not None:
        out[RESTORE_ARTIFACT] = artifact
        if checkpoint_id:
            out[RESTORE_CHECKPOINT_ID] = checkpoint_id
        if loader is not None:
            out[RESTORE_LOADER] = loader
        if unseal:
            out[RESTORE_UNSEAL] = unseal
    return out


@dataclass(frozen=True)
class RestoreReport:
    """What the agent reported on a restored pod."""

    restored_from: str
    instance_id: str
    failure: str


def restore_report(pod: PodView) -> RestoreReport:
    a = pod.annotations
    return RestoreReport(a.get(RESTORED_FROM_DIGEST, ""), a.get(INSTANCE_ID, ""),
                         a.get(RESTORE_FAILURE, ""))


def instance_id(pod: PodView) -> str:
    """The instance identity the agent gave this pod when it restored it ("" if none)."""
    return pod.annotations.get(INSTANCE_ID, "")
