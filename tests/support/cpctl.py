"""``cpctl`` as operators run it, a real subprocess from the repository's root:
:func:`cpctl` runs one command, :func:`in_process` runs the same command through
``cpctl``'s own ``main`` inside the test's process (for setting a database up and
reading what a verb answers, where the process boundary is not what the test proves:
it saves the ~0.5-1 s each interpreter start costs), :func:`upgraded` makes a database
ready for it,
:func:`assert_one_line_error` checks the one-line refusal every verb gives, and
:func:`reap` stops a server a test left running. Used by the CLI tests in ``tests/cli``
(``test_cpctl.py``, ``test_who_asked.py``, ``test_get_drain.py``,
``test_terminal_output.py``), ``tests/worker/test_drain_late_pods.py`` and
``tests/support/process_deployment.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[2]


def cpctl(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", db, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def in_process(db: str, *args: str, env: Mapping[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``cpctl --db DB ARGS`` run by ``controlplane.cli.main.main`` in this process, its
    exit code, stdout and stderr returned as :func:`cpctl` returns them. Call it from
    synchronous code (``main`` runs its own event loop). The logging configuration
    ``main`` installs is put back afterwards, and ``env`` is set only for the call."""
    from controlplane.cli.main import main
    argv = ["--db", db, *args]
    out, err = io.StringIO(), io.StringIO()
    saved = structlog.get_config()
    try:
        with _environment(env or {}), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own refusals and --help
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        structlog.configure(**saved)
    return subprocess.CompletedProcess(["cpctl", *argv], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def upgraded(db_url: str) -> str:
    """``db_url`` after ``cpctl db upgrade`` (the schema in place); the URL. In process:
    the upgrade verb's own process is tested in ``tests/cli/test_cpctl.py``."""
    result = in_process(db_url, "db", "upgrade")
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
