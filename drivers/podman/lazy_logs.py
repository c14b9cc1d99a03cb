"""What CRIU's own logs say of a lazy-pages transfer (pure parsing).

CRIU's statistics file is no help here: in lazy mode its page server starts the dump
statistics afresh (``cr_page_server`` calls ``init_stats``), so ``stats-dump`` counts no
pages and its frozen time is meaningless. Its logs do say it all, each line stamped
``(SS.ffffff)`` seconds since that CRIU started:

- the source's ``dump.log`` (runc writes it at log level 4 into the container's bundle):
  when the tasks froze (``freezer.state=FROZEN``, or ``Seized task`` without a cgroup
  freezer), when the page server listened, whether a daemon connected to it (``Accepted
  connection``: from then on the end of that connection ends the source), and when the
  transfer ended (``Lazy pages transfer finished successfully`` / ``FAILED``);
- the target's ``lazy-pages.log`` (the daemon, ``-v4``: these are debug lines): per task
  ``Found M pages to be handled by UFFD`` once the restore handed it over, ``Connecting
  to server``, each copy into the task (``uffd_copy: 0xADDR/BYTES``), and, once the task
  has all it will get, ``UFFD transferred pages: (N/M)`` (CRIU itself does not fail when
  N < M: that check is compiled out in uffd.c, so the reader must); ``FORK: child`` and
  ``EXIT`` for tasks born or gone meanwhile.

Read by :mod:`drivers.podman.lazy`; the formats are CRIU 4.1's (cr-dump.c, seize.c,
page-xfer.c, uffd.c).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

_LINE = re.compile(r"^\((\d+\.\d+)\)\s*(.*)$")
_FOUND = re.compile(r"Found (\d+) pages to be handled by UFFD")
_COPIED = re.compile(r"uffd_copy: 0x[0-9a-f]+/(\d+)")
_TRANSFERRED = re.compile(r"UFFD transferred pages: \((\d+)/(\d+)\)")
_FORKED = re.compile(r"FORK: child with ufd=")
_EXITED = re.compile(r"uffd: -?\d+--?\d+: EXIT$")
#: The task a ``uffd:`` line is about: ``<pid>-<ufd>`` (``1-11``; ``1--12`` for a ufd
#: CRIU logs negative).
_TASK = re.compile(r"uffd: (-?\d+--?\d+): ")


@dataclass(frozen=True)
class DumpLog:
    """The source's side of a lazy transfer (seconds since the dumping CRIU started)."""

    frozen_at: float | None = None
    listening_at: float | None = None
    connected: bool = False  # a lazy-pages daemon reached the page server
    served_at: float | None = None  # every page the daemon asked for was sent
    failed: bool = False

    @property
    def frozen_seconds(self) -> float | None:
        """From the freeze to the last page served: the source's share of the downtime
        and of the transfer."""
        if self.frozen_at is None or self.served_at is None:
            return None
        return self.served_at - self.frozen_at


@dataclass(frozen=True)
class FetchLog:
    """The target's side: the pages its tasks left to the daemon, and those copied in."""

    connected: bool = False  # the daemon reached the page server
    expected: int = 0
    copied: int = 0
    tasks: int = 0  # tasks handed to the daemon, or forked by them since
    done: int = 0  # tasks with every page copied in
    short: int = 0  # tasks the daemon let go with pages missing
    exited: int = 0  # tasks that exited before all their pages came (none needed)

    @property
    def complete(self) -> bool:
        return self.tasks > 0 and self.short == 0 and self.done + self.exited >= self.tasks


def parse_dump_log(text: str) -> DumpLog:
    """Read a ``dump.log``; only the last CRIU run in it counts (runc may run CRIU once
    to check its features first, into the same file)."""
    log = DumpLog()
    for raw in text.splitlines():
        found = _LINE.match(raw.strip())
        if not found:
            continue
        at, message = float(found.group(1)), found.group(2)
        if message.startswith("CRIU run id"):
            log = DumpLog()
        elif log.frozen_at is None and ("freezer.state=FROZEN" in message
                                        or message.startswith("Seized task")):
            log = replace(log, frozen_at=at)
        elif message.startswith("Starting page server on port"):
            log = replace(log, listening_at=at)
        elif message.startswith("Accepted connection from"):
            log = replace(log, connected=True)
        elif "Lazy pages transfer finished successfully" in message:
            log = replace(log, served_at=at)
        elif "Lazy pages transfer FAILED" in message or "Dumping FAILED" in message:
            log = replace(log, failed=True)
    return log


def parse_fetch_log(text: str, *, page_size: int) -> FetchLog:
    """Read a ``criu lazy-pages -v4`` log."""
    counts = dict.fromkeys(("expected", "copied", "tasks"), 0)
    ended: dict[str, str] = {}  # task -> "done" | "short" | "exited", the last word wins
    connected = False
    for line in text.splitlines():
        task = found.group(1) if (found := _TASK.search(line)) else line
        if "Connecting to server" in line:
            connected = True
        elif found := _FOUND.search(line):
            counts["expected"] += int(found.group(1))
            counts["tasks"] += 1
        elif found := _COPIED.search(line):
            counts["copied"] += int(found.group(1)) // page_size
        elif found := _TRANSFERRED.search(line):
            if ended.get(task) != "exited":
                ended[task] = "done" if found.group(1) == found.group(2) else "short"
        elif _FORKED.search(line):
            counts["tasks"] += 1
        elif _EXITED.search(line):
            # A task that exits mid-transfer is also logged with its pages short: it
            # needs none of them any more, so its exit is what counts.
            ended[task] = "exited"
    statuses = list(ended.values())
    return FetchLog(connected, done=statuses.count("done"), short=statuses.count("short"),
                    exited=statuses.count("exited"), **counts)
