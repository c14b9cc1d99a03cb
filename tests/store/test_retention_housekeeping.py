"""The worker's housekeeping (``worker/housekeeping.py``), on SQLite and PostgreSQL: a
round prunes under the configured policy, does nothing to history without one, and a
failure is counted and logged, never raised (the worker keeps running)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controlplane.clock import FakeClock, SystemClock
from controlplane.store import retention
from controlplane.store.database import Database, open_database
from controlplane.worker.housekeeping import Housekeeping
from tests.support.recorded_drain import DRAIN, make_drain

ROOT = Path(__file__).resolve().parents[2]


async def test_a_round_prunes_under_the_policy(db: Database) -> None:
    await make_drain(db, FakeClock(datetime.now(UTC) - timedelta(days=3)))
    kept = Housekeeping(db, SystemClock(), retention.Policy(default_days=7))
    await kept.round()
    assert await retention.summary(db, DRAIN) is None
    chores = Housekeeping(db, SystemClock(), retention.Policy(by_kind={"drain": 2}))
    await chores.round()
    assert chores.failures == 0
    summary = await retention.summary(db, DRAIN)
    assert summary is not None
    assert summary["outcome"] == "Failed"


async def test_without_a_policy_a_round_prunes_nothing(db: Database) -> None:
    await make_drain(db, FakeClock(datetime.now(UTC) - timedelta(days=3)))
    await Housekeeping(db, SystemClock(), retention.Policy()).round()
    assert await retention.count_summaries(db) == 0


async def test_a_failing_round_is_counted_not_raised(tmp_path: Path) -> None:
    broken = open_database(f"sqlite:///{tmp_path / 'no-schema.db'}")
    try:
        chores = Housekeeping(broken, SystemClock(), retention.Policy(default_days=0))
        await chores.round()
        await chores.round()
        assert (chores.rounds, chores.failures) == (2, 2)
    finally:
        await broken.dispose()


def test_a_bad_worker_policy_is_a_one_line_error_naming_the_flag(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cp.db'}"
    result = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", db,
                             "worker", "--history-keep-days", "pods=3"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "--history-keep-days 'pods=3'" in line
