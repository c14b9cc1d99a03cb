"""deploy/'s RBAC on a real kube-apiserver with ``--authorization-mode=RBAC``: every
overlay applies, and the control plane migrates a pod and drains a node holding only the
rights deploy/ grants it; any 403 fails.

This module's own envtest (etcd + kube-apiserver, RBAC, an audit log of every request)
authenticates deploy/'s ServiceAccounts by static bearer tokens that carry exactly the
user and groups a ServiceAccount subject binds to. As admin: ``kubectl apply
--dry-run=server -k`` of every overlay, then a real ``kubectl apply -k`` of the dev overlay
(the overlays share one namespace and one Job, so one of them). Then
:class:`~tests.deploy.deployment.DeployedRun` on that server: the workers and the node
agents (sim dumper) as their ServiceAccounts, and the CLI verbs as the worker container's
(docs/install.md step 7: operators run ``cpctl`` with ``kubectl exec`` in a worker), with
the kubelet role (``cpctl sim nodes``, as admin: not part of deploy/) providing node-1..3.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deployment import (
    NAMESPACE,
    DeployedRun,
    Grant,
    RealServer,
    empty_schema,
    granted,
    service_account_user,
)
from tests.deploy.manifests import (
    KUBECTL,
    OVERLAYS,
    ROOT,
    Obj,
    all_of,
    find,
    pod_spec,
    render,
)
from tests.support.envtest import (
    ADMIN,
    ASSETS,
    KUBECONFIG,
    Envtest,
    find_real_cluster,
    running_envtest,
    service_account,
    start_kubelet_role,
)
from tests.support.waiting import wait_for

MARKER = "sim.controlplane.dev/marker"
CUSTOM_GROUP = "checkpoint.controlplane.dev"
NODES = ("node-1", "node-2", "node-3")
#: Where the test's pods live: deploy/ binds its ClusterRoles cluster-wide, so any
#: namespace will do; one deploy/ never names shows that it is not only "default".
APPS = "apps"
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(300)]

AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]}
#: A refusal as the API server words it (``forbidden``) or as a status code; not a 403
#: inside a number, a UID or a duration.
REFUSED = re.compile(r"forbidden|(?<![\w.])403(?![\w.])", re.IGNORECASE)


@dataclass
class Server:
    env: Envtest
    admin_kubeconfig: Path
    audit_log: Path
    cluster: RealServer  # the components' tokens; the test's own requests as admin

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, "--kubeconfig", str(self.admin_kubeconfig), *args],
                              capture_output=True, text=True, timeout=120, check=False,
                              cwd=ROOT)

    def audit(self) -> list[dict[str, Any]]:
        """Every request so far (the log backend writes before it answers)."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line]


def _service_accounts() -> set[str]:
    """deploy/'s ServiceAccounts, as every overlay renders them (all in NAMESPACE)."""
    accounts = {(o["metadata"]["name"], o["metadata"]["namespace"])
                for overlay in OVERLAYS for o in all_of(render(overlay), "ServiceAccount")}
    assert {ns for _, ns in accounts} == {NAMESPACE}, accounts
    return {name for name, _ in accounts}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    kind, where = find_real_cluster()
    if kind == "none":
        pytest.skip(where)
    if kind == "kubeconfig":
        # An existing cluster cannot be given deploy/'s ServiceAccounts as token identities;
        # envtest assets set as well still serve.
        where = os.environ.get(ASSETS, "")
        if not where:
            pytest.skip(f"needs an envtest of its own started with --authorization-mode=RBAC "
                        f"and deploy/'s ServiceAccounts as token identities ({ASSETS}); an "
                        f"existing cluster ({KUBECONFIG}) cannot be given those")
    workdir = tmp_path_factory.mktemp("rbac-envtest")
    tokens = {name: f"{name}-token" for name in sorted(_service_accounts())}
    policy = workdir / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    audit_log = workdir / "audit.log"
    with running_envtest(Path(where), workdir / "server", authorization="RBAC",
                         identities=[service_account(n, NAMESPACE, t)
                                     for n, t in tokens.items()],
                         extra_args=[f"--audit-policy-file={policy}",
                                     f"--audit-log-path={audit_log}"]) as env:
        yield Server(env, env.write_kubeconfig(workdir / "admin.kubeconfig", ADMIN),
                     audit_log, RealServer(env.server, env.ca_file, ADMIN.token, tokens))


@dataclass
class Applied:
    dry_runs: dict[str, subprocess.CompletedProcess[str]]
    applied: subprocess.CompletedProcess[str]
    objects: list[Obj]


