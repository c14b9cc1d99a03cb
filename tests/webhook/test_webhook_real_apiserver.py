"""The restore gate on a real kube-apiserver (envtest, v1.36): our webhook over TLS, with
certificates from ``cpctl webhook certs --ip 127.0.0.1``, registered by URL as deploy/
registers it (CREATE pods, matchConditions on a StatefulSet controller, failurePolicy
Ignore, 2 s).

Pinned: the API server persists the gate on a StatefulSet's pod that an in-flight gated
migration awaits, and only on it; pods without a StatefulSet controller are never sent
(the webhook counts what it receives); with the webhook down, pods are still created (fail
open). And the mechanism the migration relies on (KEP-3838): a gated pod takes required
node affinity and annotations, its gate can be removed by a patch, and once ungated its
scheduling is immutable again.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from controlplane.api.webhook import (
    STATS_KEY,
    WebhookStats,
    make_webhook_app,
    running_webhook,
    server_ssl_context,
)
from controlplane.clock import FakeClock
from controlplane.machines.contract.protocol import RESTORE_ARTIFACT, RESTORE_GATE
from controlplane.store import event_store, migrate
from controlplane.store.database import open_database
from controlplane.store.records import Projection
from controlplane.store.successors import awaiting_successor
from tests.deploy.manifests import KUBECTL
from tests.support.envtest import (
    ADMIN_TOKEN,
    ROOT,
    Envtest,
    find_real_cluster,
    free_port,
    running_envtest,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NS = "apps"
#: Pods of these names have a gated migration in flight (one per test that creates one:
#: the API server outlives each test, and a pod name is taken once).
AWAITED = ("db-0", "db-1", "db-2")
#: How deploy/ registers the webhook on a dev cluster (the caBundle is added by hand).
REGISTRATION = "deploy/overlays/dev/webhook"


@dataclass
class Cluster:
    env: Envtest
    certs: Path
    port: int


def _kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run([KUBECTL, *args], input=stdin, text=True, capture_output=True,
                          timeout=60, check=False, cwd=ROOT)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _registration(url: str, ca_bundle: str) -> dict[str, Any]:
    """deploy/'s MutatingWebhookConfiguration as rendered, pointed at ``url``: what an
    operator gets after `kubectl patch` of the caBundle, but by URL instead of Service."""
    [hook_config] = [d for d in yaml.safe_load_all(_kubectl("kustomize", REGISTRATION))
                     if d and d["kind"] == "MutatingWebhookConfiguration"]
    [hook] = hook_config["webhooks"]
    hook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
    return dict(hook_config)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Our own API server (the webhook is registered by loopback URL, for this module's
    server only), with deploy/'s registration pointing at a free port."""
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.skip(where if kind == "none" else
                    "registers a webhook by loopback URL: needs envtest (KUBEBUILDER_ASSETS)")
    work = tmp_path_factory.mktemp("webhook-envtest")
    certs = work / "webhook-certs"
    made = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "webhook", "certs", "--out",
         str(certs), "--service", "controlplane-webhook", "--namespace", "checkpoint-system",
         "--ip", "127.0.0.1"], cwd=ROOT, check=True, capture_output=True, text=True,
        timeout=60)
    port = free_port()
    registration = _registration(f"https://127.0.0.1:{port}/mutate/pods", made.stdout.strip())
    with running_envtest(Path(where), work / "envtest") as env:
        kubeconfig = env.write_kubeconfig(work / "admin.kubeconfig")
        _kubectl(f"--kubeconfig={kubeconfig}", "apply", "-f", "-", stdin=yaml.safe_dump_all([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            registration]))
        yield Cluster(env, certs, port)


class Api:
    """The few pod calls the test makes, as admin over HTTPS; async, because the webhook
    the API server calls back runs on this same event loop."""

    def __init__(self, env: Envtest, session: aiohttp.ClientSession) -> None:
        self.base = f"{env.server}/api/v1/namespaces/{NS}/pods"
        self.session = session

    async def create(self, body: dict[str, Any], *, dry_run: bool = False
                     ) -> dict[str, Any]:
        params = {"dryRun": "All"} if dry_run else {}
        async with self.session.post(self.base, json=body, params=params) as resp:
            created: dict[str, Any] = await resp.json()
            assert resp.status == 201, created
            return created

    async def get(self, name: str) -> dict[str, Any]:
        async with self.session.get(f"{self.base}/{name}") as resp:
            found: dict[str, Any] = await resp.json()
            assert resp.status == 200, found
            return found

    async def patch(self, name: str, patch: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        async with self.session.patch(
                f"{self.base}/{name}", json=patch,
                headers={"Content-Type": "application/json-patch+json"}) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[Api]:
    context = ssl.create_default_context(cafile=str(cluster.env.ca_file))
    async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield Api(cluster.env, session)


def pod(name: str, *, owner: str | None = "StatefulSet") -> dict[str, Any]:
    """A pod as its controller would create it (no controller runs: nothing else acts)."""
    refs = [] if owner is None else [{
        "apiVersion": "v1" if owner == "ConfigMap" else "apps/v1", "kind": owner,
        "name": name.rsplit("-", 1)[0], "uid": str(uuid.uuid4()), "controller": True,
        "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": refs},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]}}


