"""The world the scale and recovery benchmarks run against, as separate processes.

- :class:`SimWorld`: ``python -m drivers.sim up`` (the API server, scheduler, kubelets:
  data plane instant, ``--start-seconds 0 --stop-seconds 0``) and ``python -m
  bench.sim_agents`` (every node's agent with the ``sim`` dumper, one process), an OCI
  layout on disk shared by agents and control plane; pods created over plain HTTP (not
  through the control plane, so not in its counts);
- :class:`CountingRegistry`: the control plane's registry, counting requests by method;
- :func:`migration_spec`: what ``cpctl migrate`` submits for a pod.

With ``BENCH_PROFILE_DIR`` set, the simulator and the agents run under cProfile and
write ``sim.prof`` / ``agents.prof`` there when they stop (what the scale figures' CPU
per process pointed at: the simulator costs about as much CPU as the control plane).

Used by ``bench.scale``, ``bench.growth`` and ``bench.recovery``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import ROOT
from controlplane.engine.jsonvalue import JsonObject
from drivers.registry.port import Descriptor, Manifest, Registry, Resolved

MARKER = "sim.controlplane.dev/marker"
REGISTRY_HOST = "localhost:5000"


class CountingRegistry:
    """A :class:`Registry` that counts the requests made through it, by method."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    async def resolve(self, repository: str, reference: str) -> Resolved | None:
        self.counts["resolve"] += 1
        return await self.inner.resolve(repository, reference)

    async def get_manifest(self, repository: str, reference: str) -> Manifest:
        self.counts["get_manifest"] += 1
        return await self.inner.get_manifest(repository, reference)

    async def get_blob(self, repository: str, digest: str, dest: Path) -> int:
        self.counts["get_blob"] += 1
        return await self.inner.get_blob(repository, digest, dest)

    async def push_blob(self, repository: str, source: Path | bytes, *,
                        media_type: str = "application/octet-stream",
                        digest: str | None = None) -> Descriptor:
        self.counts["push_blob"] += 1
        return await self.inner.push_blob(repository, source, media_type=media_type,
                                          digest=digest)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        self.counts["push_manifest"] += 1
        return await self.inner.push_manifest(repository, body, media_type=media_type, tag=tag)

    async def delete_manifest(self, repository: str, digest: str) -> None:
        self.counts["delete_manifest"] += 1
        await self.inner.delete_manifest(repository, digest)

    async def close(self) -> None:
        await self.inner.close()


def delay_summary(delays: list[float]) -> dict[str, float]:
    """Count, p50, p99, max and how many over 2 s of the agents' restore delays (s from
    the restore pod's ``creationTimestamp`` to its agent acting; each high by < 1 s,
    the timestamp's precision)."""
    if not delays:
        return {"count": 0}
    ordered = sorted(delays)

    def at(q: float) -> float:  # nearest rank
        return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 3)

    return {"count": len(ordered), "p50_s": at(0.50), "p99_s": at(0.99),
            "max_s": round(ordered[-1], 3), "over_2s": sum(1 for d in ordered if d > 2.0)}


def migration_spec(pod: dict[str, Any], target: str, repository: str) -> JsonObject:
    """The spec ``cpctl migrate NS/POD --to TARGET --repository REPO`` submits."""
    meta = pod["metadata"]
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    return {"pod": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
            "source_node": pod["spec"]["nodeName"], "target_node": target,
            "template": {"metadata": {"labels": dict(meta.get("labels") or {})}, "spec": spec},
            "class": {"repository": repository}}


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