@pytest.fixture(scope="module")
def applied(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Applied:
    """Every overlay dry-run on the server, then the dev overlay applied for real.

    The overlay's Namespace is applied first, on its own (as docs/install.md step 3
    creates it first): a server-side dry run does not keep the Namespace it would create,
    so every namespaced object of the same apply would meet ``namespaces
    "checkpoint-system" not found``. Applied from the overlay's object, the namespace has
    its Pod Security labels, under which the dry runs are judged."""
    objects = render("dev")
    namespace = tmp_path_factory.mktemp("namespace") / "namespace.json"
    namespace.write_text(json.dumps(find(objects, "Namespace", NAMESPACE)))
    created = server.kubectl("apply", "-f", str(namespace))
    assert created.returncode == 0, created.stderr
    dry_runs = {overlay: server.kubectl("apply", "--dry-run=server", "-k",
                                        f"deploy/overlays/{overlay}")
                for overlay in OVERLAYS}
    return Applied(dry_runs, server.kubectl("apply", "-k", "deploy/overlays/dev"), objects)


@pytest.fixture(scope="module")
def run(server: Server, applied: Applied, pg_database: str,
        tmp_path_factory: pytest.TempPathFactory) -> DeployedRun:
    """With the dev overlay's RBAC in force: migrate a pod, then drain a node."""
    assert applied.applied.returncode == 0, applied.applied.stderr
    asyncio.run(empty_schema(pg_database))
    tmp = tmp_path_factory.mktemp("rbac-deployed")
    r = DeployedRun(applied.objects, tmp, pg_database, cluster=server.cluster)
    before = len(server.audit())  # other tests' requests (one is refused) are not the run's
    kubelets = start_kubelet_role(server.admin_kubeconfig, NODES, tmp / "kubelets.log")
    try:
        r.api("/api/v1/namespaces", {"metadata": {"name": APPS}})
        r.start_registry()
        r.start_control_plane(NODES)
        r.api(f"/api/v1/namespaces/{APPS}/pods", {
            "metadata": {"name": "app", "annotations": {MARKER: "counter=41"}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "pause"}]}})
        r.running(APPS, 1)
        r.migrated = r.in_worker("migrate", f"{APPS}/app", "--to", "node-2", "--repository",
                                 f"{r.registry}/checkpoints", "--wait", "--wait-seconds", "90")
        r.pods = r.list_pods(APPS)
        for name in ("batch-1", "batch-2"):
            r.api(f"/api/v1/namespaces/{APPS}/pods", {
                "metadata": {"name": name, "annotations": {MARKER: name}},
                "spec": {"nodeName": "node-3",
                         "containers": [{"name": "main", "image": "pause"}]}})
        r.running(APPS, 3)
        r.drained = r.in_worker("drain", "node-3", "--to", "node-1", "--max-parallel", "2",
                                "--repository", f"{r.registry}/checkpoints", "--wait",
                                "--wait-seconds", "90")
        r.drained_pods = r.list_pods(APPS)
        _drive_the_resources(r, server)
    finally:
        r.stop()
        kubelets.stop()
    r.audit = server.audit()[before:]
    return r


CR = f"/apis/{CUSTOM_GROUP}/v1alpha1"


def _resource(kind: str, name: str, spec: Obj, *, namespaced: bool = True) -> Obj:
    meta = {"name": name, "namespace": APPS} if namespaced else {"name": name}
    return {"apiVersion": f"{CUSTOM_GROUP}/v1alpha1", "kind": kind, "metadata": meta,
            "spec": spec}


