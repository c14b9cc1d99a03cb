"""Many simulated nodes' agents in one process: the data plane of the scale benchmarks.

``python -m bench.sim_agents --kubeconfig K --layout DIR --workdir DIR --nodes 100``

Each node gets the real :class:`~drivers.agent.agent.NodeAgent` with the ``sim`` dumper
(the one ``python -m drivers.agent --dumper sim`` runs), its own pod watch scoped to its
node, pushing to the shared on-disk OCI layout — only the process is shared, which is
the lightest faithful way to run 100 agents on a 2-core machine (100 processes would
cost ~100 interpreters). Nodes are spread over several API connections because one
``kubernetes_asyncio`` client pools at most 100 connections and every watch holds one.
The agents' API requests are their own (this process), never the control plane's.
Prints one line when every agent serves; runs until SIGTERM/SIGINT; ``--stats FILE``
then writes the agents' summed counters (captures, pushed, restores, dumps...) and every
restore's delay from the pod's creation to its agent acting (``restore_delays``, s).
``--watch-timeout``/``--resync`` shorten the pod watches' cycle to reproduce, in a short
run, what only a long one reaches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections import Counter
from pathlib import Path

from controlplane.logs import configure as configure_logs
from drivers.agent import AgentSettings, NodeAgent, node_agent
from drivers.agent.sim import SimDumper
from drivers.kube import KubeDriver, KubeSettings
from drivers.registry import OciLayout

NODES_PER_CONNECTION = 25


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    names = [f"node-{i}" for i in range(1, args.nodes + 1)]
    # The data plane is not what is measured: no throttle.
    settings = KubeSettings(qps=0, watch_timeout=args.watch_timeout,
                            resync_seconds=args.resync)
    registry = OciLayout(Path(args.layout))
    async with contextlib.AsyncExitStack() as stack:
        drivers: list[KubeDriver] = []
        for _ in range(0, len(names), NODES_PER_CONNECTION):
            kube = await KubeDriver.connect(kubeconfig=args.kubeconfig, settings=settings)
            stack.push_async_callback(kube.close)
            drivers.append(kube)
        agents: list[NodeAgent] = []
        starting = []
        for i, node in enumerate(names):
            kube = drivers[i // NODES_PER_CONNECTION]
            starting.append(stack.enter_async_context(node_agent(
                client=kube.client, registry=registry, dumper=SimDumper, kube=settings,
                settings=AgentSettings(node, Path(args.workdir) / node,
                                       capture_timeout=args.timeout,
                                       restore_timeout=args.timeout))))
        agents.extend(await asyncio.gather(*starting))
        print(f"{len(names)} node agents serving with the sim dumper", flush=True)
        monitor = LagMonitor(agents)
        watching = asyncio.create_task(monitor.run(stop))
        await stop.wait()
        await watching
        if args.stats:
            totals: Counter[str] = Counter()
            delays: list[float] = []
            for agent in agents:
                delays.extend(agent.stats.restore_delays)
                for name, value in vars(agent.stats).items():
                    if isinstance(value, int):
                        totals[name] += value
                dumps = getattr(agent.dumper, "dumps", 0)
                totals["dumps"] += dumps if isinstance(dumps, int) else 0
            Path(args.stats).write_text(json.dumps({  # noqa: ASYNC240 (at exit)
                **totals, "restore_delays": sorted(delays), **monitor.figures()}))
    await registry.close()


class LagMonitor:
    """What bounds the agents' restore delays: this process's event-loop lag (how late a
    0.5 s timer fires: the 100 agents' CPU backlog) sampled over the run, and, for every
    restore delay over 2 s, when it was recorded (s since serving) and the lag then."""

    TICK = 0.5

    def __init__(self, agents: list[NodeAgent]) -> None:
        self.agents = agents
        self.lags: list[float] = []
        self.late: list[tuple[float, float, float]] = []  # (t, delay, lag at t)
        self._seen = [0] * len(agents)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        start = last = loop.time()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.TICK)
            now = loop.time()
            lag = max(0.0, now - last - self.TICK)
            self.lags.append(lag)
            last = now
            for i, agent in enumerate(self.agents):
                delays = agent.stats.restore_delays  # < its maxlen per node in a bench
                fresh = len(delays) - self._seen[i]
                self._seen[i] = len(delays)
                recent = list(delays)[-fresh:] if fresh > 0 else []
                self.late.extend((round(now - start, 1), round(d, 2), round(lag, 2))
                                 for d in recent if d > 2.0)

    def figures(self) -> dict[str, object]:
        lags = sorted(self.lags) or [0.0]
        return {"loop_lag_p99_s": round(lags[int(0.99 * (len(lags) - 1))], 3),
                "loop_lag_max_s": round(lags[-1], 3), "late_restores": self.late}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--layout", required=True, help="the shared OCI layout directory")
    p.add_argument("--workdir", required=True, help="scratch space (one folder per node)")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--stats", help="on exit, write the agents' summed counters here (JSON)")
    p.add_argument("--timeout", type=float, default=600.0, help="capture/restore deadline")
    defaults = KubeSettings()
    p.add_argument("--watch-timeout", type=float, default=defaults.watch_timeout,
                   help="the pod watches' timeoutSeconds")
    p.add_argument("--resync", type=float, default=defaults.resync_seconds,
                   help="the pod caches' relist period (s)")
    configure_logs("json", "warning")  # to stderr; the agents' info lines are noise here
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
