"""A source agent killed mid-stream: the target's fetch fails as interrupted and leaves no
file behind (no unverified byte of a checkpoint is ever restored from)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drivers.agent.handoff import HandoffInterrupted, fetch_checkpoint
from tests.agent.handoff_source import ADDRESS
from tests.support.stopping import stop_processes

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEY = bytes(range(32))
# Far more than the loopback socket buffers and the client's read buffer hold (~45 MiB
# here), so the source is still sending when it is killed. A hole: it costs no disk.
ARCHIVE_MIB = 256


def _start_source(tmp_path: Path) -> subprocess.Popen[str]:
    """The source agent's handoff server in a process of its own, offering a hole."""
    (tmp_path / "key").write_bytes(KEY)
    with (tmp_path / "big.tar").open("wb") as out:
        out.truncate(ARCHIVE_MIB << 20)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.agent.handoff_source", str(tmp_path / "key"),
         str(tmp_path / "big.tar"), "c1", "node-b"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _address(source: subprocess.Popen[str]) -> str:
    assert source.stdout is not None
    for line in source.stdout:
        if line.startswith(ADDRESS):
            return line.removeprefix(ADDRESS).strip()
    raise AssertionError(f"the handoff source exited ({source.wait()}) before it listened")


async def test_a_source_killed_mid_stream_fails_the_fetch_and_leaves_no_file(
        tmp_path: Path) -> None:
    source = _start_source(tmp_path)
    arrived: list[int] = []

    def kill_once_bytes_arrive(done: int, total: int) -> None:
        if not arrived:
            source.send_signal(signal.SIGKILL)
        arrived.append(done)

    try:
        address = await asyncio.to_thread(_address, source)
        with pytest.raises(HandoffInterrupted, match=r"broke after .* before its FINAL record"
                           ) as failed:
            await fetch_checkpoint(address, "c1", key=KEY, target_node="node-b",
                                   dest=tmp_path / "dest", timeout=60,
                                   progress=kill_once_bytes_arrive)
    finally:
        stop_processes([source])
    assert failed.value.retryable
    assert source.returncode == -signal.SIGKILL
    assert 0 < arrived[-1] < ARCHIVE_MIB << 20
    assert not (tmp_path / "dest").exists()
