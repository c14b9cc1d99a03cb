"""A progress line for long bulk work (``cpctl replay``): done of total, rate, time left.

Quick runs print nothing. Past ``quiet_seconds``: on a terminal one stderr line is
redrawn (at most a few times a second) and erased at the end; in a log (not a TTY) a
line every ``log_every`` seconds, so CI and ``kubectl logs`` stay readable. stdout is
left to the report.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from controlplane.app.replay import RebuildProgress


class RebuildMeter:
    """Shows a rebuild's progress; pass as ``rebuild(progress=...)``, then :meth:`close`."""

    def __init__(self, label: str, *, stream: TextIO | None = None, quiet_seconds: float = 2.0,
                 log_every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.clock = clock
        self.started = clock()
        self.quiet_until = self.started + quiet_seconds
        self.every = 0.25 if self.live else log_every
        self.next_line = self.quiet_until
        self.drawn = False

    def __call__(self, progress: RebuildProgress) -> None:
        now = self.clock()
        if now < self.next_line:
            return
        self.next_line = now + self.every
        line = self.describe(progress, now - self.started)
        if self.live:
            self.stream.write("\r\033[K" + line)
            self.drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def describe(self, p: RebuildProgress, elapsed: float) -> str:
        share = f" ({p.machines * 100 // p.total}%)" if p.total else ""
        rate = p.events / elapsed if elapsed > 0 else 0.0
        text = (f"{self.label}: {p.machines:,} of {p.total:,} machines{share}, "
                f"{p.events:,} events, {rate:,.0f} events/s")
        if 0 < p.machines < p.total:
            left = (p.total - p.machines) * elapsed / p.machines
            text += f", about {_duration(left)} left"
        return text

    def close(self) -> None:
        """Erase the redrawn line (the report follows on stdout)."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = False


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