def _drive_the_resources(r: DeployedRun, server: Server) -> None:
    """One resource of each kind, created as the admin (a person with kubectl), answered
    by the workers' front door under deploy/'s rules: every rule of the group is used."""
    r.api(f"{CR}/checkpointclasses", _resource("CheckpointClass", "rbac", {
        "repository": f"{r.registry}/checkpoints"}, namespaced=False))
    for name, node in (("keep", "node-1"), ("mover", "node-1"), ("sleeper", "node-2")):
        r.api(f"/api/v1/namespaces/{APPS}/pods", {
            "metadata": {"name": name, "annotations": {MARKER: name}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]}})
    r.running(APPS, 6)
    ns = f"{CR}/namespaces/{APPS}"
    r.api(f"{ns}/checkpoints", _resource("Checkpoint", "keep", {
        "podName": "keep", "className": "rbac"}))
    r.api(f"{ns}/restores", _resource("Restore", "keep-copy", {
        "checkpointName": "keep", "nodeName": "node-2", "podName": "keep-copy"}))
    r.api(f"{ns}/migrations", _resource("Migration", "mover", {
        "podName": "mover", "targetNodeName": "node-2", "className": "rbac"}))
    r.api(f"{ns}/suspensions", _resource("Suspension", "sleeper", {
        "podName": "sleeper", "className": "rbac"}))
    r.api(f"{CR}/drains", _resource("Drain", "empty-node-3", {
        "nodeName": "node-3", "className": "rbac"}, namespaced=False))

    def reaches(path: str, wanted: str) -> None:
        wait_for(lambda: (r.api(path).get("status") or {}).get("phase") == wanted,
                 f"{path} {wanted}", 90)
    for path, wanted in ((f"{ns}/checkpoints/keep", "Succeeded"),
                         (f"{ns}/restores/keep-copy", "Succeeded"),
                         (f"{ns}/migrations/mover", "Succeeded"),
                         (f"{ns}/suspensions/sleeper", "Suspended"),
                         (f"{CR}/drains/empty-node-3", "Succeeded")):
        reaches(path, wanted)
    resumed = server.kubectl("patch", "suspensions", "sleeper", "-n", APPS, "--type=merge",
                             "-p", '{"spec":{"operatingMode":"Running"}}')
    assert resumed.returncode == 0, resumed.stderr
    reaches(f"{ns}/suspensions/sleeper", "Resumed")


# --- the manifests on the server --------------------------------------------------------

def test_every_overlay_passes_a_server_side_dry_run(applied: Applied) -> None:
    """The API server (not only the offline schemas) accepts every object of every overlay;
    its only warning is the one the namespace's labels promise: the agent's host PID
    namespace and host paths (the checkpoint directory, the cgroups)."""
    for overlay, done in applied.dry_runs.items():
        assert done.returncode == 0, f"{overlay}: {done.stderr}"
        assert "(server dry run)" in done.stdout
        warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
        assert warnings, f"{overlay}: the namespace's warn label should flag the agent"
        assert all('host namespaces (hostPID=true), hostPath volumes (volumes '
                   '"kubelet-checkpoints", "cgroups")' in w for w in warnings), warnings


def test_the_dev_overlay_applies_and_creates_its_identities_and_rules(
        server: Server, applied: Applied) -> None:
    assert applied.applied.returncode == 0, applied.applied.stderr
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    cluster = server.cluster
    for account in all_of(applied.objects, "ServiceAccount"):
        name = account["metadata"]["name"]
        assert cluster.api(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}")
    for role in all_of(applied.objects, "ClusterRole"):
        live = cluster.api(f"{rbac}/clusterroles/{role['metadata']['name']}")
        assert live["rules"] == role["rules"]
    for binding in all_of(applied.objects, "ClusterRoleBinding"):
        live = cluster.api(f"{rbac}/clusterrolebindings/{binding['metadata']['name']}")
        assert (live["roleRef"], live["subjects"]) == (binding["roleRef"], binding["subjects"])
    for kind, path in (("Role", "roles"), ("RoleBinding", "rolebindings")):
        for obj in all_of(applied.objects, kind):
            assert cluster.api(f"{rbac}/namespaces/{NAMESPACE}/{path}/{obj['metadata']['name']}")


def _allowed(server: Server, account: str, resource: str, verb: str,
             namespace: str = "") -> bool:
    """The server's own answer (a SubjectAccessReview, as the kubelet asks it)."""
    kind, _, sub = resource.partition("/")
    attributes = {"verb": verb, "resource": kind, "subresource": sub, "namespace": namespace}
    review = server.cluster.api(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
         "spec": {"user": service_account_user(account),
                  "groups": list(service_account(account, NAMESPACE, "").groups),
                  "resourceAttributes": attributes}})
    return bool(review["status"].get("allowed"))


def test_the_server_authorizes_the_agents_kubelet_call_and_nothing_wider(
        server: Server, applied: Applied) -> None:
    """What a kubelet asks the API server before serving the agent's checkpoint request
    (the sim dumper never calls a kubelet, so this is asked directly)."""
    assert applied.applied.returncode == 0, applied.applied.stderr
    agent = pod_spec(find(applied.objects, "DaemonSet", "checkpoint-agent"))
    account = agent["serviceAccountName"]
    assert _allowed(server, account, "nodes/checkpoint", "create")
    assert not _allowed(server, account, "nodes/proxy", "create")
    assert not _allowed(server, account, "nodes/proxy", "get")
    assert not _allowed(server, account, "pods", "delete", APPS)


