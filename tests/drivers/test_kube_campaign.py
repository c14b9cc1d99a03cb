"""The driver through fault campaigns: conflict storms, error rates and latency.

Part of the contract suite (same ``harness``): on a real cluster the campaigns run in
the fault proxy in front of it (see ``harness.py``). Invariants pinned:

- a 409 storm on a pod's writes is retryable for every handler that writes it (never
  "done": a DeletePod 409 that is not the UID precondition is checked, not trusted), and
  the worker's ``ActionRunner`` gets each action through the storm, by count or by time
  window (the window runs on a fake clock, advanced once per attempt);
- under a seeded campaign of error rates (500, 503, 429) and latency on every verb the
  handlers send, every action still takes effect exactly as without faults, and the
  request counter shows the injected failures.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from controlplane.engine.decider import Action
from controlplane.worker.actions import ActionRunner, RetryPolicy
from controlplane.worker.errors import RetryableActionError
from controlplane.worker.ports import ActionHandler
from drivers.kube.driver import KubeDriver
from drivers.kube.errors import ApiConflict
from drivers.kube.resources import PODS
from tests.drivers.harness import Harness

#: Fast retries: the runner's real backoff, kept short (the storms count attempts, not time).
POLICY = RetryPolicy(attempts=8, timeout_seconds=10.0, backoff_base_seconds=0.001,
                     backoff_max_seconds=0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ticking(handler: ActionHandler, clock: FakeClock, seconds: float) -> ActionHandler:
    """``handler``, with ``seconds`` of the fake clock passing before each attempt."""
    async def attempt(action: Action, /) -> None:
        clock.now += seconds
        await handler(action)
    return attempt


async def _annotate_through_a_storm(h: Harness, name: str, uid: str,
                                    run: Callable[[Action], Awaitable[object]]) -> object:
    return await run(Action("AnnotatePod", f"storm/{name}", {
        "namespace": h.namespace, "name": name, "uid": uid, "annotations": {"storm": "over"}}))


async def test_every_pod_write_is_retryable_in_a_conflict_storm(harness: Harness) -> None:
    """A 409 that is not about the UID never counts as done: the pod is left untouched."""
    h = harness
    name = h.name("stormy")
    uid = (await h.make_pod(name))["metadata"]["uid"]
    h.faults.conflict_storm("pods", namespace=h.namespace, name=name, times=None, seconds=60)
    async with h.driver() as kube:
        handlers = kube.handlers()
        for action in (
                Action("AnnotatePod", "s/1", {"namespace": h.namespace, "name": name,
                                              "uid": uid, "annotations": {"a": "b"}}),
                Action("RemovePodAnnotations", "s/2", {"namespace": h.namespace, "name": name,
                                                       "uid": uid, "keys": ["a"]}),
                Action("DeletePod", "s/3", {"namespace": h.namespace, "name": name,
                                            "uid": uid, "reason": "test"})):
            error = await _expect_retryable(handlers[action.type], action)
            assert error.error_class == "Conflict"
            assert isinstance(error.__cause__, ApiConflict)
    pod = await h.pod(name)
    assert pod is not None
    assert pod["metadata"]["uid"] == uid
    assert pod["metadata"].get("deletionTimestamp") is None


async def _expect_retryable(handler: ActionHandler, action: Action) -> RetryableActionError:
    try:
        await handler(action)
    except RetryableActionError as exc:
        return exc
    raise AssertionError(f"{action.type} succeeded in a conflict storm")


async def test_the_action_runner_gets_through_a_storm_of_409s(harness: Harness) -> None:
    h = harness
    name = h.name("weathered")
    uid = (await h.make_pod(name))["metadata"]["uid"]
    h.faults.conflict_storm("pods", namespace=h.namespace, name=name, times=5)
    async with h.driver() as kube:
        runner = ActionRunner(kube.handlers(), POLICY)
        assert await _annotate_through_a_storm(h, name, uid, runner.run) is None
        delete = Action("DeletePod", f"storm/delete/{name}", {
            "namespace": h.namespace, "name": name, "uid": uid, "reason": "test"})
        h.faults.conflict_storm("pods", namespace=h.namespace, name=name, times=2)
        assert await runner.run(delete) is None
        assert kube.requests.errors["patch 409"] == 5
        assert kube.requests.errors["delete 409"] == 2
        assert kube.requests.by_resource[("get", "pods")] == 2  # one check per storm 409
        await kube.pods.wait_until(lambda: kube.pods.get(f"{h.namespace}/{name}") is None,
                                   limit_seconds=h.patience)
    assert await h.pod(name) is None


async def test_the_action_runner_outlasts_a_timed_storm(harness: Harness) -> None:
    """A 30 s storm, 10 s per attempt on a fake clock: attempts 1 and 2 get 409, the
    third, at t=30, lands."""
    h = harness
    name = h.name("windowed")
    uid = (await h.make_pod(name))["metadata"]["uid"]
    clock = FakeClock()
    h.faults.clock = clock
    h.faults.conflict_storm("pods", name=name, seconds=30)
    async with h.driver() as kube:
        handlers = {"AnnotatePod": _ticking(kube.handlers()["AnnotatePod"], clock, 10.0)}
        runner = ActionRunner(handlers, POLICY)
        assert await _annotate_through_a_storm(h, name, uid, runner.run) is None
        assert kube.requests.by_resource[("patch", "pods")] == 3
        assert kube.requests.errors["patch 409"] == 2
    pod = await h.pod(name)
    assert pod is not None
    assert pod["metadata"]["annotations"]["storm"] == "over"


async def test_a_seeded_campaign_of_errors_and_latency_is_survived_by_retries(
        harness: Harness) -> None:
    """Create, annotate and delete 12 pods while a third of those requests fail (500, 503,
    429) and every one is slowed: each action lands, once (no create ever conflicts, so
    no retry was sent after a success)."""
    h = harness
    faults = h.faults
    faults.seed(2024)
    # Only the handlers' verbs: list/watch stay clean, so the seeded sequence is consumed
    # by these sequential requests alone and the campaign replays exactly.
    faults.error_rate("create", 0.35, code=503, resource="pods")
    faults.error_rate("patch", 0.35, code=500, resource="pods")
    faults.error_rate("delete", 0.35, code=429, retry_after=0, resource="pods")
    faults.latency(("create", "patch", "delete"), 0.001, jitter=0.002)
    names = [h.name(f"campaign-{i}") for i in range(12)]
    h.created.extend(names)
    template = {"spec": h.pod_body("x")["spec"]}
    async with h.driver() as kube:
        runner = ActionRunner(kube.handlers(), POLICY)
        for name in names:
            failure = await runner.run(Action("CreatePod", f"c/{name}", {
                "namespace": h.namespace, "name": name, "template": template, "node": None,
                "annotations": {}, "labels": {}}))
            assert failure is None, failure
        for name in names:
            uid = await _cached_uid(h, kube, name)
            for action in (
                    Action("AnnotatePod", f"a/{name}", {"namespace": h.namespace, "name": name,
                                                        "uid": uid, "annotations": {"c": "1"}}),
                    Action("DeletePod", f"d/{name}", {"namespace": h.namespace, "name": name,
                                                      "uid": uid, "reason": "test"})):
                if action.type == "DeletePod":  # (admin reads meet no delay or error rule)
                    pod = await h.pod(name)
                    assert pod is not None
                    assert pod["metadata"]["annotations"] == {"c": "1"}
                assert await runner.run(action) is None
        failures = sum(n for key, n in kube.requests.errors.items() if key.startswith(
            ("create ", "patch ", "delete ")))
        assert failures >= 10, kube.requests.errors
        assert kube.requests.errors["create 409"] == 0  # a retried create never conflicted
        keys = [f"{h.namespace}/{n}" for n in names]
        await kube.pods.wait_until(lambda: all(kube.pods.get(k) is None for k in keys),
                                   limit_seconds=h.patience)
    assert faults.injected["error 503"] + faults.injected["error 500"] + \
        faults.injected["error 429"] == failures
    assert faults.injected["delay"] >= len(names) * 3
    assert [n for n in names if await h.pod(n) is not None] == []


async def _cached_uid(h: Harness, kube: KubeDriver, name: str) -> str:
    key = f"{h.namespace}/{name}"
    await kube.pods.wait_until(lambda: kube.pods.get(key) is not None,
                               limit_seconds=h.patience)
    pod = kube.pods.get(key)
    assert pod is not None
    return str(pod["metadata"]["uid"])


async def test_a_storm_on_one_pod_leaves_its_neighbours_alone(harness: Harness) -> None:
    h = harness
    hot, cold = h.name("hot"), h.name("cold")
    uid_hot = (await h.make_pod(hot))["metadata"]["uid"]
    uid_cold = (await h.make_pod(cold))["metadata"]["uid"]
    h.faults.conflict_storm("pods", name=hot, times=1)
    async with h.driver() as kube:
        annotate = kube.handlers()["AnnotatePod"]
        await annotate(Action("AnnotatePod", "n/1", {"namespace": h.namespace, "name": cold,
                                                     "uid": uid_cold, "annotations": {"x": "1"}}))
        error = await _expect_retryable(annotate, Action("AnnotatePod", "n/2", {
            "namespace": h.namespace, "name": hot, "uid": uid_hot, "annotations": {"x": "1"}}))
        assert error.error_class == "Conflict"
        pod = await kube.api.get(PODS, cold, namespace=h.namespace)
    assert pod["metadata"]["annotations"]["x"] == "1"
