"""Live migration with CRIU lazy pages between two podman nodes (real CRIU, runc, podman).

The counter (:mod:`drivers.podman.workload`) keeps 64 MiB of patterned pages, rewrites
4 MiB of them a second and checks every page each tick, so its first tick after the
restore touches all its memory: the pages must really arrive. Each test pins what a
step leaves behind: a finished migration continues the source's count on the target with
no repeat and no gap, every page intact, the source gone; a target that cannot restore,
or a page server or the process that dumps killed before any target came, leaves the
source running on in place, its network unlocked; a page server killed while the target
runs loses the workload, the target never computing on missing pages, and no copy runs
at all, also when the process that restored was killed first.

Two node roots (:class:`PodmanNode` with the lazy runtime) share this host; the image is
built on one and copied to the other (``podman save``/``load``: same image ID, no
registry). CRIU's lazy page server needs a 4 MiB pipe: the module raises
``fs.pipe-max-size`` to that and puts the old value back (:func:`pipe_size`). Missing
podman or CRIU fail the tests: they are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from drivers.podman import PodmanNode
from drivers.podman.lazy import (
    Handoff,
    LazyDump,
    LazyPagesLost,
    LazyRestoreFailed,
    finish_lazy_migration,
    lazy_migrate,
    restore_lazily,
    start_lazy_dump,
)
from drivers.podman.lazy_checks import (
    dirty_tracking_available,
    lazy_pages_available,
)
from drivers.podman.lazy_runc import install_runtime
from drivers.podman.lazy_watch import WATCH_LOG, verdict_path
from drivers.podman.workload import Tick, build_rootfs, command, parse_ticks, ticked_since
from tests.criu.pipe_limit import pipe_limit_raised
from tests.criu.world import require_runtime
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

IMAGE = "localhost/workloads/counter:v1"
MIB = 64
DIRTY = 4  # MiB rewritten per second
ADDRESS = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def pipe_size() -> Iterator[None]:
    """``fs.pipe-max-size`` at least 4 MiB while the module runs (CRIU's lazy page server
    grows a pipe to that; this host has no CAP_SYS_RESOURCE to exceed the limit), the old
    value put back afterwards, once no other test process needs it
    (:mod:`tests.criu.pipe_limit`: the modules run in parallel)."""
    with pipe_limit_raised():
        yield


def _reset(node: PodmanNode) -> None:
    """Remove every container (at once: the counter, PID 1, ignores SIGTERM) and image."""
    for args in (["rm", "--all", "--force", "--time", "0"], ["system", "reset", "--force"]):
        subprocess.run([*node.base_args(), *args], capture_output=True, timeout=120,
                       check=False)
    shutil.rmtree(node.root, ignore_errors=True)
    shutil.rmtree(node.runroot, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PodmanNode, PodmanNode]]:
    """Nodes A and B, both running runc through the lazy wrapper, both with the image."""
    require_runtime()
    tmp = tmp_path_factory.mktemp("lazy")
    runtime = install_runtime(tmp / "runtime" / "lazy-runc")
    a, b = (PodmanNode(tmp / n, runtime=runtime) for n in ("node-a", "node-b"))

    async def load() -> None:
        await a.load_rootfs(await asyncio.to_thread(build_rootfs, tmp / "image"), IMAGE)
        await a.run("save", "--output", str(tmp / "image.tar"), IMAGE)
        await b.run("load", "--input", str(tmp / "image.tar"))

    try:
        asyncio.run(load())
        yield a, b
    finally:
        for node in (a, b):
            _reset(node)


def _name(what: str) -> str:
    return f"lazy-{what}-{os.getpid()}-{next(_names)}"


async def _counting(node: PodmanNode, name: str, at_least: int = 5) -> list[Tick]:
    """Start a counter and wait until it has ticked ``at_least`` times; its ticks."""
    await node.start(name, IMAGE, command=command(MIB, 100, 0, DIRTY))

    async def ticked() -> list[Tick]:
        ticks = parse_ticks(await node.logs(name))
        return ticks if len(ticks) >= at_least else []
    return await eventually(ticked, limit_seconds=60, what=f"{name} to tick {at_least} times")


async def _ticks_after(node: PodmanNode, name: str, moment: float) -> list[Tick]:
    """The counter's ticks once it has ticked three times after ``moment``."""
    async def ticked() -> list[Tick]:
        ticks = parse_ticks(await node.logs(name))
        return ticks if ticked_since(ticks, moment) else []
    return await eventually(ticked, limit_seconds=60, what=f"{name} to tick after {moment}")


