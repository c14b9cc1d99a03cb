"""The kubelet dumper's lazy capability on two real kubelet + CRI-O nodes
(drivers/agent/kubelet_lazy.py): what the agent drives through
:class:`~drivers.agent.lazy.LazyDumper`. The source's dumper dumps all but memory through
the kubelet and serves the pages; the target's starts the lazy-pages daemon and waits
until CRI-O restored the pod; both ends then count every page. The test plays the part
of the control plane between them (the checkpoint image of the hand-over, the target pod
naming it). An abort before any daemon connected leaves the same process running.

One world for the module; ``fs.pipe-max-size`` is raised to the 4 MiB CRIU's page server
needs for the module and put back once no other test process needs it (tests/criu/pipe_limit.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from drivers.agent.dumper import Container, DumpRequest, RestoreRequest, Workload
from drivers.agent.errors import DumpFailed
from drivers.agent.kubelet import KubeletDumper, KubeletSettings
from drivers.realnode.lazy import PAGE_SIZE, container_dir
from drivers.realnode.runc_wrapper import LAZY_REQUEST, lazy_fetches
from drivers.registry.artifact import CheckpointArtifact
from tests.criu.pipe_limit import pipe_limit_raised
from tests.support.envtest import ADMIN_TOKEN
from tests.support.realnode import NAMESPACE, RealNodeWorld, open_realnode_world, ticks
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MIB = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeWorld]:
    with open_realnode_world(tmp_path_factory.mktemp("kubelet-lazy")) as w, pipe_limit_raised():
        yield w


def dumper(world: RealNodeWorld, node: str) -> KubeletDumper:
    """The dumper as ``drivers.agent --dumper kubelet`` builds it on ``node``."""
    s = world.node(node).settings
    assert world.nodes.pki is not None
    return KubeletDumper(KubeletSettings(
        url=world.kubelet_url(node), token=ADMIN_TOKEN, ca_file=str(world.nodes.pki.ca_cert),
        checkpoint_dir=s.checkpoints, kubelet_checkpoint_dir=str(s.checkpoints),
        cri_endpoint=f"unix://{s.crio_socket}", crictl=str(s.binaries / "crictl"),
        crio_root=s.folder / "crio" / "storage", runc_root=s.folder / "runc",
        criu=os.environ.get("CONTROLPLANE_CRIU") or "criu", timeout=120))


def holding_memory() -> list[str]:
    """A counter (``<count> <token>`` every 0.1 s) holding MIB MiB in a shell variable."""
    return ["/bin/sh", "-c", f"x=$(head -c {MIB << 20} /dev/zero | tr '\\0' a); "
            't=$RANDOM$RANDOM; i=0; while true; do i=$((i+1)); echo "$i $t"; sleep 0.1; done']


def counting(world: RealNodeWorld, pod: str, node: str, at_least: int) -> list[tuple[int, str]]:
    def enough() -> list[tuple[int, str]] | None:
        seen = ticks(world.container_log(pod, node=node))
        return seen if len(seen) >= at_least else None
    return wait_for(enough, f"{pod} to print {at_least} counts", 60)


def workload_of(pod: Mapping[str, Any]) -> Workload:
    """The pod as the agent sees it (``drivers.agent.agent.NodeAgent._workload``)."""
    statuses = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    containers = tuple(
        Container(c["name"], c["image"], (statuses.get(c["name"]) or {}).get("containerID", ""),
                  (statuses.get(c["name"]) or {}).get("imageID", ""))
        for c in pod["spec"]["containers"])
    meta = pod["metadata"]
    return Workload(NAMESPACE, meta["name"], meta["uid"], pod["spec"]["nodeName"], containers)


def started(world: RealNodeWorld, name: str) -> Workload:
    world.create_pod(name, "node-a", command=holding_memory())
    pod = world.wait_running(name)
    counting(world, name, "node-a", 3)
    return workload_of(pod)


def watching(world: RealNodeWorld, name: str):  # type: ignore[no-untyped-def]
    """``RestoreRequest.latest`` for pod ``name``: the agent wakes on the pod's changes;
    here it is read again after a short while."""
    async def latest(within: float) -> Mapping[str, Any] | None:
        await asyncio.sleep(min(within, 0.2))
        return await asyncio.to_thread(world.pod, name)
    return latest


def request_dir(world: RealNodeWorld, workload: Workload) -> Path:
    container_id = workload.containers[0].id.partition("://")[2]
    root = world.node("node-a").settings.folder / "crio" / "storage"
    return container_dir(root, container_id)


async def test_a_counter_is_handed_over_lazily_and_counts_on_with_every_page(
        world: RealNodeWorld, tmp_path: Path) -> None:
    """The target runs the source's process (same token, every count once) once CRI-O
    restored it; both ends count every page; the source stays stopped; nothing is left
    behind (the kubelet's archive, the lazy request, the daemon's registration)."""
    await asyncio.to_thread(world.pull, "node-b", world.image)
    source = await asyncio.to_thread(started, world, "klazy-src")
    a, b = dumper(world, "node-a"), dumper(world, "node-b")
    assert await a.refuse_mode("lazy", source) is None
    serving = await a.start_lazy(DumpRequest("ck-lazy-1", source, source.containers, False, "",
                                             tmp_path / "capture"), listen="127.0.0.1")
    try:
        assert not serving.connected()
        # The control plane's part: the hand-over as a checkpoint image, a pod naming it.
        image = await asyncio.to_thread(world.push_checkpoint_image, serving.archive.path,
                                        repository="checkpoints/klazy", tag="klazy-1")
        created = await asyncio.to_thread(world.create_pod, "klazy-dst", "node-b", image=image)
        target = Workload(NAMESPACE, "klazy-dst", created["metadata"]["uid"], "node-b",
                          (Container("main", image),))
        receiving = await b.restore_lazy(
            RestoreRequest(target, "", CheckpointArtifact({}), {"main": serving.archive.path},
                           "", latest=watching(world, "klazy-dst")),
            pages=("127.0.0.1", serving.port), workdir=tmp_path / "target")
        assert serving.connected()  # the restored tasks asked for pages
        served, got = await asyncio.gather(serving.finish(limit_seconds=120),
                                           receiving.finish(limit_seconds=120))
    finally:
        serving.dump.kill_page_server()
    assert served.pages >= (MIB << 20) // PAGE_SIZE, served
    assert served.bytes == served.pages * PAGE_SIZE
    assert got.pages == got.expected >= (MIB << 20) // PAGE_SIZE, got
    last_source = ticks(world.container_log("klazy-src", node="node-a"))
    seen = counting(world, "klazy-dst", "node-b", len(last_source) + 5)
    assert {t for _c, t in seen} == {last_source[-1][1]}, seen
    assert [c for c, _t in seen] == list(range(1, len(seen) + 1)), seen
    assert ticks(world.container_log("klazy-src", node="node-a")) == last_source
    assert not any(world.node("node-a").settings.checkpoints.iterdir())
    assert not (request_dir(world, source) / LAZY_REQUEST).exists()
    assert not any(lazy_fetches(world.node("node-b").settings.folder / "runc").iterdir())
    world.delete_pod("klazy-src")
    world.delete_pod("klazy-dst")


async def test_an_abort_before_any_daemon_connected_leaves_the_source_running(
        world: RealNodeWorld, tmp_path: Path) -> None:
    """CRIU rolls the dump back: the same process counts on in place, with no gap; the
    next checkpoint of it is an ordinary one (no lazy request left)."""
    source = await asyncio.to_thread(started, world, "kabort-src")
    a = dumper(world, "node-a")
    serving = await a.start_lazy(DumpRequest("ck-abort-1", source, source.containers, False,
                                             "", tmp_path / "capture"), listen="127.0.0.1")
    before = ticks(world.container_log("kabort-src", node="node-a"))
    await serving.abort(limit_seconds=60)
    after = await asyncio.to_thread(counting, world, "kabort-src", "node-a", len(before) + 5)
    assert {t for _c, t in after} == {before[-1][1]}, after
    assert [c for c, _t in after] == list(range(1, len(after) + 1)), after
    assert not (request_dir(world, source) / LAZY_REQUEST).exists()
    assert not any(world.node("node-a").settings.checkpoints.iterdir())
    assert serving.dump.page_server_pid() is None
    world.delete_pod("kabort-src")


async def test_an_abort_after_a_cancelled_wait_for_the_pages_rolls_the_dump_back(
        world: RealNodeWorld, tmp_path: Path) -> None:
    """The agent waits for the last page from the start and cancels that wait when the
    offer is withdrawn before a target took it: the dump is left for the abort, which
    rolls it back (the page server is not killed first), and the same process counts
    on."""
    source = await asyncio.to_thread(started, world, "kcancel-src")
    a = dumper(world, "node-a")
    serving = await a.start_lazy(DumpRequest("ck-cancel-1", source, source.containers, False,
                                             "", tmp_path / "capture"), listen="127.0.0.1")
    waiting = asyncio.ensure_future(serving.finish(limit_seconds=60))
    done, _ = await asyncio.wait({waiting}, timeout=1.0)
    assert not done, "no daemon reached the page server: the last page is not served"
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert serving.dump.page_server_pid() is not None  # left for the abort to roll back
    before = ticks(world.container_log("kcancel-src", node="node-a"))
    await serving.abort(limit_seconds=60)
    after = await asyncio.to_thread(counting, world, "kcancel-src", "node-a", len(before) + 5)
    assert {t for _c, t in after} == {before[-1][1]}, after
    assert [c for c, _t in after] == list(range(1, len(after) + 1)), after
    assert not (request_dir(world, source) / LAZY_REQUEST).exists()
    assert serving.dump.page_server_pid() is None
    world.delete_pod("kcancel-src")


async def test_a_pod_of_two_containers_is_refused_before_anything_is_frozen(
        world: RealNodeWorld, tmp_path: Path) -> None:
    a = dumper(world, "node-a")
    two = Workload(NAMESPACE, "two", "uid-2", "node-a", (Container("a"), Container("b")))
    why = await a.refuse_mode("lazy", two)
    assert why is not None
    assert "2 containers" in why
    with pytest.raises(DumpFailed, match="2 containers"):
        await a.start_lazy(DumpRequest("ck-2", two, two.containers, False, "", tmp_path),
                           listen="127.0.0.1")
