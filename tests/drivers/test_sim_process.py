"""``python -m drivers.sim up``: a simulated cluster as a process, until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from drivers.kube.driver import KubeDriver
from drivers.kube.errors import ApiForbidden
from drivers.kube.resources import PODS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
async def test_the_simulator_runs_as_a_process_until_sigterm(tmp_path: Path) -> None:
    """It prints where it listens, writes a usable kubeconfig, serves with the standing
    faults of its ``--fault`` flags, and exits 0 on SIGTERM."""
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "drivers.sim", "up", "--nodes", "2", "--kubeconfig",
        str(kubeconfig), "--fault", "forbid,verb=delete,resource=pods", "--seed", "3",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode()
        assert "simulated cluster listening on http://127.0.0.1:" in line
        assert str(kubeconfig) in line
        assert "1 standing fault(s), seed 3" in line
        kube = await KubeDriver.connect(kubeconfig=str(kubeconfig))
        async with kube:
            assert sorted(n["metadata"]["name"] for n in kube.nodes) == ["node-1", "node-2"]
            with pytest.raises(ApiForbidden):
                await kube.api.delete(PODS, "any", namespace="default")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "simulated cluster stopped" in out.decode()
