"""Suspend/resume, restore of a stored checkpoint, a drain and a two-container pod on
real nodes (kubelet checkpoint API + CRI-O restore), through ``cpctl`` as a person runs it.

Each counter keeps its count and token only in its shell's memory. Each test asserts what
the runtime did: the restored container's own log (from the kubelet API) goes on from
the checkpointed count with the same token — no repeat and no gap where the capture was
quiesced —; the pod's status from the API server (Running, from its checkpoint image,
never restarted); every kubelet checkpoint directory is empty again. One world serves
the module; each test makes its own pods and leaves the nodes as it found them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from controlplane.machines.contract import protocol
from tests.realnode.product import (
    ProductWorld,
    consecutive,
    open_product_world,
    restored_status,
    went_on,
)
from tests.support.realnode import counter_command, ticks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realverbs")) as w:
        yield w


def test_a_suspended_counter_resumes_on_another_node_where_it_stopped(
        world: ProductWorld) -> None:
    w = world
    name = w.name("sus")
    before = w.start_counter(name, "node-a")
    source = w.real.pod(name)
    assert source is not None
    out = w.ok("suspend", f"{w.namespace}/{name}", "--repository", w.repository, "--wait",
               "--wait-seconds", "180")
    assert f"suspend {w.namespace}/{name}: Suspended" in out, out
    wait_for(lambda: w.real.pod(name) is None or None, f"{name} deleted by the suspend")
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}

    out = w.ok("resume", f"{w.namespace}/{name}", "--node", "node-b", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"resume {w.namespace}/{name}: Resumed" in out, out
    ended = time.time()
    resumed = w.running_on(name, "node-b")
    assert resumed["metadata"]["uid"] != source["metadata"]["uid"]  # type: ignore[index]
    restored_status(resumed, w.repository)
    log = w.counting_since(name, "node-b", ended)
    consecutive(log)  # the archived lines, then the restored process's own: no repeat
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    assert log[-1][0] > before[-1][0] + 3, "it counts on past what it printed before"
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)


def test_a_stored_checkpoint_restores_into_a_new_pod_while_the_source_runs_on(
        world: ProductWorld) -> None:
    w = world
    name, copy = w.name("ckp"), w.name("copy")
    w.start_counter(name, "node-a")
    source = w.real.pod(name)
    assert source is not None
    out = w.ok("checkpoint", f"{w.namespace}/{name}", "--repository", w.repository,
               "--wait", "--wait-seconds", "180")
    operation = out.split()[0]
    checkpointed = time.time()  # the archive's lines were all logged before this
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}

    out = w.ok("restore", operation, "--node", "node-b", "--name", copy, "--wait",
               "--wait-seconds", "180")
    ended = time.time()
    restored = w.running_on(copy, "node-b")
    restored_status(restored, w.repository)
    assert restored["metadata"]["annotations"][  # type: ignore[index]
        protocol.RESTORED_FROM_DIGEST].startswith("sha256:")
    w.counting_since(copy, "node-b", ended)
    archived, own = went_on(w.timed_ticks(copy, "node-b"), checkpointed)
    assert archived, "the restored log begins with the source's, as the archive held it"
    assert own, "the restored process printed lines of its own"
    # The archive holds the source's own lines: the same token, the same counts.
    on_source = ticks(w.real.container_log(name, node="node-a"))
    assert on_source[:len(archived)] == archived
    # The source was never stopped: the same pod counts on past the checkpoint.
    still = w.real.pod(name)
    assert still is not None
    assert still["metadata"]["uid"] == source["metadata"]["uid"]
    assert (still.get("status") or {}).get("phase") == "Running"
    more = wait_for(lambda: t if len(t := ticks(w.real.container_log(name, node="node-a")))
                    > len(on_source) else None, f"{name} counting on on node-a")
    consecutive(more)
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(copy)
    w.real.delete_pod(name)


def test_a_drain_moves_three_counters_with_their_memory(world: ProductWorld) -> None:
    w = world
    label = w.name("drain")
    names = [w.name(f"drn{i}") for i in range(3)]
    befores = {}
    for name in names:
        w.real.create_pod(name, "node-a", command=counter_command(),
                          labels={"app": name, "drain": label})
    for name in names:
        w.real.wait_running(name)
        befores[name] = w.ticking(name)
    try:
        out = w.ok("drain", "node-a", "--to", "node-b", "--selector", f"drain={label}",
                   "--repository", w.repository, "--wait", "--wait-seconds", "300")
        assert "drain node-a: Succeeded" in out, out
        ended = time.time()
        for name in names:
            moved = w.running_on(name, "node-b")
            restored_status(moved, w.repository)
            log = w.counting_since(name, "node-b", ended)
            consecutive(log)
            assert log[0][1] == befores[name][0][1], f"{name}: the same life"
            assert log[-1][0] > befores[name][-1][0] + 3
        assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    finally:  # a drain leaves its node cordoned, as kubectl drain does
        w.kube.request("PATCH", "/api/v1/nodes/node-a", {"spec": {"unschedulable": None}},
                       content_type="application/merge-patch+json")
        for name in names:
            w.real.delete_pod(name)


def test_both_counters_of_a_two_container_pod_migrate_and_go_on(world: ProductWorld) -> None:
    w = world
    name, containers = w.name("two"), ("main", "side")
    w.create_counters(name, "node-a", containers)
    w.real.wait_running(name)
    before = {c: w.ticking(name, c) for c in containers}
    assert before["main"][0][1] != before["side"][0][1], "two shells, two tokens"
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"migrate {w.namespace}/{name}: Succeeded" in out, out
    ended = time.time()
    moved = w.running_on(name, "node-b")
    restored_status(moved, w.repository)
    images = {c["image"] for c in moved["spec"]["containers"]}  # type: ignore[index]
    assert len(images) == 2, f"one checkpoint image per container: {images}"
    for c in containers:
        log = w.counting_since(name, "node-b", ended, container=c)
        consecutive(log)
        assert log[0][1] == before[c][0][1], f"{c}: the same life"
        assert log[-1][0] > before[c][-1][0] + 3
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)
