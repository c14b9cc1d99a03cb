"""Live migration of a podman container with CRIU lazy pages (post-copy), step by step.

The source dumps everything but the memory and serves the pages from CRIU's page
server; the target restores at once, a ``criu lazy-pages`` daemon fetching each page when
the process first touches it (and the rest in the background); the source is removed
once every page went over. Each node's agent will run its own steps (not wired yet);
:func:`lazy_migrate` runs them all in one process (the tests):

1. :func:`start_lazy_dump` (source) returns a :class:`LazyDump` once the images without
   memory are written — its :class:`Handoff`, an archive ``podman container restore
   --import`` takes — and the page server listens;
2. :func:`restore_lazily` (target) returns a :class:`LazyRestore` once the container
   runs under podman, under the name asked for;
3. :meth:`LazyDump.finish` (source) and :meth:`LazyRestore.finish` (target) wait until
   every page went over; :func:`finish_lazy_migration` waits for both.

podman 4.3 has no lazy option and exports its archive only after runc returns, which in
lazy mode is after the last page. So both nodes run runc through
:mod:`drivers.podman.lazy_runc` (their :class:`PodmanNode`'s ``runtime``, written by its
``install_runtime``). ``podman container checkpoint --export`` writes ``config.dump``
and ``spec.dump``, then runs runc, which the wrapper makes lazy; when runc's status byte
says the page server listens, podman still waits in runc, and
:mod:`drivers.podman.lazy_handoff` builds the import archive from the container's
bundle. The target's ``podman container restore --import`` is made lazy by the same
wrapper. While the pages go over, podman holds the source container's lock: ``podman
ps`` and ``inspect`` on the source node wait until the transfer ends.

What each failure leaves is stated where it is handled: :meth:`LazyDump.abort`,
:meth:`LazyDump.finish`, :func:`restore_lazily`, :meth:`LazyRestore.finish`; the process
that dumps dying mid-way (a SIGKILLed agent) by :mod:`drivers.podman.lazy_watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.podman.lazy_checks import criu_binary, lazy_dump_refusal
from drivers.podman.lazy_handoff import extract_images, with_request, write_handoff
from drivers.podman.lazy_logs import DumpLog, FetchLog, parse_dump_log, parse_fetch_log
from drivers.podman.lazy_procs import hold_userfaultfds, let_go, page_server_pid, unlock_network
from drivers.podman.lazy_runc import REQUEST, SOCKET, is_lazy_runtime
from drivers.podman.lazy_watch import (
    Watch,
    adoptable,
    start_target_watch,
    start_watch,
    verdict_path,
)
from drivers.podman.podman import PodmanNode, RuntimeFailed

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
DAEMON_LOG = "lazy-pages.log"
PODMAN_ERR = "podman.stderr"  # what the source's podman checkpoint says, in its workdir
#: A page-server command CRIU does not know (``struct page_server_iov`` of zeros): the
#: one way to make a lazy transfer fail, and CRIU then roll the dump back.
UNKNOWN_COMMAND = bytes(24)


class LazyMigrationFailed(RuntimeFailed):
    """A lazy migration step failed; the message says where the workload is."""


class LazyDumpFailed(LazyMigrationFailed):
    """The source did not hand over; its container runs on in place unless the message
    says otherwise."""


class LazyRestoreFailed(LazyMigrationFailed):
    """The target's container did not start. ``source_committed``: the target's daemon
    had reached the page server, so the source ends with that connection
    (:meth:`LazyDump.abort` says how it ended)."""

    def __init__(self, message: str, *, source_committed: bool, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.source_committed = source_committed


class LazyPagesLost(LazyMigrationFailed):
    """The page transfer broke off once a target could run: the copies that could not be
    kept were removed, and the message says which (none runs twice)."""


@dataclass(frozen=True)
class Handoff:
    """What the source gives the target: an import archive without the memory, and the
    page server's address."""

    archive: Path
    address: str
    port: int


