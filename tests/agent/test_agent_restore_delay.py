"""The agent measures how late it acts on a restore pod: from the pod's creation, not its sight.

Invariant pinned: :attr:`AgentStats.restore_delays` gets one figure per restore the agent
starts, the seconds from the pod's ``metadata.creationTimestamp`` to the agent's clock
when it starts — so a pod whose watch event reached the agent late (served at a relist
instead of from the watch) shows up as a large delay, which a delay counted from the
agent's first sight of the pod would hide. The scale benchmark reports these figures.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from controlplane.clock import FakeClock
from controlplane.machines.contract import protocol
from drivers.agent import AgentSettings, NodeAgent
from drivers.agent.dumper import Dumper
from drivers.agent.pods import PodPatcher
from drivers.registry.port import Registry

CREATED = datetime(2026, 11, 25, 8, 0, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32


def restore_pod(*, node: str, uid: str = "uid-r1") -> dict[str, Any]:
    notes = protocol.restore_request(artifact=f"registry.test/checkpoints/app@{DIGEST}",
                                     restore_key="m/app-r1", checkpoint_id="ck-1", loader="{}")
    return {"metadata": {"namespace": "default", "name": "app-r1", "uid": uid,
                         "resourceVersion": "7", "annotations": notes,
                         "creationTimestamp": CREATED.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]},
            "status": {"phase": "Running"}}


def agent(tmp_path: Path, clock: FakeClock) -> NodeAgent:
    # The restore jobs are cancelled before they run: no patcher, registry or dumper call.
    return NodeAgent(AgentSettings("node-2", tmp_path), clock=clock,
                     patcher=cast(PodPatcher, object()), registry=cast(Registry, object()),
                     dumper=cast(Dumper, object()))


async def test_a_restore_started_late_records_the_delay_since_the_pods_creation(
        tmp_path: Path) -> None:
    clock = FakeClock(CREATED)
    a = agent(tmp_path, clock)
    clock.advance(293.5)  # the event came at a relist, ~5 minutes after the creation
    a.on_change(None, restore_pod(node="node-2"))
    a.on_change(restore_pod(node="node-2"), restore_pod(node="node-2"))  # seen again
    await a.stop()
    assert list(a.stats.restore_delays) == [293.5]


async def test_a_pod_on_another_node_records_no_delay(tmp_path: Path) -> None:
    clock = FakeClock(CREATED)
    a = agent(tmp_path, clock)
    a.on_change(None, restore_pod(node="node-1"))
    await a.stop()
    assert list(a.stats.restore_delays) == []
