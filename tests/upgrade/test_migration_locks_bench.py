"""``bench.migration_locks`` still runs (at a tiny size; ``python -m bench.migration_locks``
measures 1,000,000 events): a row for every revision after the first, with the lock
each held on ``events`` and ``machines`` and the write probe's worst round — never
checked for timings, which are not pass/fail — and it drops its database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.store.migrate import head_revision
from tests.upgrade.previous_release import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_the_lock_bench_reports_every_revision_on_a_small_history(tmp_path: Path) -> None:
    out = tmp_path / "locks.json"
    prefix = f"cp_smoke_locks_{os.getpid()}"
    run = subprocess.run(
        [sys.executable, "-m", "bench.migration_locks", "--events", "2400", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "BENCH_DB_PREFIX": prefix}, capture_output=True,
        text=True, timeout=240, check=False, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["loaded"]["events"] == 2400
    revisions = [r["revision"] for r in result["revisions"]]
    assert revisions[0] == "0002"
    assert revisions[-1] == head_revision()
    for row in result["revisions"]:
        assert {"events_lock_ms", "machines_lock_ms", "probe_worst_ms"} <= row.keys()
    # 0009 turns events into partitions: it holds the table, and the bench sees it.
    partitioned = next(r for r in result["revisions"] if r["revision"] == "0009")
    assert partitioned["events_lock_mode"] == "AccessExclusiveLock"
