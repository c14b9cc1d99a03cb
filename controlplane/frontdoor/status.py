"""The mirror's pure part: the status a custom resource should have, computed from its
operation's ``machines`` row (and, for a Suspension that was resumed, the resume's), and
the merge patch that brings the server's status there.

The status is recomputed from the store every time, never accumulated: an edited or lost
status is rebuilt by the next write, and an unchanged one costs no request
(:func:`needs_write`). The only thing carried over from the server's status is each
condition's ``lastTransitionTime`` while its status stays the same (as metav1.Condition
asks). Everything is JSON-ready: times are RFC 3339 UTC with seconds (metav1.Time).

Called by the front door's status writer (``controlplane/frontdoor``). Pure: no I/O, no
clock (``now`` comes in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from controlplane.app.drains import drain_summary
from controlplane.app.waiting import settled, waiting_for
from controlplane.frontdoor.outcomes import checkpoint_of, outcome, restored_pod
from controlplane.machines.checkpoint.machine import KIND as CHECKPOINT
from controlplane.machines.drain.state import KIND as DRAIN
from controlplane.machines.migration.state import KIND as MIGRATION
from controlplane.machines.restore.machine import KIND as RESTORE
from controlplane.machines.resume.machine import KIND as RESUME
from controlplane.machines.suspend.machine import KIND as SUSPEND
from controlplane.store.records import MachineRecord


@dataclass(frozen=True)
class ResourceKind:
    """One operation kind of the API group: its machine kind, and the resume's for a
    Suspension (its second operation, once ``operatingMode`` becomes ``Running``)."""

    kind: str
    machine: str
    resume: str | None = None


#: The five operation kinds (CheckpointClass is a class, not an operation), by kind.
KINDS: Mapping[str, ResourceKind] = MappingProxyType({k.kind: k for k in (
    ResourceKind("Checkpoint", CHECKPOINT),
    ResourceKind("Restore", RESTORE),
    ResourceKind("Migration", MIGRATION),
    ResourceKind("Suspension", SUSPEND, resume=RESUME),
    ResourceKind("Drain", DRAIN),
)})

ACCEPTED, PROGRESSING, SUCCEEDED, FAILED = "Accepted", "Progressing", "Succeeded", "Failed"
TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"
#: ``phase`` while no operation exists: refused (Accepted=False), or not created yet.
REFUSED, PENDING = "Refused", "Pending"
#: The status keys the mirror owns: the only ones compared and patched.
OWNED = ("observedGeneration", "operationID", "resumeOperationID", "phase", "conditions",
         "startTime", "completionTime", "checkpoint", "pod", "drain")
#: metav1.Condition's limits: a reason is an identifier, a message at most 32768 bytes.
_REASON_CHARS = re.compile(r"[^A-Za-z0-9_,:]")
_MAX_REASON, _MAX_MESSAGE = 1024, 32768


@dataclass(frozen=True)
class Refusal:
    """Why a resource's operation was not created: ``reason`` CamelCase (``InvalidSpec``,
    ``WorkloadBusy``...), ``message`` the submission's own error text."""

    reason: str
    message: str


