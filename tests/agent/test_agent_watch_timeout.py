"""A restore pod created as the agent's watch times out is served from the watch, not a relist.

Invariant pinned (56 restored pods waited ~5 minutes for their agent in
the 10,000-migration run): when the pod watch of a node's agent reaches its
``timeoutSeconds`` while the server still has events queued for it (a busy server lags
its streams), those events reach the agent before the stream ends, and the agent acts
on them at once. Before the simulator's fix it closed the stream with a bookmark at its
newest version and dropped the queue: the agent resumed after the restore pod and found
it only at its next relist (600 s here, so this test would time out).

The kubelets are left out so that no later change of the pod re-delivers it (in the
benchmark nothing did either: the pod was already Running when its event was lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.machines.contract import protocol
from tests.agent.world import World, open_world

NS = "default"
ABSENT = "sha256:" + "0" * 64  # the agent acts by failing to pull it: no capture needed


@pytest.fixture
async def late_world(tmp_path: Path) -> AsyncIterator[tuple[World, list[float]]]:
    offset = [0.0]  # added to the watches' clock: the test moves time past a deadline
    loop = asyncio.get_running_loop()
    async with open_world(tmp_path, kubelets=False,
                          watch_clock=lambda: loop.time() + offset[0]) as w:
        yield w, offset


def bound_pod(w: World, name: str, annotations: dict[str, str]) -> None:
    w.cluster.store.create("pods", NS, {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": "node-2", "containers": [{"name": "main", "image": "pause"}]}})


async def test_a_restore_pod_queued_when_the_watch_times_out_reaches_its_agent_at_once(
        late_world: tuple[World, list[float]]) -> None:
    w, offset = late_world
    request = protocol.restore_request(artifact=f"{w.repo}@{ABSENT}", restore_key="m/r1",
                                       checkpoint_id=None, loader="{}")
    behind: list[str] = []

    def fall_behind() -> str | None:  # asked after every event a stream sends
        if not behind:
            behind.append("r1")
            bound_pod(w, "r1", request)  # queued on node-2's stream...
            offset[0] += 3600  # ...which is now past its deadline
        return None

    w.cluster.hub.interrupt = fall_behind
    bound_pod(w, "trigger", {})

    await w.cluster.wait_for(lambda: bool(w.annotations(NS, "r1").get(
        protocol.RESTORE_FAILURE)), limit_seconds=15, what="node-2's agent acting on r1")
    assert behind == ["r1"]
    assert w.agents["node-2"].stats.restores == 1
    assert len(w.agents["node-2"].stats.restore_delays) == 1
