"""The ``faults`` profile's world: a hostile simulator and a registry behind a fault proxy.

- Simulator (seeded): 500s, 429s and 409s on writes at small rates, latency with jitter,
  watches dropped mid-stream at random, every few seconds all watches expired with 410,
  slow pod start (scheduling and start take ``start_seconds``), and now and then a node
  failing (NotReady) for a few seconds — often the one a restore is heading for — then
  recovering.
- Registry: Debian's ``docker-registry`` with htpasswd auth (the password is a secret the
  campaign later searches for in logs and events), reached through :class:`FaultProxy`:
  503s at a rate, slow blob transfers, tags that vanish for a moment (a tag HEAD/GET
  answered 404), and ``403`` on every manifest DELETE in the ``locked`` repository — a
  persistent GC refusal, which must end as ``GarbageCollectionFailed`` and be visible as
  a condition, a Warning event and the ``controlplane_gc_failures_total`` metric.

Used by :mod:`tests.reliability.campaign` (``profile="faults"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from controlplane.api.metrics import render
from controlplane.clock import SystemClock
from controlplane.store.database import open_database
from drivers.kube import KubeDriver
from drivers.registry.auth import Credentials
from drivers.registry.client import RegistryClient
from drivers.registry.transport import RegistrySettings
from drivers.sim import SimCluster
from tests.registry.servers import bcrypt_htpasswd, run_registry
from tests.reliability.campaign import (
    KUBE,
    CampaignConfig,
    CampaignResult,
    World,
    agents,
    record_deletion,
)

USER, PASSWORD = "campaign", "registry-pw-3d7f1b9c0a"
TAG_PATH = re.compile(r"^/v2/(.+)/manifests/([^/@:]+)$")  # a tag, not a digest


class FaultProxy:
    """Forwards to the registry; injects faults by a seeded random sequence."""

    def __init__(self, upstream: str, seed: int, *, error_rate: float = 0.03,
                 vanish_rate: float = 0.05, blob_delay: float = 0.05,
                 locked: str = "locked") -> None:
        self.upstream, self.rng = upstream, random.Random(seed)
        self.error_rate, self.vanish_rate, self.blob_delay = error_rate, vanish_rate, blob_delay
        self.locked = locked
        self.injected: Counter[str] = Counter()
        self.host = ""
        self.active = True
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.host = f"127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _fault(self, request: web.Request) -> web.Response | None:
        if not self.active or not request.path.startswith("/v2/"):
            return None
        if request.method == "DELETE" and f"/{self.locked}/manifests/" in request.path:
            self.injected["403 delete"] += 1
            return _oci_error(403, "DENIED", "requested access to the resource is denied")
        if self.rng.random() < self.error_rate:
            self.injected["503"] += 1
            return _oci_error(503, "UNAVAILABLE", "service unavailable (injected)")
        if (request.method in ("GET", "HEAD") and TAG_PATH.match(request.path)
                and self.rng.random() < self.vanish_rate):
            self.injected["tag vanished"] += 1
            return _oci_error(404, "MANIFEST_UNKNOWN", "manifest unknown (injected)")
        return None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        refused = self._fault(request)
        if refused is not None:
            return refused
        if self.active and "/blobs/" in request.path:
            self.injected["slow blob"] += 1
            await asyncio.sleep(self.rng.uniform(0, self.blob_delay))  # the fault: slowness
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "content-length", "transfer-encoding")}
        body = await request.read()
        async with self._session.request(request.method, f"http://{self.upstream}"
                                         f"{request.path_qs}", headers=headers, data=body,
                                         allow_redirects=False) as upstream:
            payload = await upstream.read()
            out = {k: v for k, v in upstream.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding", "connection",
                                        "content-encoding")}
            if "Location" in out:  # uploads continue through the proxy too
                out["Location"] = out["Location"].replace(self.upstream, self.host)
            return web.Response(status=upstream.status, body=payload, headers=out)


def _oci_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"errors": [{"code": code, "message": message}]}, status=status)


@contextlib.asynccontextmanager
async def open_fault_world(cfg: CampaignConfig, workdir: Path,
                           deleted: list[tuple[str, str]]) -> AsyncIterator[FaultWorld]:
    htpasswd = workdir / "htpasswd"
    htpasswd.write_text(bcrypt_htpasswd(USER, PASSWORD))
    password_file = workdir / "registry-password"
    password_file.write_text(PASSWORD + "\n")
    async with run_registry(workdir / "registry", auth={"htpasswd": {
            "realm": "campaign", "path": str(htpasswd)}}) as registry, \
            FaultProxy(registry.host, cfg.seed) as proxy, \
            SimCluster(nodes=cfg.nodes, seed=cfg.seed, start_seconds=0.3,
                       stop_seconds=0.1) as cluster:
        kubeconfig = cluster.write_kubeconfig(workdir / "sim.kubeconfig")
        client = RegistryClient(RegistrySettings(
            credentials={proxy.host: Credentials(USER, PASSWORD)}, backoff_initial=0.05,
            request_timeout=10))
        unsubscribe = cluster.store.subscribe(lambda c: record_deletion(c, deleted))
        kube = await KubeDriver.connect(kubeconfig=str(kubeconfig), settings=KUBE)
        try:
            async with kube, agents(cluster, kube, client, workdir):
                limits = str(cfg.workloads)
                world = FaultWorld(cluster, kube, client, f"{proxy.host}/checkpoints/campaign", [
                    "--kubeconfig", str(kubeconfig), "--registry-credentials", proxy.host,
                    USER, str(password_file), "--max-operations", limits, "--max-per-node",
                    limits])
                world.proxy = proxy
                world.start_faults()
                yield world
        finally:
            unsubscribe()
            await client.close()


class FaultWorld(World):
    proxy: FaultProxy
    secrets = (PASSWORD,)

    def start_faults(self) -> None:
        f = self.cluster.faults
        f.error_rate(("create", "patch", "delete"), 0.04, code=500)
        f.error_rate(("patch", "delete"), 0.03, code=409, reason="Conflict",
                     message="the object has been modified; please apply your changes to "
                             "the latest version and try again")
        f.error_rate(("get", "list", "patch"), 0.02, code=429, retry_after=0)
        f.latency("*", 0.005, jitter=0.02)
        f.drop_watch_rate(0.01, abrupt=True)

    def repository_for(self, rng: random.Random) -> str:
        if rng.random() < 0.1:
            return self.repository.rsplit("/", 1)[0] + "/locked"
        return self.repository

    async def disturb(self, rng: random.Random, stop: asyncio.Event,
                      result: CampaignResult) -> None:
        """Every ~2 s: expire every watch (410); every ~6 s fail a node for 2-4 s."""
        ticks = 0
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rng.uniform(1.0, 3.0)):
                    await stop.wait()
            ticks += 1
            self.cluster.faults.expire_watches()
            if ticks % 3 == 0 and not self.failed_nodes:
                node = rng.choice(self.cluster.node_names)
                self.failed_nodes.add(node)
                self.cluster.fail_node(node)
                result.node_failures += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(rng.uniform(2.0, 4.0)):
                        await stop.wait()
                self.cluster.recover_node(node)
                self.failed_nodes.discard(node)

    def calm(self) -> None:
        self.cluster.faults.clear()
        self.proxy.active = False
        for node in list(self.failed_nodes):
            self.cluster.recover_node(node)
        self.failed_nodes.clear()

    def count_faults(self, result: CampaignResult) -> None:
        super().count_faults(result)
        result.registry_faults.update(self.proxy.injected)

    async def gc_refusals(self, db_url: str, machines: list[dict[str, Any]]) -> dict[str, int]:
        """How a persistent GC refusal shows: phase, condition, Warning event, metric."""
        failed = [m for m in machines if m["phase"] == "GarbageCollectionFailed"]
        with_condition = 0
        for m in failed:
            state = m["state"]
            state = json.loads(state) if isinstance(state, str) else state
            if "GarbageCollectionFailed" in json.dumps(state.get("conditions")):
                with_condition += 1
        warnings = [e for e in self.cluster.store.peek("events")
                    if e.get("type") == "Warning" and "arbage" in json.dumps(e)]
        db = open_database(db_url, pool_size=2)
        try:
            text = await render(db, SystemClock().now())
        finally:
            await db.dispose()
        metric = next((float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("controlplane_gc_failures_total ")), 0.0)
        return {"phase": len(failed), "condition": with_condition,
                "warning_events": len(warnings), "metric": int(metric)}
