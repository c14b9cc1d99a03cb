"""Against the real kube-controller-manager and kube-scheduler: a ReplicaSet's pod moves by
adoption (no cold copy, the replica count kept, the restored pod owned); other
controllers' pods are refused by name, never half-moved; bare pods beside them move.

The world is a kube-apiserver of its own with the real ReplicaSet, Deployment and
StatefulSet controllers and the real scheduler (``Envtest.start_controllers``), the
kubelet role binding nothing (``--no-scheduler``: it only runs the nodes' kubelets), and
the product beside it as processes (``tests/e2e/world.py``: sim-dumper agents, a worker,
``cpctl`` verbs). What the real controllers do is the judge: after each refusal the
workload has exactly its replicas, with the same pods (UIDs) as before.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from drivers.sim import MARKER
from tests.deploy.manifests import KUBECTL
from tests.e2e.world import Obj, World, open_world
from tests.support.envtest import (
    NODES,
    ROOT,
    RealCluster,
    find_real_cluster,
    free_port,
    running_envtest,
    start_kubelet_role,
)
from tests.support.podwatch import PodWatch
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow
AFFINITY_NODE_1 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                  "operator": "In", "values": ["node-1"]}]}]}}}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.fail(f"these tests start a control plane of their own: {where}", pytrace=False)
    tmp = tmp_path_factory.mktemp("controllers")
    with running_envtest(Path(where), tmp / "envtest") as env:
        env.start_controllers()
        kubeconfig = env.write_kubeconfig(tmp / "admin.kubeconfig")
        role = start_kubelet_role(kubeconfig, NODES, tmp / "kubelets.log", "--no-scheduler")
        try:
            real = RealCluster(kubeconfig, list(NODES), env, role)
            with open_world("real", tmp, real) as w:
                _serve_webhook(w, kubeconfig)
                yield w
        finally:
            role.stop()


def _serve_webhook(w: World, kubeconfig: Path) -> None:
    """The control plane's restore-gate webhook as a process over the world's database,
    registered as deploy/ registers it (by loopback URL), once the API server calls it."""
    certs = w.tmp / "webhook-certs"
    made = w.cpctl("webhook", "certs", "--out", str(certs), "--service", "controlplane-webhook",
                   "--namespace", "checkpoint-system", "--ip", "127.0.0.1")
    assert made.returncode == 0, made.stderr
    port = free_port()
    w.start("webhook", "controlplane.cli.main", "--db", w.db, "webhook", "serve", "--cert",
            str(certs / "tls.crt"), "--key", str(certs / "tls.key"), "--host", "127.0.0.1",
            "--port", str(port))
    [config] = [d for d in yaml.safe_load_all(subprocess.run(
        [KUBECTL, "kustomize", "deploy/overlays/dev/webhook"], cwd=ROOT, check=True,
        capture_output=True, text=True).stdout) if d and d["kind"] ==
        "MutatingWebhookConfiguration"]
    config["webhooks"][0]["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate/pods",
                                             "caBundle": made.stdout.strip()}
    w.kube.request("POST", "/apis/admissionregistration.k8s.io/v1/"
                   "mutatingwebhookconfigurations", config)
    probe = {"metadata": {"name": "probe-0", "ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "probe",
        "uid": "00000000-0000-4000-8000-000000000001", "controller": True}]},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def called() -> bool:
        w.kube.request("POST", f"/api/v1/namespaces/{w.namespace}/pods?dryRun=All", probe)
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=5,
                                        context=context) as resp:
                return int(json.loads(resp.read())["reviews"]) > 0
        except urllib.error.HTTPError as exc:  # up, not serving yet: close its socket
            exc.close()
            return False
        except OSError:  # not listening yet
            assert w.procs["webhook"].poll() is None, w.stderr("webhook")
            return False
    wait_for(called, "the API server to call the webhook", 60)


def _apply(w: World, path: str, body: Obj) -> None:
    w.kube.request("POST", path, body)


def _template(app: str, *, pin: bool) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
                 "terminationGracePeriodSeconds": 1}
    if pin:
        spec["affinity"] = AFFINITY_NODE_1
    return {"metadata": {"labels": {"app": app, "e2e": "verbs"}}, "spec": spec}


def _running(w: World, app: str, count: int) -> list[Obj]:
    def ready() -> list[Obj] | None:
        pods = w.running_pods(f"app={app}")
        return pods if len(pods) == count else None
    return wait_for(ready, f"{count} running {app} pods", 120)


def _uids(pods: list[Obj]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def test_a_deployment_pod_migrates_and_its_replicaset_adopts_the_restored_pod(
        world: World) -> None:
    """Never a cold replacement, never two running copies, three replicas at the end, the
    restored pod owned by the ReplicaSet with its marker; judged by the real controller."""
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/deployments", {
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": _template("web", pin=False)}})
    before = _running(w, "web", 3)
    pod = before[0]
    name, owner = pod["metadata"]["name"], pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"  # the real controller made it
    w.kube.request("PATCH", f"/api/v1/namespaces/{w.namespace}/pods/{name}",
                   {"metadata": {"annotations": {MARKER: "n=7"}}},
                   "application/merge-patch+json")
    target = next(n for n in NODES if n != pod["spec"]["nodeName"])
    with PodWatch(w) as watch:
        out = w.ok("migrate", f"{w.namespace}/{name}", "--to", target, "--wait",
                   "--wait-seconds", "120", "--repository", "localhost:5000/checkpoints")
        after = _running(w, "web", 3)
    assert "Succeeded" in out, out
    restored = [p for p in after if p["metadata"]["uid"] not in _uids(before)]
    assert len(restored) == 1, [p["metadata"]["name"] for p in after]
    moved = restored[0]
    assert moved["spec"]["nodeName"] == target
    assert moved["metadata"]["annotations"][MARKER] == "n=7"  # its state came along
    ref = moved["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("ReplicaSet", owner["name"], True)
    assert f"(pod {w.namespace}/{moved['metadata']['name']})" in out  # the output names it
    assert _uids(after) == (_uids(before) - {pod["metadata"]["uid"]}) | {moved["metadata"]["uid"]}
    # the controller made no cold copy (a retried restore attempt's pod never had labels)
    assert watch.created("web") == {moved["metadata"]["uid"]}
    assert watch.most_running_with(MARKER, "n=7") == 1  # never two live copies


def test_a_statefulset_pod_is_refused_a_suspend_and_keeps_its_identity(world: World) -> None:
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/statefulsets", {
        "metadata": {"name": "kv"},
        "spec": {"replicas": 2, "serviceName": "kv",
                 "selector": {"matchLabels": {"app": "kv"}},
                 "template": _template("kv", pin=False)}})
    before = _running(w, "kv", 2)
    assert sorted(p["metadata"]["name"] for p in before) == ["kv-0", "kv-1"]
    done = w.cpctl("suspend", f"{w.namespace}/kv-1", "--repository",
                   "localhost:5000/checkpoints", cluster=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"owned by StatefulSet {w.namespace}/kv" in done.stderr
    assert "scale the StatefulSet down" in done.stderr  # what to do instead
    assert _uids(_running(w, "kv", 2)) == _uids(before)


def test_a_statefulset_pod_migrates_into_its_gated_successor_keeping_name_and_claim(
        world: World) -> None:
    """Same name on the target node, its marker intact, the same volume claim bound to
    the same volume; the controller's successor never ran cold (judged by a real watch)."""
    w = world
    for i in range(2):
        w.kube.request("POST", "/api/v1/persistentvolumes", {
            "metadata": {"name": w.name(f"pv{i}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "manual", "hostPath": {"path": f"/tmp/pv{i}"}}})
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/statefulsets", {
        "metadata": {"name": "db"},
        "spec": {"replicas": 2, "serviceName": "db",
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": _template("db", pin=False),
                 "volumeClaimTemplates": [{
                     "metadata": {"name": "data"},
                     "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                              "resources": {"requests": {"storage": "1Gi"}}}}]}})
    before = {p["metadata"]["name"]: p for p in _running(w, "db", 2)}
    source = before["db-1"]
    claim = w.kube.request("GET", f"/api/v1/namespaces/{w.namespace}/persistentvolumeclaims/"
                           "data-db-1")
    w.kube.request("PATCH", f"/api/v1/namespaces/{w.namespace}/pods/db-1",
                   {"metadata": {"annotations": {MARKER: "n=11"}}},
                   "application/merge-patch+json")
    target = next(n for n in NODES if n not in (source["spec"]["nodeName"],
                                                before["db-0"]["spec"]["nodeName"]))
    with PodWatch(w) as watch:
        out = w.ok("migrate", f"{w.namespace}/db-1", "--to", target, "--wait",
                   "--wait-seconds", "120", "--repository", "localhost:5000/checkpoints")
        after = {p["metadata"]["name"]: p for p in _running(w, "db", 2)}
    assert "Succeeded" in out, out
    moved = after["db-1"]
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]  # the controller's successor
    assert moved["spec"]["nodeName"] == target
    assert moved["metadata"]["annotations"][MARKER] == "n=11"
    assert moved["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert not moved["spec"].get("schedulingGates")
    volumes = {v["name"]: v for v in moved["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "data-db-1"
    now = w.kube.request("GET", f"/api/v1/namespaces/{w.namespace}/persistentvolumeclaims/"
                         "data-db-1")
    assert (now["metadata"]["uid"], now["spec"]["volumeName"]) == (
        claim["metadata"]["uid"], claim["spec"]["volumeName"])
    assert after["db-0"]["metadata"]["uid"] == before["db-0"]["metadata"]["uid"]
    assert f"(pod {w.namespace}/db-1)" in out
    assert watch.created() == {moved["metadata"]["uid"]}  # one successor, ours
    assert watch.most_running_with(MARKER, "n=11") == 1  # never two live copies
    assert watch.ran_ungated(moved["metadata"]["uid"]) is False


def test_a_drain_moves_the_bare_pod_and_hands_the_replicaset_pods_over(world: World) -> None:
    w = world
    _apply(w, f"/apis/apps/v1/namespaces/{w.namespace}/replicasets", {
        "metadata": {"name": "pinned"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "pinned"}},
                 "template": _template("pinned", pin=True)}})
    owned = _running(w, "pinned", 2)
    bare = w.make_pod(w.name("bare"), "node-1", marker="n=5", labels={"app": "bare-drain"})
    plan = json.loads(w.ok("drain", "node-1", "--dry-run", "-o", "json",
                           "--repository", "localhost:5000/checkpoints"))
    how = {m["pod"]: m["how"] for m in plan["moves"]}
    assert how[f"{w.namespace}/{bare['metadata']['name']}"] == \
        "bare: restored under its own name"
    for p in owned:
        assert how[f"{w.namespace}/{p['metadata']['name']}"].startswith("adopted: ")
    with PodWatch(w) as watch:
        out = w.ok("drain", "node-1", "--repository", "localhost:5000/checkpoints",
                   "--wait", "--wait-seconds", "180")
        after = _running(w, "pinned", 2)
    assert "drain node-1" in out
    moved = wait_for(lambda: w.running_pods("app=bare-drain") or None, "the bare pod moved")
    assert moved[0]["spec"]["nodeName"] != "node-1"
    assert moved[0]["metadata"]["name"] == bare["metadata"]["name"]  # it kept its name
    assert not _uids(after) & _uids(owned)  # both restored elsewhere ...
    assert all(p["spec"]["nodeName"] != "node-1" for p in after)
    assert all(p["metadata"]["ownerReferences"][0]["name"] == "pinned" for p in after)
    assert watch.created("pinned", "bare-drain") == \
        _uids(after) | {moved[0]["metadata"]["uid"]}  # ... and no cold copy
