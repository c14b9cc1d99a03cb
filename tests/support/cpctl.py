"""``cpctl`` as operators run it, a real subprocess from the repository's root:
:func:`cpctl` runs one command, :func:`upgraded` makes a database ready for it,
:func:`assert_one_line_error` checks the one-line refusal every verb gives, and
:func:`reap` stops a server a test left running. Used by the CLI tests in ``tests/cli``
(``test_cpctl.py``, ``test_who_asked.py``, ``test_get_drain.py``,
``test_terminal_output.py``), ``tests/worker/test_drain_late_pods.py`` and
``tests/support/process_deployment.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cpctl(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", db, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def upgraded(db_url: str) -> str:
    """``db_url`` after ``cpctl db upgrade`` (the schema in place); the URL."""
    result = cpctl(db_url, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    return db_url


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int,
                          *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("cpctl: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def reap(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Kill a server subprocess if a test left it running; close and drain its pipes."""
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=20)  # reads what is left, closes the pipes
    return out or "", err or ""
