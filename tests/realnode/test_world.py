"""The real-node world itself: two kubelet + CRI-O nodes on one host that run pods,
checkpoint a container through the kubelet API, restore it on the other node from a
checkpoint image, and leave nothing of theirs on the host once stopped.

The tests run in file order on one world (module scope): the last one stops it and
checks what it gave back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.realnode import config, host
from tests.e2e.world import ApiError
from tests.support.realnode import (
    RealNodeWorld,
    archived_log,
    counter_command,
    open_realnode_world,
    resumed_at,
    ticks,
)
from tests.support.waiting import WaitTimedOut, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeWorld]:
    with open_realnode_world(tmp_path_factory.mktemp("realnode")) as w:
        yield w


def counting(world: RealNodeWorld, pod: str, at_least: int) -> list[tuple[int, str]]:
    def enough() -> list[tuple[int, str]] | None:
        seen = ticks(world.container_log(pod))
        return seen if len(seen) >= at_least else None
    return wait_for(enough, f"{pod} to print {at_least} counts", 60)


def test_both_nodes_are_ready_and_run_cri_o(world: RealNodeWorld) -> None:
    for name in world.names:
        node = world.kube.request("GET", f"/api/v1/nodes/{name}")
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", node["status"]["conditions"]
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == "cri-o://1.36.3"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.2"


def test_a_counter_runs_on_each_node(world: RealNodeWorld) -> None:
    for name in world.names:
        world.create_pod(f"counter-{name}", name, command=counter_command())
    for name in world.names:
        pod = world.wait_running(f"counter-{name}")
        assert pod["spec"]["nodeName"] == name
        seen = counting(world, f"counter-{name}", 3)
        assert [c for c, _t in seen] == list(range(1, len(seen) + 1)), seen
        assert world.log_files(f"counter-{name}"), "no log file under podLogsDir"
        # The API server reaches the kubelet too (by node name, with its client cert).
        assert ticks(world.log_through_api_server(f"counter-{name}"))[:3] == seen[:3]


def test_the_kubelet_checkpoint_api_writes_an_archive(world: RealNodeWorld) -> None:
    world.create_pod("archived", "node-a", command=counter_command())
    world.wait_running("archived")
    counting(world, "archived", 2)
    archive = world.checkpoint("archived")
    assert archive.parent == world.node("node-a").settings.checkpoints
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"config.dump", "spec.dump"} <= names, sorted(names)
    assert any(n.startswith("checkpoint/") for n in names), sorted(names)


def test_a_checkpoint_image_restores_on_the_other_node_where_the_count_left_off(
        world: RealNodeWorld) -> None:
    world.create_pod("source", "node-a", command=counter_command())
    world.wait_running("source")
    before = counting(world, "source", 5)
    token = before[-1][1]
    archive = world.checkpoint("source")
    image = world.push_checkpoint_image(archive, tag="source-1")
    world.pull("node-b", world.image)  # the checkpointed container's base image
    world.create_pod("restored", "node-b", image=image)
    pod = world.wait_running("restored")
    assert pod["spec"]["nodeName"] == "node-b"

    last: list[str] = [""]

    def went_on() -> list[tuple[int, str]] | None:
        last[0] = world.container_log("restored")
        log = ticks(last[0])
        # Past the archived log: counts printed by the restored process itself.
        return log if len(log) >= len(before) + 10 else None
    try:
        log = wait_for(went_on, "the restored counter to print", 60)
    except WaitTimedOut as exc:
        raise AssertionError(f"{exc}; its log: {last[0][-3000:]!r}") from None
    archived = ticks(archived_log(archive))
    assert archived, "the archive holds no log of the counter"
    at = resumed_at(log, archived, token)
    assert at is not None, f"not the checkpointed counter going on: {log} (archived: {archived})"
    # The checkpoint came after the last count read before it: it holds at least that.
    assert at - 1 >= before[-1][0], (at, before[-1], log)


def test_cpctl_sim_nodes_real_runs_a_second_world_beside_this_one(
        world: RealNodeWorld) -> None:
    """Two worlds on one host (the command a person runs, here against this world's API
    server): the second takes other bridges and cgroups, and stopping it with SIGTERM
    gives back its own and leaves the first world's pods running."""
    state = world.tmp / "by-hand"
    out = (world.tmp / "by-hand.out").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sim", "nodes", "--real",
         "--kubeconfig", str(world.kubeconfig), "--nodes", "node-c", "--state-dir",
         str(state)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2])
    try:
        wait_for(lambda: "real nodes ready: node-c" in Path(out.name).read_text()
                 or proc.poll() is not None, "cpctl sim nodes --real's ready line", 90)
        assert proc.poll() is None, Path(out.name).read_text()
        node = world.kube.request("GET", "/api/v1/nodes/node-c")
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == "cri-o://1.36.3"
        theirs = [h for h in map(host.Holding.load, (host.RUN_DIR / "worlds").glob("*.json"))
                  if h.owner.pid == proc.pid]
        assert len(theirs) == 1
        assert world.nodes.held is not None
        assert theirs[0].slot != world.nodes.held.slot
        assert not set(theirs[0].bridges) & set(world.nodes.held.bridges)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        out.close()
    assert code == 0, Path(out.name).read_text()
    assert "real nodes stopped" in Path(out.name).read_text()
    assert not state.exists()
    for bridge in theirs[0].bridges:
        assert not Path("/sys/class/net", bridge).exists()
    for root in theirs[0].cgroups:
        assert host.leftover_cgroups(root) == []
    # The first world's counters count on.
    for name in world.names:
        before = len(ticks(world.container_log(f"counter-{name}")))
        counting(world, f"counter-{name}", before + 2)
    with pytest.raises(ApiError) as gone:  # its Node object deleted on the way out
        world.kube.request("GET", "/api/v1/nodes/node-c")
    assert gone.value.code == 404


def test_stopping_gives_everything_back(world: RealNodeWorld) -> None:
    root: Path = world.nodes.root
    assert world.leftovers(), "the running world should hold bridges, cgroups, a folder"
    problems = world.close()
    assert problems == []
    assert world.leftovers() == []
    assert not root.exists()
    others = [h for h in host.SysctlRecord.holders() if h.alive()]
    if others:  # another world on this host still holds them: the record keeps them
        assert host.SysctlRecord.recorded()
    else:
        assert {n: host.read_sysctl(n) for n in config.HOST_SYSCTLS} == world.sysctls_before
