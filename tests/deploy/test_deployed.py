"""The control plane started from the manifests' settings migrates a pod end to end, and
the RBAC rules grant exactly the API calls the drivers made doing it.

One recorded run (:class:`~tests.deploy.deployment.DeployedRun`, the dev overlay): the
migration Job's command, the Deployment's init container, two worker replicas and the API
container, one agent per simulated node, each with the command line and environment the
rendered objects give it, on PostgreSQL; then ``cpctl migrate --wait`` run in the worker
container's environment and identity (as ``kubectl exec deploy/controlplane -c worker --
cpctl migrate ...`` would). The simulator's audit records every API call by identity.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from drivers.agent.dumper import Container, DumpRequest, Workload
from drivers.agent.kubelet import KubeletDumper, KubeletSettings
from tests.deploy.deployment import (
    NAMESPACE,
    SUBSTITUTIONS,
    DeployedRun,
    Grant,
    empty_schema,
    granted,
    service_account_user,
)
from tests.deploy.manifests import find, pod_spec, render

MARKER = "sim.controlplane.dev/marker"
CUSTOM_GROUP = "checkpoint.controlplane.dev"
# The run fixture starts a dozen processes: 25 s alone, 86 s measured on 2 busy cores.
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def run(pg_database: str, tmp_path_factory: pytest.TempPathFactory) -> DeployedRun:
    """Deploy (dev overlay), migrate one pod, stop everything; the record of it all."""
    asyncio.run(empty_schema(pg_database))
    r = DeployedRun(render("dev"), tmp_path_factory.mktemp("deployed"), pg_database)
    try:
        r.start_simulator()
        r.start_registry()
        r.start_control_plane(("node-1", "node-2", "node-3"))
        r.api("/api/v1/namespaces/default/pods", {
            "metadata": {"name": "app", "annotations": {MARKER: "counter=41"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
        r.running("default", 1)
        r.migrated = r.in_worker("migrate", "default/app", "--to", "node-2", "--repository",
                                 f"{r.registry}/checkpoints", "--wait", "--wait-seconds", "90")
        r.pods = r.list_pods("default")
        # A drain too: it cordons a node (PATCH nodes) and runs child migrations.
        for name in ("batch-1", "batch-2"):
            r.api("/api/v1/namespaces/default/pods", {
                "metadata": {"name": name, "annotations": {MARKER: name}},
                "spec": {"nodeName": "node-3",
                         "containers": [{"name": "main", "image": "pause"}]}})
        r.running("default", 3)
        r.drained = r.in_worker("drain", "node-3", "--to", "node-1", "--max-parallel", "2",
                                "--repository", f"{r.registry}/checkpoints", "--wait",
                                "--wait-seconds", "90")
        r.drained_pods = r.list_pods("default")
        with urllib.request.urlopen(r.api_url + "/healthz", timeout=10) as resp:
            r.healthz = json.loads(resp.read())
        with urllib.request.urlopen(r.api_url + "/metrics", timeout=10) as resp:
            r.metrics = resp.read().decode()
        r.audit = r.api("/sim/audit")["items"]
    finally:
        r.stop()
    return r


def test_the_deployed_control_plane_migrates_a_pod_and_keeps_its_state(
        run: DeployedRun) -> None:
    """Started only from the manifests' settings (plus the listed substitutions), two
    worker replicas and three agents migrate a pod; the state marker arrives."""
    assert set(SUBSTITUTIONS)  # what differs from a cluster, and nothing else
    assert run.migrated is not None
    assert run.migrated.returncode == 0, run.migrated.stdout + run.migrated.stderr
    assert "migrate default/app: Succeeded" in run.migrated.stdout
    [moved] = run.pods
    assert moved["spec"]["nodeName"] == "node-2"
    assert moved["metadata"]["annotations"][MARKER] == "counter=41"


def test_the_deployed_control_plane_drains_a_node(run: DeployedRun) -> None:
    assert run.drained is not None
    assert run.drained.returncode == 0, run.drained.stdout + run.drained.stderr
    batch = {p["metadata"]["annotations"][MARKER]: p["spec"]["nodeName"]
             for p in run.drained_pods if p["metadata"]["annotations"][MARKER] != "counter=41"}
    assert batch == {"batch-1": "node-1", "batch-2": "node-1"}


def test_the_api_container_serves_its_probe_and_the_metrics(run: DeployedRun) -> None:
    assert run.healthz == {"status": "ok"}
    assert 'controlplane_operations{kind="migration",phase="Succeeded"} 3' in run.metrics
    assert 'controlplane_operations{kind="drain",phase="Succeeded"} 1' in run.metrics


def test_every_component_drains_and_exits_cleanly_on_sigterm(run: DeployedRun) -> None:
    """SIGTERM (what the kubelet sends first) ends workers, agents and the API with 0."""
    components = [n for n in run.exit_codes if n.split("-")[0] in ("worker", "agent", "api")]
    assert len(components) == 2 + 3 + 1
    assert {n: run.exit_codes[n] for n in components} == dict.fromkeys(components, 0), \
        {n: run.stderr(n)[-2000:] for n in components if run.exit_codes[n]}


# --- RBAC: exactly the calls the code makes ------------------------------------------------

def _recorded(run: DeployedRun, user: str) -> set[Grant]:
    """The API calls ``user`` made in the recorded run (core/v1 only: all the simulator
    serves, and all the drivers call)."""
    return {("", e["resource"] + (f"/{e['subresource']}" if e["subresource"] else ""),
             e["verb"]) for e in run.audit if e["user"] == user}


#: How the kubelet authorizes its own API (pkg/kubelet/server/auth.go): the path's first
#: segment names the nodes subresource, anything unlisted is nodes/proxy; the HTTP method
#: names the verb.
KUBELET_SUBRESOURCES = {"stats": "stats", "metrics": "metrics", "logs": "log", "spec": "spec",
                        "checkpoint": "checkpoint", "pods": "pods"}
KUBELET_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}


async def _kubelet_calls(tmp: Path) -> set[Grant]:
    """The kubelet calls the agent's kubelet dumper makes to capture one pod, recorded by
    a stand-in kubelet, as the kubelet's authorizer sees them."""
    calls: list[tuple[str, str]] = []
    node_dir = tmp / "node-checkpoints"
    node_dir.mkdir()

    async def any_call(request: web.Request) -> web.Response:
        calls.append((request.method, request.path))
        (node_dir / "archive.tar").write_bytes(b"tar")
        return web.json_response({"items": ["/var/lib/kubelet/checkpoints/archive.tar"]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_call)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        port = runner.addresses[0][1]
        dumper = KubeletDumper(KubeletSettings(url=f"http://127.0.0.1:{port}", token="t",
                                               checkpoint_dir=node_dir))
        wanted = (Container("main", "quay.io/app:1"),)
        work = tmp / "work"
        work.mkdir()
        await dumper.dump(DumpRequest("ck-1", Workload("default", "app", "uid-1", "node-1",
                                                       wanted), wanted, quiesce=False,
                                      saver="{}", workdir=work))
    finally:
        await runner.cleanup()
    assert calls
    return {("", "nodes/" + KUBELET_SUBRESOURCES.get(path.split("/")[1], "proxy"),
             KUBELET_VERBS[method]) for method, path in calls}


def test_control_plane_rbac_grants_exactly_the_api_calls_of_a_recorded_run(
        run: DeployedRun) -> None:
    """No missing rule (a 403 in production) and no unused one (more than least)."""
    deployment = find(run.objects, "Deployment", "controlplane")
    user = service_account_user(pod_spec(deployment)["serviceAccountName"])
    recorded = _recorded(run, user)
    assert ("", "pods", "delete") in recorded  # the run did migrate
    # The simulator serves no custom resources, so the rules for the custom resources' kinds
    # (checkpoint.controlplane.dev) go unused here; test_crds_real.py checks them on a real
    # server, and test_rbac_real.py's recorded run there uses them.
    assert {g for g in granted(run.objects, user) if g[0] != CUSTOM_GROUP} == recorded


async def test_agent_rbac_grants_exactly_its_api_and_kubelet_calls(
        run: DeployedRun, tmp_path: Path) -> None:
    daemonset = find(run.objects, "DaemonSet", "checkpoint-agent")
    user = service_account_user(pod_spec(daemonset)["serviceAccountName"])
    recorded = _recorded(run, user) | await _kubelet_calls(tmp_path)
    assert ("", "pods", "patch") in recorded
    assert granted(run.objects, user) == recorded


def test_no_other_identity_called_the_api_and_the_migration_job_has_no_rights(
        run: DeployedRun) -> None:
    users = {e["user"] for e in run.audit} - {""}  # "": the test's own requests
    accounts = {service_account_user(pod_spec(find(run.objects, kind, name))[
        "serviceAccountName"]) for kind, name in [("Deployment", "controlplane"),
                                                  ("DaemonSet", "checkpoint-agent")]}
    assert users == accounts
    job = find(run.objects, "Job", "controlplane-db-upgrade")
    assert not granted(run.objects, service_account_user(
        pod_spec(job)["serviceAccountName"], NAMESPACE))
