"""``cpctl history prune`` and ``cpctl history import`` as operators run them (a real
subprocess), on SQLite and PostgreSQL: reports over all time unchanged, a pruned
operation's ``history`` is its summary, a prune SIGKILLed in the middle loses nothing
and the next run finishes, the archive round trip, help and one-line errors.

The history is the demo's (checkpoint, migration, suspend, resume through the simulator)
written in-process before the subprocesses run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.demo import Demo
from controlplane.clock import SystemClock
from controlplane.store.database import Database
from controlplane.wiring.embedded import embedded
from tests.support import faulty_cpctl
from tests.support.cpctl import in_process

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first

ROOT = Path(__file__).resolve().parents[2]
REPORTS = (("operations", "kind"), ("operations", "requester"), ("migrations", "node"),
           ("checkpoints", "class"), ("operations", "day"), ("drains", "kind"))


def cpctl(db: str, *args: str, crash_after: str | None = None
          ) -> subprocess.CompletedProcess[str]:
    """``cpctl --db db args``; ``crash_after``: SIGKILLed right after printing a progress
    line that starts with it (the test-only entry ``tests/support/faulty_cpctl.py``)."""
    argv = ["-m", "controlplane.cli.main", "--db", db, *args]
    if crash_after is not None:
        argv = faulty_cpctl.command(argv[2:], f"prune.progress={crash_after}")
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=dict(os.environ))


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
async def finished(db: Database, db_url: str, tmp_path: Path) -> str:
    """The URL of a database holding the demo's four settled operations."""
    async with embedded(db, tmp_path / "world", SystemClock()) as world:
        await Demo(db, world, time.monotonic()).run()
    return db_url


def all_reports(db: str) -> dict[str, Any]:
    """Every report as ``-o json`` prints it (in process: the prunes are the subprocesses)."""
    return {f"{name} --by {by}": json.loads(ok(in_process(db, "report", name, "--by", by,
                                                          "-o", "json")))
            for name, by in REPORTS}


def ids(db: str) -> list[str]:
    listed = json.loads(ok(in_process(db, "list", "-o", "json")))["items"]
    return sorted(m["id"] for m in listed)


def test_prune_keeps_every_report_and_history_shows_the_summary(finished: str) -> None:
    before, machines = all_reports(finished), ids(finished)
    assert len(machines) == 4
    dry = cpctl(finished, "history", "prune", "--keep-days", "0", "--dry-run")
    assert "4 operation(s) would be pruned" in ok(dry)
    assert ids(finished) == machines
    result = cpctl(finished, "history", "prune", "--keep-days", "0", "--batch", "3")
    assert "pruned 4 operation(s)" in ok(result)
    assert "phase 1 (summaries): batch 2: 1 of 1 summarized" in result.stderr
    assert "phase 3 (machines)" in result.stderr
    assert ids(finished) == []
    assert all_reports(finished) == before
    shown = cpctl(finished, "history", machines[0])
    assert "pruned at" in ok(shown)
    assert "summary row" in shown.stdout
    as_json = json.loads(ok(cpctl(finished, "history", machines[0], "-o", "json")))
    assert as_json["pruned"] is True
    assert as_json["summary"]["machine_id"] == machines[0]
    again = cpctl(finished, "history", "prune", "--keep-days", "0")
    assert "pruned 0 operation(s)" in ok(again)


def test_a_recent_operation_is_kept_by_its_kinds_days(finished: str) -> None:
    result = cpctl(finished, "history", "prune", "--keep-days", "0",
                   "--keep-days", "migration=30")
    assert "pruned 3 operation(s)" in ok(result)
    [left] = json.loads(ok(cpctl(finished, "list", "-o", "json")))["items"]
    assert left["kind"] == "migration"


@pytest.mark.parametrize("crash_after", ["phase 1 (summaries): batch 1",
                                         "phase 2 (history): batch 1"])
def test_a_prune_killed_in_the_middle_loses_nothing_and_the_next_run_finishes(
    finished: str, crash_after: str,
) -> None:
    """SIGKILL right after a batch committed: the reports are unchanged in the
    in-between state, and a plain rerun finishes the prune."""
    before, machines = all_reports(finished), ids(finished)
    killed = cpctl(finished, "history", "prune", "--keep-days", "0", "--batch", "2",
                   crash_after=crash_after)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert crash_after in killed.stderr
    assert ids(finished) == machines  # no machines row deleted before phase 3
    assert all_reports(finished) == before
    ok(cpctl(finished, "history", "prune", "--keep-days", "0", "--batch", "2"))
    assert ids(finished) == []
    assert all_reports(finished) == before
    for machine_id in machines:
        assert json.loads(ok(in_process(finished, "history", machine_id, "-o", "json")))["pruned"]


def _without_positions(shown: str) -> list[dict[str, Any]]:
    """A history as ``-o json`` prints it, less each event's global ``position``: an
    import appends the events to the global order anew (``restore_history_txn``)."""
    return [{k: v for k, v in e.items() if k != "position"} for e in json.loads(shown)]


def test_archive_then_import_gives_back_the_same_history(finished: str,
                                                         tmp_path: Path) -> None:
    machines = ids(finished)
    histories = {m: _without_positions(ok(in_process(finished, "history", m, "-o", "json")))
                 for m in machines}
    before = all_reports(finished)
    archive = tmp_path / "archive"
    ok(cpctl(finished, "history", "prune", "--keep-days", "0", "--archive", str(archive)))
    assert list(archive.glob("*.jsonl.gz"))
    assert "imported 4 operation(s)" in ok(cpctl(finished, "history", "import", str(archive)))
    assert "4 already present" in ok(cpctl(finished, "history", "import", str(archive)))
    assert ids(finished) == machines
    for machine_id, shown in histories.items():
        assert _without_positions(ok(in_process(finished, "history", machine_id, "-o",
                                           "json"))) == shown
    assert all_reports(finished) == before
    ok(cpctl(finished, "replay", "--verify"))


def test_history_help_names_prune_and_import_and_prune_help_explains_the_policy() -> None:
    history = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "history",
                              "--help"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
    assert "cpctl history prune --keep-days" in history.stdout
    assert "cpctl history import" in history.stdout
    prune = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "history",
                            "prune", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
    assert prune.returncode == 0
    for fragment in ("usage: cpctl history prune", "--keep-days", "--archive", "--dry-run",
                     "--batch", "settled", "history_keep_days", "summary row"):
        assert fragment in prune.stdout


@pytest.mark.parametrize(("args", "fragments"), [
    (["prune", "--keep-days", "forever"], ["--keep-days 'forever'", "e.g. --keep-days 90"]),
    (["prune", "--keep-days", "pods=3"], ["'pods' is not a kind", "migration"]),
    (["prune", "--keep-days", "-1"], ["--keep-days '-1'"]),
    (["import", "/nonexistent/archive"], ["PATH '/nonexistent/archive' does not exist"]),
])
def test_bad_arguments_are_one_line_errors_naming_the_flag(
    tmp_path: Path, args: list[str], fragments: list[str],
) -> None:
    db = f"sqlite:///{tmp_path / 'cp.db'}"
    ok(cpctl(db, "db", "upgrade"))
    result = cpctl(db, "history", *args)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("cpctl: error: ")
    for fragment in fragments:
        assert fragment in line
