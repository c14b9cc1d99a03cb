"""The simulator's and the kubelet role's servers, for ``cpctl sim up`` and ``cpctl sim
nodes``: the CLI parses, this module checks the values, reaches into ``drivers`` and runs
them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from controlplane.errors import UsageError
from drivers.kubelet.options import RoleOptions
from drivers.kubelet.podman_nodes import RuntimeNodes
from drivers.kubelet.serve import serve as serve_role
from drivers.sim import faultspec
from drivers.sim.cluster import SimCluster

#: More simulated nodes than this is a typo, not a cluster (the benchmarks use 100).
MAX_SIM_NODES = 10_000


def check_simulator(*, nodes: int, port: int, node_cpu: str, node_memory: str,
                    node_pods: int, start_seconds: float, stop_seconds: float,
                    faults: Sequence[str]) -> list[faultspec.FaultSpec]:
    """The parsed ``--fault`` specs when every value of ``cpctl sim up`` is usable, else a
    :class:`UsageError` naming the flag. The node shape and pod delays are checked by the
    kubelet role's rules: the simulator's nodes and the role's are the same nodes."""
    if not 1 <= nodes <= MAX_SIM_NODES:
        raise UsageError(f"--nodes: {nodes} is not between 1 and {MAX_SIM_NODES}",
                         hint="pass e.g. --nodes 3 for node-1..node-3")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: {port} is not a TCP port",
                         hint="pass e.g. --port 6443, or 0 for any free one")
    RoleOptions(nodes=tuple(f"node-{i}" for i in range(1, nodes + 1)), cpu=node_cpu,
                memory=node_memory, pods=node_pods, start_seconds=start_seconds,
                stop_seconds=stop_seconds).check()
    specs = []
    for text in faults:
        try:
            specs.append(faultspec.parse(text))
        except ValueError as exc:
            raise UsageError(f"--fault: {exc}", hint="e.g. --fault error,verb=get,rate=0.1,"
                             "code=503; every kind and key: docs/simulator.md") from None
    return specs


async def run_simulator(*, nodes: int, port: int, kubeconfig: str | None, kubelets: bool,
                        node_cpu: str, node_memory: str, node_pods: int,
                        start_seconds: float, stop_seconds: float, faults: Sequence[str],
                        seed: int, on_ready: Callable[[str, Path | None], None],
                        stop: asyncio.Event) -> None:
    """The simulated API server (with its nodes and kubelets unless ``kubelets`` is off)
    until ``stop``: values checked first (:func:`check_simulator`), the ``faults``
    installed, the kubeconfig written, then ``on_ready(url, kubeconfig path)``."""
    specs = check_simulator(nodes=nodes, port=port, node_cpu=node_cpu,
                            node_memory=node_memory, node_pods=node_pods,
                            start_seconds=start_seconds, stop_seconds=stop_seconds,
                            faults=faults)
    async with SimCluster(nodes=nodes, port=port, node_cpu=node_cpu, node_memory=node_memory,
                          node_pods=node_pods, start_seconds=start_seconds,
                          stop_seconds=stop_seconds, seed=seed, kubelets=kubelets) as cluster:
        for spec in specs:
            spec.install(cluster.faults)
        path = None
        if kubeconfig:
            try:
                path = cluster.write_kubeconfig(kubeconfig)
            except OSError as exc:
                raise UsageError(f"--kubeconfig {kubeconfig}: cannot write it ({exc})",
                                 hint="pass a path in a writable directory") from None
        on_ready(cluster.url, path)
        await stop.wait()


async def run_kubelet_role(*, nodes: tuple[str, ...], cpu: str, memory: str, pods: int,
                           start_seconds: float, stop_seconds: float, ready_timeout: float,
                           kubeconfig: str | None, context: str | None,
                           on_ready: Callable[[tuple[str, ...], str], None],
                           stop: asyncio.Event, runtime_root: Path | None = None,
                           schedule: bool = True, lazy_runtime: bool = True) -> None:
    """The kubelet role against any API server until ``stop`` (options checked first);
    with ``runtime_root``, every node runs real containers under ``runtime_root/<node>``
    (``lazy_runtime``: created with the lazy-pages runc wrapper, so they can migrate
    lazily)."""
    options = RoleOptions(nodes=nodes, cpu=cpu, memory=memory, pods=pods,
                          start_seconds=start_seconds, stop_seconds=stop_seconds,
                          ready_timeout=ready_timeout, schedule=schedule).check()
    runtime = None if runtime_root is None else RuntimeNodes.under(runtime_root, nodes,
                                                                   lazy=lazy_runtime)
    await serve_role(options, kubeconfig=kubeconfig, context=context, on_ready=on_ready,
                     stop=stop, runtime=runtime)
