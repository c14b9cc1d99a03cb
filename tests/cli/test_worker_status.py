"""``cpctl worker`` says what it does at a steady low rate, and that it stopped."""

from __future__ import annotations

import re
from pathlib import Path

from controlplane.cli.worker_status import Snapshot, status_line, stopped_line
from tests.support.cpctl import in_process, upgraded


def test_a_busy_interval_says_claims_events_and_what_is_in_flight() -> None:
    line = status_line("w1", Snapshot(3, 10, 0, 0, 2), Snapshot(5, 31, 1, 1, 4), 60)
    assert line == ("worker w1: 2 claims, 21 events committed in the last 60s; 4 in flight; "
                    "1 lease loss (another worker took them over); 1 action failure "
                    "(cpctl history ID says which)")


def test_an_idle_interval_prints_nothing_so_the_caller_says_idle_once() -> None:
    assert status_line("w1", Snapshot(5, 31, 0, 0, 0), Snapshot(5, 31, 0, 0, 0), 60) is None
    assert status_line("w1", Snapshot(5, 31, 0, 0, 1), Snapshot(5, 31, 0, 0, 1), 60) == \
        "worker w1: 0 claims, 0 events committed in the last 60s; 1 in flight"


def test_the_last_line_gives_the_totals() -> None:
    assert stopped_line("w1", Snapshot(1, 4, 0, 2, 0), 125.4) == (
        "worker w1 stopped after 2m05s: 1 claim, 4 events committed, 0 lease losses, "
        "2 action failures")


def test_a_worker_that_ran_to_the_end_says_it_stopped(tmp_path: Path) -> None:
    db = upgraded(f"sqlite:///{tmp_path / 'cp.db'}")
    assert in_process(db, "submit", "steps", "--spec", '{"steps": 2}').returncode == 0
    ran = in_process(db, "worker", "--until-done", "--poll-seconds", "0.05",
                     "--worker-id", "w-test")
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("worker w-test starting:")
    assert re.fullmatch(r"worker w-test stopped after \d+s: \d+ claims?, 2 events committed, "
                        r"0 lease losses, 0 action failures", lines[-1]), lines
