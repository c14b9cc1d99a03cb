"""A lazy (post-copy) migration done by two node agents, on real CRIU, podman and runc.

Pins the agents' lazy handoff (docs/protocol.md, "Lazy handoff"), driven by annotations
only: a capture with mode ``lazy`` and ``capture-handoff`` to node-2, and a pod on node-2
created with ``restore-handoff``. The target marks ``restored-from-handoff`` as soon as
the container runs, before the source has served its last page, then ``pages-received``
with every page it expected; the source reports ``Transferred`` with ``report-pages``
and its container is gone; the restored counter counts on from the source's log, no
count repeated or skipped, every tick ``ok`` (every page arrived with its pattern). A
request withdrawn before any target came, or after a target failed before its
lazy-pages daemon reached the page server, leaves the same source process counting on.

The world: the simulator's API, the kubelet role with two podman nodes made as ``cpctl
sim nodes --runtime-root`` makes them (the lazy runc wrapper), and two in-process agents
with the ``criu`` dumper and a shared handoff key. CRIU's lazy page server needs a 4 MiB
pipe: the module raises ``fs.pipe-max-size`` to that and puts the old value back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.agent import AgentSettings, node_agent
from drivers.agent.criu import CriuDumper
from drivers.agent.handoffs import HandoffSettings
from drivers.agent.pods import PodPatcher
from drivers.kube import KubeDriver, KubeSettings
from drivers.kube.resources import CoreV1
from drivers.kubelet.options import RoleOptions
from drivers.kubelet.podman_nodes import RuntimeNodes
from drivers.kubelet.role import KubeletRole
from drivers.podman import PodmanNode, container_name
from drivers.podman.workload import Tick, build_rootfs, command, parse_ticks, ticked_since
from drivers.registry.layout import OciLayout
from drivers.sim import SimCluster
from drivers.sim.store import Change
from tests.criu.pipe_limit import pipe_limit_raised
from tests.criu.world import require_runtime
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

NS = "default"
NODES = ("node-1", "node-2")
IMAGE = "localhost/workloads/counter:v1"
KEY = bytes(range(32))
KUBE = KubeSettings(backoff_initial=0.05, backoff_max=0.5, sync_timeout=10)


@pytest.fixture(scope="module", autouse=True)
def pipe_size() -> Iterator[None]:
    """``fs.pipe-max-size`` at least 4 MiB while the module runs, the old value put back
    (once no other test process needs it: :mod:`tests.criu.pipe_limit`)."""
    with pipe_limit_raised():
        yield


def _reset(node: PodmanNode) -> None:
    for args in (["rm", "--all", "--force", "--time", "0"], ["system", "reset", "--force"]):
        subprocess.run([*node.base_args(), *args], capture_output=True, timeout=120,
                       check=False)
    shutil.rmtree(node.root, ignore_errors=True)
    shutil.rmtree(node.runroot, ignore_errors=True)


@pytest.fixture(scope="module")
def runtime_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two node roots, as ``cpctl sim nodes --runtime-root`` makes them, with the image
    (built on node-1, ``podman save``/``load`` to node-2: same image ID, no registry)."""
    require_runtime()
    tmp = tmp_path_factory.mktemp("lazy-agents")
    root = tmp / "nodes"
    nodes = RuntimeNodes.under(root, NODES).nodes
    one, two = nodes["node-1"], nodes["node-2"]

    async def load() -> None:
        await one.load_rootfs(await asyncio.to_thread(build_rootfs, tmp / "image"), IMAGE)
        await one.run("save", "--output", str(tmp / "image.tar"), IMAGE)
        await two.run("load", "--input", str(tmp / "image.tar"))

    try:
        asyncio.run(load())
        yield root
    finally:
        for node in nodes.values():
            _reset(node)


