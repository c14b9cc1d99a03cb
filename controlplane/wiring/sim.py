"""The simulator's and the kubelet role's servers, for ``cpctl sim up`` and ``cpctl sim
nodes``: the CLI parses, this module reaches into ``drivers`` and runs them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from drivers.kubelet.options import RoleOptions
from drivers.kubelet.runtime import RuntimeNodes
from drivers.kubelet.serve import serve as serve_role
from drivers.sim.__main__ import parse_args
from drivers.sim.__main__ import serve as serve_simulator


async def run_simulator(*, nodes: int, port: int, kubeconfig: str, kubelets: bool) -> None:
    """The simulated API server (with its nodes and kubelets unless ``kubelets`` is off)."""
    flags = ["up", "--nodes", str(nodes), "--port", str(port), "--kubeconfig", kubeconfig]
    await serve_simulator(parse_args(flags if kubelets else [*flags, "--no-kubelets"]))


async def run_kubelet_role(*, nodes: tuple[str, ...], cpu: str, memory: str, pods: int,
                           start_seconds: float, stop_seconds: float, ready_timeout: float,
                           kubeconfig: str | None, context: str | None,
                           on_ready: Callable[[tuple[str, ...], str], None],
                           stop: asyncio.Event, runtime_root: Path | None = None,
                           schedule: bool = True) -> None:
    """The kubelet role against any API server until ``stop`` (options checked first);
    with ``runtime_root``, every node runs real containers under ``runtime_root/<node>``."""
    options = RoleOptions(nodes=nodes, cpu=cpu, memory=memory, pods=pods,
                          start_seconds=start_seconds, stop_seconds=stop_seconds,
                          ready_timeout=ready_timeout, schedule=schedule).check()
    runtime = None if runtime_root is None else RuntimeNodes.under(runtime_root, nodes)
    await serve_role(options, kubeconfig=kubeconfig, context=context, on_ready=on_ready,
                     stop=stop, runtime=runtime)