@dataclass(frozen=True)
class LazyMigration:
    """A finished lazy migration, in CRIU's own numbers."""

    container_id: str  # the target's container
    pages: int  # copied into the target's tasks by the daemon (UFFD)
    bytes: int
    frozen_seconds: float | None  # the source frozen → its last page served (dump.log)


class LazyDump:
    """The source's side, from the moment its page server listens."""

    def __init__(self, source: PodmanNode, name: str, bundle: Path, workdir: Path,
                 handoff: Handoff, checkpoint: asyncio.subprocess.Process | None,
                 watch: Watch | None = None) -> None:
        self.source, self.name, self.bundle, self.workdir = source, name, bundle, workdir
        self.handoff = handoff
        #: podman container checkpoint, in runc until the end; ``None``: an earlier agent's
        #: dump, ended, that a daemon had taken over (:func:`start_lazy_dump` adopts it)
        self._checkpoint = checkpoint
        self._watch = watch  # what becomes of the source should this agent die first

    def dump_log(self) -> DumpLog:
        try:
            return parse_dump_log((self.bundle / "dump.log").read_text(errors="replace"))
        except FileNotFoundError:
            return DumpLog()

    def page_server_pid(self) -> int | None:
        """The CRIU serving the pages (runc's ``criu`` child), while it runs."""
        return page_server_pid(self.workdir / "runc.pid")

    async def _ended(self, limit_seconds: float) -> tuple[int, str]:
        """podman's exit code and words once the dump is over; past ``limit_seconds``, the page
        server is killed first (CRIU's death lets the frozen tasks go on)."""
        if self._checkpoint is None:  # adopted: CRIU's log says how it ended
            log = self.dump_log()
            ended = log.served_at is not None and not log.failed
            return (0 if ended else 1), "the lazy dump of an agent that died before it ended"
        try:
            await asyncio.wait_for(asyncio.shield(self._checkpoint.wait()), limit_seconds)
        except TimeoutError:
            pid = self.page_server_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        words = await reap(self._checkpoint, limit_seconds, self.workdir / PODMAN_ERR)
        return self._checkpoint.returncode or 0, words

    async def abort(self, *, limit_seconds: float = 60.0) -> str:
        """Give up while no target runs: the source runs on in place, if it still can;
        what podman said of the dump it ran.

        CRIU ends a lazy dump when the one connection to its page server ends, however it
        ends, and then kills the dumped tasks — also when the daemon on the other side
        failed. An unknown command instead fails the transfer, and CRIU rolls the dump
        back ("Unfreezing tasks"): the same process goes on with its memory, nothing
        lost. So while the page server still listens (no daemon connected), abort sends
        one. A CRIU that died (SIGKILL) lets the tasks go on as well. Either way CRIU
        leaves the container's network locked (its iptables chain ``CRIU`` drops every
        packet: the rollback after a lazy transfer skips the unlock), and abort removes
        that lock as CRIU's own unlock would.

        If a daemon had connected and its restore then failed, the end of its connection
        was the end of the transfer: CRIU killed the source. Its container, without
        memory, is removed and :class:`LazyPagesLost` raised: the workload is lost.
        """
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(10):
                reader, writer = await asyncio.open_connection(self.handoff.address,
                                                               self.handoff.port)
                writer.write(UNKNOWN_COMMAND)
                await reader.read(1)  # CRIU closes it once it has failed the transfer
                writer.close()
        code, words = await self._ended(limit_seconds)
        self._forget()
        if code == 0:
            await self.source.remove(self.name)
            raise LazyPagesLost(
                f"{self.name}: a target's lazy-pages daemon had taken the page server and "
                "then ended its connection, which CRIU takes for the end of the transfer: "
                "it killed the source, and its container (without memory) was removed; "
                "nothing runs")
        state = await inspect(self.source, self.name)
        status = ((state or {}).get("State") or {}).get("Status", "gone")
        if status != "running":
            raise LazyDumpFailed(f"{self.name} is {status} after its lazy dump was aborted "
                                 f"(podman: {words})")
        pid = int(((state or {}).get("State") or {}).get("Pid") or 0)
        await unlock_network(pid, limit_seconds=limit_seconds)
        return words

    async def finish(self, *, limit_seconds: float = 600.0) -> DumpLog:
        """Wait until the page server has sent every page the target asked for: CRIU then
        kills the source's tasks and podman exports what it holds (no memory); the
        container is removed. The returned log says how long the source was frozen.

        If the transfer broke off instead (the page server killed or failed), a target
        may run with some or all of the memory, and CRIU's end may have let the source go
        on from the moment it froze: it must not run beside that target, nor go back in
        time, so it is removed and :class:`LazyPagesLost` raised. Whether the workload
        survives is then the target's to say (:meth:`LazyRestore.finish`).

        But if CRIU ended before any daemon reached its page server (it was killed, say),
        no target can run: not one page left, and CRIU's death let the frozen source go
        on with all its memory. The source is kept, the dump's files too, and
        :class:`LazyDumpFailed` raised: :meth:`abort` then unlocks its network and says
        whether it runs."""
        code, words = await self._ended(limit_seconds)
        log = self.dump_log()
        if code != 0 and not log.connected:
            raise LazyDumpFailed(f"{self.name}: the page server ended before any target's "
                                 f"lazy-pages daemon reached it (podman: {words}); no page "
                                 "left, and the source was kept")
        self._forget()
        await self.source.remove(self.name)
        if code != 0:
            raise LazyPagesLost(
                f"{self.name}: the page server ended before the transfer was complete "
                f"(podman: {words}); the source was removed, whatever CRIU had left of it")
        return log

    def _forget(self) -> None:
        """Leave no request and no images behind: the handoff and the dump's own images
        hold a few plain pages (those CRIU does not serve lazily)."""
        if self._watch is not None:
            self._watch.dismiss()
        (self.bundle / REQUEST).unlink(missing_ok=True)
        (self.bundle / REQUEST).with_suffix(".taken").unlink(missing_ok=True)
        shutil.rmtree(self.bundle / "checkpoint", ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


class LazyRestore:
    """The target's side, from the moment its container runs."""

    def __init__(self, target: PodmanNode, name: str, workdir: Path,
                 daemon: asyncio.subprocess.Process) -> None:
        self.target, self.name, self.workdir = target, name, workdir
        self.container_id = ""
        self.daemon = daemon  # criu lazy-pages
        self._held: list[int] = []  # its userfaultfds, duplicated (lazy_procs)
        self._watch: Watch | None = None  # what becomes of it should this agent die

    def fetch_log(self) -> FetchLog:
        try:
            text = (self.workdir / "daemon" / DAEMON_LOG).read_text(errors="replace")
        except FileNotFoundError:
            return FetchLog()
        return parse_fetch_log(text, page_size=PAGE_SIZE)

    def hold(self) -> None:
        """Keep the restored tasks' userfaultfds open here too: should the daemon die
        with pages missing, their faults then wait for :meth:`finish` to remove the
        container instead of reading zeros (:mod:`drivers.podman.lazy_procs`)."""
        self._held = hold_userfaultfds(self.daemon.pid)

    async def finish(self, *, limit_seconds: float = 600.0) -> FetchLog:
        """Wait until every page reached the target: the daemon exits 0 once it has copied
        them all and the restore said it was done.

        If it fails or stops short, the restored process lacks memory: its container is
        removed (while its faults still wait on the held userfaultfds) and
        :class:`LazyPagesLost` raised."""
        try:
            code = await asyncio.wait_for(self.daemon.wait(), limit_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.daemon.kill()
            code = await self.daemon.wait()
        log = self.fetch_log()
        if self._watch is not None:
            self._watch.dismiss()
        try:
            if code == 0 and log.complete:
                shutil.rmtree(self.workdir, ignore_errors=True)
                return log
            _drop_images(self.workdir)
            await self.target.remove(self.name)
        finally:
            let_go(self._held)
        raise LazyPagesLost(
            f"{self.name}: {log.copied} of {log.expected} pages reached the target before "
            f"its lazy-pages daemon ended (exit {code}); the container was removed")


async def start_lazy_dump(source: PodmanNode, name: str, *, address: str, workdir: Path,
                          limit_seconds: float = 120.0) -> LazyDump:
    """Freeze ``name`` on ``source``, write its images but the memory and serve the memory
    on ``address`` (a free port); return once the page server listens, with the handoff.

    If it cannot (the container is not running, its runtime is not the lazy one, this
    node's pipe limit is too low for CRIU's page server, CRIU fails before its page server
    listens), the source runs on as before: :class:`LazyDumpFailed`."""
    state = await inspect(source, name)
    status = ((state or {}).get("State") or {}).get("Status", "gone")
    if state is not None and status != "running":
        bundle = Path(state["StaticDir"])
        if await asyncio.to_thread(adoptable, bundle, workdir / "runc.pid") is not None:
            # This capture's own dump, started by an agent that died after a target's
            # daemon took the page server (lazy_watch): it ended; adopt it.
            served = Handoff(workdir / "handoff.tar", address, 0)
            return LazyDump(source, name, bundle, workdir, served, None)
    if state is None or status != "running":
        raise LazyDumpFailed(f"{name} is {status}, not running, on {source.root}")
    refusal = await asyncio.to_thread(lazy_dump_refusal)
    if refusal:
        raise LazyDumpFailed(f"{name} cannot be dumped lazily here: {refusal}")
    if not is_lazy_runtime(str(state.get("OCIRuntime") or "")):
        raise LazyDumpFailed(f"{name} runs under {state.get('OCIRuntime')!r}, which cannot "
                             "dump lazily", hint="create it on a node whose PodmanNode "
                             "runtime is drivers.podman.lazy_runc.install_runtime()'s")
    bundle = Path(state["StaticDir"])
    mountpoint = Path(state.get("GraphDriver", {}).get("Data", {}).get("MergedDir") or "/")
    handoff = Handoff(workdir / "handoff.tar", address, free_port(address))
    reader = await asyncio.to_thread(_request_lazy_dump, bundle, workdir, handoff)
    try:
        checkpoint = await spawn_podman(source, "container", "checkpoint", name, "--export",
                                        str(workdir / "served.tar"), "--compress", "none",
                                        "--keep", stderr=workdir / PODMAN_ERR)
    except OSError:
        os.close(reader)
        (bundle / REQUEST).unlink(missing_ok=True)
        raise
    try:
        watch: Watch | None = await start_watch(
            bundle=bundle, serve=f"{address}:{handoff.port}", podman_pid=checkpoint.pid,
            inspect=[*source.base_args(), "container", "inspect", name])
    except OSError:
        watch = None  # the dump goes on: only an agent's death would find no one watching
    dump = LazyDump(source, name, bundle, workdir, handoff, checkpoint, watch)
    try:
        ready = await asyncio.wait_for(_first_byte(reader), limit_seconds)
    except TimeoutError:
        ready = False
    finally:
        os.close(reader)
    try:
        if not ready:
            raise LazyDumpFailed(f"CRIU's page server for {name} did not get ready")
        changes = json.loads(await source.run("diff", "--format", "json", name))
        await asyncio.to_thread(write_handoff, bundle, handoff.archive, changes=changes,
                                mountpoint=mountpoint)
    except (LazyDumpFailed, RuntimeFailed, OSError, tarfile.TarError, ValueError) as exc:
        words = await dump.abort(limit_seconds=limit_seconds)
        raise LazyDumpFailed(f"no lazy dump of {name}: {exc} (podman: {words}); the source "
                             "runs on in place") from exc
    return dump


def _drop_images(workdir: Path) -> None:
    """The target's copies of the images (a few plain pages); the daemon's log stays."""
    shutil.rmtree(workdir / "images", ignore_errors=True)
    (workdir / "restore.tar").unlink(missing_ok=True)


def _fresh(folder: Path, *inside: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in inside:
        (folder / name).mkdir()


def _request_lazy_dump(bundle: Path, workdir: Path, handoff: Handoff) -> int:
    """Ask the wrapper for a lazy checkpoint (the bundle's request); the read end of the
    FIFO its status byte will come through, opened before any writer (non-blocking: a
    writer finding no reader fails at once instead of hanging)."""
    _fresh(workdir)
    fifo = workdir / "ready"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    (bundle / REQUEST).write_text(json.dumps({
        "serve": f"{handoff.address}:{handoff.port}", "ready": str(fifo),
        "pid": str(workdir / "runc.pid")}))
    return reader


async def restore_lazily(target: PodmanNode, handoff: Handoff, name: str, *, workdir: Path,
                         limit_seconds: float = 120.0) -> LazyRestore:
    """Start ``criu lazy-pages`` for the handoff's page server, then restore the handoff's
    container on ``target`` as ``name``; return once podman says it runs (its memory
    arrives from then on: :meth:`LazyRestore.finish`). The container's image must be on
    ``target`` or pullable.

    If the restore fails, the daemon is stopped and any half-made container removed:
    :class:`LazyRestoreFailed`, whose ``source_committed`` says whether the daemon had
    reached the page server (then the source has ended with that connection)."""
    if not is_lazy_runtime(target.runtime):
        raise LazyRestoreFailed(f"{target.root} runs {target.runtime!r}, which cannot "
                                "restore lazily", source_committed=False)
    if await target.state(name) is not None:  # a failed restore removes the name: not another's
        raise LazyRestoreFailed(f"{target.root} has a container named {name} already",
                                source_committed=False)
    await asyncio.to_thread(_fresh, workdir, "daemon")
    await asyncio.to_thread(extract_images, handoff.archive, workdir / "images")
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        daemon = await asyncio.create_subprocess_exec(
            criu_binary(), "lazy-pages", "--page-server", "--address", handoff.address,
            "--port", str(handoff.port), "--images-dir", str(workdir / "images"),
            "--work-dir", str(workdir / "daemon"), "--status-fd", str(write_end),
            "-v4", "-o", DAEMON_LOG, pass_fds=(write_end,), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    finally:
        os.close(write_end)
    lazy = LazyRestore(target, name, workdir, daemon)
    try:
        try:
            ready = await asyncio.wait_for(_first_byte(read_end), limit_seconds)
        finally:
            os.close(read_end)
        if not ready:
            raise RuntimeFailed(f"criu lazy-pages exited (see {workdir / 'daemon'})")
        archive = await asyncio.to_thread(with_request, handoff.archive,
                                          workdir / "restore.tar",
                                          workdir / "daemon" / SOCKET)
        async with asyncio.timeout(limit_seconds):
            out = await target.run("container", "restore", "--import", str(archive),
                                   "--name", name)
    except (RuntimeFailed, OSError, tarfile.TarError, TimeoutError) as exc:
        with contextlib.suppress(ProcessLookupError):
            daemon.kill()
        await daemon.wait()
        committed = lazy.fetch_log().connected
        _drop_images(workdir)
        await target.remove(name)
        raise LazyRestoreFailed(f"no lazy restore of {name}: {exc}",
                                source_committed=committed) from exc
    lazy.container_id = out.strip().splitlines()[-1] if out.strip() else ""
    with contextlib.suppress(OSError):  # the daemon is gone already: finish() removes it
        lazy.hold()
    with contextlib.suppress(OSError):  # only an agent's death would find no one watching
        lazy._watch = await start_target_watch(
            daemon_pid=daemon.pid, log=workdir / "daemon" / DAEMON_LOG, page_size=PAGE_SIZE,
            verdict=verdict_path(workdir),
            remove=[*target.base_args(), "rm", "--force", "--ignore", "--time", "0", name])
    return lazy


async def finish_lazy_migration(dump: LazyDump, restore: LazyRestore, *,
                                limit_seconds: float = 600.0) -> LazyMigration:
    """Both sides' :meth:`~LazyDump.finish`: the migration is done when every page reached
    the target (the source is removed either way); else :class:`LazyPagesLost`, and
    nothing runs."""
    served, fetched = await asyncio.gather(dump.finish(limit_seconds=limit_seconds),
                                           restore.finish(limit_seconds=limit_seconds),
                                           return_exceptions=True)
    if isinstance(fetched, BaseException):
        source = f"; the source: {served}" if isinstance(served, BaseException) else ""
        raise LazyPagesLost(f"{fetched}{source}") from fetched
    if isinstance(served, BaseException) and not isinstance(served, LazyMigrationFailed):
        raise served
    frozen = served.frozen_seconds if isinstance(served, DumpLog) else None
    return LazyMigration(restore.container_id, fetched.copied, fetched.copied * PAGE_SIZE,
                         frozen)


async def lazy_migrate(source: PodmanNode, name: str, target: PodmanNode, new_name: str,
                       *, address: str, workdir: Path,
                       limit_seconds: float = 600.0) -> LazyMigration:
    """Migrate ``name`` from ``source`` to ``target`` as ``new_name``, memory after the
    container (the three steps in order). A failed restore aborts the dump
    (:meth:`LazyDump.abort`: the source runs on when it still can). Any other error
    (a half-made target that could not be removed, say) leaves the source frozen and its
    page server waiting: nothing runs twice; killing that CRIU lets the source go on."""
    dump = await start_lazy_dump(source, name, address=address, workdir=workdir / "source",
                                 limit_seconds=limit_seconds)
    try:
        restore = await restore_lazily(target, dump.handoff, new_name,
                                       workdir=workdir / "target", limit_seconds=limit_seconds)
    except LazyRestoreFailed:
        await dump.abort(limit_seconds=limit_seconds)
        raise
    return await finish_lazy_migration(dump, restore, limit_seconds=limit_seconds)


def free_port(address: str) -> int:
    """A port free on ``address`` now (CRIU must be given one: runc drops port 0). Should
    another process take it first, CRIU cannot listen and the dump fails, the source
    running on."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


async def _first_byte(fd: int) -> bool:
    """Whether ``fd`` (a FIFO or a pipe) gives a byte before its end."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            return
        if not done.done():
            done.set_result(bool(data))

    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


async def inspect(node: PodmanNode, name: str) -> dict[str, Any] | None:
    """``podman container inspect``'s object for ``name``, or ``None``."""
    try:
        raw = json.loads(await node.run("container", "inspect", name))
    except RuntimeFailed:
        return None
    return dict(raw[0]) if raw else None


async def spawn_podman(node: PodmanNode, *args: str,
                       stderr: Path) -> asyncio.subprocess.Process:
    """``podman <args>`` on ``node``, left running (:meth:`PodmanNode.run` waits); its
    stderr goes to the file ``stderr``, its stdout nowhere: no pipe to this process, so
    it ends its work should this process die first (with its pipes' reader gone, podman
    would die of its last words)."""
    env = dict(os.environ)
    criu = os.environ.get("CONTROLPLANE_CRIU")
    if criu:  # as PodmanNode.run: the CRIU that works here, first on runc's PATH
        env["PATH"] = f"{Path(criu).parent}:{env.get('PATH', '')}"
    with stderr.open("wb") as err:
        return await asyncio.create_subprocess_exec(
            *node.base_args(), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=err, env=env)


async def reap(proc: asyncio.subprocess.Process, limit_seconds: float, stderr: Path) -> str:
    """Wait for ``proc`` (killed after ``limit_seconds``); the end of what it said on
    stderr (the file ``stderr``)."""
    try:
        await asyncio.wait_for(proc.wait(), limit_seconds)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    try:
        err = await asyncio.to_thread(stderr.read_bytes)
    except OSError:
        err = b""
    lines = [line for line in err.decode(errors="replace").splitlines() if line]
    return " | ".join(lines[-3:]) or "(no message)"
