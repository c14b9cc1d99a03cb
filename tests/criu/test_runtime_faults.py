"""A migration through the registry on runtime-backed nodes (real CRIU) meets the data
plane's faults: the registry gone during the push and during the pull, the node agent
killed in the middle of a dump and of a restore, the agent's work directory full.

Each ends as docs/reliability.md ("The data plane's faults") states: the workload runs
on the source or restored on a target — never both (both nodes' runtimes are sampled
throughout), never neither unless the history says so and the checkpoint is kept. A step
is caught by the runtime call itself: the agents' podman holds the call a test aims at
until the test lets it go (tests/criu/gates.py), never by timing or by sampling for a
process; a killed agent is started again, as its DaemonSet would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from drivers.podman.lazy_watch import process_alive
from drivers.podman.workload import ticked_since
from tests.criu.faults import TwoCopies, counts_on_in_place, history_of, moved, ticking
from tests.criu.world import CriuWorld, open_criu_world, resumed, wait_running_on
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BIG_MIB = 96  # a restore long enough for CRIU to be seen running (the runtime-killed test)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriuWorld]:
    with open_criu_world(tmp_path_factory.mktemp("criu-runtime")) as w:
        yield w


def _migrate(w: CriuWorld, name: str, repository: str) -> str:
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--repository",
               repository)
    return out.split()[0]


def _finished(w: CriuWorld, operation: str) -> str:
    return w.wait_phase(operation, "Succeeded", "Failed", limit=240)


def _ended(w: CriuWorld, operation: str) -> Callable[[], str | None]:
    """For :meth:`Gate.wait_held`: the operation's phase once it ended, else None."""
    def ended() -> str | None:
        phase = w.phase_of(operation)
        return f"{operation} ended {phase}" if phase in ENDED else None
    return ended


ENDED = ("Succeeded", "Failed", "RolledBack")


def test_the_registry_gone_during_the_push_leaves_the_process_running_at_home(
        world: CriuWorld) -> None:
    w = world
    assert w.relay is not None
    name = w.name("rpush")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        w.relay.cutting = True
        try:
            operation = _migrate(w, name, w.relayed_repository)
            phase = _finished(w, operation)
        finally:
            w.relay.cutting = False
    assert w.relay.cuts > 0, "the push was never cut: the test proved nothing"
    assert phase == "Failed"
    assert copies.both == []
    [failed] = [e["data"] for e in history_of(w, operation) if e["type"] == "CaptureFailed"]
    assert "RegistryUnreachable" in failed["message"], failed
    counts_on_in_place(w, name, source, before)


def test_the_registry_gone_during_the_pull_rolls_back_from_the_kept_checkpoint(
        world: CriuWorld) -> None:
    """The artifact is verified and the source gone when the target's pull breaks: the
    agent refuses the short blob (its digest), the restore fails naming the registry,
    and the migration rolls back — the kept checkpoint restored on the source's node
    (the registry back) — so exactly one copy runs, counting on from the checkpoint."""
    w = world
    assert w.relay is not None
    name = w.name("rpull")
    source, before = ticking(w, name)
    with TwoCopies(w, name) as copies:
        w.relay.cutting_pulls = True  # only a pull downloads this much
        try:
            operation = _migrate(w, name, w.relayed_repository)
            wait_for(lambda: (w.relay is not None and w.relay.pull_cuts > 0) or None,
                     "the target's pull to be cut", 120)
        finally:
            w.relay.cutting_pulls = False
        phase = w.wait_phase(operation, "Succeeded", "RolledBack", "Failed", limit=240)
    assert copies.both == []
    history = history_of(w, operation)
    [failed] = [e["data"] for e in history if e["type"] == "RestoreFailed"]
    assert "RegistryBadResponse" in failed["message"], failed
    assert phase == "RolledBack", [e["type"] for e in history]
    back = wait_running_on(w, name, "node-1")
    assert back["metadata"]["uid"] != source["metadata"]["uid"]
    assert [c for c in w.containers("node-2") if name in c] == []
    ended = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(back), ended) else None,
                     f"{name} to count on, restored on node-1", every=0.25)
    resumed(ticks, before, quiesced=True)


def test_an_agent_killed_in_the_middle_of_its_dump_leaves_the_process_running_at_home(
        world: CriuWorld) -> None:
    """Killed once it called podman to checkpoint the container: podman checkpoints
    without it (the container stopped, its dump kept beside it); the next agent cannot
    capture a stopped container, reports it and thaws it from that dump: the same process
    counts on."""
    w = world
    name = w.name("kdump")
    source, before = ticking(w, name)  # the gate holds the call: no size needed to catch it
    with TwoCopies(w, name) as copies:
        with w.holding("node-1", "checkpoint", name) as call:
            operation = _migrate(w, name, w.repository)
            podman = call.wait_held(_ended(w, operation))
            w.kill("agent-node-1")
        # the agent comes back once the orphaned podman is done: the container stopped
        wait_for(lambda: not process_alive(podman) or None,
                 "the orphaned podman checkpoint to finish", 120)
        w.start_agent("node-1")
        phase = _finished(w, operation)
    assert copies.both == []
    assert phase == "Failed"
    [failed] = [e["data"] for e in history_of(w, operation) if e["type"] == "CaptureFailed"]
    assert "DumpFailed" in failed["message"], failed
    counts_on_in_place(w, name, source, before)


