"""A simulated Kubernetes cluster on loopback: ``async with SimCluster(nodes=3) as cluster``.

Starts the simulated API server (:mod:`drivers.sim.server`) on ``127.0.0.1:0`` with the
namespaces ``default`` and ``kube-system`` and ``nodes`` Ready nodes (``node-1``...,
4 CPUs and 8Gi each unless told otherwise), plus the simulated scheduler and kubelets
(:mod:`drivers.sim.kubelet`) and the workload controllers (:mod:`drivers.sim.controllers`;
``controllers=False`` leaves them out); ``kubelets=False`` leaves all of them out (no
nodes either), for the kubelet role (:mod:`drivers.kubelet`) to do their job through the
API. Point any Kubernetes client at it with :meth:`SimCluster.write_kubeconfig`.

Test conveniences act on the store directly (not counted as API requests): pods
(:meth:`create_pod`, :meth:`pod`), the simulated workload state (:meth:`set_marker`,
:meth:`marker`: the ``sim.controlplane.dev/marker`` annotation a migration must carry
over), node operations (:meth:`fail_node`, :meth:`drain`...), fault hooks
(:attr:`faults`), :meth:`wait_for` (await a condition on store changes, no polling) and
:meth:`settle` (run the kubelets and controllers until quiescent, when transitions take
no time).

Called by tests, demos, benchmarks and ``cpctl sim up`` (through
:mod:`controlplane.wiring.sim`).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from aiohttp import web

from drivers.sim.controllers import Controllers
from drivers.sim.faults import Faults
from drivers.sim.kubelet import Kubelets
from drivers.sim.objects import MARKER, Obj, meta
from drivers.sim.server import SimServer
from drivers.sim.store import Change, Store
from drivers.sim.watch import WatchHub

DEFAULT_IMAGE = "registry.k8s.io/pause:3.9"


class SimCluster:
    """The simulated cluster: API server, scheduler, kubelets, faults. Loopback only."""

    def __init__(self, nodes: int | Sequence[str] = 3, *, host: str = "127.0.0.1",
                 port: int = 0, node_cpu: str = "4", node_memory: str = "8Gi",
                 node_pods: int = 110, namespaces: Sequence[str] = ("default", "kube-system"),
                 start_seconds: float = 0.0, stop_seconds: float = 0.0,
                 bookmark_seconds: float = 30.0, history_limit: int = 100_000,
                 seed: int = 0, kubelets: bool = True, controllers: bool = True) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the simulator serves loopback only")
        self.node_names = ([f"node-{i}" for i in range(1, nodes + 1)] if isinstance(nodes, int)
                           else list(nodes))
        self.host, self._port = host, port
        self.store = Store(history_limit=history_limit)
        self.hub = WatchHub(self.store, bookmark_seconds=bookmark_seconds)
        self.faults = Faults(self.store, self.hub, seed=seed)
        self.server = SimServer(self.store, self.hub, self.faults)
        self.kubelets = Kubelets(self.store, start_seconds=start_seconds,
                                 stop_seconds=stop_seconds)
        self._namespaces = tuple(namespaces)
        self._node_size = (node_cpu, node_memory)
        self._node_pods = node_pods
        # False: no in-process scheduler or kubelets and no nodes; the kubelet role
        # (drivers.kubelet, ``cpctl sim nodes``) registers node_names and does their job
        # through the API, as it does against a real API server.
        self.in_process_kubelets = kubelets
        # The workload controllers run where the kubelets do: without them the world is
        # the kubelet role's, and a real control plane's controllers are not there either.
        self.controllers = Controllers(self.store) if kubelets and controllers else None
        self._runner: web.AppRunner | None = None

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        for name in self._namespaces:
            self.store.create("namespaces", "", {"metadata": {"name": name}})
        if self.in_process_kubelets:
            for name in self.node_names:
                self.kubelets.add_node(name, cpu=self._node_size[0],
                                       memory=self._node_size[1], pods=self._node_pods)
            self.kubelets.start()
        if self.controllers is not None:
            self.controllers.start()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        self._port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.server.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        self.server.closing.set()
        self.hub.shutdown()
        await self.kubelets.stop()
        if self.controllers is not None:
            await self.controllers.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    @property
    def requests(self) -> Counter[str]:
        """API requests the server received, by verb (get, list, watch, create...)."""
        return self.server.requests

    def kubeconfig(self, *, namespace: str = "default") -> Obj:
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "sim",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {"token": "sim"}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim",
                                                     "namespace": namespace}}],
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig (JSON, which is YAML) that points at this cluster."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.kubeconfig(), indent=2) + "\n")
        return out

    # --- test conveniences -------------------------------------------------------------

    def create_pod(self, namespace: str, name: str, *, node: str | None = None,
                   image: str = DEFAULT_IMAGE, labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None, cpu: str | None = None,
                   memory: str | None = None, marker: str | None = None,
                   command: Sequence[str] = ()) -> Obj:
        """Create a pod (``node``: required node affinity to it) straight in the store."""
        ann = dict(annotations or {})
        if marker is not None:
            ann[MARKER] = marker
        requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
        container: Obj = {"name": "main", "image": image}
        if command:
            container["command"] = list(command)
        if requests:
            container["resources"] = {"requests": requests}
        spec: Obj = {"containers": [container]}
        if node is not None:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                 {"nodeSelectorTerms": [{"matchExpressions": [
                                                     {"key": "kubernetes.io/hostname",
                                                      "operator": "In", "values": [node]}]}]}}}
        return self.store.create("pods", namespace, {
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": ann},
            "spec": spec})

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.store.find("pods", namespace, name)

    def set_marker(self, namespace: str, name: str, value: str) -> Obj:
        """Set the pod's simulated workload state (the marker annotation)."""
        def change(pod: Obj) -> None:
            meta(pod).setdefault("annotations", {})[MARKER] = value
        out = self.store.mutate("pods", namespace, name, change)
        if out is None:
            raise KeyError(f"no pod {namespace}/{name}")
        return out

    def marker(self, namespace: str, name: str) -> str | None:
        pod = self.pod(namespace, name)
        return None if pod is None else (meta(pod).get("annotations") or {}).get(MARKER)

    async def wait_for(self, check: Callable[[], bool], *, limit_seconds: float = 10.0,
                       what: str = "condition") -> None:
        """Wait until ``check()`` holds, re-checking on every store change."""
        changed = asyncio.Event()

        def on_change(_: Change) -> None:
            changed.set()

        unsubscribe = self.store.subscribe(on_change)
        try:
            async with asyncio.timeout(limit_seconds):
                while not check():
                    await changed.wait()
                    changed.clear()
        except TimeoutError:
            raise TimeoutError(f"{what} not reached within {limit_seconds}s") from None
        finally:
            unsubscribe()

    def settle(self, *, max_passes: int = 50) -> int:
        """Run the scheduler, kubelets and controllers until nothing changes; returns the
        passes that wrote (see ``Kubelets.settle``: with zero-time transitions the cluster
        is then quiescent, a ReplicaSet's pods created, running and counted)."""
        if self.controllers is None:
            return self.kubelets.settle(max_passes=max_passes)
        for done in range(max_passes):
            before = self.store.rv
            self.kubelets.reconcile()
            self.controllers.reconcile()
            if self.store.rv == before:
                return done
        raise RuntimeError(f"the simulated cluster did not settle in {max_passes} passes")

    def fail_node(self, name: str) -> Obj:
        return self.kubelets.fail_node(name)

    def recover_node(self, name: str) -> Obj:
        return self.kubelets.recover_node(name)

    def cordon(self, name: str) -> Obj:
        return self.kubelets.cordon(name)

    def uncordon(self, name: str) -> Obj:
        return self.kubelets.uncordon(name)

    def taint(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> Obj:
        return self.kubelets.taint(name, key, value, effect)

    def drain(self, name: str, *, grace: int | None = None) -> list[str]:
        return self.kubelets.drain(name, grace=grace)

    def add_node(self, name: str, *, cpu: str = "4", memory: str = "8Gi",
                 labels: Mapping[str, str] | None = None) -> Obj:
        return self.kubelets.add_node(name, cpu=cpu, memory=memory, labels=labels)
