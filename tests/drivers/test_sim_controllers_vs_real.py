"""The simulator's ReplicaSet controller deletes the same pod as the real one.

One scenario, played over HTTP against ``SimCluster`` and against a kube-apiserver with
the real kube-controller-manager and kube-scheduler (``Envtest.start_controllers``) and
the kubelet role running the nodes: a ReplicaSet of 3 running pods with
``pod-deletion-cost`` 10, -5 and 20 (by name order), then a running orphan with cost 0
relabelled to match. Invariant pinned: both adopt the orphan (same controller reference)
and delete the pod of cost -5, leaving 3 pods.

The real half polls (another process makes the condition true); the simulator's half
waits on store changes.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from drivers.sim import SimCluster
from tests.support.envtest import (
    ADMIN_TOKEN,
    NODES,
    find_real_cluster,
    running_envtest,
    start_kubelet_role,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow
PODS = "/api/v1/namespaces/default/pods"
RS = "/apis/apps/v1/namespaces/default/replicasets"
COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE = "application/merge-patch+json"
Obj = dict[str, Any]
Call = Callable[..., Awaitable[tuple[int, Any]]]


def _client(session: aiohttp.ClientSession, base: str, ssl_context: ssl.SSLContext | None,
            token: str) -> Call:
    async def call(method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> tuple[int, Any]:
        async with session.request(method, base + path, ssl=ssl_context,
                                   data=None if body is None else json.dumps(body),
                                   headers={"Content-Type": content_type,
                                            "Authorization": f"Bearer {token}"}) as r:
            return r.status, await r.json()
    return call


def _pod_template() -> Obj:
    return {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
            "terminationGracePeriodSeconds": 1}


async def _pods(call: Call) -> list[Obj]:
    _, body = await call("GET", PODS)
    return list(body["items"])


def _running(pod: Obj) -> bool:
    ready = [c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    return (pod["status"].get("phase") == "Running" and bool(ready)
            and ready[0]["status"] == "True" and not pod["metadata"].get("deletionTimestamp"))


async def play(call: Call, wait: Callable[[Callable[[], Awaitable[bool]]], Awaitable[None]],
               ) -> tuple[str, Obj]:
    """The scenario; returns the deleted pod's cost and the adopted orphan."""
    code, rs = await call("POST", RS, {
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": _pod_template()}}})
    assert code == 201, rs

    async def three_running() -> bool:
        return sum(1 for p in await _pods(call)
                   if p["metadata"]["labels"].get("app") == "web" and _running(p)) == 3
    await wait(three_running)
    own = sorted(p["metadata"]["name"] for p in await _pods(call)
                 if p["metadata"]["labels"].get("app") == "web")
    costs = dict(zip(own, ("10", "-5", "20"), strict=True))
    for name, cost in costs.items():
        code, _ = await call("PATCH", f"{PODS}/{name}",
                             {"metadata": {"annotations": {COST: cost}}}, MERGE)
        assert code == 200
    code, _ = await call("POST", PODS, {
        "metadata": {"name": "orphan", "labels": {"app": "later"},
                     "annotations": {COST: "0"}}, "spec": _pod_template()})
    assert code == 201

    async def orphan_running() -> bool:
        return any(p["metadata"]["name"] == "orphan" and _running(p)
                   for p in await _pods(call))
    await wait(orphan_running)
    code, _ = await call("PATCH", f"{PODS}/orphan", {"metadata": {"labels": {"app": "web"}}},
                         MERGE)
    assert code == 200

    async def one_deleted() -> bool:
        pods = {p["metadata"]["name"]: p for p in await _pods(call)}
        live = [n for n, p in pods.items() if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 3 and len(pods) >= 3
    await wait(one_deleted)
    pods = {p["metadata"]["name"]: p for p in await _pods(call)}
    [deleted] = [n for n in [*own, "orphan"]
                 if n not in pods or pods[n]["metadata"].get("deletionTimestamp")]
    return costs.get(deleted, "0"), pods["orphan"]


def _owner(pod: Obj) -> Obj:
    [ref] = pod["metadata"]["ownerReferences"]
    return {k: v for k, v in ref.items() if k != "uid"}


async def test_the_simulator_and_the_real_replicaset_controller_delete_the_same_pod(
        tmp_path: Path) -> None:
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.skip(f"needs a control plane of its own (KUBEBUILDER_ASSETS): {where}")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with SimCluster(nodes=list(NODES)) as sim:
            call = _client(session, sim.url, None, "sim")

            async def settled(check: Callable[[], Awaitable[bool]]) -> None:
                await eventually(check, limit_seconds=10, what="the simulator")
            sim_cost, sim_orphan = await play(call, settled)

        with running_envtest(Path(where), tmp_path / "envtest") as env:
            env.start_controllers()
            kubeconfig = env.write_kubeconfig(tmp_path / "admin.kubeconfig")
            role = await asyncio.to_thread(start_kubelet_role, kubeconfig, NODES,
                                           tmp_path / "kubelets.log", "--no-scheduler")
            try:
                context = ssl.create_default_context(cafile=str(env.ca_file))
                call = _client(session, env.server, context, ADMIN_TOKEN)

                async def polled(check: Callable[[], Awaitable[bool]]) -> None:
                    await eventually(check, limit_seconds=120, every=0.2, what="the real one")
                real_cost, real_orphan = await play(call, polled)
            finally:
                await asyncio.to_thread(role.stop)

    assert (sim_cost, real_cost) == ("-5", "-5")
    assert _owner(sim_orphan) == _owner(real_orphan) == {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "controller": True,
        "blockOwnerDeletion": True}
