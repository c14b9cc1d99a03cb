"""An operation as every output shows it: one field set, one spelling.

``cpctl get/list -o json|yaml`` and the HTTP API (``GET /operations``,
``/operations/{id}``) print the same document, in snake_case (the custom resources keep
Kubernetes' camelCase: docs/resources.md). The fields, for every kind:

- ``id``, ``kind``, ``phase``, ``terminal``, ``version``, ``held``, ``attempts``,
  ``created_at``, ``updated_at``;
- ``workload``: ``namespace/name`` of the pod it acts on (the WORKLOAD column);
- ``node``: where it ran or landed (the NODE column): the node a migration left the
  workload on once it finished, else the node a restore or resume was asked for, else
  the source's node;
- ``source_node`` and ``target_node`` as asked (``null`` where the kind has none);
- ``pod``: ``namespace/name`` of the pod it left running (``null``: none, or not yet);
- ``parent``: the drain that started this migration; ``waiting_for``: what it waits for
  now, as ``cpctl --wait`` says it (``null`` once settled); ``drain``: a drain's counts;
- with ``detail`` (``get``, and each ``list`` item): ``spec``, ``state``,
  ``next_wake_at``, ``lease_owner``, ``lease_expires_at``.

docs/api.md lists them; a test holds the CLI and the API to the same keys.
"""

from __future__ import annotations

from typing import Any

from controlplane.store import queries
from controlplane.store.records import MachineRecord

#: The drain kind's name (``machines.drain.state.KIND``), spelled here so that the table
#: of ``cpctl list``, which needs only :func:`node_of`, imports no machine.
DRAIN = "drain"



def target_node(record: MachineRecord) -> str | None:
    """The node the operation was asked to move or restore to (``None``: no such node; a
    drain's ``node`` is the node it empties, its ``source_node``)."""
    if record.kind == DRAIN:
        return None
    for name in queries.TARGET_FIELDS:  # the fields `cpctl list --node` filters on
        value = record.spec.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def node_of(record: MachineRecord) -> str | None:
    """Where the operation ran or landed: a finished migration's final node, else the node
    a restore or resume was asked for, else the source's node (a drain: the node it
    empties)."""
    if record.kind == DRAIN:  # the node it empties
        drained = record.spec.get("node")
        return drained if isinstance(drained, str) and drained else record.source_node
    final = record.state.get("final_node")
    if isinstance(final, str) and final:
        return final
    if record.kind != "migration":
        asked = target_node(record)
        if asked is not None:
            return asked
    return record.source_node


def parent_of(record: MachineRecord) -> str | None:
    """The drain that started this migration, or ``None``.

    A child's id is ``child_id(drain id, pod uid)`` (``<drain id>-<12 hex digits>``), so
    the parent is read off the id and proven by recomputing it from the pod UID in the
    child's spec: no query, and a migration that merely looks like a child is not one.
    (Drain ids longer than 51 characters are truncated in their children's ids; cpctl
    makes 36-character UUIDs.)"""
    from controlplane.machines.drain.state import child_id

    prefix, dash, _ = record.id.rpartition("-")
    pod = record.spec.get("pod")
    if record.kind != "migration" or not dash or not isinstance(pod, dict):
        return None
    uid = pod.get("uid")
    return prefix if isinstance(uid, str) and child_id(prefix, uid) == record.id else None


def _final_pod(record: MachineRecord) -> str | None:
    """:func:`final_pod`, or ``None`` when this release cannot decode the state (one a
    newer release wrote, or a partial one a test made): a listing never fails on it."""
    from controlplane.app.waiting import final_pod

    try:
        return final_pod(record)
    except (TypeError, ValueError, KeyError):
        return None


def operation_json(record: MachineRecord, *, detail: bool = False) -> dict[str, Any]:
    """The operation's document (datetimes as objects: the renderer writes them ISO)."""
    from controlplane.app.drains import drain_summary
    from controlplane.app.waiting import settled, waiting_for

    out: dict[str, Any] = {
        "id": record.id, "kind": record.kind, "phase": record.phase,
        "terminal": record.terminal, "version": record.version,
        "workload": record.workload, "node": node_of(record),
        "source_node": record.source_node, "target_node": target_node(record),
        "pod": _final_pod(record), "held": record.held, "attempts": record.attempts,
        "created_at": record.created_at, "updated_at": record.updated_at,
        "parent": parent_of(record),
        "waiting_for": None if settled(record) else waiting_for(record),
    }
    if record.kind == DRAIN:
        out["drain"] = drain_summary(record)
    if detail:
        out.update(spec=record.spec, state=record.state, next_wake_at=record.next_wake_at,
                   lease_owner=record.lease_owner, lease_expires_at=record.lease_expires_at)
    return out
