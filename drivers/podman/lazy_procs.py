"""The host's side of a lazy migration: CRIU's processes, its network lock, userfaultfd.

- :func:`page_server_pid`: the CRIU serving a lazy dump's pages (runc's ``criu``
  child), for the tests that kill it and for a stuck dump.
- :func:`unlock_network`: CRIU locks a dumped container's network (an iptables chain
  ``CRIU`` in its namespace that drops every packet) and, when a lazy transfer fails and
  it lets the tasks go on, does not unlock it (cr-dump.c unlocks before the transfer, and
  only for a dump that already failed). This removes the lock as CRIU's unlock does.
- :func:`hold_userfaultfds`: duplicates of the ``criu lazy-pages`` daemon's userfaultfd
  descriptors. When the daemon dies with pages missing, the kernel releases a
  userfaultfd whose last descriptor closes, and a missing page then reads as zeros: the
  restored process runs on with wrong memory (the counter prints ``corrupt``). While
  another descriptor is held, its faults wait instead, and the process is removed
  before it computes anything.

Called by :mod:`drivers.podman.lazy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from pathlib import Path

from drivers.podman.podman import RuntimeFailed

#: CRIU's own network unlock (net.c, iptables_network_unlock_internal).
UNLOCK = ("*filter\n:CRIU - [0:0]\n-D INPUT -j CRIU\n-D OUTPUT -j CRIU\nCOMMIT\n",
          "*filter\n:CRIU - [0:0]\n-X CRIU\nCOMMIT\n")
USERFAULTFD = "anon_inode:[userfaultfd]"
SYS_PIDFD_GETFD = 438  # the same number on every architecture (Linux 5.6)


def page_server_pid(runc_pid_file: Path) -> int | None:
    """The ``criu`` child of the runc whose pid the wrapper wrote, while it runs."""
    try:
        runc = int(runc_pid_file.read_text())
        tasks = list(Path(f"/proc/{runc}/task").iterdir())
    except (OSError, ValueError):
        return None
    for task in tasks:  # Go forks from any of runc's threads
        with contextlib.suppress(OSError, ValueError):
            for child in (task / "children").read_text().split():
                if Path(f"/proc/{child}/comm").read_text().strip() == "criu":
                    return int(child)
    return None


async def unlock_network(pid: int, *, limit_seconds: float) -> bool:
    """Remove CRIU's network lock from the network namespace of ``pid``; whether there
    was one."""
    async def run(*argv: str, stdin: str = "") -> int:
        proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net=/proc/{pid}/ns/net", *argv, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            await asyncio.wait_for(proc.communicate(stdin.encode()), limit_seconds)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        return proc.returncode or 0

    found = False
    for tool in ("iptables", "ip6tables"):
        if pid <= 0 or await run(tool, "-w", "-S", "CRIU") != 0:
            continue
        found = True
        for script in UNLOCK:
            if await run(f"{tool}-restore", "-w", "--noflush", stdin=script) != 0:
                raise RuntimeFailed(f"could not remove CRIU's network lock from process "
                                    f"{pid}'s network namespace ({tool}-restore failed)")
    return found


def hold_userfaultfds(pid: int) -> list[int]:
    """Duplicates, in this process, of every userfaultfd process ``pid`` holds (needs
    ptrace rights over it: our own child, as root). Close them with :func:`let_go`."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    held: list[int] = []
    try:
        for entry in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(entry) != USERFAULTFD:
                    continue
                fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(entry.name), 0)
                if fd < 0:
                    raise OSError(ctypes.get_errno(), "pidfd_getfd")
                held.append(fd)
    except BaseException:
        let_go(held)
        raise
    finally:
        os.close(pidfd)
    return held


def let_go(held: list[int]) -> None:
    for fd in held:
        with contextlib.suppress(OSError):
            os.close(fd)
    held.clear()
