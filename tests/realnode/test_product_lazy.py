"""The product migrates lazily (post-copy) between real kubelet + CRI-O nodes.

``cpctl migrate --mode lazy`` of a counter whose count and token live only in its shell's
memory: the source's agent (kubelet dumper) dumps all but memory through the kubelet's
checkpoint API and serves the pages; the target pod names the hand-over's checkpoint
image, which the target's agent pushes once it has fetched the hand-over, and CRI-O
restores it while the agent's ``criu lazy-pages`` daemon brings the memory. The history
has the target verified before every page arrived, and the source deleted only after;
nothing is pushed as an artifact. The restored container's log goes on from the source's
last count, no repeat and no gap.

One world for the module; ``fs.pipe-max-size`` is raised to the 4 MiB CRIU's page server
needs for the module and put back once no other test process needs it (tests/criu/pipe_limit.py).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.realnode.lazy import PAGE_SIZE
from tests.criu.pipe_limit import pipe_limit_raised
from tests.realnode.product import (
    ProductWorld,
    consecutive,
    open_product_world,
    start_on_own_base,
)
from tests.support.realnode import Tick, ticks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MIB = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductWorld]:
    with open_product_world(tmp_path_factory.mktemp("rplazy")) as w, pipe_limit_raised():
        yield w


def holding_memory() -> list[str]:
    """A counter (``<count> <token>`` every 0.1 s) holding MIB MiB in a shell variable."""
    return ["/bin/sh", "-c", f"x=$(head -c {MIB << 20} /dev/zero | tr '\\0' a); "
            't=$RANDOM$RANDOM; i=0; while true; do i=$((i+1)); echo "$i $t"; sleep 0.1; done']


def pod_on(w: ProductWorld, prefix: str, node: str) -> dict[str, Any]:
    """The running pod on ``node`` whose name begins with ``prefix``."""
    def found() -> dict[str, Any] | None:
        for pod in w.kube.pods(w.namespace):
            if pod["metadata"]["name"].startswith(prefix) and \
                    pod["spec"].get("nodeName") == node and \
                    (pod.get("status") or {}).get("phase") == "Running":
                return pod
        return None
    return wait_for(found, f"{prefix} running on {node}", 120)


def in_registry(w: ProductWorld, ref: str) -> bool:
    """Whether the registry still has the manifest ``registry/repo@sha256:...``."""
    name, _, digest = ref.partition("@")
    repository = name.split("/", 1)[1]
    request = urllib.request.Request(
        f"http://{w.real.registry}/v2/{repository}/manifests/{digest}", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise


def downtime(log: list[tuple[float, Tick]]) -> tuple[float, Tick]:
    """The longest silence in a restored log, and the tick before it (the last one the
    source printed: the archived lines come first)."""
    gaps = [(later[0] - earlier[0], earlier[1]) for earlier, later in pairwise(log)]
    return max(gaps)


def test_a_lazy_migration_between_real_nodes_counts_on_after_every_page(
        world: ProductWorld) -> None:
    w = world
    name = w.name("lazy")
    w.real.create_pod(name, "node-a", command=holding_memory())
    w.real.wait_running(name)
    before = w.ticking(name)
    source = w.real.pod(name)
    assert source is not None
    done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
                   w.repository, "--mode", "lazy", "--wait", "--wait-seconds", "240",
                   cluster=True)
    operation = done.stdout.split()[0]
    assert w.phase_of(operation) == "Succeeded", \
        done.stdout + done.stderr + w.ok("history", operation, cluster=False)
    history = w.history(operation)
    events = [e["type"] for e in history]
    assert events.index("RestoreVerified") < events.index("PagesTransferred") \
        < events.index("SourceDeleted"), events
    assert "ArtifactVerified" not in events, events  # nothing was pushed as an artifact
    [pages] = [e["data"] for e in history if e["type"] == "PagesTransferred"]
    assert pages["pages"] >= (MIB << 20) // PAGE_SIZE, pages

    moved = pod_on(w, name, "node-b")
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]
    notes = moved["metadata"]["annotations"]
    assert protocol.RESTORED_FROM_HANDOFF in notes, notes
    # The hand-over's checkpoint image, named by digest once the target's agent pushed it,
    # and deleted from the registry once every page arrived (nothing can serve them again).
    pinned = moved["spec"]["containers"][0]["image"]
    assert pinned.startswith(f"{w.repository}@sha256:"), pinned
    wait_for(lambda: not in_registry(w, pinned), f"{pinned} deleted from the registry", 30)
    moved_name = moved["metadata"]["name"]
    ended = time.time()
    restored = w.counting_since(moved_name, "node-b", ended)
    consecutive(restored)  # no repeat, no gap: the source's process, going on
    assert restored[0][1] == before[0][1], "the same life: the token drawn at start"
    pause, last = downtime(w.timed_ticks(moved_name, "node-b"))
    assert restored[-1][0] > last[0] + 2, "the restored process counts on"
    print(f"lazy migration on real nodes: downtime {pause:.2f}s, {pages['pages']} pages, "
          f"source frozen -> last page {pages.get('seconds')}s")

    def source_gone() -> bool:
        found = w.real.node("node-a").crictl(
            "ps", "-a", "-q", "--label", f"io.kubernetes.pod.uid={source['metadata']['uid']}")
        return found.returncode == 0 and not found.stdout.strip()
    wait_for(source_gone, "the source's container to be removed from node-a", 60)
    left = w.real.pod(name)
    assert left is None or left["metadata"]["uid"] != source["metadata"]["uid"]
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    assert ticks(w.real.container_log(moved_name, node="node-b"))


def test_a_target_that_cannot_restore_lazily_leaves_the_source_running_in_place(
        world: ProductWorld) -> None:
    """The target's agent cannot pull the base image CRI-O restores onto (deleted from
    the registry): its restore fails before its daemon reached the page server, so the
    source's dump is rolled back and the same process counts on, in the same pod; the
    target pod is removed. Nothing was frozen for longer than the attempt."""
    w = world
    name = w.name("lazyrb")
    source, before = start_on_own_base(w, name, holding_memory(), base_gone=True)

    done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
                   w.repository, "--mode", "lazy", "--wait", "--wait-seconds", "240",
                   cluster=True)
    operation = done.stdout.split()[0]
    phase = w.phase_of(operation)
    history = w.history(operation)
    events = [e["type"] for e in history]
    # Failed (machine.py: verified --HandoffAbandoned--> WakingInPlace --> Failed): the
    # workload runs where it was, and the migration did not happen.
    assert phase == "Failed", done.stdout + done.stderr
    assert events.index("RestoreFailed") < events.index("HandoffAbandoned") \
        < events.index("SourceReleased"), events
    assert "SourceDeleted" not in events, events
    assert "WorkloadLost" not in events, events
    [abandoned] = [e["data"] for e in history if e["type"] == "HandoffAbandoned"]
    assert "cannot pull" in abandoned["message"], abandoned
    ended = time.time()

    still = w.real.pod(name)
    assert still is not None
    assert still["metadata"]["uid"] == source["metadata"]["uid"], "the same pod, in place"
    log = w.counting_since(name, "node-a", ended)
    consecutive(log)  # the same process: no repeat, no gap
    assert log[0][1] == before[0][1], "the same life: the token drawn at start"
    on_b = [p["metadata"]["name"] for p in w.kube.pods(w.namespace)
            if p["spec"].get("nodeName") == "node-b"]
    wait_for(lambda: not any(p["metadata"]["name"].startswith(name)
                             and p["spec"].get("nodeName") == "node-b"
                             for p in w.kube.pods(w.namespace)),
             f"the target pod to be removed from node-b (there: {on_b})", 60)
    assert w.checkpoints_left() == {"node-a": [], "node-b": []}
    w.real.delete_pod(name)
