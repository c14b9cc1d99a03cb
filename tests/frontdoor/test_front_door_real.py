"""The front door against a real kube-apiserver: resources applied with ``kubectl`` run to
the end on the kubelet role, their status mirrors the history, and the hard cases hold —
two workers racing on one resource, a worker killed between creating the operation and
writing the first status, a resource deleted mid-migration.

The world is an envtest of its own with deploy/'s CRDs installed, the kubelet role
(``cpctl sim nodes``) providing node-1..3, and the product beside it as processes
(``tests/e2e/world.py``: sim-dumper agents, a worker whose front door is open).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import KUBECTL
from tests.e2e.world import REPO, ROOT, ApiError, Obj, World, open_world
from tests.support import faulty_cpctl
from tests.support.envtest import (
    NODES,
    RealCluster,
    find_real_cluster,
    running_envtest,
    start_kubelet_role,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
API = "/apis/checkpoint.controlplane.dev/v1alpha1"
PLURAL = {"Checkpoint": "checkpoints", "Restore": "restores", "Migration": "migrations",
          "Suspension": "suspensions", "Drain": "drains"}


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    kind, where = find_real_cluster()
    if kind != "assets":
        pytest.fail(f"these tests start an API server of their own: {where}", pytrace=False)
    tmp = tmp_path_factory.mktemp("frontdoor")
    with running_envtest(Path(where), tmp / "envtest") as env:
        kubeconfig = env.write_kubeconfig(tmp / "admin.kubeconfig")
        kubectl(kubeconfig, "apply", "-k", str(ROOT / "deploy" / "base" / "crds"))
        kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd",
                "--all")
        role = start_kubelet_role(kubeconfig, NODES, tmp / "kubelets.log")
        try:
            real = RealCluster(kubeconfig, list(NODES), env, role)
            with open_world("real", tmp, real) as w:
                apply(w, {"apiVersion": "checkpoint.controlplane.dev/v1alpha1",
                          "kind": "CheckpointClass", "metadata": {"name": "default"},
                          "spec": {"repository": REPO}})
                yield w
        finally:
            role.stop()


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def apply(w: World, obj: Obj) -> None:
    kubectl(w.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(obj))


def resource(w: World, kind: str, name: str, **spec: Any) -> Obj:
    """A resource of ``kind`` in the world's namespace, applied with kubectl; as stored."""
    body: Obj = {"apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": kind,
                 "metadata": {"name": name, "namespace": w.namespace}, "spec": spec}
    apply(w, body)
    return read(w, kind, name) or {}


def read(w: World, kind: str, name: str) -> Obj | None:
    try:
        got: Obj = w.kube.request("GET", f"{API}/namespaces/{w.namespace}/{PLURAL[kind]}/{name}")
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise
    return got


def condition(obj: Obj | None, type_: str) -> Obj:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def settled_status(w: World, kind: str, name: str, limit: float = 120) -> Obj:
    """The resource once its status says Succeeded or Failed (True)."""
    def done() -> Obj | None:
        obj = read(w, kind, name)
        ended = any(condition(obj, t).get("status") == "True" for t in ("Succeeded", "Failed"))
        return obj if ended else None
    return wait_for(done, f"{kind} {name} settled", limit)


def operations_of(w: World, pod: str) -> list[Obj]:
    """Every operation in the store on the world's pod ``pod``."""
    listed = json.loads(w.ok("list", "--limit", "1000", "-o", "json", cluster=False))
    return [op for op in listed["items"] if (op["spec"].get("pod") or {}).get("name") == pod
            and op["spec"]["pod"].get("namespace") == w.namespace]


def events_of(w: World, operation: str) -> list[Obj]:
    history = json.loads(w.ok("history", operation, "-o", "json", cluster=False))
    return list(history if isinstance(history, list) else history["events"])


