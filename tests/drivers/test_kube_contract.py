"""The cluster port's contract: what the Kubernetes driver promises the engine.

Every test runs on the simulator and, when ``CONTROLPLANE_TEST_KUBECONFIG`` is set, on a
real cluster (see ``harness.py``); tests that need fault injection skip on the real one.
Invariants pinned: observations come from the watch cache and tell a recreated pod by
its UID; no action ever touches a pod whose UID is not the one named (gate 4); every
action is idempotent; watch changes wake by pod UID; the cache heals a 410 by relisting.

Each docstring's "Pins" line names the real API-server behaviour the test holds the
simulator to (run it on a real cluster to check both); ``test_kube_api_semantics`` pins
the lower-level behaviours the driver's code paths depend on.
"""

from __future__ import annotations

from typing import Any

from controlplane.engine.decider import Action
from controlplane.engine.observation import Interests, NodeView, PodView, ProbeError
from drivers.kube.driver import KubeDriver
from drivers.kube.resources import EVENTS, PODS
from tests.drivers.harness import Harness, Wakes


def _phase(kube: KubeDriver, key: str) -> str | None:
    pod = kube.pods.get(key)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def _uid(kube: KubeDriver, key: str) -> str | None:
    pod = kube.pods.get(key)
    return None if pod is None else pod["metadata"]["uid"]


def _act(type_: str, key: str, **params: Any) -> Action:
    return Action(type_, key, params)


async def _recreate(h: Harness, kube: KubeDriver, name: str) -> tuple[str, str]:
    """Create ``name``, then delete and recreate it: returns (old uid, new uid)."""
    key = f"{h.namespace}/{name}"
    old = (await h.make_pod(name))["metadata"]["uid"]
    await kube.pods.wait_until(lambda: _uid(kube, key) == old, limit_seconds=h.patience)
    await h.delete_now(name)
    await kube.pods.wait_until(lambda: kube.pods.get(key) is None, limit_seconds=h.patience)
    new = (await h.make_pod(name))["metadata"]["uid"]
    await kube.pods.wait_until(lambda: _uid(kube, key) == new, limit_seconds=h.patience)
    assert old != new
    return old, new


async def test_observer_answers_pods_and_nodes_from_the_cache(harness: Harness) -> None:
    """A running pod is observed with its UID, node, phase and readiness, from the cache;
    a missing pod is ``None`` only after the API server's 404 (one GET: a cache proves
    presence, never absence); a node is ready; registry tags are a ProbeError, never
    "absent".

    Pins: the scheduler honours required node affinity; a running pod has ``nodeName``,
    phase ``Running`` and condition ``Ready=True``; a node's ``Ready`` condition; LIST +
    WATCH of pods and nodes sync without any further GET; GET of a missing pod is 404."""
    h = harness
    name = h.name("observed")
    async with h.driver() as kube:
        created = await h.make_pod(name, node=h.nodes[0], annotations={"a": "1"})
        key = f"{h.namespace}/{name}"
        await kube.pods.wait_until(lambda: _phase(kube, key) == "Running",
                                   limit_seconds=h.patience)
        before = kube.requests.snapshot()
        seen = await kube.observer.observe(Interests(
            pods=frozenset({key, f"{h.namespace}/{h.name('absent')}"}),
            nodes=frozenset({h.nodes[0]}), tags=frozenset({"registry.local/repo:tag"})))
        assert kube.requests.since(before) == {"get": 1}, "only the absent pod is read"
    pod = seen.pods[key]
    assert isinstance(pod, PodView)
    assert (pod.uid, pod.node, pod.phase, pod.ready, pod.deleting) == (
        created["metadata"]["uid"], h.nodes[0], "Running", True, False)
    assert pod.annotations["a"] == "1"
    assert [v for k, v in seen.pods.items() if k != key] == [None]
    node = seen.nodes[h.nodes[0]]
    assert isinstance(node, NodeView)
    assert node.ready
    assert not node.unschedulable
    assert isinstance(seen.tags["registry.local/repo:tag"], ProbeError)


async def test_a_recreated_pod_is_observed_with_its_new_uid_and_wakes_both(
        harness: Harness) -> None:
    """Same name, new UID: the observation carries the newcomer's UID, and the watch wakes
    the machines of the old UID (it was deleted) and of the new one.

    Pins: a pod recreated under the same name gets a new ``metadata.uid``; the watch sends
    the old one's ``DELETED`` (with its UID) before the newcomer's ``ADDED``."""
    h, wakes = harness, Wakes()
    name = h.name("reborn")
    async with h.driver(wakes) as kube:
        old, new = await _recreate(h, kube, name)
        seen = await kube.observer.observe(Interests(pods=frozenset({f"{h.namespace}/{name}"})))
        await wakes.wait_for(new, limit_seconds=h.patience)
    pod = seen.pods[f"{h.namespace}/{name}"]
    assert isinstance(pod, PodView)
    assert pod.uid == new
    assert old in wakes.uids
    assert new in wakes.uids


