"""The README's "Using cpctl" section, run as written: its first block's long-running
commands each start and print their ready line, then its second block runs under
``bash -euo pipefail`` in the same directory and every verb in it succeeds. A README
that drifts from the CLI fails here, not in a new user's first hour."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def readme_blocks() -> list[str]:
    """The ``sh`` blocks of the README's "Using cpctl" section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Using `cpctl`", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)


def commands(block: str) -> list[str]:
    """One command per line (a trailing ``# comment`` is the shell's to ignore)."""
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Path]:
    """The first block's commands running in ``tmp_path`` (with ``.venv`` linked in),
    each having printed its ready line."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    procs: list[subprocess.Popen[str]] = []
    try:
        for i, command in enumerate(commands(readme_blocks()[0])):
            with (tmp_path / f"start-{i}.stderr").open("w") as err:
                proc = subprocess.Popen(["bash", "-c", command], cwd=tmp_path, text=True,
                                        stdout=subprocess.PIPE, stderr=err,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(proc)
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            if command.startswith(".venv/bin/cpctl db upgrade"):  # then the worker's line
                assert ready.startswith("schema at "), ready
                ready = proc.stdout.readline()
                assert ready.startswith("worker "), ready
            assert ready, (command, (tmp_path / f"start-{i}.stderr").read_text())
        yield tmp_path
    finally:
        for proc in procs:
            with_group(proc, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with_group(proc, signal.SIGKILL)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def with_group(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group already ended
        os.killpg(proc.pid, sig)


def test_the_readme_has_a_start_block_and_a_use_block() -> None:
    start, use = readme_blocks()[:2]
    assert any("sim up" in c for c in commands(start))
    assert any("cpctl worker" in c for c in commands(start))
    assert any("cpctl migrate" in c for c in commands(use))


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
