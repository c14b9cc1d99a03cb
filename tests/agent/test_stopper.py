"""A quiesced kubelet capture stops the container's processes by signal, found through
the container's cgroup; a real process is stopped and continued."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.agent.errors import DumpFailed
from drivers.agent.stopper import container_cgroup, signal_container
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