def test_an_agent_killed_in_the_middle_of_a_restore_is_replaced_and_the_process_moves(
        world: CriuWorld) -> None:
    """Killed once it called podman to restore the container on the target: podman
    restores without it; the next agent finds the container running under the pod's name,
    keeps it and marks the pod: the migration succeeds, one copy."""
    w = world
    name = w.name("krest")
    source, before = ticking(w, name)  # the gate holds the call: no size needed to catch it
    with TwoCopies(w, name) as copies:
        with w.holding("node-2", "restore", name) as call:
            operation = _migrate(w, name, w.repository)
            call.wait_held(_ended(w, operation))
            w.kill("agent-node-2")
        w.start_agent("node-2")
        phase = _finished(w, operation)
    assert copies.both == []
    assert phase == "Succeeded", [e["type"] for e in history_of(w, operation)]
    moved(w, name, source, before)


def test_a_full_work_directory_fails_the_dump_naming_it_and_the_process_runs_on(
        world: CriuWorld, tmp_path: Path) -> None:
    """The source agent's work directory on a 1 MiB tmpfs: the archive cannot be
    written; the capture fails saying so, and the same process counts on."""
    w = world
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], check=True)
    try:
        w.kill("agent-node-1")
        w.start_agent("node-1", workdir=full)
        name = w.name("full")
        source, before = ticking(w, name)
        with TwoCopies(w, name) as copies:
            operation = _migrate(w, name, w.repository)
            phase = _finished(w, operation)
        assert copies.both == []
        assert phase == "Failed"
        [failed] = [e["data"] for e in history_of(w, operation)
                    if e["type"] == "CaptureFailed"]
        assert "no space left on device" in failed["message"].lower(), failed
        counts_on_in_place(w, name, source, before)
    finally:
        w.kill("agent-node-1")
        w.start_agent("node-1")
        subprocess.run(["umount", "--lazy", str(full)], check=False)


def test_the_target_node_deleted_while_its_restore_runs(world: CriuWorld) -> None:
    """The target's Node object is deleted from the API once its agent called podman to
    restore there (the node registers itself again, as a kubelet does; no controller
    collects its pods here): the restore pod is bound already and its agent goes on, so
    the migration succeeds on node-2 — the workload running once, counting on from its
    checkpoint."""
    w = world
    name = w.name("ndel")
    source, before = ticking(w, name)  # the gate holds the call: no size needed to catch it
    with TwoCopies(w, name) as copies:
        with w.holding("node-2", "restore", name) as call:
            operation = _migrate(w, name, w.repository)
            call.wait_held(_ended(w, operation))
            w.kube.request("DELETE", "/api/v1/nodes/node-2")
        phase = w.wait_phase(operation, "Succeeded", "RolledBack", "Failed", limit=240)
    history = history_of(w, operation)
    assert copies.both == []
    assert phase == "Succeeded", [e["type"] for e in history]
    [finished] = [e["data"] for e in history if e["type"] == "MigrationFinished"]
    where = finished["final_node"]
    assert where == "node-2", finished
    moved = wait_running_on(w, name, where)
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]
    ended = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(moved), ended) else None,
                     f"{name} to count on on {where}", every=0.25)
    resumed(ticks, before, quiesced=True)
    wait_for(lambda: w.kube.request("GET", "/api/v1/nodes/node-2") or None,
             "node-2 registered again")


def _runtime_processes(root: Path) -> list[int]:
    """Every process of a node's runtime: those naming its root (podman, conmon) and all
    their descendants (runc, CRIU, the containers' processes)."""
    parents: dict[int, int] = {}
    named: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (proc / "stat").read_text()
            parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if str(root).encode() in (proc / "cmdline").read_bytes():
                named.add(int(proc.name))
    found, frontier = set(named), set(named)
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return sorted(found - {os.getpid()})


def _criu_under(root: Path) -> bool:
    return any(_comm(pid) == "criu" for pid in _runtime_processes(root))


def _comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


def test_the_target_runtime_killed_while_it_restores_rolls_back_to_the_source_node(
        world: CriuWorld) -> None:
    """Every process of node-2's runtime (podman, conmon, runc, CRIU, the container's)
    is killed while podman restores there: the restore fails, and the migration rolls
    back — the kept checkpoint restored on node-1 — one copy, counting on."""
    w = world
    name = w.name("rdie")
    _, before = ticking(w, name, mib=BIG_MIB)
    root = w.runtime_root / "node-2"
    with TwoCopies(w, name) as copies:
        with w.holding("node-2", "restore", name) as call:
            operation = _migrate(w, name, w.repository)
            call.wait_held(_ended(w, operation))
        # let go: CRIU restores 96 MiB under podman, long enough to be seen doing it
        wait_for(lambda: _criu_under(root) or None, "CRIU restoring under podman", 60,
                 every=0.01)
        killed = _runtime_processes(root)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        phase = w.wait_phase(operation, "Succeeded", "RolledBack", "Failed", limit=240)
    history = history_of(w, operation)
    assert killed, "no runtime process was killed: the test proved nothing"
    assert copies.both == []
    assert phase == "RolledBack", [e["type"] for e in history]
    [failed] = [e["data"] for e in history if e["type"] == "RestoreFailed"]
    assert "CRIU could not restore" in failed["message"], failed
    [finished] = [e["data"] for e in history if e["type"] == "MigrationFinished"]
    where = finished["final_node"]
    assert where == "node-1", finished
    assert [c for c in w.containers("node-2") if name in c] == []
    moved = wait_running_on(w, name, where)
    ended = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(moved), ended) else None,
                     f"{name} to count on on {where}", every=0.25)
    resumed(ticks, before, quiesced=True)
