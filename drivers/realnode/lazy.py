"""Post-copy (CRIU lazy pages) of a kubelet-managed container between real CRI-O nodes.

The driver-level building block. Called by the kubelet dumper's lazy capability
(:mod:`drivers.agent.kubelet_lazy`) and ``tests/realnode/test_lazy_realnode.py``. Both
nodes' CRI-O run runc through :mod:`drivers.realnode.runc_wrapper`, which hands lazy calls
to :mod:`drivers.podman.lazy_runc`.

- Source: :func:`request_lazy_dump` drops a request into the container's directory
  (CRI-O's ``--work-path``); the caller then asks the kubelet's checkpoint API, and
  CRI-O's ``runc checkpoint --leave-running`` becomes lazy. That call returns only after
  the last page was served (the kubelet's ``?timeout=`` must cover the transfer), and
  CRI-O writes its archive after it, so :meth:`LazyDump.wait_listening` waits for runc's
  status byte and :meth:`LazyDump.write_handoff` builds the checkpoint image's archive
  from the container's directory meanwhile: CRI-O's own files, CRIU's images without the
  memory, a :data:`~drivers.realnode.runc_wrapper.LAZY_IMAGES` marker naming the page
  server, the log, the root file system's changes (from the overlay's upper layer).
  :meth:`LazyDump.hold_source` sends ``SIGSTOP`` while CRIU holds the tasks, so that
  when ``--leave-running`` lets them go after the last page they stay stopped.
- Target: :func:`start_fetch` starts ``criu lazy-pages`` and registers it for that page
  server; a pod naming the checkpoint image is then restored by CRI-O, lazily;
  :meth:`LazyFetch.finish` waits for every page.
- A restore that fails before its daemon connected: :meth:`LazyDump.abort` makes CRIU
  roll the dump back (an unknown page-server command), and the source runs on. On any
  way out, :meth:`LazyDump.kill_page_server`: runc and CRIU outlive CRI-O.

Not handled here (the podman path has them, :mod:`drivers.podman.lazy`): holding the
target's userfaultfds so a dead daemon cannot leave faults reading zeros, and the loss
cases once the daemon has connected. The pod's network namespace is the sandbox's,
outside the dump, so CRIU never locks it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from drivers.podman.lazy_checks import lazy_dump_refusal
from drivers.podman.lazy_logs import FetchLog, parse_fetch_log
from drivers.podman.lazy_procs import page_server_pid
from drivers.realnode.runc_wrapper import LAZY_IMAGES, LAZY_REQUEST, lazy_fetches

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
#: A page-server command CRIU does not know: it fails the transfer and rolls the dump back.
UNKNOWN_COMMAND = bytes(24)
#: A ``criu lazy-pages -v4`` line about one task: ``uffd: PID-UFD: ...`` (UFD negative
#: once the task's userfaultfd was closed).
_TASK = re.compile(r"uffd: (\d+)-(-?\d+): (.*)$")
_DONE = re.compile(r"UFFD transferred pages: \((\d+)/(\d+)\)")
LOG_MEMBER = "io.kubernetes.cri-o.LogPath"  # where CRI-O's archive keeps the log
#: CRI-O's own files in the container's directory that its archive carries.
CONTAINER_FILES = ("config.dump", "spec.dump", "bind.mounts")


class LazyMigrationFailed(Exception):
    """A lazy step failed; the message says where the workload is."""


class LazyPagesLost(LazyMigrationFailed):
    """The pages did not all reach the target: its copy lacks memory."""


@dataclass(frozen=True)
class Handoff:
    archive: Path  # CRI-O's checkpoint archive layout, without the memory
    address: str
    port: int


def container_dir(crio_root: Path, container_id: str) -> Path:
    """CRI-O's directory of a container (its ``ctr.Dir()``, runc's ``--work-path``)."""
    return crio_root / "overlay-containers" / container_id / "userdata"


class LazyDump:
    """The source's side: a request made, then runc's lazy checkpoint."""

    def __init__(self, directory: Path, workdir: Path, address: str, port: int,
                 reader: int) -> None:
        self.directory, self.workdir = directory, workdir
        self.address, self.port = address, port
        self._reader: int | None = reader  # the FIFO runc's status byte comes through
        self._listening = False

    def listening(self) -> bool:
        """Whether CRIU wrote every image but the memory and its page server listens
        (runc's status byte has come); does not wait."""
        if self._listening or self._reader is None:
            return self._listening
        with contextlib.suppress(BlockingIOError):
            if os.read(self._reader, 1):  # b"" before runc opened it, too
                self._listening = True
                self._close_reader()
        return self._listening

    def wait_listening(self, *, limit_seconds: float) -> bool:
        """Whether the page server listens (:meth:`listening`) within ``limit_seconds``."""
        deadline = time.monotonic() + limit_seconds
        try:
            while time.monotonic() < deadline:
                if self.listening():
                    return True
                time.sleep(0.01)
            return False
        finally:
            self._close_reader()

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            os.close(reader)

    def page_server_pid(self) -> int | None:
        """The CRIU serving the pages (runc's ``criu`` child), while it runs."""
        return page_server_pid(self.workdir / "runc.pid")

    def kill_page_server(self) -> None:
        """End an abandoned dump: CRIU's death lets the frozen tasks go. Needed on every
        way out, since runc and CRIU outlive CRI-O and the node's teardown (seen here: a
        dump left waiting kept the source held after its node was gone)."""
        pid = self.page_server_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def write_handoff(self, *, upper: Path) -> Handoff:
        """CRI-O's archive of the frozen container, without its memory; ``upper``: its
        overlay's upper layer (the root file system's changes)."""
        archive = self.workdir / "handoff.tar"
        spec = json.loads((self.directory / "spec.dump").read_text())
        marker = json.dumps({"serve": f"{self.address}:{self.port}"}).encode()
        with tarfile.open(archive, "w") as tar:
            for name in CONTAINER_FILES:
                if (self.directory / name).exists():
                    tar.add(self.directory / name, name)
            tar.add(self.directory / "checkpoint", "checkpoint")
            _add_bytes(tar, f"checkpoint/{LAZY_IMAGES}", marker)
            log = (spec.get("annotations") or {}).get(LOG_MEMBER)
            if log and Path(log).is_file():
                tar.add(log, LOG_MEMBER)
            mounted = {m["destination"] for m in spec.get("mounts") or []}
            files, deleted = rootfs_changes(upper, mounted)
            if files:
                inner = io.BytesIO()
                with tarfile.open(fileobj=inner, mode="w") as diff:
                    for path in files:
                        diff.add(upper / path, path, recursive=False)
                _add_bytes(tar, "rootfs-diff.tar", inner.getvalue())
            if deleted:
                _add_bytes(tar, "deleted.files", json.dumps(deleted).encode())
        return Handoff(archive, self.address, self.port)

    def hold_source(self, pids: list[int]) -> None:
        """``SIGSTOP`` the container's tasks while CRIU holds them: ``--leave-running``
        (the kubelet's) lets them go after the last page, and they must not run on."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def release_source(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def abort(self, *, limit_seconds: float = 10.0) -> bool:
        """Fail the transfer before a daemon connected: CRIU rolls the dump back and the
        source runs on (the kubelet's checkpoint call then fails). Whether the page
        server took the command."""
        try:
            with socket.create_connection((self.address, self.port),
                                          timeout=limit_seconds) as conn:
                conn.sendall(UNKNOWN_COMMAND)
                conn.recv(1)  # CRIU closes it once it has failed the transfer
            return True
        except OSError:
            return False

    def forget(self) -> None:
        self._close_reader()
        (self.directory / LAZY_REQUEST).unlink(missing_ok=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def container_tasks(init_pid: int, *, cgroups: Path = Path("/sys/fs/cgroup")) -> list[int]:
    """The processes of the container whose first process is ``init_pid`` (its v1 freezer
    cgroup's members: CRI-O nodes here run cgroupfs on cgroup v1)."""
    for line in Path(f"/proc/{init_pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "freezer" in controllers.split(","):
            procs = (cgroups / "freezer" / path.lstrip("/") / "cgroup.procs").read_text()
            return [int(p) for p in procs.split()]
    return [init_pid]


def request_lazy_dump(directory: Path, workdir: Path, *, address: str) -> LazyDump:
    """Make the next ``runc checkpoint`` of the container whose CRI-O directory is
    ``directory`` lazy, its page server on ``address`` (a free port). Refused before
    anything is frozen when this node's pipe limit is too low for CRIU's page server
    (:func:`~drivers.podman.lazy_checks.lazy_dump_refusal`: CRIU would fail only at the
    first page asked for)."""
    refusal = lazy_dump_refusal()
    if refusal:
        raise LazyMigrationFailed(f"no lazy dump on this node: {refusal}")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    fifo = workdir / "ready"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    port = free_port(address)
    (directory / LAZY_REQUEST).write_text(json.dumps({
        "serve": f"{address}:{port}", "ready": str(fifo),
        "pid": str(workdir / "runc.pid")}))
    return LazyDump(directory, workdir, address, port, reader)


def rootfs_changes(upper: Path, mounted: set[str]) -> tuple[list[str], list[str]]:
    """What an overlay upper layer changed: paths to carry (relative) and deleted paths
    (absolute; overlay whiteouts), leaving out mount points and what lies under them, as
    CRI-O's own diff does. Opaque directories are carried as directories only."""
    files: list[str] = []
    deleted: list[str] = []
    for root, dirs, names in os.walk(upper):
        for name in sorted(dirs) + sorted(names):
            path = Path(root, name)
            absolute = "/" + str(path.relative_to(upper))
            if any(absolute == m or absolute.startswith(m.rstrip("/") + "/") for m in mounted):
                continue
            info = path.lstat()
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                deleted.append(absolute)
            else:
                files.append(absolute.lstrip("/"))
    return files, deleted


class LazyFetch:
    """The target's ``criu lazy-pages`` daemon, registered for one page server."""

    def __init__(self, daemon: subprocess.Popen[bytes], workdir: Path,
                 registration: Path) -> None:
        self.daemon, self.workdir, self.registration = daemon, workdir, registration

    def fetch_log(self) -> FetchLog:
        try:
            text = (self.workdir / "lazy-pages.log").read_text(errors="replace")
        except FileNotFoundError:
            return FetchLog()
        return parse_fetch_log(text, page_size=PAGE_SIZE)

    def handed_over(self) -> tuple[int, int]:
        """(pages received, pages expected) of the tasks handed over
        (:func:`handed_over_pages`)."""
        return handed_over_pages(self._log_text())

    def _log_text(self) -> str:
        try:
            return (self.workdir / "lazy-pages.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def finish(self, *, limit_seconds: float = 600.0) -> FetchLog:
        """Wait until every page reached the target (the daemon exits 0 once all are
        copied); else :class:`LazyPagesLost`."""
        try:
            code = self.daemon.wait(limit_seconds)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            code = self.daemon.wait()
        self.registration.unlink(missing_ok=True)
        log = self.fetch_log()
        if code == 0 and every_task_fetched(self._log_text()):
            return log
        raise LazyPagesLost(f"{log.copied} of {log.expected} pages reached the target before "
                            f"its lazy-pages daemon ended (exit {code})")

    def close(self) -> None:
        if self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.registration.unlink(missing_ok=True)


def handed_over_pages(log: str) -> tuple[int, int]:
    """(pages received, pages expected) of the tasks the restore handed to a ``criu
    lazy-pages -v4`` daemon: each task's last ``UFFD transferred pages: (N/M)``, all M of a
    task that exited (it needs none any more). Children forked during the transfer are left
    out: their copies of pages their parent already had would count twice. Pure."""
    expected: dict[tuple[str, str], int] = {}
    received: dict[tuple[str, str], int] = {}
    exited: set[tuple[str, str]] = set()
    for line in log.splitlines():
        found = _TASK.search(line)
        if not found:
            continue
        task = (found.group(1), found.group(2).lstrip("-"))
        message = found.group(3)
        if message.startswith("Found ") and "handled by UFFD" in message:
            expected[task] = int(message.split()[1])
        elif message == "EXIT":
            exited.add(task)
        elif count := _DONE.search(message):
            received[task] = int(count.group(1))
    got = sum(m if task in exited else min(received.get(task, 0), m)
              for task, m in expected.items())
    return got, sum(expected.values())


def every_task_fetched(log: str) -> bool:
    """Whether a ``criu lazy-pages -v4`` log shows every task it was handed (or that was
    forked since) with all its pages copied in, or exited. Pure.

    A task forked during the transfer that exits early is logged as transferred short
    *and* as exited ("1--12: UFFD transferred pages: (691/4133)", "1-12: EXIT", a shell's
    ``sleep`` child): it needs no more pages. :func:`~drivers.podman.lazy_logs.parse_fetch_log`
    counts it as short, so tasks are followed here one by one."""
    tasks: set[tuple[str, str]] = set()
    done: set[tuple[str, str]] = set()
    exited: set[tuple[str, str]] = set()
    for line in log.splitlines():
        found = _TASK.search(line)
        if not found:
            continue
        pid, ufd, message = found.group(1), found.group(2).lstrip("-"), found.group(3)
        if message.startswith("Found ") and "handled by UFFD" in message:
            tasks.add((pid, ufd))
        elif message.startswith("FORK: child with ufd="):
            tasks.add((pid, message.rsplit("=", 1)[1].strip()))
        elif message == "EXIT":
            exited.add((pid, ufd))
        elif (count := _DONE.search(message)) and count.group(1) == count.group(2):
            done.add((pid, ufd))
    return bool(tasks) and tasks <= done | exited


def start_fetch(handoff: Handoff, *, runc_root: Path, workdir: Path, criu: str,
                limit_seconds: float = 30.0) -> LazyFetch:
    """Start ``criu lazy-pages`` for ``handoff``'s page server on the node whose runc root
    is ``runc_root`` and register it there; return once its socket listens."""
    shutil.rmtree(workdir, ignore_errors=True)
    images = workdir / "images"
    images.mkdir(parents=True)
    with tarfile.open(handoff.archive, "r:") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith("checkpoint/"):
                member.name = member.name.removeprefix("checkpoint/")
                tar.extract(member, images, filter="data")
    daemon = subprocess.Popen(
        [criu, "lazy-pages", "--page-server", "--address", handoff.address,
         "--port", str(handoff.port), "-D", str(images), "-W", str(workdir),
         "-v4", "-o", "lazy-pages.log"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    registration = lazy_fetches(runc_root) / f"{handoff.address}:{handoff.port}.socket"
    fetch = LazyFetch(daemon, workdir, registration)
    deadline = time.monotonic() + limit_seconds
    while not (workdir / "lazy-pages.socket").exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            fetch.close()
            raise LazyMigrationFailed(f"criu lazy-pages did not listen (exit {daemon.poll()}); "
                                      f"see {workdir / 'lazy-pages.log'}")
        time.sleep(0.01)
    registration.parent.mkdir(parents=True, exist_ok=True)
    registration.unlink(missing_ok=True)
    registration.symlink_to(workdir / "lazy-pages.socket")
    return fetch


def free_port(address: str) -> int:
    """A port free on ``address`` now (runc drops a page-server port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    tar.addfile(info, io.BytesIO(data))
