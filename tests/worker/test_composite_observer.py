"""The composite observer routes each interest to its part, and never turns a failure
into 'absent'."""

from __future__ import annotations

from controlplane.engine.observation import (
    Interests,
    NodeView,
    Observation,
    PodView,
    ProbeError,
    TagView,
)
from controlplane.worker.composite import CompositeObserver


class Cluster:
    def __init__(self) -> None:
        self.asked: list[Interests] = []

    async def observe(self, interests: Interests) -> Observation:
        self.asked.append(interests)
        return Observation(pods={k: PodView("ns", "p", "u", "n", "Running")
                                 for k in interests.pods},
                           nodes={k: NodeView(k, True) for k in interests.nodes})


class Registry:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[Interests] = []

    async def observe(self, interests: Interests) -> Observation:
        self.asked.append(interests)
        if self.fail:
            raise ConnectionError("registry unreachable")
        return Observation(tags={k: TagView(k, "sha256:" + "a" * 64) for k in interests.tags})


async def test_each_part_is_asked_only_for_what_it_serves() -> None:
    cluster, registry = Cluster(), Registry()
    obs = await CompositeObserver(cluster=cluster, registry=registry).observe(
        Interests(pods=frozenset({"ns/p"}), tags=frozenset({"r/x:t"}), nodes=frozenset({"n"})))
    assert cluster.asked == [Interests(pods=frozenset({"ns/p"}), nodes=frozenset({"n"}))]
    assert registry.asked == [Interests(tags=frozenset({"r/x:t"}))]
    assert set(obs.pods) == {"ns/p"}
    assert set(obs.tags) == {"r/x:t"}
    assert set(obs.nodes) == {"n"}


async def test_a_part_with_nothing_to_answer_is_not_called() -> None:
    cluster, registry = Cluster(), Registry()
    await CompositeObserver(cluster=cluster, registry=registry).observe(
        Interests(pods=frozenset({"ns/p"})))
    assert registry.asked == []


async def test_a_failing_part_answers_probe_errors_never_absent() -> None:
    obs = await CompositeObserver(cluster=Cluster(), registry=Registry(fail=True)).observe(
        Interests(pods=frozenset({"ns/p"}), tags=frozenset({"r/x:t"})))
    tag = obs.tags["r/x:t"]
    assert isinstance(tag, ProbeError)
    assert "unreachable" in tag.message
    assert isinstance(obs.pods["ns/p"], PodView)