def _release(dump: LazyDump) -> None:
    """Kill a page server still waiting (a failed test's): CRIU's death lets the source
    go, and podman, which holds the container's lock meanwhile, returns."""
    server = dump.page_server_pid()
    if server is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def _network_locked(pid: int) -> bool:
    """Whether CRIU's network lock (iptables chain ``CRIU``) is in ``pid``'s namespace."""
    done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "iptables", "-w", "-S",
                           "CRIU"], capture_output=True, timeout=30, check=False)
    return done.returncode == 0


async def test_a_lazily_migrated_counter_counts_on_with_every_page(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """After every page arrived, the target's log is the source's log going on: counts
    1..N strictly consecutive across the move (the source was frozen: no count twice, none
    skipped), every tick ``ok`` (every page came with its pattern); the source container
    is gone and the target runs under podman."""
    a, b = nodes
    name, moved = _name("src"), _name("dst")
    before = await _counting(a, name)
    migration = await lazy_migrate(a, name, b, moved, address=ADDRESS, workdir=tmp_path)
    done = time.time()
    assert migration.pages * os.sysconf("SC_PAGE_SIZE") >= MIB << 20, migration
    assert migration.frozen_seconds is not None
    assert migration.frozen_seconds > 0
    assert await a.state(name) is None
    state = await b.state(moved)
    assert state is not None
    assert state.running
    assert state.id == migration.container_id
    assert moved in [s.name for s in await b.states()]  # what the kubelet's relist sees
    ticks = await _ticks_after(b, moved, done)
    assert ticks[:len(before)] == before, "the target's log does not start with the source's"
    counts = [t.count for t in ticks]
    assert counts == list(range(1, len(counts) + 1)), counts
    assert all(t.ok for t in ticks), [t for t in ticks if not t.ok]


async def test_a_target_that_cannot_restore_leaves_the_source_running_in_place(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """A target without the image fails its restore before the memory was asked for: the
    dump is rolled back, the same source process counts on (no count lost or repeated,
    every page intact) and its network is not left locked by CRIU."""
    a, _ = nodes
    bare = PodmanNode(tmp_path / "node-c", runtime=a.runtime)  # has no image
    name = _name("stay")
    try:
        before = await _counting(a, name)
        with pytest.raises(LazyRestoreFailed) as failed:
            await lazy_migrate(a, name, bare, _name("nowhere"), address=ADDRESS,
                               workdir=tmp_path / "work")
        assert not failed.value.source_committed
        ended = time.time()
        state = await a.state(name)
        assert state is not None
        assert state.running
        assert await bare.states() == []
        ticks = await _ticks_after(a, name, ended)
        assert ticks[:len(before)] == before
        counts = [t.count for t in ticks]
        assert counts == list(range(1, len(counts) + 1)), counts
        assert all(t.ok for t in ticks)
        raw = await a.run("container", "inspect", "--format", "{{.State.Pid}}", name)
        assert not _network_locked(int(raw.strip()))
    finally:
        await a.remove(name)
        await asyncio.to_thread(_reset, bare)


async def test_a_page_server_killed_before_any_target_leaves_the_source_running_on(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """CRIU's death before a target connected releases the frozen source: the same
    process counts on by itself, but behind CRIU's network lock; ``abort`` finds it
    running and unlocks its network."""
    a, _ = nodes
    name = _name("freed")
    try:
        before = await _counting(a, name)
        dump = await start_lazy_dump(a, name, address=ADDRESS, workdir=tmp_path)
        server = dump.page_server_pid()
        assert server is not None
        os.kill(server, signal.SIGKILL)
        ticks = await _ticks_after(a, name, time.time())  # it runs again on its own
        raw = await a.run("container", "inspect", "--format", "{{.State.Pid}}", name)
        assert _network_locked(int(raw.strip()))
        await dump.abort()
        assert not _network_locked(int(raw.strip()))
        assert ticks[:len(before)] == before
        counts = [t.count for t in ticks]
        assert counts == list(range(1, len(counts) + 1)), counts
        assert all(t.ok for t in ticks)
    finally:
        _release(dump)
        await a.remove(name)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return str(exc)


#: The process that dumps, as an agent would, until it is killed: prints ``listening``
#: once the page server listens.
_DUMPER = """
import asyncio, sys
from pathlib import Path
from drivers.podman import PodmanNode
from drivers.podman.lazy import start_lazy_dump

async def main():
    node = PodmanNode(Path(sys.argv[1]), runtime=sys.argv[2])
    await start_lazy_dump(node, sys.argv[3], address=sys.argv[4], workdir=Path(sys.argv[5]))
    print("listening", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_dump_whose_process_dies_before_any_target_came_is_rolled_back(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """The process that dumps (an agent) SIGKILLed while its page server waits for a
    target: the dump's watchdog (:mod:`drivers.podman.lazy_watch`) rolls it back — the
    same process counts on with every page, its network unlocked — instead of leaving it
    frozen and podman's lock held for good."""
    a, _ = nodes
    name = _name("orphan")
    try:
        before = await _counting(a, name)
        dumper = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DUMPER, str(a.root), a.runtime, name, ADDRESS,
            str(tmp_path / "dump"), stdout=asyncio.subprocess.PIPE,
            cwd=ROOT)
        assert dumper.stdout is not None
        line = await asyncio.wait_for(dumper.stdout.readline(), 120)
        assert line.strip() == b"listening"
        dumper.kill()
        await dumper.wait()
        ticks = await _ticks_after(a, name, time.time())  # it runs again, by itself
        raw = await a.run("container", "inspect", "--format", "{{.State.Pid}}", name)
        bundle = Path((await a.run("container", "inspect", "--format", "{{.StaticDir}}",
                                   name)).strip())
        await eventually(lambda: not _network_locked(int(raw.strip())), limit_seconds=60,
                         what=f"{name}'s network unlocked",
                         describe=lambda: _read(bundle / WATCH_LOG))
        assert ticks[:len(before)] == before
        counts = [t.count for t in ticks]
        assert counts == list(range(1, len(counts) + 1)), counts
        assert all(t.ok for t in ticks)
    finally:
        await a.remove(name)


class WithholdingRelay:
    """A TCP relay between the target's daemon and the page server that passes the
    daemon's requests but only the first ``budget`` bytes of the answers (enough for the
    restore itself), and ends the daemon's connection when the page server's ends: the
    target runs, and cannot have every page, whenever the page server is killed."""

    def __init__(self, upstream: Handoff, budget: int) -> None:
        self.upstream = (upstream.address, upstream.port)
        self.budget = budget
        self.forwarded = 0
        self.withheld = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> WithholdingRelay:
        self._server = await asyncio.start_server(self._serve, ADDRESS, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, daemon_r: asyncio.StreamReader,
                     daemon_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)

        async def requests() -> None:
            with contextlib.suppress(OSError):
                while data := await daemon_r.read(65536):
                    server_w.write(data)
                    await server_w.drain()

        async def answers() -> None:
            with contextlib.suppress(OSError):
                while data := await server_r.read(65536):
                    room = max(self.budget - self.forwarded, 0)
                    if room:
                        daemon_w.write(data[:room])
                        await daemon_w.drain()
                    self.forwarded += min(room, len(data))
                    self.withheld += len(data) - min(room, len(data))
            daemon_w.transport.abort()  # the page server is gone: so is the daemon's link

        pending = asyncio.ensure_future(requests())
        await answers()
        pending.cancel()
        server_w.transport.abort()


async def test_a_page_server_killed_while_the_target_runs_loses_the_workload_and_nothing_runs(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """The target runs, not every page has arrived (the relay withholds them), the page
    server is SIGKILLed: the target never computes on missing memory (no ``corrupt``
    tick, its faults wait), the migration fails with LazyPagesLost, and then neither the
    target nor the source (which CRIU's death let go on from its freeze) runs: never two
    copies, never one going back in time."""
    a, b = nodes
    name, moved = _name("lost"), _name("half")
    await _counting(a, name, at_least=3)
    dump = await start_lazy_dump(a, name, address=ADDRESS, workdir=tmp_path / "source")
    try:
        async with WithholdingRelay(dump.handoff, budget=1 << 20) as relay:
            handoff = Handoff(dump.handoff.archive, ADDRESS, relay.port)
            restore = await restore_lazily(b, handoff, moved, workdir=tmp_path / "target")
            state = await b.state(moved)
            assert state is not None
            assert state.running
            await eventually(lambda: relay.withheld > 0, limit_seconds=60,
                             what="the daemon to ask for pages the relay withholds")
            server = dump.page_server_pid()
            assert server is not None
            os.kill(server, signal.SIGKILL)
            await asyncio.wait_for(restore.daemon.wait(), 60)  # it lost the page server
            assert restore.daemon.returncode != 0
            ticks = parse_ticks(await b.logs(moved))
            assert all(t.ok for t in ticks), [t for t in ticks if not t.ok]
            with pytest.raises(LazyPagesLost, match="pages reached the target"):
                await finish_lazy_migration(dump, restore, limit_seconds=120)
        assert await a.state(name) is None
        assert await b.state(moved) is None
    finally:
        _release(dump)
        await b.remove(moved)
        await a.remove(name)


#: The process that restores, as an agent would, until it is killed: prints ``running``
#: once the container runs (its pages still to come).
_RESTORER = """
import asyncio, sys
from pathlib import Path
from drivers.podman import PodmanNode
from drivers.podman.lazy import Handoff, restore_lazily

async def main():
    node = PodmanNode(Path(sys.argv[1]), runtime=sys.argv[2])
    handoff = Handoff(Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    await restore_lazily(node, handoff, sys.argv[6], workdir=Path(sys.argv[7]))
    print("running", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_pages_lost_while_no_process_watched_them_remove_the_target(
        nodes: tuple[PodmanNode, PodmanNode], tmp_path: Path) -> None:
    """The process that restored (an agent) SIGKILLed while the target runs with pages to
    come, then the page server killed: the restore's watchdog, which held the tasks'
    faults, removes the target (it never computes on missing memory) and leaves a
    verdict saying the pages were lost; the source, whose transfer had begun, is lost
    too: nothing runs."""
    a, b = nodes
    name, moved = _name("unwatched"), _name("unwatched-half")
    workdir = tmp_path / "target"
    await _counting(a, name, at_least=3)
    dump = await start_lazy_dump(a, name, address=ADDRESS, workdir=tmp_path / "source")
    try:
        async with WithholdingRelay(dump.handoff, budget=1 << 20) as relay:
            restorer = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _RESTORER, str(b.root), b.runtime,
                str(dump.handoff.archive), ADDRESS, str(relay.port), moved, str(workdir),
                stdout=asyncio.subprocess.PIPE, cwd=ROOT)
            assert restorer.stdout is not None
            line = await asyncio.wait_for(restorer.stdout.readline(), 120)
            assert line.strip() == b"running"
            await eventually(lambda: relay.withheld > 0, limit_seconds=60,
                             what="the daemon to ask for pages the relay withholds")
            restorer.kill()
            await restorer.wait()
            server = dump.page_server_pid()
            assert server is not None
            os.kill(server, signal.SIGKILL)
            verdict = await eventually(lambda: _verdict(verdict_path(workdir)),
                                       limit_seconds=120, what="the watchdog's verdict")
            assert verdict is not None
            assert "lost" in verdict, verdict
            assert await b.state(moved) is None
        with pytest.raises(LazyPagesLost):
            await dump.finish(limit_seconds=120)
        assert await a.state(name) is None
    finally:
        _release(dump)
        await b.remove(moved)
        await a.remove(name)


def _verdict(path: Path) -> dict[str, object] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and not found.get("pending") else None


def test_pre_copy_is_refused_here_for_want_of_soft_dirty_tracking() -> None:
    """This host's kernel has no soft-dirty page bits: the reason names the feature."""
    require_runtime()
    reason = dirty_tracking_available()
    assert reason is not None
    assert "CONFIG_MEM_SOFT_DIRTY" in reason, reason
    assert "mem_dirty_track" in reason, reason


def test_lazy_pages_work_here_once_the_pipe_limit_is_raised() -> None:
    """userfaultfd is there; with ``fs.pipe-max-size`` raised (this module's fixture),
    nothing stands in the way of post-copy."""
    require_runtime()
    assert lazy_pages_available() is None
