"""``cpctl sim nodes``: bad flags are refused naming the flag and the fix (exit 2); the
process prints exactly one ready line once its nodes are Ready, serves pods, and exits 0
on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from controlplane.cli.main import main
from drivers.kube.resources import NODES, PODS
from drivers.sim.objects import condition
from tests.kubelet.world import admin_client
from tests.support.envtest import ROOT, free_port, start_kubelet_role
from tests.support.waiting import eventually


@pytest.fixture(autouse=True)
def _logs_restored() -> Iterator[None]:
    """main() points the logs at this test's captured stderr, closed after it: put the
    configuration back, or later tests' loggers write to a closed file (and raise)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize(("flags", "named", "fix"), [
    (["--nodes", "Node_1"], "--nodes: 'Node_1' is not a valid node name", "--nodes node-1"),
    (["--nodes", "a,a"], "--nodes: a node name is listed twice", "name each node once"),
    (["--nodes", ","], "--nodes: no node names given", "comma-separated"),
    (["--nodes", "a", "--node-memory", "8GB"], "--node-memory: '8GB' is not a positive",
     "--node-memory 8Gi"),
    (["--nodes", "a", "--node-cpu", "0"], "--node-cpu: '0' is not a positive", "500m"),
    (["--nodes", "a", "--node-pods", "0"], "--node-pods: 0 is not a positive", "110"),
    (["--nodes", "a", "--start-seconds", "-1"], "--start-seconds: -1.0 is not between",
     "--start-seconds 0"),
])
def test_bad_flags_exit_2_naming_the_flag_and_the_fix(
        flags: list[str], named: str, fix: str, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    code = main(["sim", "nodes", "--kubeconfig", str(tmp_path / "none"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert named in err
    assert fix in err


def test_a_missing_kubeconfig_is_named(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code = main(["sim", "nodes", "--kubeconfig", str(tmp_path / "none"), "--nodes", "a"])
    err = capsys.readouterr().err
    assert code != 0
    assert f"kubeconfig {tmp_path / 'none'}" in err
    assert "does not exist" in err


def _start_sim(kubeconfig: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "sim", "up", "--no-kubelets",
         "--kubeconfig", str(kubeconfig)], cwd=ROOT, text=True, stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL)


@pytest.mark.slow
async def test_process_prints_one_ready_line_serves_pods_and_exits_0(tmp_path: Path) -> None:
    """``cpctl sim up --no-kubelets`` (no nodes) + ``cpctl sim nodes``: the role's nodes,
    with the flags' sizes, run a pod; SIGTERM ends it with exit 0 and nothing more on
    stdout after the ready line."""
    kubeconfig = tmp_path / "kubeconfig"
    sim = await asyncio.to_thread(_start_sim, kubeconfig)
    try:
        assert sim.stdout is not None
        assert "(no nodes, no kubelets)" in await asyncio.to_thread(sim.stdout.readline)
        admin = await admin_client(kubeconfig)
        try:
            nodes, _ = await admin.list_all(NODES)
            assert nodes == []  # the simulator registered none: the role does
            role = await asyncio.to_thread(start_kubelet_role, kubeconfig, ["n-a", "n-b"],
                                           tmp_path / "role.log", "--node-cpu", "2")
            for name in ("n-a", "n-b"):
                node = await admin.get(NODES, name)
                assert (condition(node, "Ready") or {}).get("status") == "True"
                assert node["status"]["allocatable"]["cpu"] == "2"
            await admin.create(PODS, {"metadata": {"name": "web"}, "spec": {
                "containers": [{"name": "main", "image": "pause"}]}}, namespace="default")

            async def running() -> bool:
                pod = await admin.get(PODS, "web", namespace="default")
                return (pod.get("status") or {}).get("phase") == "Running"

            await eventually(running, limit_seconds=30, what="web Running")
            role.proc.send_signal(signal.SIGTERM)
            assert role.proc.stdout is not None
            rest = await asyncio.to_thread(role.proc.stdout.read)  # until it exits
            await asyncio.to_thread(role.stop)
        finally:
            await admin.client.close()
        assert role.proc.returncode == 0, (tmp_path / "role.log").read_text()
        assert rest == ""  # the ready line was the only one
    finally:
        sim.send_signal(signal.SIGTERM)
        await asyncio.to_thread(sim.communicate, timeout=20)


def test_an_unreachable_server_fails_after_the_ready_timeout(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Exit 1 naming the node, the timeout and the address; no ready line."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    code = main(["sim", "nodes", "--kubeconfig", str(kubeconfig), "--nodes", "a",
                 "--ready-timeout", "1"])
    out, err = capsys.readouterr()
    assert code == 1, err
    assert out == ""
    assert "node a not registered within 1s" in err
    assert "127.0.0.1" in err