async def test_annotating_with_a_stale_uid_leaves_the_recreated_pod_untouched(
        harness: Harness) -> None:
    """AnnotatePod / RemovePodAnnotations with the old UID are done without patching the
    newcomer; with the current UID they apply.

    Pins: a strategic merge patch carrying another ``metadata.uid`` is refused (422,
    immutable field); ``null`` in a strategic merge patch removes an annotation, and
    removing one that is absent is not an error."""
    h = harness
    name = h.name("stale")
    async with h.driver() as kube:
        old, new = await _recreate(h, kube, name)
        handlers = kube.handlers()
        await handlers["AnnotatePod"](_act("AnnotatePod", "k/1", namespace=h.namespace,
                                           name=name, uid=old, annotations={"x": "stale"}))
        pod = await h.pod(name)
        assert pod is not None
        assert "x" not in (pod["metadata"].get("annotations") or {})
        await handlers["AnnotatePod"](_act("AnnotatePod", "k/2", namespace=h.namespace,
                                           name=name, uid=new, annotations={"x": "1", "y": "2"}))
        await handlers["RemovePodAnnotations"](_act(
            "RemovePodAnnotations", "k/3", namespace=h.namespace, name=name, uid=old,
            keys=["x"]))
        await handlers["RemovePodAnnotations"](_act(
            "RemovePodAnnotations", "k/4", namespace=h.namespace, name=name, uid=new,
            keys=["y", "never-set"]))
        pod = await h.pod(name)
    assert pod is not None
    assert pod["metadata"]["uid"] == new
    annotations = pod["metadata"].get("annotations") or {}
    assert annotations.get("x") == "1"
    assert "y" not in annotations


async def test_delete_with_a_uid_precondition_spares_a_newcomer(harness: Harness) -> None:
    """DeletePod of the old UID is done and leaves the same-named newcomer alone; of the
    current UID it deletes; a repeat on the gone pod (404) is done too.

    Pins: ``preconditions.uid`` of another pod is ``409`` "the UID in the precondition (…)
    does not match the UID in record (…)" (recognised without a GET) and deletes nothing;
    a DELETE of a gone pod is 404."""
    h = harness
    name = h.name("victim")
    key = f"{h.namespace}/{name}"
    async with h.driver() as kube:
        old, new = await _recreate(h, kube, name)
        delete = kube.handlers()["DeletePod"]
        before = kube.requests.snapshot()
        await delete(_act("DeletePod", "d/1", namespace=h.namespace, name=name, uid=old,
                          reason="test"))
        assert kube.requests.since(before) == {"delete": 1}, "recognised without a GET"
        survivor = await h.pod(name)
        assert survivor is not None
        assert survivor["metadata"]["uid"] == new
        assert survivor["metadata"].get("deletionTimestamp") is None
        await delete(_act("DeletePod", "d/2", namespace=h.namespace, name=name, uid=new,
                          reason="test"))
        await kube.pods.wait_until(lambda: kube.pods.get(key) is None, limit_seconds=h.patience)
        await delete(_act("DeletePod", "d/2", namespace=h.namespace, name=name, uid=new,
                          reason="test"))


