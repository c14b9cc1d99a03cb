"""Post-copy between two real kubelet + CRI-O nodes (drivers/realnode/lazy.py): the kubelet's
checkpoint API dumps everything but the memory, CRI-O restores a checkpoint image without
it, and a ``criu lazy-pages`` daemon brings the pages; a restore that cannot fetch them
fails, and the source then runs on.

One world for the module; ``fs.pipe-max-size`` is raised to the 4 MiB CRIU's page server
needs for the module and put back once no other test process needs it (tests/criu/pipe_limit.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drivers.realnode.lazy import (
    PAGE_SIZE,
    container_dir,
    container_tasks,
    request_lazy_dump,
    start_fetch,
)
from drivers.realnode.runc_wrapper import lazy_fetches
from tests.criu.pipe_limit import pipe_limit_raised
from tests.support.realnode import RealNodeWorld, open_realnode_world, ticks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

MIB = 16


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeWorld]:
    with open_realnode_world(tmp_path_factory.mktemp("lazy-realnode")) as w, pipe_limit_raised():
        yield w


def holding_memory() -> list[str]:
    """A counter (``<count> <token>`` every 0.1 s) that first writes /moved.txt, removes
    /bin/true and holds MIB MiB in a shell variable."""
    return ["/bin/sh", "-c", "echo moved > /moved.txt; rm /bin/true; "
            f"x=$(head -c {MIB << 20} /dev/zero | tr '\\0' a); t=$RANDOM$RANDOM; i=0; "
            'while true; do i=$((i+1)); echo "$i $t"; sleep 0.1; done']


def counting(world: RealNodeWorld, pod: str, node: str, at_least: int) -> list[tuple[int, str]]:
    def enough() -> list[tuple[int, str]] | None:
        seen = ticks(world.container_log(pod, node=node))
        return seen if len(seen) >= at_least else None
    return wait_for(enough, f"{pod} to print {at_least} counts", 60)


def started_source(world: RealNodeWorld, pod: str) -> tuple[str, dict[str, Any]]:
    world.create_pod(pod, "node-a", command=holding_memory())
    status = world.wait_running(pod)["status"]["containerStatuses"][0]
    counting(world, pod, "node-a", 3)
    container_id = status["containerID"].split("//", 1)[1]
    inspected = world.node("node-a").crictl("inspect", container_id)
    assert inspected.returncode == 0, inspected.stderr
    return container_id, json.loads(inspected.stdout)["info"]


def checkpoint_in_background(world: RealNodeWorld, pod: str) -> tuple[threading.Thread,
                                                                       dict[str, Any]]:
    """The kubelet checkpoint call: it returns only once the last page was served."""
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            answer["body"] = world.kubelet("node-a", "POST",
                                           f"/checkpoint/default/{pod}/main?timeout=300",
                                           timeout=320).decode()
        except Exception as exc:  # reported through the answer, asserted by the test
            answer["error"] = str(exc)
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, answer


def crio_root(world: RealNodeWorld, node: str) -> Path:
    return world.node(node).settings.folder / "crio" / "storage"


def test_a_container_moves_with_its_memory_after_it_and_counts_on(
        world: RealNodeWorld, tmp_path: Path) -> None:
    """The restored process is the source's, going on: same token, every count once, its
    root file system's change there; the source stays stopped; every page went over."""
    world.pull("node-b", world.image)
    container_id, info = started_source(world, "lazy-src")
    dump = request_lazy_dump(container_dir(crio_root(world, "node-a"), container_id),
                             tmp_path / "source", address="127.0.0.1")
    thread, answer = checkpoint_in_background(world, "lazy-src")
    try:
        assert dump.wait_listening(limit_seconds=60), answer
        dump.hold_source(container_tasks(info["pid"]))
        upper = Path(info["runtimeSpec"]["root"]["path"]).parent / "diff"
        handoff = dump.write_handoff(upper=upper)
        image = world.push_checkpoint_image(handoff.archive, repository="checkpoints/lazy",
                                            tag="lazy-1")
        fetch = start_fetch(handoff, runc_root=world.node("node-b").settings.folder / "runc",
                            workdir=tmp_path / "target",
                            criu=os.environ.get("CONTROLPLANE_CRIU") or "criu")
        try:
            world.create_pod("lazy-dst", "node-b", image=image)
            world.wait_running("lazy-dst")
            log = fetch.finish(limit_seconds=120)
        finally:
            fetch.close()
        thread.join(330)
    finally:
        dump.kill_page_server()
    assert "body" in answer, answer  # the kubelet's call ended well, after the last page
    assert log.copied >= (MIB << 20) // PAGE_SIZE, log
    last_source = ticks(world.container_log("lazy-src", node="node-a"))
    seen = counting(world, "lazy-dst", "node-b", len(last_source) + 5)
    assert {t for _c, t in seen} == {last_source[-1][1]}, seen
    assert [c for c, _t in seen] == list(range(1, len(seen) + 1)), seen
    time.sleep(0.5)
    assert ticks(world.container_log("lazy-src", node="node-a")) == last_source
    dst = world.pod("lazy-dst")
    assert dst is not None
    moved_id = dst["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    moved = world.node("node-b").crictl("exec", moved_id, "cat", "/moved.txt")
    assert moved.stdout.strip() == "moved", moved.stderr
    removed = world.node("node-b").crictl("exec", moved_id, "ls", "/bin/true")
    assert removed.returncode != 0, removed.stdout  # the deletion went over too
    assert not list(lazy_fetches(world.node("node-b").settings.folder / "runc").iterdir())
    dump.forget()
    world.delete_pod("lazy-src")
    world.delete_pod("lazy-dst")


def test_a_restore_without_its_daemon_fails_and_the_source_runs_on(
        world: RealNodeWorld, tmp_path: Path) -> None:
    """Images without memory are never restored without it: CRI-O's restore fails, the
    dump is rolled back and the same process counts on in place."""
    world.pull("node-b", world.image)
    container_id, info = started_source(world, "abort-src")
    dump = request_lazy_dump(container_dir(crio_root(world, "node-a"), container_id),
                             tmp_path / "source", address="127.0.0.1")
    thread, answer = checkpoint_in_background(world, "abort-src")
    try:
        assert dump.wait_listening(limit_seconds=60), answer
        handoff = dump.write_handoff(upper=Path(info["runtimeSpec"]["root"]["path"]).parent
                                     / "diff")
        image = world.push_checkpoint_image(handoff.archive, repository="checkpoints/lazy",
                                            tag="abort-1")
        world.create_pod("abort-dst", "node-b", image=image)

        def refused() -> dict[str, Any] | None:
            statuses = ((world.pod("abort-dst") or {}).get("status") or {}).get(
                "containerStatuses") or []
            waiting = statuses[0]["state"].get("waiting") if statuses else None
            reason = (waiting or {}).get("reason")
            return waiting if reason not in (None, "ContainerCreating") else None
        waiting = wait_for(refused, "abort-dst to fail", 60)
        assert "no lazy-pages daemon is registered" in waiting.get("message", ""), waiting
        before = ticks(world.container_log("abort-src", node="node-a"))
        assert dump.abort()
        thread.join(60)
    finally:
        dump.kill_page_server()
    assert "error" in answer, answer  # CRI-O's checkpoint failed: nothing was taken
    after = counting(world, "abort-src", "node-a", len(before) + 5)
    assert {t for _c, t in after} == {before[-1][1]}, after
    assert [c for c, _t in after] == list(range(1, len(after) + 1)), after
    # The pod's network namespace is the sandbox's, outside the dump: CRIU never locked it.
    locked = subprocess.run(["nsenter", f"--net=/proc/{info['pid']}/ns/net", "iptables",
                             "-w", "-S", "CRIU"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert locked.returncode != 0, locked.stdout
    dump.forget()
    world.delete_pod("abort-src")
    world.delete_pod("abort-dst")
