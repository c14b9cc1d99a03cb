"""The product migrates on real nodes: kubelet checkpoint API + CRI-O restore.

A counter whose count and token live only in its shell's memory runs on ``node-a``;
``cpctl migrate`` moves it to ``node-b`` through our agent (kubelet dumper, quiesced by
SIGSTOP), the registry (one checkpoint image per container) and CRI-O, which restores it
from that image. Each test asserts what the runtime did: the restored container's own
log goes on from the checkpointed count with the same token, no repeat and no gap; the
source never printed past its checkpoint; the pod's status from the API server; the
kubelet's checkpoint directory is empty again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from controlplane.machines.contract import protocol
from tests.realnode.product import ProductWorld, open_product_world
from tests.support.realnode import Tick, ticks
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


def timed_ticks(w: ProductWorld, name: str, node: str) -> list[tuple[datetime, Tick]]:
    """The container's ticks with the time the runtime logged each (``timestamps=true``)."""
    body = w.real.kubelet(node, "GET", f"/containerLogs/{w.namespace}/{name}/main"
                          "?timestamps=true").decode(errors="replace")
    out = []
    for line in body.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            stamp = datetime.fromisoformat(parts[0][:26].rstrip("Z") + "+00:00")
            out.append((stamp, (int(parts[1]), parts[2])))
    return out


def last_before_the_pause(log: list[tuple[datetime, Tick]]) -> Tick:
    """The tick before the longest silence: the last one the checkpoint kept (the
    restored log begins with the archived lines, then the migration's downtime)."""
    gaps = [(later[0] - earlier[0], earlier[1]) for earlier, later in pairwise(log)]
    return max(gaps)[1]


def consecutive(log: list[Tick]) -> None:
    """One token, counts 1, 2, 3... with no repeat and no gap."""
    assert len({token for _, token in log}) == 1, f"more than one life: {log[:3]}..."
    counts = [count for count, _ in log]
    assert counts == list(range(1, len(counts) + 1)), f"repeat or gap in {counts}"


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
    checkpointed = last_before_the_pause(timed_ticks(w, name, "node-b"))
    assert last_on_source[-1] == checkpointed, \
        "the source printed nothing after its checkpoint (quiesced)"
    assert restored[-1][0] > checkpointed[0], "the restored process counts on"
    assert time.time() - ended < 60
    assert not any(Path(w.real.node("node-a").settings.checkpoints).iterdir()), \
        "the kubelet's checkpoint directory is emptied (the agent took the archive)"
    assert w.real.pod(name) is not None
