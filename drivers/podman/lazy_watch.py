"""A lazy dump's watchdog: what becomes of the source when the agent that dumps it dies.

The agent's ``podman container checkpoint`` — and runc, and CRIU's page server under it
— outlive a SIGKILLed agent. Left alone, a page server that no target reached listens
for ever: the source stays frozen and podman keeps its lock (the next agent's podman
calls on that container wait for good). So :func:`drivers.podman.lazy.start_lazy_dump`
starts this process beside podman, holding the read end of a pipe whose write end only
the agent holds (:class:`Watch`). The agent writes ``done`` on it once it has seen the
dump through (finished or aborted it itself); the pipe's end without that word means the
agent died. Then:

- no target's lazy-pages daemon has reached the page server (the bundle's ``dump.log``):
  the dump is aborted as :meth:`~drivers.podman.lazy.LazyDump.abort` does it (CRIU's
  unknown command: it rolls the dump back; past a deadline, the page server is killed,
  which lets the tasks go on too), and once podman is done the container's network lock
  is removed: the same source process runs on, and the next agent captures it afresh;
- one has: the workload is the target's. The watchdog waits for the transfer to end
  and leaves the container, its ``dump.log`` and images in the bundle: the next agent
  adopts the ended dump (:func:`adoptable`) and reports it, instead of dumping again.

The target's side (:func:`start_target_watch`, beside ``criu lazy-pages``) holds the
restored tasks' userfaultfds from the start, as the agent does, and the daemon's log
open. Should the agent die, it waits for the daemon's end: every page in, it writes a
verdict (``{"pages": N, "expected": M}``) beside the agent's work directory, which the
next agent turns into ``pages-received`` (:func:`drivers.agent.lazy.pages_unjudged`);
pages missing, it removes the container first (its faults waited on the held
descriptors: it never ran on missing memory) and writes ``{"lost": why}``.

Run as ``python -m drivers.podman.lazy_watch`` by :mod:`drivers.podman.lazy`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from drivers.podman.lazy_logs import DumpLog, parse_dump_log, parse_fetch_log
from drivers.podman.lazy_procs import hold_userfaultfds, let_go, unlock_network
from drivers.podman.lazy_runc import REQUEST

#: The agent's word on the pipe: it saw the dump through itself.
DONE = b"done"
#: A page-server command CRIU does not know: it fails the transfer and rolls back.
UNKNOWN_COMMAND = bytes(24)
#: Seconds an abandoned dump with no target is given to roll back before its page
#: server is killed.
ROLLBACK_SECONDS = 60.0
#: Seconds a lazy-pages daemon no agent watches is given to fetch the rest of the pages.
DAEMON_SECONDS = 600.0
TAKEN = Path(REQUEST).with_suffix(".taken").name
WATCH_LOG = "lazy-watch.log"  # the source's watchdog's words, in the container's bundle


class Watch:
    """The agent's end of the pipe to a dump's watchdog."""

    def __init__(self, write_end: int, process: asyncio.subprocess.Process) -> None:
        self._fd: int | None = write_end
        self.process = process

    def dismiss(self) -> None:
        """The agent saw the dump through: the watchdog exits doing nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, DONE)
            os.close(fd)


async def start_watch(*, bundle: Path, serve: str, podman_pid: int,
                      inspect: list[str]) -> Watch:
    """Start the watchdog of the dump podman ``podman_pid`` runs on ``bundle``'s container
    (its page server on ``serve``; ``inspect``: the podman command that inspects it)."""
    return await _start("source", "--bundle", str(bundle), "--serve", serve,
                        "--podman-pid", str(podman_pid), "--inspect", json.dumps(inspect),
                        log=bundle / WATCH_LOG)


async def start_target_watch(*, daemon_pid: int, log: Path, page_size: int, verdict: Path,
                             remove: list[str]) -> Watch:
    """Start the watchdog of the lazy restore whose ``criu lazy-pages`` is ``daemon_pid``
    (its log ``log``); it writes ``verdict`` should the agent die, and runs ``remove`` (the
    podman command that removes the container) if pages are then missing."""
    return await _start("target", "--daemon-pid", str(daemon_pid), "--log", str(log),
                        "--page-size", str(page_size), "--verdict", str(verdict),
                        "--inspect", json.dumps(remove))


def verdict_path(workdir: Path) -> Path:
    """Where the target's watchdog leaves its verdict for a lazy restore in ``workdir``: a
    file beside it, which the agent's start-up cleaning keeps (it removes directories)."""
    return workdir.with_name(workdir.name + ".verdict")


async def _start(side: str, *args: str, log: Path | None = None) -> Watch:
    """Start the watchdog process; what it does and any error go to ``log``."""
    read_end, write_end = os.pipe()
    here = await asyncio.to_thread(lambda: Path(__file__).resolve().parents[2])
    words = await asyncio.to_thread(log.open, "ab") if log is not None else None
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "drivers.podman.lazy_watch", side, "--fd", str(read_end),
            *args, pass_fds=(read_end,), cwd=here, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=words if words is not None else asyncio.subprocess.DEVNULL,
            start_new_session=True)  # a signal to the agent's group is not one to it
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        if words is not None:
            words.close()
    return Watch(write_end, process)


def adoptable(bundle: Path, runc_pid_file: Path) -> DumpLog | None:
    """The log of a lazy dump an earlier agent started for the same capture (its request,
    taken by the wrapper, names the same ``runc.pid``) and a target's daemon took over:
    the dump a new agent adopts instead of dumping a stopped container (``None``: none)."""
    try:
        request = json.loads((bundle / TAKEN).read_text())
        text = (bundle / "dump.log").read_text(errors="replace")
    except (OSError, ValueError):
        return None
    if not isinstance(request, dict) or request.get("pid") != str(runc_pid_file):
        return None
    log = parse_dump_log(text)
    return log if log.connected else None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it is in /proc and not a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                for child in (task / "children").read_text().split():
                    found.append(int(child))
                    queue.append(int(child))
    return found