class SimWorld:
    """The simulator and the node agents as processes, and plain-HTTP pod setup."""

    def __init__(self, root: Path, *, nodes: int, node_pods: int = 110,
                 agent_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.agent_args = agent_args  # extra options of bench.sim_agents
        self.nodes = nodes
        self.node_pods = node_pods
        self.kubeconfig = root / "kube.yaml"
        self.layout = root / "oci"
        self.url = ""
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._http: aiohttp.ClientSession | None = None
        self._drains: list[asyncio.Task[None]] = []

    async def _start(self, name: str, *args: str) -> str:
        profile_dir = os.environ.get("BENCH_PROFILE_DIR")
        if profile_dir:  # cProfile the process; written when it exits on SIGTERM
            args = ("cProfile", "-o", str(Path(profile_dir) / f"{name}.prof"), "-m", *args)
        with (self.root / f"{name}.stderr").open("w") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *args, cwd=ROOT, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=err)
        self.procs[name] = proc
        assert proc.stdout is not None
        async with asyncio.timeout(120):
            line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError(f"{name} did not start: see {self.root / (name + '.stderr')}")
        # Keep reading: a full pipe would block the process on its next print.
        self._drains.append(asyncio.create_task(_drain(proc.stdout)))
        return line

    async def start_sim(self) -> None:
        line = await self._start("sim", "drivers.sim", "up", "--nodes", str(self.nodes),
                                 "--node-pods", str(self.node_pods),
                                 "--kubeconfig", str(self.kubeconfig))
        self.url = line.split("listening on ")[1].split()[0]
        self._http = aiohttp.ClientSession(self.url)

    async def start_agents(self) -> None:
        await self._start("agents", "bench.sim_agents", "--kubeconfig", str(self.kubeconfig),
                          "--layout", str(self.layout), "--workdir", str(self.root / "work"),
                          "--nodes", str(self.nodes), "--stats", str(self.root / "agents.json"),
                          *self.agent_args)

    def agent_stats(self) -> dict[str, Any]:
        """The agents' summed counters and ``restore_delay`` (see :func:`delay_summary`),
        once they stopped (empty before)."""
        path = self.root / "agents.json"
        if not path.exists():
            return {}
        stats = dict(json.loads(path.read_text()))
        stats["restore_delay"] = delay_summary(stats.pop("restore_delays", []))
        return stats

    def node(self, i: int) -> str:
        return f"node-{i % self.nodes + 1}"

    async def create_pods(self, count: int, *, concurrency: int = 32) -> list[dict[str, Any]]:
        """``app-0``.. ``app-{count-1}``, round-robin over the nodes, until all Running."""
        assert self._http is not None
        http = self._http
        slots = asyncio.Semaphore(concurrency)

        async def create(i: int) -> dict[str, Any]:
            body = {"metadata": {"name": f"app-{i}", "labels": {"app": f"app-{i}"},
                                 "annotations": {MARKER: f"app-{i}=1"}},
                    "spec": {"nodeName": self.node(i),
                             "containers": [{"name": "main", "image": "pause"}]}}
            async with slots, http.post("/api/v1/namespaces/default/pods", json=body) as r:
                r.raise_for_status()
                created: dict[str, Any] = await r.json()
                return created

        pods = await asyncio.gather(*(create(i) for i in range(count)))
        async with asyncio.timeout(300):
            while await self.running() < count:  # noqa: ASYNC110
                await asyncio.sleep(0.2)  # another process: nothing to await
        return pods

    async def list_pods(self) -> list[dict[str, Any]]:
        assert self._http is not None
        async with self._http.get("/api/v1/namespaces/default/pods") as r:
            r.raise_for_status()
            items: list[dict[str, Any]] = (await r.json())["items"]
            return items

    async def running(self) -> int:
        return sum(1 for p in await self.list_pods()
                   if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp"))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        for name in ("agents", "sim"):
            proc = self.procs.get(name)
            if proc is None or proc.returncode is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def sim_world(root: Path, *, nodes: int, pods: int,
                    agent_args: tuple[str, ...] = ()) -> AsyncIterator[
        tuple[SimWorld, list[dict[str, Any]]]]:
    """Simulator up, ``pods`` pods Running, agents serving; torn down on exit."""
    root.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at setup)
    world = SimWorld(root, nodes=nodes, node_pods=max(110, 3 * pods // nodes + 10),
                     agent_args=agent_args)
    try:
        await world.start_sim()
        created = await world.create_pods(pods)
        await world.start_agents()
        yield world, created
    finally:
        await world.stop()
