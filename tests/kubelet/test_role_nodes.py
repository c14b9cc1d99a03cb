"""The role keeps its nodes: heartbeats refresh ``Ready`` and a deleted node comes back.
Simulator only (the heartbeat is shortened here; the real server is shared)."""

from __future__ import annotations

from pathlib import Path

from drivers.kube.resources import NODES
from drivers.kubelet import KubeletRole
from drivers.sim import SimCluster
from drivers.sim.objects import condition
from tests.kubelet.world import admin_client, role_options


async def test_heartbeats_keep_nodes_ready_and_a_deleted_node_is_registered_again(
        tmp_path: Path) -> None:
    async with SimCluster(nodes=["node-1"], kubelets=False) as sim:
        api = await admin_client(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        role = KubeletRole(api, role_options(nodes=("node-1",), heartbeat_seconds=0.05))
        try:
            await role.start()
            first = await api.get(NODES, "node-1")
            beat = (condition(first, "Ready") or {}).get("lastHeartbeatTime")

            def heartbeat() -> object:
                stored = sim.store.find("nodes", "", "node-1") or {}
                return (condition(stored, "Ready") or {}).get("lastHeartbeatTime")

            # Second precision: a heartbeat in the next second is a visible change.
            await sim.wait_for(lambda: heartbeat() != beat, what="a newer heartbeat")
            await api.delete(NODES, "node-1")
            await sim.wait_for(lambda: sim.store.find("nodes", "", "node-1") is not None
                               and sim.store.find("nodes", "", "node-1")["metadata"]["uid"]
                               != first["metadata"]["uid"], what="node-1 registered again")
            again = await api.get(NODES, "node-1")
            assert (condition(again, "Ready") or {}).get("status") == "True"
            assert again["status"]["allocatable"]["pods"] == "110"
        finally:
            await role.stop()
            await api.client.close()