def test_the_server_enforces_rbac_on_these_tokens(server: Server, applied: Applied) -> None:
    """A control: the control plane's own token reading Secrets is refused, so the run
    below passing is the rules' doing, not an open server's."""
    assert applied.applied.returncode == 0, applied.applied.stderr
    workers = pod_spec(find(applied.objects, "Deployment", "controlplane"))
    token = server.cluster.tokens[workers["serviceAccountName"]]
    req = urllib.request.Request(f"{server.env.server}/api/v1/namespaces/{NAMESPACE}/secrets",
                                 headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(server.env.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10, context=context).close()
    assert refused.value.code == 403
    refused.value.close()


def test_the_migration_jobs_identity_may_do_nothing(server: Server, applied: Applied) -> None:
    job = pod_spec(find(applied.objects, "Job", "controlplane-db-upgrade"))
    account = job["serviceAccountName"]
    assert account in server.cluster.tokens
    for resource, verb in (("pods", "list"), ("pods", "get"), ("secrets", "get"),
                           ("nodes", "list"), ("events", "create")):
        assert not _allowed(server, account, resource, verb, NAMESPACE), (resource, verb)


# --- the control plane at work, with deploy/'s rights only --------------------------------

def test_a_pod_migrates_with_only_the_rights_deploy_grants(run: DeployedRun) -> None:
    assert run.migrated is not None
    assert run.migrated.returncode == 0, run.migrated.stdout + run.migrated.stderr
    assert f"migrate {APPS}/app: Succeeded" in run.migrated.stdout
    [moved] = run.pods
    assert moved["spec"]["nodeName"] == "node-2"
    assert moved["metadata"]["annotations"][MARKER] == "counter=41"


def test_a_node_drains_with_only_the_rights_deploy_grants(run: DeployedRun) -> None:
    assert run.drained is not None
    assert run.drained.returncode == 0, run.drained.stdout + run.drained.stderr
    batch = {p["metadata"]["annotations"][MARKER]: p["spec"]["nodeName"]
             for p in run.drained_pods if p["metadata"]["annotations"][MARKER] != "counter=41"}
    assert batch == {"batch-1": "node-1", "batch-2": "node-1"}, run.drained.stdout


def test_no_request_of_any_component_was_refused(run: DeployedRun, server: Server) -> None:
    """The server's audit log has no 403 for deploy/'s identities, and no component's log
    (nor the verbs' output) mentions a refusal."""
    users = {service_account_user(name) for name in server.cluster.tokens}
    refused = [(e["user"]["username"], e["verb"], e.get("requestURI"))
               for e in run.audit if e["user"]["username"] in users
               and e.get("responseStatus", {}).get("code") == 403]
    assert not refused
    assert {e["user"]["username"] for e in run.audit} >= {
        service_account_user(pod_spec(find(run.objects, kind, name))["serviceAccountName"])
        for kind, name in (("Deployment", "controlplane"), ("DaemonSet", "checkpoint-agent"))}
    logs = {p.name: p.read_text(errors="replace")
            for p in [*run.tmp.glob("*.stderr"), *run.tmp.glob("*.log")]}
    for name, verb in (("cpctl migrate", run.migrated), ("cpctl drain", run.drained)):
        assert verb is not None
        logs[name] = verb.stdout + verb.stderr
    found = {name: [line for line in text.splitlines() if REFUSED.search(line)][:5]
             for name, text in logs.items()}
    assert not {name: lines for name, lines in found.items() if lines}


def _recorded(run: DeployedRun, user: str) -> set[Grant]:
    """The resource requests ``user`` made in the run, from the server's audit log."""
    return {(ref.get("apiGroup", ""),
             ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
             e["verb"])
            for e in run.audit if e["user"]["username"] == user
            for ref in [e.get("objectRef")] if ref}


def test_the_rules_grant_exactly_what_the_run_asked_of_the_real_server(
        run: DeployedRun) -> None:
    """As on the simulator (test_deployed.py), now by a real server's audit: no rule
    missing, none unused. The agent's one kubelet grant is asked of the server by the
    kubelet, not by the agent (the SubjectAccessReview test above)."""
    for kind, name, kubelet in (("Deployment", "controlplane", set()),
                                ("DaemonSet", "checkpoint-agent",
                                 {("", "nodes/checkpoint", "create")})):
        user = service_account_user(pod_spec(find(run.objects, kind, name))[
            "serviceAccountName"])
        recorded, rules = _recorded(run, user) | kubelet, granted(run.objects, user)
        # The front door's rules too: the run drives one resource of each kind.
        assert recorded == rules, user