async def test_create_pod_is_idempotent_and_places_by_required_affinity(
        harness: Harness) -> None:
    """CreatePod twice makes one pod (AlreadyExists is done); it carries REQUIRED node
    affinity to the target instead of nodeName, and the scheduler puts it there.

    Pins: a second POST of a name is ``409 AlreadyExists`` (not ``Conflict``); the API
    server stores the affinity terms as sent; the scheduler binds by required affinity."""
    h = harness
    name = h.name("restored")
    target = h.nodes[-1]
    h.created.append(name)
    template = {"metadata": {"labels": {"app": "demo"}, "annotations": {"from": "template"}},
                "spec": {"containers": [{"name": "main", "image": h.pod_body("x")["spec"][
                    "containers"][0]["image"]}], "terminationGracePeriodSeconds": 1,
                         "nodeSelector": {"kubernetes.io/hostname": "old-node"}}}
    action = _act("CreatePod", "c/1", namespace=h.namespace, name=name, template=template,
                  node=target, annotations={"restore": "yes"}, labels={"app": "restored"})
    async with h.driver() as kube:
        create = kube.handlers()["CreatePod"]
        await create(action)
        first = await h.pod(name)
        await create(action)
        key = f"{h.namespace}/{name}"
        await kube.pods.wait_until(lambda: _phase(kube, key) == "Running",
                                   limit_seconds=h.patience)
        pod = kube.pods.get(key)
    assert first is not None
    assert pod is not None
    assert pod["metadata"]["uid"] == first["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == target
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": [target]}]}]
    assert "kubernetes.io/hostname" not in (pod["spec"].get("nodeSelector") or {})
    assert pod["metadata"]["labels"]["app"] == "restored"
    assert pod["metadata"]["annotations"] == {"from": "template", "restore": "yes"}


async def test_emit_event_creates_one_event_per_action_key(harness: Harness) -> None:
    """EmitEvent twice with one key makes one core/v1 Event about the pod.

    Pins: core/v1 Events accept a client-chosen name (so a repeat is AlreadyExists) and
    field selectors on ``involvedObject.name`` and ``reason``."""
    h = harness
    name = h.name("noted")
    async with h.driver() as kube:
        uid = (await h.make_pod(name))["metadata"]["uid"]
        action = _act("EmitEvent", f"machine-{name}/event/finished", namespace=h.namespace,
                      object={"kind": "Pod", "name": name, "uid": uid}, type="Warning",
                      reason="CheckpointFailed", message="capture failed: criu")
        emit = kube.handlers()["EmitEvent"]
        await emit(action)
        await emit(action)
        events, _ = await h.admin.list_all(EVENTS, namespace=h.namespace,
                                           field_selector=f"involvedObject.name={name},"
                                                          f"reason=CheckpointFailed")
    assert len(events) == 1
    event = events[0]
    assert (event["type"], event["message"], event["involvedObject"]["uid"]) == (
        "Warning", "capture failed: criu", uid)


async def test_a_watched_change_wakes_with_the_pod_uid(harness: Harness) -> None:
    """A change made by someone else reaches ``on_pod_change(uid)`` through the watch.

    Pins: an annotation patch is a ``MODIFIED`` watch event carrying the pod's UID."""
    h, wakes = harness, Wakes()
    name = h.name("watched")
    async with h.driver(wakes) as kube:
        uid = (await h.make_pod(name))["metadata"]["uid"]
        await wakes.wait_for(uid, limit_seconds=h.patience)
        mark = len(wakes.uids)
        await h.admin.patch(PODS, name, {"metadata": {"annotations": {"poke": "1"}}},
                            namespace=h.namespace)
        await wakes.wait_for(uid, limit_seconds=h.patience, after=mark)
        assert kube.wakes is not None
        assert kube.wakes.failed == 0


async def test_requests_are_counted_by_verb(harness: Harness) -> None:
    """Benchmarks read API requests by verb: one create, one patch, one delete here.

    Pins: each handler is exactly one request when nothing fails (no read-before-write),
    on any API server."""
    h = harness
    name = h.name("counted")
    h.created.append(name)
    template = {"metadata": {}, "spec": h.pod_body(name)["spec"]}
    async with h.driver() as kube:
        before = kube.requests.snapshot()
        handlers = kube.handlers()
        await handlers["CreatePod"](_act("CreatePod", "n/1", namespace=h.namespace, name=name,
                                         template=template, node=None, annotations={},
                                         labels={}))
        pod = await h.pod(name)
        assert pod is not None
        uid = pod["metadata"]["uid"]
        await handlers["AnnotatePod"](_act("AnnotatePod", "n/2", namespace=h.namespace,
                                           name=name, uid=uid, annotations={"k": "v"}))
        await handlers["DeletePod"](_act("DeletePod", "n/3", namespace=h.namespace, name=name,
                                         uid=uid, reason="test"))
        counts = kube.requests.since(before)
    # (watch/list are left out: a cache may reconnect meanwhile on a real cluster)
    assert {verb: counts.get(verb, 0) for verb in ("get", "create", "patch", "delete")} == {
        "get": 0, "create": 1, "patch": 1, "delete": 1}


async def test_a_label_scoped_cache_reads_through_for_pods_it_does_not_hold(
        harness: Harness) -> None:
    """With a pod label selector the cache cannot prove absence: a pod outside it is read
    from the API server, not reported missing.

    Pins: LIST/WATCH with a ``labelSelector`` leave out non-matching pods; GET ignores it."""
    h = harness
    name = h.name("unlabelled")
    async with h.driver(pod_label_selector=f"test={h.name('elsewhere')}") as kube:
        uid = (await h.make_pod(name))["metadata"]["uid"]
        seen = await kube.observer.observe(Interests(pods=frozenset({f"{h.namespace}/{name}"})))
        assert len(kube.pods) == 0
    pod = seen.pods[f"{h.namespace}/{name}"]
    assert isinstance(pod, PodView)
    assert pod.uid == uid
