"""The node agent's ``--workdir`` is its own: by default one per node, checked at start.

Through the CLI as a user runs it (``cpctl sim up``, then ``python -m drivers.agent`` per
node in one working directory): agents started without ``--workdir`` each get
``var/checkpoint-agent/<node>`` (in the ready line and on disk, holding the agent's
lock), ``$CONTROLPLANE_AGENT_WORKDIR`` stands for the flag, a second agent given a
directory in use refuses to start, and a workdir that cannot be created exits 2 with one
line naming ``--workdir``, the path and the fix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONTROLPLANE_AGENT_WORKDIR"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


class Processes:
    """Processes started in one working directory; all stopped at the end."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=self.cwd, text=True,
                                env=env or _env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def agent(self, node: str, *flags: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return self.start("drivers.agent", "--node", node, "--kubeconfig", "kube.yaml",
                          "--layout", "oci", "--dumper", "sim", *flags, env=env)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it serves (or exits: "")
    assert line, f"exited {proc.wait(10)}: {proc.stderr.read() if proc.stderr else ''}"
    return line.strip()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Processes]:
    """``cpctl sim up --nodes 3`` with its kubeconfig at ``kube.yaml`` in ``tmp_path``."""
    ps = Processes(tmp_path)
    try:
        sim = ps.start("controlplane.cli.main", "sim", "up", "--nodes", "3", "--kubeconfig",
                       "kube.yaml")
        assert "listening on" in _line(sim)
        yield ps
    finally:
        ps.stop()


def test_agents_without_workdir_each_get_their_own_directory(
        cluster: Processes, tmp_path: Path) -> None:
    """Two agents on one host, no ``--workdir``: node-1's and node-2's directories under
    the working directory, each named in the agent's ready line and locked by its pid."""
    agents = {node: cluster.agent(node) for node in ("node-1", "node-2")}
    for node, proc in agents.items():
        workdir = tmp_path / "var" / "checkpoint-agent" / node
        line = _line(proc)
        assert line == f"node agent serving {node} with the sim dumper; workdir {workdir}"
        assert workdir.is_dir()
        assert (workdir / "agent.lock").read_text().strip() == str(proc.pid)


def test_a_second_agent_on_a_workdir_in_use_refuses_to_start(
        cluster: Processes, tmp_path: Path) -> None:
    """Another agent given node-1's directory exits 2 naming the holder; the first one
    keeps serving."""
    first = cluster.agent("node-1")
    _line(first)
    workdir = tmp_path / "var" / "checkpoint-agent" / "node-1"
    second = cluster.agent("node-2", "--workdir", str(workdir))
    _, err = second.communicate(timeout=60)
    assert second.returncode == 2
    assert err == (f"python -m drivers.agent: error: --workdir {workdir}: another agent "
                   f"(pid {first.pid}) uses it; give each agent its own --workdir (the "
                   "default is var/checkpoint-agent/NODE under the working directory)\n")
    assert first.poll() is None


def test_the_environment_variable_stands_for_the_flag(
        cluster: Processes, tmp_path: Path) -> None:
    custom = tmp_path / "scratch" / "n3"
    proc = cluster.agent("node-3", env=_env(CONTROLPLANE_AGENT_WORKDIR=str(custom)))
    assert _line(proc).endswith(f"; workdir {custom}")
    assert (custom / "agent.lock").is_file()


def test_a_workdir_that_cannot_be_created_exits_2_naming_the_flag(tmp_path: Path) -> None:
    """A file where the directory should be: refused before any cluster is contacted
    (there is none here), one line with the flag, the path and the fix."""
    (tmp_path / "taken").write_text("a file, not a directory\n")
    workdir = tmp_path / "taken" / "node-1"
    result = subprocess.run(
        [sys.executable, "-m", "drivers.agent", "--node", "node-1", "--kubeconfig",
         str(tmp_path / "missing.yaml"), "--dumper", "sim", "--workdir", str(workdir)],
        cwd=tmp_path, env=_env(), text=True, capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"python -m drivers.agent: error: --workdir {workdir}: "
                                    "cannot create or write it: a file is in the way; "
                                    "pass --workdir a directory this agent can write")


def test_help_says_the_default_workdir() -> None:
    result = subprocess.run([sys.executable, "-m", "drivers.agent", "--help"], cwd=ROOT,
                            env=_env(), text=True, capture_output=True, timeout=60)
    assert result.returncode == 0
    assert ("--workdir DIR node-local scratch space for archives, this agent's alone "
            "(default: $CONTROLPLANE_AGENT_WORKDIR, else var/checkpoint-agent/NODE under "
            "the working directory; created if missing)") in " ".join(result.stdout.split())
