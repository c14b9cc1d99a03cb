"""Runtime-backed nodes for the kubelet role: a pod bound to one runs real containers.

With ``cpctl sim nodes --runtime podman --runtime-root DIR`` every node of the role is
its own podman storage root (``DIR/<node>``, :class:`~drivers.podman.podman.PodmanNode`),
whose podman runs runc through the lazy-pages wrapper (``DIR/lazy-runc``,
:func:`~drivers.podman.lazy_runc.runtime_under`) unless told not to (``--plain-runc``):
podman records a container's runtime when it creates it, and only a container created
with the wrapper can later be migrated lazily:

- **start**: a pod that asks to be restored (``restore-artifact``, or ``restore-handoff``
  from the source agent's stream) is not started cold —
  the node agent restores its containers from the checkpoint, and the pod is reported
  ``Running`` once they run; any other pod's containers are pulled and started
  (``command``/``args``/plain ``env`` from the spec) and reported ``Running`` when they do;
- **relist** (every ``relist_seconds``, the kubelet's PLEG): a running pod's status is
  restated from its real containers (:func:`drivers.kubelet.containers.pod_status`) when
  it changed, and containers whose pod is gone (seen twice, so a pod the watch has not
  shown yet is not taken for gone) are removed;
- **finish**: a terminating pod's containers are removed before the kubelet's final delete.

Used by :class:`drivers.kubelet.role.KubeletRole`; runtime errors reach the role as
:class:`~drivers.podman.podman.RuntimeFailed` and are retried like a failed write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from controlplane.logs import get_logger
from controlplane.machines.contract import protocol
from drivers.kubelet import containers as rules
from drivers.podman.lazy_runc import runtime_under
from drivers.podman.podman import ContainerState, PodmanNode, container_name
from drivers.sim.objects import Obj, meta

log = get_logger("drivers.kubelet.podman_nodes")


def _spec_containers(pod: Obj) -> list[Obj]:
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]


def _name(pod: Obj, container: str) -> str:
    m = meta(pod)
    return container_name(str(m.get("namespace")), str(m.get("name")), str(m.get("uid")),
                          container)


def _env(container: Obj) -> dict[str, str]:
    return {str(e["name"]): str(e.get("value") or "") for e in container.get("env") or []
            if isinstance(e, dict) and "name" in e and "valueFrom" not in e}


def awaits_restore(pod: Obj) -> bool:
    """The pod asks the node agent to restore it (from the registry or a handoff): its
    containers come from the checkpoint, never from a cold start."""
    annotations = meta(pod).get("annotations") or {}
    return protocol.RESTORE_ARTIFACT in annotations or protocol.RESTORE_HANDOFF in annotations


class RuntimeNodes:
    """The role's nodes, each with its own podman."""

    def __init__(self, nodes: Mapping[str, PodmanNode]) -> None:
        self.nodes = dict(nodes)
        self._orphans: set[tuple[str, str]] = set()  # (node, container) gone at last relist

    @classmethod
    def under(cls, root: Path, names: Iterable[str], *, lazy: bool = True) -> RuntimeNodes:
        """The nodes ``root/<name>`` (``lazy``: with the lazy-pages runc wrapper)."""
        runtime = runtime_under(root, lazy=lazy)
        return cls({name: PodmanNode(root.resolve() / name, runtime=runtime)
                    for name in names})

    def backs(self, node: str) -> bool:
        return node in self.nodes

    async def _states(self, node: str, pod: Obj) -> dict[str, ContainerState | None]:
        runtime = self.nodes[node]
        found = {s.name: s for s in await runtime.states()}
        return {str(c["name"]): found.get(_name(pod, str(c["name"])))
                for c in _spec_containers(pod)}

    async def start(self, pod: Obj, node: str) -> Obj | None:
        """Run the pod's containers (or wait for their restore); the status fields to
        report once all run, ``None`` while they do not yet."""
        runtime = self.nodes[node]
        states = await self._states(node, pod)
        if not awaits_restore(pod):
            for spec in _spec_containers(pod):
                cname = str(spec["name"])
                state = states.get(cname)
                if state is not None and (state.running or state.checkpointed):
                    continue
                if state is not None:
                    await runtime.remove(state.name)
                image = str(spec.get("image") or "")
                await runtime.pull(image)
                await runtime.start(_name(pod, cname), image,
                                    command=[str(a) for a in spec.get("command") or []],
                                    args=[str(a) for a in spec.get("args") or []],
                                    env=_env(spec))
            states = await self._states(node, pod)
        if not states or not all(s is not None and s.running for s in states.values()):
            return None
        return rules.pod_status(pod, states)

    async def finish(self, pod: Obj, node: str) -> None:
        """Remove the pod's containers (the kubelet's kill, grace already spent)."""
        await self.nodes[node].remove(*(_name(pod, str(c["name"]))
                                        for c in _spec_containers(pod)))

    async def relist(self, pods: Iterable[Obj]) -> list[tuple[Obj, Obj]]:
        """One PLEG pass: ``(pod, status fields)`` for every running pod whose real
        containers now say something else; removes containers of pods long gone."""
        by_node: dict[str, list[Obj]] = {}
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node in self.nodes:
                by_node.setdefault(node, []).append(pod)
        updates: list[tuple[Obj, Obj]] = []
        orphans: set[tuple[str, str]] = set()
        for node, runtime in self.nodes.items():
            states = await runtime.states()
            known = {str(meta(p).get("uid")) for p in by_node.get(node, [])}
            for state in states:
                owner = state.owner
                if owner is not None and owner.uid not in known:
                    orphans.add((node, state.name))
            for pod in by_node.get(node, []):
                if (pod.get("status") or {}).get("phase") != "Running" or \
                        meta(pod).get("deletionTimestamp") is not None:
                    continue
                found = {s.name: s for s in states}
                mine = {str(c["name"]): found.get(_name(pod, str(c["name"])))
                        for c in _spec_containers(pod)}
                fields = rules.pod_status(pod, mine)
                if rules.changed(pod, fields):
                    updates.append((pod, fields))
        for node, name in sorted(orphans & self._orphans):
            log.info("removing a container whose pod is gone", node=node, container=name)
            await self.nodes[node].remove(name)
        self._orphans = orphans - self._orphans
        return updates
