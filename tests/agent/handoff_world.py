"""Helpers of the agent handoff tests: agents holding the shared key, a capture that asks
for a handoff, a pod created with ``restore-handoff``, and what the agents reported.

Requests are written with the protocol's own constructors, as the control plane would;
waiting is on store changes. Used by ``tests/agent/test_agent_handoff*.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from controlplane.machines.contract import protocol
from drivers.agent.handoffs import HandoffSettings
from tests.agent.world import World, open_world

NS = "default"
KEY = bytes(range(32))
TARGET = "node-2"
#: Both agents hold the key; the target re-reads the source pod every 20 ms while it waits.
HANDOFF = {node: HandoffSettings(KEY, "127.0.0.1", 0, poll=0.02)
           for node in ("node-1", "node-2")}


@contextlib.asynccontextmanager
async def handoff_world(tmp_path: Path, *, registry: str = "layout",
                        handoff: dict[str, HandoffSettings] | None = None,
                        capture_timeout: float = 30,
                        restore_timeout: float = 15) -> AsyncIterator[World]:
    async with open_world(tmp_path, registry=registry,
                          handoff=HANDOFF if handoff is None else handoff,
                          capture_timeout=capture_timeout,
                          restore_timeout=restore_timeout) as w:
        yield w


async def source(w: World, name: str = "app", *, marker: str = "counter=41") -> str:
    """A running workload on node-1; its UID."""
    w.cluster.create_pod(NS, name, node="node-1", marker=marker)
    await w.running(NS, name)
    return w.uid(NS, name)


def handoff_value(checkpoint_id: str, target: str = TARGET) -> str:
    return protocol.capture_request(checkpoint_id=checkpoint_id, artifact="", source_uid="",
                                    containers=(), quiesce=True, saver="",
                                    handoff_to=target)[protocol.CAPTURE_HANDOFF]


def capture_with_handoff(w: World, checkpoint_id: str, *, name: str = "app",
                         target: str = TARGET, quiesce: bool = True) -> str:
    """The capture request, asking for a handoff to ``target``; the artifact's tag ref."""
    return w.request_capture(NS, name, checkpoint_id, quiesce=quiesce, extra={
        protocol.CAPTURE_HANDOFF: handoff_value(checkpoint_id, target)})


def restore_pod(w: World, name: str, checkpoint_id: str, *, source_name: str = "app",
                uid: str | None = None, extra: dict[str, str] | None = None) -> None:
    """A pod on node-2 asking to be restored from the source agent's stream."""
    notes = protocol.restore_handoff_request(
        checkpoint_id=checkpoint_id, source=f"{NS}/{source_name}",
        source_uid=uid or w.uid(NS, source_name), restore_key=f"m/{name}", loader="{}")
    w.cluster.create_pod(NS, name, node=TARGET, annotations={**notes, **(extra or {})})


async def restored(w: World, name: str, *, limit: float = 20) -> dict[str, str]:
    """The pod's annotations once the agent restored it or reported a failure."""
    await w.cluster.wait_for(
        lambda: bool(w.annotations(NS, name).get(protocol.INSTANCE_ID, "").startswith(
            w.uid(NS, name)) or w.annotations(NS, name).get(protocol.RESTORE_FAILURE)),
        limit_seconds=limit, what=f"{name} restored or failed")
    return w.annotations(NS, name)


def first_change(w: World, name: str, key: str, value: str | None = None) -> int:
    """Index in the store's history of the first change of pod ``name`` carrying ``key``
    (with ``value``, if given); -1 if none did."""
    for index, change in enumerate(w.history):
        meta = change.obj.get("metadata") or {}
        if change.resource != "pods" or (meta.get("namespace"), meta.get("name")) != (
                NS, name):
            continue
        notes = meta.get("annotations") or {}
        if key in notes and (value is None or notes[key] == value):
            return index
    return -1