@dataclass
class Lazy:
    cluster: SimCluster
    nodes: RuntimeNodes
    history: list[Change] = field(default_factory=list)

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.cluster.pod(NS, name)
        assert pod is not None, name
        return pod

    def notes(self, name: str) -> dict[str, str]:
        return dict(self.pod(name)["metadata"].get("annotations") or {})

    def container(self, name: str) -> str:
        m = self.pod(name)["metadata"]
        return container_name(NS, name, m["uid"], "main")

    async def ticks(self, node: str, name: str) -> list[Tick]:
        return parse_ticks(await self.nodes.nodes[node].logs(self.container(name)))

    async def counting(self, name: str, mib: int, dirty: int) -> list[Tick]:
        self.cluster.create_pod(NS, name, node="node-1", image=IMAGE,
                                command=command(mib, 100, dirty_mib_per_s=dirty))

        async def ticked() -> list[Tick]:
            with contextlib.suppress(Exception):
                ticks = await self.ticks("node-1", name)
                return ticks if len(ticks) >= 5 else []
            return []
        return await eventually(ticked, limit_seconds=60, what=f"{name} to tick 5 times")

    async def ticks_after(self, node: str, name: str, moment: float) -> list[Tick]:
        async def ticked() -> list[Tick]:
            ticks = await self.ticks(node, name)
            return ticks if ticked_since(ticks, moment) else []
        return await eventually(ticked, limit_seconds=60, what=f"{name} ticking on {node}")

    def capture_lazily(self, name: str, checkpoint_id: str) -> None:
        uid = self.pod(name)["metadata"]["uid"]
        notes = protocol.capture_request(
            checkpoint_id=checkpoint_id, artifact=f"127.0.0.1:5000/lazy/{name}:{checkpoint_id}",
            source_uid=uid, containers=(), quiesce=False, saver="{}", mode=protocol.LAZY,
            handoff_to="node-2")
        self.cluster.store.mutate("pods", NS, name, lambda pod: pod["metadata"].setdefault(
            "annotations", {}).update(notes))

    def withdraw(self, name: str) -> None:
        def change(pod: dict[str, Any]) -> None:
            for key in protocol.CAPTURE_REQUEST_KEYS:
                pod["metadata"].get("annotations", {}).pop(key, None)
        self.cluster.store.mutate("pods", NS, name, change)

    def restore_pod(self, name: str, source: str, checkpoint_id: str,
                    container: str = "main") -> None:
        notes = protocol.restore_handoff_request(
            checkpoint_id=checkpoint_id, source=f"{NS}/{source}",
            source_uid=self.pod(source)["metadata"]["uid"], restore_key=f"m/{name}",
            loader="{}")
        self.cluster.create_pod(NS, name, node="node-2", image=IMAGE, annotations=notes,
                                command=command(64, 100, dirty_mib_per_s=4))
        if container != "main":
            self.cluster.store.mutate("pods", NS, name, lambda pod: pod["spec"][
                "containers"][0].update(name=container))

    async def until(self, name: str, check: Any, what: str, limit: float = 60) -> None:
        await self.cluster.wait_for(lambda: bool(check(self.notes(name))), limit_seconds=limit,
                                    what=f"{name}: {what}")

    def first(self, name: str, key: str, value: str | None = None) -> int:
        """Index in the store's history of pod ``name``'s first change carrying ``key``."""
        for index, change in enumerate(self.history):
            meta = change.obj.get("metadata") or {}
            notes = meta.get("annotations") or {}
            if change.resource == "pods" and meta.get("name") == name and key in notes and \
                    (value is None or notes[key] == value):
                return index
        return -1


@pytest.fixture
async def lazy(runtime_root: Path, tmp_path: Path) -> AsyncIterator[Lazy]:
    runtime = RuntimeNodes.under(runtime_root, NODES)
    async with SimCluster(nodes=[], kubelets=False) as cluster, \
            contextlib.AsyncExitStack() as stack:
        kube = await KubeDriver.connect(
            kubeconfig=str(cluster.write_kubeconfig(tmp_path / "sim.kubeconfig")), settings=KUBE)
        stack.push_async_callback(kube.close)
        world = Lazy(cluster, runtime)
        stack.callback(cluster.store.subscribe(world.history.append))
        role = KubeletRole(CoreV1(kube.client), RoleOptions(nodes=NODES), runtime=runtime)
        await role.start()
        stack.push_async_callback(role.stop)
        registry = OciLayout(tmp_path / "oci")  # a lazy capture pushes nothing
        for node in NODES:
            def dumper(patcher: PodPatcher, node: str = node) -> CriuDumper:
                return CriuDumper(runtime.nodes[node])
            await stack.enter_async_context(node_agent(
                client=kube.client, registry=registry, dumper=dumper, kube=KUBE,
                handoff=HandoffSettings(KEY, "127.0.0.1", 0, poll=0.05),
                settings=AgentSettings(node, tmp_path / "agents" / node, capture_timeout=90,
                                       restore_timeout=90)))
        yield world


