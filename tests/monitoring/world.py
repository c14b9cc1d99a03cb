"""The product deployed and watched by a real Prometheus: a node agent per node and
``cpctl worker`` as processes (an agent is killed with SIGKILL), each serving its
``/metrics`` on a free loopback port; the simulated cluster (two nodes) and the API
(``make_app`` served as ``cpctl serve --metrics-public`` serves it) on an event loop in a
thread of the test's process, which saves two interpreter starts; and
:class:`~tests.monitoring.prometheus.Prometheus` scraping all of them every second with
the shipped rules (every ``for:`` shortened, :func:`~tests.monitoring.tools.rules_for_test`).
Processes are started and stopped by :class:`tests.support.process_deployment.Deployment`.
Used by ``tests/monitoring/test_prometheus_end_to_end.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from controlplane.api.app import make_app
from controlplane.api.serving import make_runner
from controlplane.machines.catalog import default_kinds
from controlplane.store.database import Database, open_database
from drivers.sim import SimCluster
from tests.monitoring.prometheus import Prometheus
from tests.monitoring.tools import rules_for_test
from tests.support.cpctl import in_process, upgraded
from tests.support.process_deployment import REPO, Deployment
from tests.support.waiting import wait_for

NODES = ("node-1", "node-2")
TOKEN = "monitoring-test-token-8d2e"
METRICS = re.compile(r"metrics http://(\S+)/metrics")
T = TypeVar("T")
#: The ``for:`` every alert gets in the test's copy of the rules.
SHORT_FOR = "1s"


@dataclass
class Monitored:
    """The deployment, where each part serves its metrics, and the Prometheus on them."""

    d: Deployment
    prometheus: Prometheus
    api_url: str
    worker_metrics: str
    agent_metrics: dict[str, str] = field(default_factory=dict)
    started: float = 0.0  # Unix time the Prometheus started scraping

    def cpctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``cpctl`` verb on the deployment's database, run in this process (the verbs
        are not what these tests prove; an interpreter start each would cost ~1 s)."""
        return in_process(self.d.db, *args)

    def cluster(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``cpctl`` verb that needs the cluster and the registry."""
        return self.cpctl(*args, "--repository", REPO, *self.d.cluster_args())

    def kill_agent(self, node: str) -> None:
        proc = self.d.agents[node]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def restart_agent(self, node: str, generation: int) -> None:
        """Start ``node``'s agent again (its metrics on a new port, as a restarted pod
        gets a new address) and let Prometheus discover it there."""
        self.agent_metrics[node] = start_agent(self.d, node, f"agent-{node}-{generation}")
        self.prometheus.discover(self.agent_metrics)


def start_agent(d: Deployment, node: str, name: str) -> str:
    """A node agent with its ``/metrics`` on a free port; that ``host:port``."""
    return _served(_agent(d, node, name), METRICS, name, d)


def _agent(d: Deployment, node: str, name: str) -> subprocess.Popen[str]:
    d.agents[node] = agent = d.start(
        name, "drivers.agent", "--node", node, "--kubeconfig", str(d.kubeconfig),
        "--layout", str(d.layout), "--dumper", "sim", "--workdir", str(d.tmp / "work" / node),
        "--metrics-listen", "127.0.0.1:0")
    return agent


def _served(proc: subprocess.Popen[str], pattern: re.Pattern[str], name: str,
            d: Deployment) -> str:
    """The address in the line ``proc`` prints once it serves."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = pattern.search(line)
    assert found, f"{name} printed {line!r}; stderr: {(d.tmp / f'{name}.stderr').read_text()}"
    return found.group(1)


class InThread:
    """An event loop in a thread of this process, hosting the simulator and the API."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="monitored",
                                       daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()
        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(60)

    async def sim(self, kubeconfig: Path) -> str:
        cluster = await self.stack.enter_async_context(SimCluster(nodes=list(NODES)))
        cluster.write_kubeconfig(kubeconfig)
        return cluster.url

    async def api(self, db_url: str) -> str:
        """The API over ``db_url`` on a free loopback port, ``/metrics`` public; its URL."""
        db: Database = open_database(db_url)
        self.stack.push_async_callback(db.dispose)
        runner = make_runner(make_app(db, token=TOKEN, kinds=default_kinds(),
                                      metrics_public=True))
        await runner.setup()
        self.stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    def stop(self) -> None:
        try:
            self.call(self.stack.aclose)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@contextlib.contextmanager
def monitored(tmp: Path) -> Iterator[Monitored]:
    """The world, up and scraped; everything stopped after (Prometheus and the product
    stopping at once: each takes a moment)."""
    d = Deployment(tmp)
    prometheus = Prometheus(tmp / "prometheus", discovered="controlplane-agent",
                            rules=rules_for_test(tmp / "rules.yml", for_=SHORT_FOR),
                            static={})
    hosted = InThread()
    try:
        d.url = hosted.call(lambda: hosted.sim(d.kubeconfig))
        upgraded(d.db)
        # The processes start at once (each is an interpreter start), then each is awaited.
        agents = {node: _agent(d, node, f"agent-{node}") for node in NODES}
        worker = d.start("worker", "controlplane.cli.main", "--db", d.db, "worker",
                         "--worker-id", "w-1", "--poll-seconds", "0.05",
                         "--metrics-listen", "127.0.0.1:0", *d.cluster_args())
        world = Monitored(d, prometheus, api_url=hosted.call(lambda: hosted.api(d.db)),
                          worker_metrics=_served(worker, METRICS, "worker", d),
                          agent_metrics={node: _served(proc, METRICS, f"agent-{node}", d)
                                         for node, proc in agents.items()})
        prometheus.static = {
            "controlplane-api": [world.api_url.removeprefix("http://")],
            "controlplane-worker": [world.worker_metrics]}
        prometheus.start(world.agent_metrics)
        world.started = time.time()
        wait_for(prometheus.targets_up, "every target scraped and up", 30, every=0.1)
        yield world
    finally:
        prometheus.terminate()
        d.stop()
        prometheus.stop()
        hosted.stop()
