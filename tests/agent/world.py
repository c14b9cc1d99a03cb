"""A simulated cluster with a node agent per node and a registry: the agent tests' world.

:func:`open_world` starts :class:`~drivers.sim.SimCluster` (2 nodes), one
:func:`~drivers.agent.node_agent` per node (the sim dumper, or whatever the test
passes), connected through the Kubernetes driver's client to the simulator's API, and a
registry backend: the on-disk OCI layout or a real registry on loopback. Helpers write
requests the way the control plane does (the protocol's own constructors) and read
what the agents report; waiting is on store changes, never by sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.machines.contract import protocol
from drivers.agent import AgentSettings, NodeAgent, node_agent
from drivers.agent.handoffs import HandoffSettings
from drivers.agent.pods import PodPatcher
from drivers.agent.runner import DumperFactory
from drivers.agent.sealing import Sealing
from drivers.agent.sim import SimDumper
from drivers.kube import KubeDriver, KubeSettings
from drivers.sim import SimCluster
from drivers.sim.store import Change
from tests.registry.backends import Backend, open_backend

KUBE = KubeSettings(backoff_initial=0.05, backoff_max=0.5, sync_timeout=10)


@dataclass
class World:
    cluster: SimCluster
    backend: Backend
    agents: dict[str, NodeAgent]
    dumpers: dict[str, Any]
    history: list[Change] = field(default_factory=list)

    @property
    def repo(self) -> str:
        return self.backend.repo("checkpoints/app")

    def annotations(self, ns: str, name: str) -> dict[str, str]:
        pod = self.cluster.pod(ns, name)
        return dict(((pod or {}).get("metadata") or {}).get("annotations") or {})

    def uid(self, ns: str, name: str) -> str:
        pod = self.cluster.pod(ns, name)
        assert pod is not None
        return str(pod["metadata"]["uid"])

    def annotate(self, ns: str, name: str, changes: Mapping[str, str | None]) -> None:
        def change(pod: dict[str, Any]) -> None:
            notes = pod["metadata"].setdefault("annotations", {})
            for k, v in changes.items():
                if v is None:
                    notes.pop(k, None)
                else:
                    notes[k] = v
        self.cluster.store.mutate("pods", ns, name, change)

    def request_capture(self, ns: str, name: str, checkpoint_id: str, *,
                        tag: str | None = None, uid: str | None = None, quiesce: bool = False,
                        extra: Mapping[str, str] | None = None) -> str:
        artifact = f"{self.repo}:{tag or checkpoint_id}"
        notes = protocol.capture_request(checkpoint_id=checkpoint_id, artifact=artifact,
                                         source_uid=uid or self.uid(ns, name), containers=(),
                                         quiesce=quiesce, saver="{}")
        self.annotate(ns, name, {**notes, **(extra or {})})
        return artifact

    def withdraw(self, ns: str, name: str) -> None:
        self.annotate(ns, name, {k: None for k in protocol.CAPTURE_REQUEST_KEYS})

    async def running(self, ns: str, name: str) -> None:
        await self.cluster.wait_for(
            lambda: ((self.cluster.pod(ns, name) or {}).get("status") or {}).get("phase")
            == "Running", what=f"{ns}/{name} running")

    async def report(self, ns: str, name: str, *states: str, limit: float = 15) -> str:
        """Wait until the pod's report is in one of ``states``; return it."""
        await self.cluster.wait_for(
            lambda: self.annotations(ns, name).get(protocol.REPORT_STATE) in states,
            limit_seconds=limit, what=f"{ns}/{name} report in {states}")
        return self.annotations(ns, name)[protocol.REPORT_STATE]

    def states_seen(self, ns: str, name: str) -> list[str]:
        """Every report state the pod went through, in order (repeats collapsed)."""
        out: list[str] = []
        for change in self.history:
            meta = change.obj.get("metadata") or {}
            if change.resource != "pods" or (meta.get("namespace"), meta.get("name")) != (
                    ns, name):
                continue
            state = (meta.get("annotations") or {}).get(protocol.REPORT_STATE)
            if state and (not out or out[-1] != state):
                out.append(state)
        return out


def sim_dumper(**kwargs: Any) -> Callable[[PodPatcher], SimDumper]:
    return lambda patcher: SimDumper(patcher, **kwargs)


@contextlib.asynccontextmanager
async def open_world(tmp_path: Path, *, registry: str = "layout",
                     dumpers: Mapping[str, DumperFactory] | None = None,
                     capture_timeout: float = 30, restore_timeout: float = 30,
                     allow_delete: bool = True, parallel: int = 4, kubelets: bool = True,
                     watch_clock: Callable[[], float] | None = None,
                     sealing: Mapping[str, Sealing] | None = None,
                     handoff: Mapping[str, HandoffSettings] | None = None
                     ) -> AsyncIterator[World]:
    """``handoff``: per node, the agent's handoff (none: started without --handoff-key)."""
    async with SimCluster(nodes=2, kubelets=kubelets) as cluster:
        cluster.hub.clock = watch_clock  # the watches' deadlines (before any is opened)
        kubeconfig = cluster.write_kubeconfig(tmp_path / "sim.kubeconfig")
        kube = await KubeDriver.connect(kubeconfig=str(kubeconfig), settings=KUBE)
        history: list[Change] = []
        unsubscribe = cluster.store.subscribe(history.append)
        try:
            async for backend in open_backend(registry, tmp_path, delete=allow_delete):
                async with contextlib.AsyncExitStack() as stack:
                    agents: dict[str, NodeAgent] = {}
                    for node in cluster.node_names:
                        factory = (dumpers or {}).get(node, sim_dumper())
                        settings = AgentSettings(node, tmp_path / "work" / node,
                                                 capture_timeout=capture_timeout,
                                                 restore_timeout=restore_timeout,
                                                 parallel=parallel)
                        agents[node] = await stack.enter_async_context(node_agent(
                            client=kube.client, settings=settings, registry=backend.registry,
                            dumper=factory, kube=KUBE, sealing=(sealing or {}).get(node),
                            handoff=(handoff or {}).get(node)))
                    yield World(cluster, backend, agents,
                                {n: a.dumper for n, a in agents.items()}, history)
        finally:
            unsubscribe()
            await kube.close()