def test_a_checkpoint_applied_with_kubectl_runs_to_the_end_and_mirrors_its_artifact(
        w: World) -> None:
    pod = w.name("ckpt")
    w.make_pod(pod, "node-1")
    made = resource(w, "Checkpoint", pod, podName=pod)
    obj = settled_status(w, "Checkpoint", pod)
    status = obj["status"]
    assert condition(obj, "Succeeded")["status"] == "True", status
    assert condition(obj, "Accepted")["status"] == "True"
    assert status["operationID"] == made["metadata"]["uid"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["checkpoint"]["artifact"].startswith(REPO + ":")
    assert status["checkpoint"]["digest"].startswith("sha256:")
    assert w.get(status["operationID"])["phase"] == status["phase"]
    listed = kubectl(w.kubeconfig, "get", "ckpt", pod, "-n", w.namespace).stdout
    assert status["phase"] in listed


def test_kubectl_apply_of_a_migration_yaml_moves_the_pod_and_get_shows_it_succeeded(
        w: World) -> None:
    pod = w.name("mig")
    w.make_pod(pod, "node-1")
    manifest = w.tmp / f"{pod}.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "Migration",
        "metadata": {"name": pod, "namespace": w.namespace},
        "spec": {"podName": pod, "targetNodeName": "node-2"}}))
    kubectl(w.kubeconfig, "apply", "-f", str(manifest))
    obj = settled_status(w, "Migration", pod)
    assert condition(obj, "Succeeded")["status"] == "True", obj["status"]
    assert obj["status"]["pod"] == f"{w.namespace}/{pod}"
    moved = w.running(pod)
    assert moved["spec"]["nodeName"] == "node-2"
    assert condition(obj, "Progressing")["status"] == "False"
    assert obj["status"]["completionTime"] >= obj["status"]["startTime"]
    listed = kubectl(w.kubeconfig, "get", "migrations", "-n", w.namespace).stdout
    [row] = [line.split() for line in listed.splitlines() if line.startswith(pod + " ")]
    assert "Succeeded" in row


def test_a_suspension_suspends_and_operating_mode_running_resumes(w: World) -> None:
    pod = w.name("susp")
    w.make_pod(pod, "node-3")
    resource(w, "Suspension", pod, podName=pod)
    suspended = wait_for(lambda: (o := read(w, "Suspension", pod)) and (
        o.get("status") or {}).get("phase") == "Suspended" and o, "suspended", 120)
    assert w.kube.pod(w.namespace, pod) is None
    assert suspended["status"]["checkpoint"]["artifact"]
    resource(w, "Suspension", pod, podName=pod, operatingMode="Running")
    resumed = wait_for(lambda: (o := read(w, "Suspension", pod)) and (
        o.get("status") or {}).get("phase") == "Resumed" and o, "resumed", 120)
    assert resumed["status"]["observedGeneration"] == resumed["metadata"]["generation"] == 2
    assert condition(resumed, "Succeeded")["status"] == "True"
    assert w.running(pod)["metadata"]["name"] == pod


def test_a_restore_names_its_checkpoint_resource(w: World) -> None:
    pod = w.name("src")
    w.make_pod(pod, "node-1")
    resource(w, "Checkpoint", pod, podName=pod)
    assert condition(settled_status(w, "Checkpoint", pod), "Succeeded")["status"] == "True"
    copy = w.name("copy")
    resource(w, "Restore", copy, checkpointName=pod, nodeName="node-2", podName=copy)
    obj = settled_status(w, "Restore", copy)
    assert condition(obj, "Succeeded")["status"] == "True", obj["status"]
    assert w.running(copy)["spec"]["nodeName"] == "node-2"


def test_a_drain_moves_every_pod_off_its_node(w: World) -> None:
    pods = [w.name("drained") for _ in range(3)]
    for pod in pods:
        w.make_pod(pod, "node-3", labels={"drain-test": "yes"})
    name = w.name("drain")
    body: Obj = {"apiVersion": "checkpoint.controlplane.dev/v1alpha1", "kind": "Drain",
                 "metadata": {"name": name},
                 "spec": {"nodeName": "node-3", "targets": ["node-1", "node-2"]}}
    apply(w, body)

    def drained() -> Obj | None:
        obj = w.kube.request("GET", f"{API}/drains/{name}")
        ended = any(condition(obj, t).get("status") == "True" for t in ("Succeeded", "Failed"))
        return obj if ended else None
    obj = wait_for(drained, "drain settled", 240)
    assert condition(obj, "Succeeded")["status"] == "True", obj["status"]
    assert obj["status"]["drain"]["succeeded"] >= 3
    for pod in pods:
        assert w.running(pod)["spec"]["nodeName"] in ("node-1", "node-2")
    node = w.kube.request("GET", "/api/v1/nodes/node-3")
    assert node["spec"].get("unschedulable") is True
    w.kube.request("PATCH", "/api/v1/nodes/node-3", {"spec": {"unschedulable": None}},
                   content_type="application/merge-patch+json")