def gates(body: dict[str, Any]) -> list[str]:
    return [g["name"] for g in body["spec"].get("schedulingGates") or []]


@asynccontextmanager
async def serving(cluster: Cluster, tmp_path: Path) -> AsyncIterator[WebhookStats]:
    """Our webhook on the registered port over a SQLite store in which a gated migration
    of each of :data:`AWAITED` is in flight; yields once the API server calls it."""
    db = open_database(f"sqlite:///{tmp_path / 'cp.db'}")
    try:
        await migrate.upgrade(db)
        for name in AWAITED:
            await event_store.create_machine(
                db, machine_id=f"mig-{name}", kind="migration", spec={"successor": "gated"},
                initial=Projection("Checkpointing", {}, False), now=FakeClock().now(),
                worker_id="test", workload=f"{NS}/{name}")
        app = make_webhook_app(partial(awaiting_successor, db))
        context = server_ssl_context(str(cluster.certs / "tls.crt"),
                                     str(cluster.certs / "tls.key"))
        async with running_webhook(app, host="127.0.0.1", port=cluster.port,
                                   ssl_context=context):
            yield app[STATS_KEY]
    finally:
        await db.dispose()


async def _until_called(api: Api, stats: WebhookStats) -> None:
    """The API server loads a new webhook configuration asynchronously, and until it
    has, pods are admitted without asking us: dry-run creates until one reaches us."""
    async def called() -> bool:
        await api.create(pod("probe-0"), dry_run=True)
        return stats.reviews > 0
    await eventually(called, limit_seconds=30, every=0.1, what="the webhook to be called")


@pytest.fixture
async def webhook(cluster: Cluster, api: Api, tmp_path: Path) -> AsyncIterator[WebhookStats]:
    async with serving(cluster, tmp_path) as stats:
        await _until_called(api, stats)
        yield stats


async def test_an_awaited_statefulset_pod_is_persisted_with_the_gate(
    api: Api, webhook: WebhookStats
) -> None:
    created = await api.create(pod("db-0"))
    assert gates(created) == [RESTORE_GATE]
    assert gates(await api.get("db-0")) == [RESTORE_GATE]
    assert webhook.gated == 1


async def test_a_statefulset_pod_no_migration_awaits_is_asked_about_and_not_gated(
    api: Api, webhook: WebhookStats
) -> None:
    before = webhook.lookups
    await api.create(pod("other-0"))
    assert gates(await api.get("other-0")) == []
    assert webhook.lookups == before + 1


@pytest.mark.parametrize("owner", [None, "ReplicaSet", "ConfigMap"])
async def test_a_pod_without_a_statefulset_controller_is_never_sent(
    api: Api, webhook: WebhookStats, owner: str | None
) -> None:
    """deploy/'s matchConditions filter it out in the API server: the webhook receives
    nothing for it, yet it does receive the StatefulSet pod created right after."""
    before = webhook.reviews
    created = await api.create(pod(f"plain-{(owner or 'bare').lower()}-0", owner=owner))
    assert gates(created) == []
    assert webhook.reviews == before
    await api.create(pod("probe-1"), dry_run=True)
    assert webhook.reviews == before + 1


async def test_with_the_webhook_stopped_an_awaited_pod_is_still_created_ungated(
    cluster: Cluster, api: Api, tmp_path: Path
) -> None:
    """failurePolicy Ignore: the registration is live (the webhook was called), then the
    server stops; the API server's call is refused and the pod admitted (fail open)."""
    async with serving(cluster, tmp_path) as stats:
        await _until_called(api, stats)
    created = await api.create(pod("db-2"))
    assert gates(created) == []


async def test_a_gated_pod_takes_affinity_and_annotations_then_its_gate_is_removed(
    api: Api, webhook: WebhookStats
) -> None:
    """What the migration does with the successor (KEP-3838), on the real server: while
    gated, required node affinity and the restore annotations may be added; the gate is
    removed by a patch; once ungated, the pod's scheduling can no longer be changed."""
    assert gates(await api.create(pod("db-1"))) == [RESTORE_GATE]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": ["node-2"]}]}]}}}
    artifact = "registry.example/ckpt@sha256:" + "a" * 64
    status, body = await api.patch("db-1", [
        {"op": "add", "path": "/spec/affinity", "value": affinity},
        {"op": "add", "path": "/metadata/annotations", "value": {RESTORE_ARTIFACT: artifact}}])
    assert status == 200, body
    assert (body["spec"]["affinity"], gates(body)) == (affinity, [RESTORE_GATE])
    status, body = await api.patch("db-1", [
        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": RESTORE_GATE}]},
        {"op": "remove", "path": "/spec/schedulingGates"}])
    assert status == 200, body
    live = await api.get("db-1")
    assert gates(live) == []
    assert live["metadata"]["annotations"][RESTORE_ARTIFACT] == artifact
    status, body = await api.patch("db-1", [{
        "op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringScheduling"
        "IgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/0/values",
        "value": ["node-3"]}])
    assert status == 422, body
