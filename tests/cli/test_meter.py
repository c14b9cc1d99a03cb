"""The rebuild's progress line: silent for quick runs, then periodic in a log, redrawn on a
terminal; it says how far, how fast and how long is left."""

from __future__ import annotations

import io

from controlplane.app.replay import (
    AUTO_MAX_JOBS,
    AUTO_PARALLEL_MACHINES,
    RebuildProgress,
    auto_jobs,
)
from controlplane.cli.meter import RebuildMeter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_quick_rebuild_prints_nothing() -> None:
    out, clock = io.StringIO(), Clock()
    meter = RebuildMeter("projections", stream=out, clock=clock, quiet_seconds=2)
    clock.now += 1.5
    meter(RebuildProgress(9, 100, 9))
    meter.close()
    assert out.getvalue() == ""


def test_a_long_rebuild_logs_a_line_every_interval_with_rate_and_time_left() -> None:
    out, clock = io.StringIO(), Clock()
    meter = RebuildMeter("projections", stream=out, clock=clock, quiet_seconds=2, log_every=10)
    clock.now += 5
    meter(RebuildProgress(500, 6_000, 1_000))
    clock.now += 3  # within the interval: nothing
    meter(RebuildProgress(700, 8_400, 1_000))
    clock.now += 7
    meter(RebuildProgress(750, 9_000, 1_000))
    lines = out.getvalue().splitlines()
    assert lines == [
        "projections: 500 of 1,000 machines (50%), 6,000 events, 1,200 events/s, about 5 s left",
        "projections: 750 of 1,000 machines (75%), 9,000 events, 600 events/s, about 5 s left",
    ]


def test_on_a_terminal_the_line_is_redrawn_and_erased_at_the_end() -> None:
    out, clock = Terminal(), Clock()
    meter = RebuildMeter("rebuild", stream=out, clock=clock, quiet_seconds=0)
    clock.now += 1
    meter(RebuildProgress(1, 12, 4))
    clock.now += 1
    meter(RebuildProgress(2, 24, 4))
    meter.close()
    text = out.getvalue()
    assert text.count("\r\033[K") == 3
    assert "rebuild: 2 of 4 machines (50%)" in text
    assert text.endswith("\r\033[K")


def test_only_a_large_history_is_rebuilt_in_parallel_by_default() -> None:
    assert auto_jobs(AUTO_PARALLEL_MACHINES - 1, cpus=16) == 1
    assert auto_jobs(AUTO_PARALLEL_MACHINES, cpus=2) == 2
    assert auto_jobs(10 * AUTO_PARALLEL_MACHINES, cpus=64) == AUTO_MAX_JOBS
    assert auto_jobs(AUTO_PARALLEL_MACHINES, cpus=1) == 1
