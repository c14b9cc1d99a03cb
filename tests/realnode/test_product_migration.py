"""The product migrates on real nodes: kubelet checkpoint API + CRI-O restore.

A counter whose count and token live only in its shell's memory runs on ``node-a``;
``cpctl migrate`` moves it to ``node-b`` through our agent (kubelet dumper, quiesced by
SIGSTOP), the registry (one checkpoint image per container) and CRI-O, which restores it
from that image. Each test asserts what the runtime did: the restored container's own
log goes on from the checkpointed count with the same token, no repeat and no gap; the
source never printed past its checkpoint; the pod's status from the API server; the
kubelet's checkpoint directory is empty again. A target that cannot start the
checkpoint (its base image deleted from the registry: node-b cannot pull it) rolls back
to node-a, which restores from its own copy of the image. A restore the kubelet asked
CRI-O for before the agent had pulled the base image (held at its pull) waits for the
kubelet's retry and succeeds in the same attempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from controlplane.machines.contract import protocol
from tests.realnode.product import (
    ProductWorld,
    TimedTick,
    consecutive,
    open_product_world,
    restored_status,
    start_on_own_base,
)
from tests.support.realnode import Tick, counter_command, ticks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("realproduct")) as w:
        yield w


class LastTicks:
    """The source's log, read until the pod is gone: what it printed last."""

    def __init__(self, w: ProductWorld, name: str) -> None:
        self.w, self.name, self.seen = w, name, list[Tick]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen = ticks(self.w.real.container_log(self.name, node="node-a")) or \
                    self.seen
            except Exception:  # the pod or its log went away: keep what was seen
                return
            self._stop.wait(0.03)

    def stop(self) -> list[Tick]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def last_before_the_pause(log: list[TimedTick]) -> Tick:
    """The tick before the longest silence: the last one the checkpoint kept (the
    restored log begins with the archived lines, then the migration's downtime)."""
    gaps = [(later[0] - earlier[0], earlier[1]) for earlier, later in pairwise(log)]
    return max(gaps)[1]


def test_a_counter_migrates_between_real_nodes_with_no_repeat_and_no_gap(
        world: ProductWorld) -> None:
    w = world
    name = w.name("mig")
    before = w.start_counter(name, "node-a")
    source = w.real.pod(name)
    assert source is not None
    watcher = LastTicks(w, name)
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    last_on_source = watcher.stop()
    assert f"migrate {w.namespace}/{name}: Succeeded" in out, out

    moved = w.running_on(name, "node-b")
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]  # type: ignore[index]
    digest = moved["metadata"]["annotations"][protocol.RESTORED_FROM_DIGEST]  # type: ignore[index]
    assert digest.startswith("sha256:")
    image = moved["spec"]["containers"][0]["image"]  # type: ignore[index]
    assert image.startswith(f"{w.repository}@sha256:"), "CRI-O restored a checkpoint image"

    ended = time.time()
    restored = wait_for(
        lambda: t if len(t := ticks(w.real.container_log(name, node="node-b"))) >
        len(last_on_source) + 3 else None, f"{name} counting on on node-b")
    consecutive(restored)
    assert restored[0][1] == before[0][1], "the same life: the token drawn at start"
    checkpointed = last_before_the_pause(w.timed_ticks(name, "node-b"))
    assert last_on_source[-1] == checkpointed, \
        "the source printed nothing after its checkpoint (quiesced)"
    assert restored[-1][0] > checkpointed[0], "the restored process counts on"
    assert time.time() - ended < 60
    assert not any(Path(w.real.node("node-a").settings.checkpoints).iterdir()), \
        "the kubelet's checkpoint directory is emptied (the agent took the archive)"
    assert w.real.pod(name) is not None


def test_a_target_that_cannot_start_the_checkpoint_rolls_back_to_the_source(
        world: ProductWorld) -> None:
    w = world
    name = w.name("rb")
    source, before = start_on_own_base(w, name, counter_command(), base_gone=True)

    done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
                   w.repository, "--wait", "--wait-seconds", "240", cluster=True)
    operation = done.stdout.split()[0]
    assert w.phase_of(operation) == "RolledBack", done.stdout + done.stderr
    ended = time.time()
    [rollback] = [e for e in w.history(operation) if e["type"] == "RollbackStarted"]
    assert rollback["data"]["failed_node"] == "node-b", rollback
    assert rollback["data"]["node"] == "node-a", rollback
    assert "cannot pull" in rollback["data"]["message"], rollback

    back = w.running_on(name, "node-a")
    assert back["metadata"]["uid"] != source["metadata"]["uid"]  # type: ignore[index]
    restored_status(back, w.repository)
    log = w.counting_since(name, "node-a", ended)
    consecutive(log)  # restored from the quiesced checkpoint: no repeat, no gap
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    assert log[-1][0] > before[-1][0] + 3
    on_b = [p["metadata"]["name"] for p in w.kube.pods(w.namespace)
            if p["spec"].get("nodeName") == "node-b"]
    assert not any(p.startswith(name) for p in on_b), f"left on node-b: {on_b}"
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)


def test_a_restore_tried_before_the_base_image_arrived_succeeds_on_the_kubelets_retry(
        world: ProductWorld) -> None:
    w = world
    name = w.name("race")
    _, before = start_on_own_base(w, name, counter_command())

    def lacking_base() -> str | None:
        for pod in w.kube.pods(w.namespace):
            if pod["spec"].get("nodeName") != "node-b" or \
                    not pod["metadata"]["name"].startswith(name):
                continue
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                message = ((status.get("state") or {}).get("waiting") or {}).get("message")
                if message and "image not known" in message:
                    return str(message)
        return None

    with w.holding_pulls("node-b") as pull_held:
        operation = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-b",
                         "--repository", w.repository).split()[0]
        pull_held()
        message = wait_for(lacking_base, "CRI-O to lack the base image on node-b", 120)
    assert "locating image with ID" in message, message
    phase = w.wait_phase(operation, "Succeeded", "Failed", "RolledBack", limit=240)
    ended = time.time()
    events = [e["type"] for e in w.history(operation)]
    assert phase == "Succeeded", events
    assert not {"RestoreFailed", "TargetFailed"} & set(events), "one attempt, not failed"

    moved = w.running_on(name, "node-b")
    restored_status(moved, w.repository)
    log = w.counting_since(name, "node-b", ended)
    consecutive(log)
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    w.real.delete_pod(name)
