"""A node agent's own ``/metrics`` (Prometheus text format), served with
``python -m drivers.agent --metrics-listen HOST:PORT``.

What only the agent knows: that it serves its node (``controlplane_agent_serving{node}``,
1 while its pod watch runs: the series an alert joins with the control plane's per-node
work to see a node whose agent is gone, ``docs/alerts.md``), and its captures and
restores, started and failed, by node. Every series carries the agent's own ``node``
label, so nothing depends on the scraper's relabelling. Counters start at 0 with the
process (``increase()`` handles the restart). Called by :mod:`drivers.agent.__main__`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from aiohttp import web

from controlplane.exposition import CONTENT_TYPE, Exposition
from drivers.agent.agent import AgentStats

#: (name, AgentStats field, help) of the agent's counters, in exposition order.
COUNTERS = (
    ("controlplane_agent_captures_total", "captures",
     "Capture jobs this agent started (checkpoint, migration and suspend captures)."),
    ("controlplane_agent_captures_pushed_total", "pushed",
     "Captures this agent pushed to the registry and reported Pushed."),
    ("controlplane_agent_captures_failed_total", "failed",
     "Captures that failed on this agent (dumper, registry, deadline, withdrawn), "
     "reported Failed with the workload released."),
    ("controlplane_agent_captures_refused_total", "refused",
     "Capture requests this agent refused (wrong node, UID or version)."),
    ("controlplane_agent_restores_total", "restores", "Restore jobs this agent started."),
    ("controlplane_agent_restore_failures_total", "restore_failures",
     "Restores that failed on this agent (pull, provenance, dumper, deadline), marked "
     "restore-failure on the pod."),
)


def render(node: str, stats: AgentStats, *, started: float) -> str:
    """The agent's exposition: ``started`` is the ``time.monotonic()`` of its start."""
    out = Exposition()
    out.family("controlplane_agent_serving", "gauge",
               "1 while this node agent watches its node's pods and serves their requests.")
    out.sample("controlplane_agent_serving", 1, node=node)
    for name, attribute, text in COUNTERS:
        out.family(name, "counter", text)
        out.sample(name, getattr(stats, attribute), node=node)
    out.family("controlplane_agent_uptime_seconds", "gauge", "Seconds since the agent started.")
    out.sample("controlplane_agent_uptime_seconds", round(time.monotonic() - started, 3),
               node=node)
    return out.text()


@contextlib.asynccontextmanager
async def metrics_endpoint(node: str, stats: AgentStats, host: str,
                           port: int) -> AsyncIterator[str]:
    """Serve ``/metrics`` on ``host:port`` (0: a free port) while the body runs; yields
    the bound ``host:port``. No token: counters only, no pod or workload names."""
    started = time.monotonic()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(node, stats, started=started),
                            headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0] if runner.addresses else (host, port)
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
        yield f"{shown}:{bound[1]}"
    finally:
        await runner.cleanup()