def desired_status(
    kind: str,
    *,
    generation: int,
    operation: MachineRecord | None,
    resume: MachineRecord | None = None,
    refusal: Refusal | None = None,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The status resource ``kind`` (a key of :data:`KINDS`) at ``generation`` should have.

    No ``operation``: ``refusal`` gives Accepted=False with its reason and message (phase
    ``Refused``); without one, Accepted=Unknown, reason ``Pending`` (being created).
    With one: Accepted=True; Progressing True while the operation is not settled (reason
    its phase, message what it waits for), False once settled; then Succeeded and Failed,
    one True, with the reason and message the machine recorded (:mod:`.outcomes`). A
    Suspension's ``resume``, once it exists, gives the phase, the conditions, the
    completion and the pod; the checkpoint stays the suspension's. ``previous`` (the
    status on the server) only lends unchanged conditions their ``lastTransitionTime``.
    """
    spec = _kind(kind)
    old = _conditions(previous)
    if operation is None:
        if resume is not None:
            raise ValueError(f"{kind}: a resume without its suspend operation")
        if refusal is not None:
            first = _condition(ACCEPTED, FALSE, refusal.reason, refusal.message)
        else:
            first = _condition(ACCEPTED, UNKNOWN, PENDING, "the operation is being created")
        return {"observedGeneration": generation,
                "phase": REFUSED if refusal is not None else PENDING,
                "conditions": _stamped([first], old, generation, now)}
    _check(spec, operation, resume)
    current = resume if resume is not None else operation
    accepted = f"{operation.kind} operation {operation.id}"
    if resume is not None:
        accepted += f"; {resume.kind} operation {resume.id}"
    conditions = [_condition(ACCEPTED, TRUE, "OperationCreated", accepted)]
    done = settled(current)
    if done:
        end = outcome(current)
        conditions += [
            _condition(PROGRESSING, FALSE, current.phase, end.message),
            _condition(SUCCEEDED, TRUE if end.succeeded else FALSE, end.reason, end.message),
            _condition(FAILED, FALSE if end.succeeded else TRUE, end.reason, end.message),
        ]
    else:
        conditions.append(_condition(PROGRESSING, TRUE, current.phase, waiting_for(current)))
    status: dict[str, Any] = {
        "observedGeneration": generation, "operationID": operation.id,
        "phase": current.phase, "conditions": _stamped(conditions, old, generation, now),
        "startTime": rfc3339(operation.created_at),
    }
    if resume is not None:
        status["resumeOperationID"] = resume.id
    if done:
        status["completionTime"] = rfc3339(current.updated_at)
    checkpoint = checkpoint_of(operation)
    if checkpoint is not None:
        status["checkpoint"] = checkpoint
    pod = restored_pod(current)
    if pod is not None:
        status["pod"] = pod
    if operation.kind == DRAIN:
        status["drain"] = {k: v for k, v in drain_summary(operation).items() if k != "node"}
    return status


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) of the status subresource that turns the owned
    keys of ``current`` into ``desired``: what differs, and ``None`` for what must go (a
    ``completionTime`` of a Suspension resumed since, a stale ``digest``...). Lists
    (``conditions``) are replaced whole, as a merge patch does. Empty: nothing to write."""
    have = current or {}
    patch: dict[str, Any] = {}
    for key in OWNED:
        if key not in desired:
            if have.get(key) is not None:
                patch[key] = None
        elif key not in have or have[key] != desired[key]:
            patch[key] = _merge(have.get(key), desired[key])
    return patch


def needs_write(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether the server's status differs from ``desired`` in anything the mirror owns:
    lost (``None``, ``{}``), edited, or stale (an older ``observedGeneration``)."""
    return bool(status_patch(current, desired))


def rfc3339(moment: datetime) -> str:
    """``moment`` as metav1.Time writes it: UTC, whole seconds, ``Z`` (naive is UTC)."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kind(kind: str) -> ResourceKind:
    found = KINDS.get(kind)
    if found is None:
        raise ValueError(f"kind {kind!r} has no operation; known: {', '.join(KINDS)}")
    return found


def _check(spec: ResourceKind, operation: MachineRecord, resume: MachineRecord | None) -> None:
    if operation.kind != spec.machine:
        raise ValueError(f"a {spec.kind}'s operation is a {spec.machine} machine, not "
                         f"{operation.kind} ({operation.id})")
    if resume is not None and resume.kind != spec.resume:
        raise ValueError(f"a {spec.kind} has no resume of kind {resume.kind} ({resume.id})"
                         if spec.resume is None else
                         f"a {spec.kind}'s resume is a {spec.resume} machine, not "
                         f"{resume.kind} ({resume.id})")


def _condition(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": _reason(reason),
            "message": message.encode()[:_MAX_MESSAGE].decode(errors="ignore")}


def _reason(text: str) -> str:
    """A metav1.Condition reason (``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``): the
    machines' reasons are CamelCase already; anything else is cut down to one."""
    cleaned = _REASON_CHARS.sub("", text).lstrip("0123456789_,:")[:_MAX_REASON].rstrip(",:")
    return cleaned or "Unknown"


def _conditions(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The previous conditions by type (anything malformed is ignored)."""
    listed = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(listed, list):
        return {}
    return {str(c["type"]): c for c in listed if isinstance(c, Mapping) and "type" in c}


def _stamped(conditions: list[dict[str, Any]], old: Mapping[str, Mapping[str, Any]],
             generation: int, now: datetime) -> list[dict[str, Any]]:
    """Each condition with ``lastTransitionTime`` (kept while its status is unchanged,
    else ``now``) and ``observedGeneration``."""
    out = []
    for c in conditions:
        before = old.get(c["type"])
        kept = before.get("lastTransitionTime") if before is not None and \
            before.get("status") == c["status"] else None
        when = kept if isinstance(kept, str) and kept else rfc3339(now)
        out.append({**c, "lastTransitionTime": when, "observedGeneration": generation})
    return out


def _merge(have: Any, want: Any) -> Any:
    """The merge patch from ``have`` to ``want`` for one value (objects recursively)."""
    if not isinstance(want, Mapping) or not isinstance(have, Mapping):
        return want
    patch: dict[str, Any] = {k: None for k in have if k not in want}
    for k, v in want.items():
        if k not in have or have[k] != v:
            patch[k] = _merge(have.get(k), v)
    return patch
