"""The README's "Using cpctl" section, run as written: its first block's long-running
commands each start and print their ready line, then its second block runs under
``bash -euo pipefail`` in the same directory and every verb in it succeeds. A README
that drifts from the CLI fails here, not in a new user's first hour."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.walkthrough import commands, sh_blocks
from tests.support.walkthrough import started as started_block

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def readme_blocks() -> list[str]:
    """The ``sh`` blocks of the README's "Using cpctl" section, in order."""
    return sh_blocks(ROOT / "README.md", "Using `cpctl`")


def _ready(command: str, proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if command.startswith(".venv/bin/cpctl db upgrade"):  # then the worker's line
        assert ready.startswith("schema at "), ready
        ready = proc.stdout.readline()
        assert ready.startswith("worker "), ready
    return ready


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Path]:
    """The first block's commands running in ``tmp_path`` (with ``.venv`` linked in),
    each having printed its ready line."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    with started_block(readme_blocks()[0], tmp_path, ready=_ready):
        yield tmp_path


def test_the_readme_has_a_start_block_and_a_use_block() -> None:
    start, use = readme_blocks()[:2]
    assert any("sim up" in c for c in commands(start))
    assert any("cpctl worker" in c for c in commands(start))
    assert any("cpctl migrate" in c for c in commands(use))


@pytest.mark.timeout(300)  # a net for a hang: two sections of verbs, each a process
def test_every_command_of_using_cpctl_runs_as_written(started: Path) -> None:
    use = readme_blocks()[1]
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", use], cwd=started, text=True,
                            capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    for line in ("migrate default/app: Succeeded", "restore default/app-copy on node-3: Succeeded",
                 "suspend default/app: Suspended", "resume default/app: Resumed",
                 "drain node-3: Succeeded"):
        assert line in out, out
    assert "DRY RUN: nothing is changed" in out
    assert re.search(r"^[0-9a-f-]{36}: Succeeded$", out, flags=re.MULTILINE), out  # wait
    assert "0 mismatches" in out
    # "Scripting and resources": its block, in the same directory, after the walkthrough.
    [script] = sh_blocks(ROOT / "README.md", "Scripting and resources")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=started,
                            text=True, capture_output=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert re.search(r"^[0-9a-f]{8} migration default/app node-2 Succeeded$", out,
                     flags=re.MULTILINE), out
    assert re.search(r"^[0-9a-f]{8} restore default/app-copy node-3 Succeeded$", out,
                     flags=re.MULTILINE), out
    assert re.search(r"^[0-9a-f]{8} drain node:node-3 node-3 Succeeded$", out,
                     flags=re.MULTILINE), out
    assert "kind: migration\n" in out, out
    assert "phase: Succeeded\n" in out, out
    assert re.search(r"^\d+ events$", out, flags=re.MULTILINE), out
    assert out.rstrip().splitlines()[-1].startswith("kind,count,succeeded,"), out  # CSV