def test_a_refused_spec_is_a_condition_and_creates_nothing(w: World) -> None:
    name = w.name("ghost")
    made = resource(w, "Migration", name, podName="no-such-pod", targetNodeName="node-2")
    obj = wait_for(lambda: (o := read(w, "Migration", name)) and condition(
        o, "Accepted").get("status") == "False" and o, "refused", 60)
    accepted = condition(obj, "Accepted")
    assert accepted["reason"] == "InvalidSpec"
    assert "no-such-pod" in accepted["message"]
    assert w.cpctl("get", made["metadata"]["uid"]).returncode != 0
    kubectl(w.kubeconfig, "delete", "migration", name, "-n", w.namespace, "--timeout=60s")
    assert read(w, "Migration", name) is None


def test_two_workers_racing_on_one_resource_create_one_operation(w: World) -> None:
    second = w.start("worker-2", "controlplane.cli.main", "--db", w.db, "worker",
                     "--poll-seconds", "0.05", *w.cluster_args())
    try:
        pods = [w.name("race") for _ in range(3)]
        for pod in pods:
            w.make_pod(pod, "node-2")
        for pod in pods:
            resource(w, "Checkpoint", pod, podName=pod)
        for pod in pods:
            obj = settled_status(w, "Checkpoint", pod)
            assert condition(obj, "Succeeded")["status"] == "True", obj["status"]
            ops = operations_of(w, pod)
            assert [op["id"] for op in ops] == [obj["metadata"]["uid"]]
            submitted = [e for e in events_of(w, obj["metadata"]["uid"])
                         if e["type"] == "Submitted"]
            assert len(submitted) == 1
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


def test_a_worker_killed_after_creating_the_operation_leaves_it_to_the_next(
        w: World) -> None:
    first = w.procs["worker"]
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    if first.stdout is not None:
        first.stdout.close()
    pod = w.name("crash")
    w.make_pod(pod, "node-1")
    # SIGKILLed by an injected fault right after creating an operation (test-only entry).
    argv = faulty_cpctl.command(["--db", w.db, "worker", "--poll-seconds", "0.05",
                                 *w.cluster_args()], "frontdoor.submitted")
    with (w.tmp / "crashing.stderr").open("w") as err:
        crashing = subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, text=True,
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    made = resource(w, "Checkpoint", pod, podName=pod)
    assert crashing.wait(120) == -signal.SIGKILL
    uid = made["metadata"]["uid"]
    assert w.get(uid)["id"] == uid  # the operation exists...
    assert not (read(w, "Checkpoint", pod) or {}).get("status")  # ...its status does not
    w.start("worker", "controlplane.cli.main", "--db", w.db, "worker", "--poll-seconds",
            "0.05", *w.cluster_args())
    obj = settled_status(w, "Checkpoint", pod)
    assert condition(obj, "Succeeded")["status"] == "True", obj["status"]
    assert [op["id"] for op in operations_of(w, pod)] == [uid]


def test_deleting_a_migration_mid_way_cancels_it_and_keeps_the_history(w: World) -> None:
    pod = w.name("cancel")
    w.make_pod(pod, "node-1")
    with w.paused("node-1"):  # the capture waits on the source's agent
        made = resource(w, "Migration", pod, podName=pod, targetNodeName="node-2")
        uid = made["metadata"]["uid"]
        wait_for(lambda: (read(w, "Migration", pod) or {}).get("status", {}).get(
            "operationID") == uid, "accepted", 60)
        kubectl(w.kubeconfig, "delete", "migration", pod, "-n", w.namespace, "--wait=false")
        held = read(w, "Migration", pod)
        assert held is not None
        assert held["metadata"].get("deletionTimestamp")
    wait_for(lambda: read(w, "Migration", pod) is None, "deleted once settled", 120)
    record = w.get(uid)
    assert record["terminal"]
    assert record["phase"] != "Succeeded"
    assert w.running(pod)["spec"]["nodeName"] == "node-1"
    assert any("Cancel" in e["type"] for e in events_of(w, uid))


def test_a_lost_status_is_rebuilt_from_the_history(w: World) -> None:
    pod = w.name("lost")
    w.make_pod(pod, "node-2")
    resource(w, "Checkpoint", pod, podName=pod)
    before = settled_status(w, "Checkpoint", pod)["status"]
    w.kube.request("PATCH", f"{API}/namespaces/{w.namespace}/checkpoints/{pod}/status",
                   {"status": {"phase": "Edited", "conditions": None, "checkpoint": None}},
                   content_type="application/merge-patch+json")
    rebuilt = wait_for(lambda: (o := read(w, "Checkpoint", pod)) and (
        o.get("status") or {}).get("phase") == before["phase"] and o, "rebuilt", 60)
    assert rebuilt["status"]["checkpoint"] == before["checkpoint"]
    assert condition(rebuilt, "Succeeded")["status"] == "True"
