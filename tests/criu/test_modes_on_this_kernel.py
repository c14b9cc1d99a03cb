"""The criu dumper asks this node's real CRIU whether pre-copy can run, and refuses it
before anything is frozen with the kernel's own answer (on this CI machine: dirty-page
tracking is off, so the refusal names it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from drivers.agent.criu import CriuDumper
from drivers.podman.podman import PodmanNode


def _criu_says() -> tuple[int, str]:
    done = subprocess.run([os.environ.get("CONTROLPLANE_CRIU", "criu"), "check", "--feature",
                           "mem_dirty_track"], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


async def test_precopy_is_refused_with_what_this_kernel_lacks(tmp_path: Path) -> None:
    dumper = CriuDumper(PodmanNode(tmp_path / "node"))
    why = await dumper.refuse_mode("precopy")
    code, said = await asyncio.to_thread(_criu_says)
    assert why is not None
    if code != 0:  # this machine: "Dirty tracking is OFF"
        assert "soft-dirty page tracking" in why
        assert "CONFIG_MEM_SOFT_DIRTY" in why
        assert said.strip().rsplit("):", 1)[-1].strip() in why
    else:
        assert "no pre-dump rounds" in why
    assert dumper.dumps == 0  # asked, never dumped