async def test_a_lazy_handoff_moves_the_counter_with_every_page_and_removes_the_source(
        lazy: Lazy) -> None:
    """The target runs (and says so) before the last page left the source; then every
    page it expected arrived, the source reports them served and is gone, and the
    restored log is the source's going on: no count twice, none skipped, every tick ok."""
    before = await lazy.counting("app", 64, 4)
    source_container = lazy.container("app")
    lazy.capture_lazily("app", "ck-lazy")
    lazy.restore_pod("app-r", "app", "ck-lazy")

    await lazy.until("app-r", lambda n: n.get(protocol.RESTORED_FROM_HANDOFF) or
                     n.get(protocol.RESTORE_FAILURE), "restored")
    notes = lazy.notes("app-r")
    assert protocol.RESTORE_FAILURE not in notes, notes[protocol.RESTORE_FAILURE]
    assert notes[protocol.INSTANCE_ID].startswith(lazy.pod("app-r")["metadata"]["uid"])
    await lazy.until("app-r", lambda n: n.get(protocol.PAGES_RECEIVED) or
                     n.get(protocol.RESTORE_FAILURE), "every page")
    await lazy.until("app", lambda n: n.get(protocol.REPORT_STATE) in ("Transferred", "Failed"),
                     "the source's end")
    done = time.time()

    target = lazy.notes("app-r")
    assert protocol.RESTORE_FAILURE not in target, target[protocol.RESTORE_FAILURE]
    received = json.loads(target[protocol.PAGES_RECEIVED])
    assert received["checkpoint"] == "ck-lazy"
    assert received["pages"] == received["expected"] > 0, received
    assert received["expected"] * os.sysconf("SC_PAGE_SIZE") >= 64 << 20, received
    source = lazy.notes("app")
    assert source[protocol.REPORT_STATE] == "Transferred", source.get(protocol.REPORT_REASON)
    served = json.loads(source[protocol.REPORT_PAGES])
    assert served["checkpoint"] == "ck-lazy"
    assert served["pages"] >= received["expected"], (served, received)
    assert served["bytes"] == served["pages"] * os.sysconf("SC_PAGE_SIZE")
    assert served["seconds"] is not None, served
    assert served["seconds"] > 0, served
    assert json.loads(source[protocol.REPORT_HANDOFF])["pages"].startswith("127.0.0.1:")
    # Marked as restored while the pages still went over: before both ends said "all".
    marked = lazy.first("app-r", protocol.RESTORED_FROM_HANDOFF)
    assert 0 <= marked < lazy.first("app-r", protocol.PAGES_RECEIVED)
    assert marked < lazy.first("app", protocol.REPORT_STATE, "Transferred")

    assert await lazy.nodes.nodes["node-1"].state(source_container) is None
    ticks = await lazy.ticks_after("node-2", "app-r", done)
    assert ticks[:len(before)] == before, "the target's log does not start with the source's"
    counts = [t.count for t in ticks]
    assert counts == list(range(1, len(counts) + 1)), counts
    assert all(t.ok for t in ticks), [t for t in ticks if not t.ok]
    gap = max(b.at - a.at for a, b in itertools.pairwise(ticks))
    print(f"lazy handoff: longest pause between ticks {gap:.3f}s; source frozen to last "
          f"page {served['seconds']}s; {served['pages']} pages")


@pytest.mark.parametrize("target", ["none", "failed"])
async def test_a_lazy_capture_withdrawn_before_a_target_took_its_pages_leaves_the_source(
        lazy: Lazy, target: str) -> None:
    """No target's daemon reached the page server (none came; or one fetched the archive
    and failed its restore: its pod has no container of that name): the withdrawal
    aborts the dump, reported ``Failed: Withdrawn``, and the same process counts on —
    no count lost or repeated, every page intact."""
    before = await lazy.counting("stay", 16, 0)
    node = lazy.nodes.nodes["node-1"]
    pid = (await node.run("container", "inspect", "--format", "{{.State.Pid}}",
                          lazy.container("stay"))).strip()
    lazy.capture_lazily("stay", "ck-stay")
    await lazy.until("stay", lambda n: "serving pages to node-2" in n.get(
        protocol.REPORT_REASON, ""), "serving its pages")
    assert protocol.REPORT_HANDOFF in lazy.notes("stay")
    if target == "failed":
        lazy.restore_pod("stay-r", "stay", "ck-stay", container="other")
        await lazy.until("stay-r", lambda n: n.get(protocol.RESTORE_FAILURE), "failed")
        assert lazy.notes("stay-r")[protocol.RESTORE_FAILURE].startswith(
            "RestoreFailed: a lazy restore takes one container that pod default/stay-r has")
        await asyncio.sleep(0.5)  # the source stays frozen, serving: no daemon came
        assert lazy.notes("stay")[protocol.REPORT_STATE] == "Capturing"
    lazy.withdraw("stay")
    await lazy.until("stay", lambda n: n.get(protocol.REPORT_STATE) == "Failed", "failed")
    assert lazy.notes("stay")[protocol.REPORT_REASON].startswith("Withdrawn:")
    ended = time.time()

    ticks = await lazy.ticks_after("node-1", "stay", ended)
    assert (await node.run("container", "inspect", "--format", "{{.State.Pid}}",
                           lazy.container("stay"))).strip() == pid
    assert ticks[:len(before)] == before
    counts = [t.count for t in ticks]
    assert counts == list(range(1, len(counts) + 1)), counts
    assert all(t.ok for t in ticks)
