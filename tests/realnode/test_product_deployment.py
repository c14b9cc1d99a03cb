"""A Deployment's pod migrates between real nodes by adoption, judged by the real
kube-controller-manager and kube-scheduler (``Envtest.start_controllers``).

The pod (1 replica, the counter whose count and token live only in its shell's memory)
is checkpointed through the kubelet API with its source kept stopped, restored by CRI-O
on the other node beside it with its labels parked, handed to its ReplicaSet, and the
source deleted (``docs/owners.md``). No admission webhook is needed: it holds only a
StatefulSet's successor. The judges: the ReplicaSet owns the restored pod and never
made a cold copy (a real watch); the Deployment counts one available replica; the
restored container's own log goes on with the same token, no repeat and no gap; every
kubelet checkpoint directory is empty again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.world import Obj
from tests.realnode.product import (
    ProductWorld,
    consecutive,
    open_product_world,
    restored_status,
)
from tests.support.podwatch import PodWatch
from tests.support.realnode import counter_command
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realdeploy")) as w:
        yield w


def _running(w: ProductWorld, app: str) -> list[Obj]:
    """The app's pods once exactly one runs and none is on its way out."""
    def one() -> list[Obj] | None:
        pods = w.kube.pods(w.namespace, f"app={app}")
        running = w.running_pods(f"app={app}")
        return running if len(running) == 1 and len(pods) == 1 else None
    return wait_for(one, f"one running {app} pod", 120)


def test_a_deployment_pod_migrates_and_its_replicaset_adopts_the_restored_counter(
        world: ProductWorld) -> None:
    w = world
    app = w.name("dep")
    w.kube.request("POST", f"/apis/apps/v1/namespaces/{w.namespace}/deployments", {
        "metadata": {"name": app},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}}, "spec": {
                     "containers": [{"name": "main", "image": w.real.image,
                                     "command": counter_command()}],
                     "terminationGracePeriodSeconds": 0}}}})
    try:
        [pod] = _running(w, app)
        name, source_node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet"  # the real controller made it
        target = next(n for n in w.real.names if n != source_node)
        before = w.ticking(name)
        with PodWatch(w) as watch:
            out = w.ok("migrate", f"{w.namespace}/{name}", "--to", target, "--repository",
                       w.repository, "--wait", "--wait-seconds", "180")
            ended = time.time()
            [moved] = _running(w, app)
        assert f"migrate {w.namespace}/{name}: Succeeded" in out, out
        assert moved["metadata"]["uid"] != pod["metadata"]["uid"]
        assert moved["spec"]["nodeName"] == target
        assert f"(pod {w.namespace}/{moved['metadata']['name']})" in out  # named in output
        ref = moved["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["controller"]) == \
            ("ReplicaSet", owner["name"], True)
        # The RS made no cold copy: its pods carry the app label from their creation; a
        # restore attempt that failed (CRI-O may not know the base image yet: retried) is
        # created with its labels parked and deleted without them.
        assert watch.created(app) == {moved["metadata"]["uid"]}
        assert w.real.pod(name) is None, "the source is gone"
        restored_status(moved, w.repository)
        log = w.counting_since(moved["metadata"]["name"], target, ended)
        consecutive(log)
        assert log[0][1] == before[0][1], "the same life: the token drawn at start"
        assert log[-1][0] > before[-1][0] + 3
        deployment = wait_for(lambda: d if (d := w.kube.request(
            "GET", f"/apis/apps/v1/namespaces/{w.namespace}/deployments/{app}")).get(
            "status", {}).get("availableReplicas") == 1 else None,
            f"deployment {app} with one available replica")
        assert deployment["status"].get("replicas") == 1, deployment["status"]
        assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    finally:
        w.kube.request("DELETE", f"/apis/apps/v1/namespaces/{w.namespace}/deployments/{app}",
                       {"propagationPolicy": "Background"})
