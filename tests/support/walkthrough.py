"""A walkthrough of the docs run as written: its fenced shell blocks, the long-running
commands of a start block each waited for by its ready line, then a block of commands
under ``bash -euo pipefail`` in the same directory.

:func:`sh_blocks` reads the ``sh`` blocks of a section of a Markdown page,
:func:`commands` splits a block into its commands, :func:`started` runs a start block's
commands (each in a process group of its own, stopped with SIGTERM, then SIGKILL) and
:func:`console_output` is what a page shows under ``$ <command>``. Used by
``tests/docs/test_resources_walkthrough.py`` (and fit for the README's,
``tests/docs/test_readme_walkthrough.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path


def section(page: Path, heading: str) -> str:
    """The text of the section ``## <heading>`` of ``page`` (up to the next ``## ``)."""
    return page.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def sh_blocks(page: Path, heading: str) -> list[str]:
    """The ``sh`` blocks of that section, in order."""
    return re.findall(r"```sh\n(.*?)```", section(page, heading), flags=re.DOTALL)


def commands(block: str) -> list[str]:
    """One command per line (a trailing ``# comment`` is the shell's to ignore)."""
    return [line for line in block.splitlines() if line.strip()]


def console_output(text: str, command: str) -> list[str]:
    """The lines ``text`` shows under ``$ <command>`` in a ``console`` block."""
    lines = text.splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


def with_group(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group already ended
        os.killpg(proc.pid, sig)


@contextlib.contextmanager
def started(block: str, cwd: Path, *, env: Mapping[str, str] | None = None,
            ready: Callable[[str, subprocess.Popen[str]], str] | None = None,
            ) -> Iterator[list[str]]:
    """The block's commands running in ``cwd``, each having printed its ready line (its
    first line on stdout; ``ready(command, proc)`` reads it instead when given); yields
    those lines. Each command is a process group of its own, so its children stop with
    it; every group gets SIGTERM at the end, SIGKILL after 20 s."""
    procs: list[subprocess.Popen[str]] = []
    lines: list[str] = []
    try:
        for i, command in enumerate(commands(block)):
            with (cwd / f"start-{i}.stderr").open("w") as err:
                proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, text=True,
                                        stdout=subprocess.PIPE, stderr=err, env=env,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(proc)
            assert proc.stdout is not None
            line = ready(command, proc) if ready else proc.stdout.readline()
            assert line, (command, (cwd / f"start-{i}.stderr").read_text())
            lines.append(line)
        yield lines
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
