"""A quiesced kubelet capture stops the container's processes by signal, found through
the container's cgroup; a real process is stopped and continued. (The stop in the window
between CRIU's dump and CRI-O's thaw is pinned on real nodes: tests/realnode.)"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.agent.errors import DumpFailed
from drivers.agent.stopper import container_cgroup, signal_container, stop_when_dumped
from tests.support.waiting import wait_for


def state(pid: int) -> str:
    """The process' state letter (``T``: stopped) from ``/proc/<pid>/stat``."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def fake_cgroups(root: Path, container: str, pids: list[int]) -> Path:
    """A v1 ``pids`` hierarchy holding the container's scope the way CRI-O names it."""
    (root / "pids").mkdir(parents=True)
    (root / "pids" / "cgroup.procs").write_text("")
    scope = root / "pids" / "kubepods" / "besteffort" / "pod1" / f"crio-{container}"
    scope.mkdir(parents=True)
    (scope / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    return scope


def test_a_containers_processes_are_stopped_and_continued(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    scope = fake_cgroups(tmp_path, "abc123", [sleeper.pid])
    assert container_cgroup("cri-o://abc123", tmp_path) == scope
    assert signal_container("cri-o://abc123", signal.SIGSTOP, root=tmp_path) == 1
    wait_for(lambda: state(sleeper.pid) == "T" or None, what="the process stopped")
    signal_container("cri-o://abc123", signal.SIGCONT, root=tmp_path)
    wait_for(lambda: state(sleeper.pid) != "T" or None, what="the process running again")


def test_a_container_without_a_cgroup_is_named_in_the_failure(tmp_path: Path) -> None:
    fake_cgroups(tmp_path, "abc123", [])
    with pytest.raises(DumpFailed, match="container cri-o://other"):
        signal_container("cri-o://other", signal.SIGSTOP, root=tmp_path)


def test_a_dump_that_never_froze_the_container_leaves_the_stop_to_the_caller(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """No CRI-O pause and no CRIU seen before the kubelet answered: ``late``, nothing
    sent (the caller stops the container itself); no v1 freezer at all: ``no-freezer``."""
    fake_cgroups(tmp_path, "abc123", [sleeper.pid])
    freezer = tmp_path / "freezer" / "kubepods" / "pod1" / "crio-abc123"
    freezer.mkdir(parents=True)
    (tmp_path / "freezer" / "cgroup.procs").write_text("")
    (freezer / "cgroup.procs").write_text(f"{sleeper.pid}\n")
    (freezer / "freezer.self_freezing").write_text("0\n")
    done = threading.Event()
    done.set()
    assert stop_when_dumped("cri-o://abc123", done, root=tmp_path) == "late"
    assert state(sleeper.pid) != "T"
    assert stop_when_dumped("cri-o://abc123", done, root=tmp_path / "pids") == "no-freezer"