def _page_server(podman_pid: int) -> int | None:
    for pid in _descendants(podman_pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "criu":
                return pid
    return None


def _wait_gone(pid: int, limit: float | None) -> bool:
    deadline = None if limit is None else time.monotonic() + limit
    while process_alive(pid):
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _send_unknown_command(serve: str) -> bool:
    """Whether the page server on ``serve`` took CRIU's unknown command."""
    host, port = serve.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as sock:
            sock.sendall(UNKNOWN_COMMAND)
            sock.recv(1)  # CRIU closes it once it has failed the transfer
    except OSError:
        return False
    return True


def _dump_log(bundle: Path) -> DumpLog:
    try:
        return parse_dump_log((bundle / "dump.log").read_text(errors="replace"))
    except OSError:
        return DumpLog()


def _running_pid(inspect: list[str]) -> int:
    """The container's pid if podman says it runs, else 0."""
    done = subprocess.run(inspect, capture_output=True, text=True, timeout=120, check=False)
    try:
        state: dict[str, Any] = (json.loads(done.stdout) or [{}])[0].get("State") or {}
    except (ValueError, IndexError, AttributeError):
        return 0
    return int(state.get("Pid") or 0) if state.get("Status") == "running" else 0


def watch(fd: int, bundle: Path, serve: str, podman_pid: int, inspect: list[str]) -> str:
    """Wait for the agent's word or its end; then act as the module says. What it did."""
    with os.fdopen(fd, "rb") as pipe:
        word = pipe.read()
    if word.startswith(DONE):
        return "dismissed"
    if _dump_log(bundle).connected:
        _wait_gone(podman_pid, None)  # the target's: the transfer ends when its daemon's does
        return "handed over"
    sent = False  # CRIU logs our own connection as accepted too: after it, do not ask
    if process_alive(podman_pid):
        # Until the page server takes it: a dump still writing its images listens later.
        deadline = time.monotonic() + ROLLBACK_SECONDS
        while process_alive(podman_pid) and time.monotonic() < deadline:
            if _dump_log(bundle).connected:
                _wait_gone(podman_pid, None)  # a target's daemon came first: its transfer
                return "handed over"
            if sent := _send_unknown_command(serve):
                break
            time.sleep(0.2)
        if not _wait_gone(podman_pid, ROLLBACK_SECONDS):
            server = _page_server(podman_pid)
            if server is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server, signal.SIGKILL)
            _wait_gone(podman_pid, ROLLBACK_SECONDS)
    if not sent and _dump_log(bundle).connected:
        return "handed over"
    pid = _running_pid(inspect)
    if pid:
        asyncio.run(unlock_network(pid, limit_seconds=60))
    (bundle / TAKEN).unlink(missing_ok=True)  # nothing to adopt: the source runs on
    return "rolled back"


def watch_target(fd: int, daemon_pid: int, log: Path, page_size: int, verdict: Path,
                 remove: list[str]) -> str:
    """The target's side (see the module). What it did."""
    held: list[int] = []
    with contextlib.suppress(OSError):
        held = hold_userfaultfds(daemon_pid)  # from the start: no moment unheld
    _write(verdict, {"pending": True})  # a next agent waits for the verdict
    try:
        with contextlib.ExitStack() as files:
            # Open now: a next agent's start removes the restore's directory. Gone already,
            # the agent finished first (it says so, below).
            text: BinaryIO | None = None
            with contextlib.suppress(OSError):
                text = files.enter_context(log.open("rb"))
            with os.fdopen(fd, "rb") as pipe:
                word = pipe.read()
            if word.startswith(DONE):
                verdict.unlink(missing_ok=True)
                return "dismissed"
            if not _wait_gone(daemon_pid, DAEMON_SECONDS):  # stuck: its faults wait on
                with contextlib.suppress(ProcessLookupError):  # what is held here
                    os.kill(daemon_pid, signal.SIGKILL)
                _wait_gone(daemon_pid, ROLLBACK_SECONDS)
            fetched = parse_fetch_log(text.read().decode(errors="replace") if text else "",
                                      page_size=page_size)
        if fetched.complete:
            _write(verdict, {"pages": fetched.copied, "expected": fetched.expected})
            return "every page"
        subprocess.run(remove, capture_output=True, timeout=120, check=False)
        _write(verdict, {"lost": f"{fetched.copied} of {fetched.expected} pages reached the "
                                 "target before its lazy-pages daemon ended, while no agent "
                                 "watched; the container was removed"})
        return "lost"
    finally:
        let_go(held)


def _write(path: Path, value: dict[str, Any]) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps(value))
    staging.replace(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lazy_watch")
    parser.add_argument("side", choices=("source", "target"))
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--bundle", type=Path)
    parser.add_argument("--serve", default="")
    parser.add_argument("--podman-pid", type=int, default=0)
    parser.add_argument("--inspect", default="[]")
    parser.add_argument("--daemon-pid", type=int, default=0)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--page-size", type=int, default=4096)
    parser.add_argument("--verdict", type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.side == "source":
        did = watch(args.fd, args.bundle, args.serve, args.podman_pid, json.loads(args.inspect))
        if did != "dismissed":
            print(f"lazy_watch: the agent is gone; the dump was {did}", file=sys.stderr)
    else:
        watch_target(args.fd, args.daemon_pid, args.log, args.page_size, args.verdict,
                     json.loads(args.inspect))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
