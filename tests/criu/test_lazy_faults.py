"""SIGKILL during a real lazy (post-copy) migration, through the product (issue 35, item 5).

A ``cpctl migrate --mode lazy`` of a counter between runtime-backed nodes with real
CRIU (:mod:`tests.criu.world`), and at each step of the transfer one process of the
product is SIGKILLed: the worker, the source's agent, the target's agent, or CRIU's page
server on the source. The outcome must be the one docs/protocol.md ("Lazy handoff") and
docs/runtime.md ("Lazy migrations in the migration machine") state: before the target
runs, the same source process runs on; after it runs, the migration completes, or its
history says ``WorkloadLost`` plainly and nothing runs, twice or on missing pages.

The steps are held open, never timed: the target's agent, paused (SIGSTOP), cannot
fetch the hand-over yet (a); a relay put between the target's lazy-pages daemon and the
page server (the offer's page-server address pointed at it while that agent is paused)
passes the pages the restore needs and keeps the rest back, so the target runs with its
pages in flight until the test lets them go (b); with the worker dead, the agents finish
the transfer and no one deletes the source (c).

Measured on the CI machine (2 shared cores), the module: world ~10 s, each migration
10-45 s, under 3 minutes in all.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.podman.lazy_procs import page_server_pid
from drivers.podman.lazy_watch import process_alive
from drivers.podman.workload import Tick, ticked_since
from tests.criu.pipe_limit import pipe_limit_raised
from tests.criu.world import CriuWorld, open_criu_world, resumed, wait_running_on
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

MIB = 16  # rewriting DIRTY MiB/s: memory that changes while the pages are held
DIRTY = 4


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriuWorld]:
    with pipe_limit_raised(), open_criu_world(tmp_path_factory.mktemp("lazyf")) as w:
        yield w


# --- what the tests look at ----------------------------------------------------------


def _counter(w: CriuWorld, base: str) -> tuple[str, dict[str, Any], list[Tick]]:
    name = w.name(base)
    pod = w.make_counter(name, "node-1", mib=MIB, dirty_mib_per_s=DIRTY)
    before = wait_for(lambda: t if len(t := w.ticks(pod)) >= 5 else None,
                      f"{name} to tick 5 times", every=0.25)
    return name, pod, before


#: The class these migrations use: the class defaults' deadlines (a 15-minute transfer
#: deadline) cut to what a test can wait for.
CLASS = "lazy-faults"


def _write_class(w: CriuWorld) -> Path:
    path = w.tmp / "lazy-faults-classes.yaml"
    path.write_text(json.dumps({"classes": [{
        "name": CLASS, "repository": w.repository,
        "timeouts": {"capture": 90, "release": 30, "delete": 60, "schedule": 30,
                     "restore": 30}}]}))
    return path


def _migrate(w: CriuWorld, name: str) -> str:
    """Submit a lazy migration to node-2 (not waiting); its operation id."""
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--class", CLASS,
               "--classes-file", str(_write_class(w)), "--mode", "lazy")
    return out.split()[0]


def _history(w: CriuWorld, operation: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(w.ok("history", operation, "-o", "json",
                                                   cluster=False))
    return events


def _types(w: CriuWorld, operation: str) -> list[str]:
    return [e["type"] for e in _history(w, operation)]


def _recorded(w: CriuWorld, operation: str, event: str, limit: float = 120) -> list[str]:
    return wait_for(lambda: t if event in (t := _types(w, operation)) else None,
                    f"{operation}'s history to record {event}", limit)


def _notes(w: CriuWorld, name: str) -> dict[str, str]:
    pod = w.kube.pod(w.namespace, name)
    return dict(((pod or {}).get("metadata") or {}).get("annotations") or {})


def _target(w: CriuWorld, operation: str) -> dict[str, Any] | None:
    """The migration's restore pod (it carries ``restore-handoff`` for ``operation``)."""
    for pod in w.kube.pods(w.namespace):
        raw = (pod["metadata"].get("annotations") or {}).get(protocol.RESTORE_HANDOFF)
        if raw and json.loads(raw).get("checkpoint") == operation:
            return pod
    return None


def _pod_uid(w: CriuWorld, name: str) -> str | None:
    pod = w.kube.pod(w.namespace, name)
    return None if pod is None else str(pod["metadata"]["uid"])


def _finished(w: CriuWorld, operation: str) -> dict[str, Any]:
    """The migration's end, once it ended: ``MigrationFinished``'s data."""
    w.wait_phase(operation, "Succeeded", "Failed", "Cancelled", limit=180)
    [end] = [e["data"] for e in _history(w, operation) if e["type"] == "MigrationFinished"]
    return dict(end)


def _of_pod(w: CriuWorld, node: str, uid: str) -> list[str]:
    return [c for c in w.containers(node) if c.endswith(uid)]


def _page_server(w: CriuWorld, uid: str) -> int | None:
    """CRIU's page server of the source pod ``uid``'s lazy dump, while it runs."""
    for pid_file in (w.tmp / "work" / "node-1").glob(f"capture-{uid}-*/lazy/runc.pid"):
        pid = page_server_pid(pid_file)
        if pid is not None:
            return pid
    return None


def _offered(w: CriuWorld, name: str, operation: str) -> dict[str, Any]:
    """The source's ``report-handoff`` once it is written: the page server listens."""
    def offer() -> dict[str, Any] | None:
        raw = _notes(w, name).get(protocol.REPORT_HANDOFF)
        found: dict[str, Any] | None = json.loads(raw) if raw else None
        return found if found and found.get("checkpoint") == operation else None
    return wait_for(offer, f"{name} to offer its lazy hand-over", 120)


class PageRelay:
    """A TCP relay between the target's lazy-pages daemon and CRIU's page server, as a
    network between the nodes: the daemon's requests pass, the page server's answers
    pass up to ``budget`` bytes (enough for the restore itself), the rest is kept back
    until :meth:`release` (step (b): the target runs, its pages held). If the page
    server's connection ends while answers are kept back, the daemon's is cut (RST):
    what was in flight is lost with it."""

    def __init__(self, upstream: str, *, budget: int = 1 << 20) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host.strip("[]"), int(port))
        self.budget = budget
        self.passed = 0
        self.withheld = 0
        self.connections = 0
        self._released = threading.Event()
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name="page-relay").start()

    def _accept(self) -> None:
        while True:
            try:
                daemon, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(daemon,), daemon=True).start()

    def _serve(self, daemon: socket.socket) -> None:
        with daemon, socket.create_connection(self.upstream) as server:
            def requests() -> None:
                with contextlib.suppress(OSError):
                    while data := daemon.recv(65536):
                        server.sendall(data)
                    server.shutdown(socket.SHUT_WR)  # the daemon is done: so is CRIU
            threading.Thread(target=requests, daemon=True).start()
            kept = bytearray()
            with contextlib.suppress(OSError):
                while True:
                    if self._released.is_set() and kept:
                        daemon.sendall(kept)
                        kept.clear()
                    ready, _, _ = select.select([server], [], [], 0.05)
                    if not ready:
                        continue
                    data = server.recv(1 << 20)
                    if not data:
                        break
                    room = 0 if kept else max(self.budget - self.passed, 0)
                    if self._released.is_set():
                        room = len(data)
                    if room:
                        daemon.sendall(data[:room])
                        self.passed += min(room, len(data))
                    kept += data[room:]
                    self.withheld = len(kept)
            # The page server went: so does the daemon's link, at once (shutdown, not just
            # close: the requests thread, blocked reading it, would keep it open).
            with contextlib.suppress(OSError):
                daemon.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self._server.close()


@contextlib.contextmanager
def _relayed(w: CriuWorld, name: str, operation: str) -> Iterator[PageRelay]:
    """Once ``name`` offers its lazy hand-over, point its page server's address, as the
    target's agent will read it, at a :class:`PageRelay` (call it while that agent is
    paused: it has read nothing yet)."""
    offer = _offered(w, name, operation)
    relay = PageRelay(offer["pages"])
    uid = _pod_uid(w, name)
    try:
        offer["pages"] = relay.address
        w.kube.request("PATCH", f"/api/v1/namespaces/{w.namespace}/pods/{name}",
                       {"metadata": {"annotations": {
                           protocol.REPORT_HANDOFF: json.dumps(offer)}}},
                       content_type="application/merge-patch+json")
        yield relay
    finally:
        relay.close()
        server = _page_server(w, uid or "")
        if server is not None:  # a failed test's: CRIU's death lets podman go
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)


def _held(w: CriuWorld, name: str, operation: str, relay: PageRelay) -> str:
    """Step (b), waited for and checked: the target runs (the history says so) and the
    relay keeps pages back; the restore pod's name."""
    _recorded(w, operation, "RestoreVerified")
    wait_for(lambda: relay.withheld > 0, "the target's daemon to ask for pages kept back")
    target = wait_for(lambda: _target(w, operation), "the restore pod")
    tname: str = target["metadata"]["name"]
    assert _notes(w, name).get(protocol.REPORT_STATE) != "Transferred"
    assert protocol.PAGES_RECEIVED not in _notes(w, tname)
    return tname


def _counts_on(w: CriuWorld, name: str, node: str, before: list[Tick]) -> list[Tick]:
    """``name``'s one running pod on ``node`` counts on from ``before``: the same process,
    no count repeated, none skipped, every page intact."""
    pod = wait_running_on(w, name, node)
    since = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(pod), since) else None,
                     f"{name} on {node} to count on", 120, every=0.25)
    resumed(ticks, before, quiesced=True)
    return ticks


# --- the tests -----------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_a_worker_killed_at_every_step_of_a_lazy_migration_is_replaced_and_it_completes(
        world: CriuWorld) -> None:
    """The worker is SIGKILLed while the source dumps (the target not running), again
    while the target runs with its pages held, and again once every page arrived but
    before the source pod was deleted (both agents too, then); each time a new one takes
    over and the migration ends as it would have: Succeeded, the counter counting on on
    node-2 with no repeat, the source gone."""
    w = world
    name, pod, before = _counter(w, "wkr")
    uid = pod["metadata"]["uid"]
    with contextlib.ExitStack() as holding:
        with w.paused("node-2"):
            operation = _migrate(w, name)
            wait_for(lambda: _notes(w, name).get(protocol.CAPTURE_CHECKPOINT_ID) == operation,
                     f"{name} to be asked for its lazy capture")
            w.kill("worker")  # (a) the source dumps; no target runs
            relay = holding.enter_context(_relayed(w, name, operation))
        w.start_worker()
        target = _held(w, name, operation, relay)
        server = _page_server(w, uid)
        assert server is not None
        assert w.phase_of(operation) == "TargetRunning"
        w.kill("worker")  # (b) the target runs, its pages held
        relay.release()
        # The pages go over with no worker: the agents need none.
        wait_for(lambda: _notes(w, name).get(protocol.REPORT_STATE) == "Transferred",
                 f"{name}'s agent to report every page served")
        wait_for(lambda: protocol.PAGES_RECEIVED in _notes(w, target),
                 "the target's agent to mark every page received")
    assert _pod_uid(w, name) == uid  # the source pod is still there: no worker deleted it
    assert not process_alive(server)  # CRIU ended with the transfer: no page server at (c)
    for node in ("node-1", "node-2"):  # (c) the agents too: their part is done
        w.kill(f"agent-{node}")
        w.start_agent(node)
    w.start_worker()
    _recorded(w, operation, "PagesTransferred")
    w.kill("worker")  # (c) every page arrived; the source pod not deleted yet, or being
    w.start_worker()
    w.wait_phase(operation, "Succeeded", "Failed", limit=120)
    events = _types(w, operation)
    assert w.phase_of(operation) == "Succeeded", events
    assert events.count("RestoreVerified") == 1, events
    assert events.index("RestoreVerified") < events.index("PagesTransferred") \
        < events.index("SourceDeleted"), events
    _counts_on(w, name, "node-2", before)
    assert _of_pod(w, "node-1", uid) == []


@pytest.mark.timeout(300)
def test_a_page_server_killed_before_any_target_reached_it_leaves_the_source_running_on(
        world: CriuWorld) -> None:
    """(a) CRIU's page server SIGKILLed once it listens, before the target's agent has
    even fetched the hand-over: no page left, so no target can run; the source's agent
    reports the dump failed, the migration fails saying the workload runs on in place,
    and it does: the same pod, the same process counting on, nothing on node-2."""
    w = world
    name, pod, before = _counter(w, "psa")
    uid = pod["metadata"]["uid"]
    with w.paused("node-2"):
        operation = _migrate(w, name)
        _offered(w, name, operation)
        server = wait_for(lambda: _page_server(w, uid), f"{name}'s page server")
        os.kill(server, signal.SIGKILL)
        end = _finished(w, operation)
    events = _types(w, operation)
    assert "WorkloadLost" not in events, events
    assert "RestoreVerified" not in events, events
    assert end["phase"] == "Failed", end
    assert "DumpFailed" in end["message"], end
    assert "no page left the source" in end["message"], end
    assert _pod_uid(w, name) == uid
    _counts_on(w, name, "node-1", before)
    assert [c for c in w.containers("node-2") if name in c] == []


@pytest.mark.timeout(300)
def test_a_page_server_killed_while_the_target_runs_loses_the_workload_plainly(
        world: CriuWorld) -> None:
    """(b) CRIU's page server SIGKILLed while the target runs with pages still to come:
    the workload is lost, and the history says so (``WorkloadLost``); neither copy runs
    afterwards, and the target never ran on missing memory (no corrupt tick)."""
    w = world
    name, pod, _ = _counter(w, "psb")
    uid = pod["metadata"]["uid"]
    with contextlib.ExitStack() as holding:
        with w.paused("node-2"):
            operation = _migrate(w, name)
            relay = holding.enter_context(_relayed(w, name, operation))
        target = _held(w, name, operation, relay)
        moved = w.kube.pod(w.namespace, target)
        assert moved is not None
        server = _page_server(w, uid)
        assert server is not None
        os.kill(server, signal.SIGKILL)
        end = _finished(w, operation)
    events = _types(w, operation)
    assert "WorkloadLost" in events, events
    assert end["phase"] == "Failed", end
    assert end["reason"] == "WorkloadLost", end
    assert "the workload is gone" in end["message"], end
    assert "PagesTransferred" not in events, events
    assert _of_pod(w, "node-1", uid) == []
    assert _of_pod(w, "node-2", moved["metadata"]["uid"]) == []
    assert [p for p in w.running_pods(f"app={name}")] == []




@pytest.mark.timeout(300)
def test_a_source_agent_killed_before_the_target_runs_leaves_the_source_to_its_successor(
        world: CriuWorld) -> None:
    """(a) The source's agent SIGKILLed while its page server waits for the target (no
    target has the hand-over yet): the dump it left is rolled back (its watchdog), the
    same process runs on, and the next agent captures it afresh — a new offer — and the
    migration completes: the counter counts on on node-2, never having run twice."""
    w = world
    name, pod, before = _counter(w, "sra")
    uid = pod["metadata"]["uid"]
    with w.paused("node-2"):
        operation = _migrate(w, name)
        first = _offered(w, name, operation)
        w.kill("agent-node-1")  # (a) frozen, serving, no target
        w.start_agent("node-1")
        wait_for(lambda: _offered(w, name, operation)["pages"] != first["pages"],
                 f"the next agent of node-1 to offer {name} afresh", 120)
    end = _finished(w, operation)
    events = _types(w, operation)
    assert end["phase"] == "Succeeded", (end, events)
    assert events.count("RestoreVerified") == 1, events
    _counts_on(w, name, "node-2", before)
    assert _of_pod(w, "node-1", uid) == []


@pytest.mark.timeout(300)
def test_a_source_agent_killed_while_the_target_runs_leaves_the_transfer_to_finish(
        world: CriuWorld) -> None:
    """(b) The source's agent SIGKILLed while the target runs and its pages are held (the
    target's agent killed too, before it ever fetched: its successor restores): the page
    server, the target's now, serves on; the next source agent adopts the ended dump and
    reports every page, and the migration completes."""
    w = world
    name, pod, before = _counter(w, "srb")
    uid = pod["metadata"]["uid"]
    with contextlib.ExitStack() as holding:
        with w.paused("node-2"):
            operation = _migrate(w, name)
            relay = holding.enter_context(_relayed(w, name, operation))
            w.kill("agent-node-2")  # (a) the target's agent, before it fetched anything
        w.start_agent("node-2")
        _held(w, name, operation, relay)
        w.kill("agent-node-1")  # (b)
        w.start_agent("node-1")
        relay.release()
        end = _finished(w, operation)
    events = _types(w, operation)
    assert end["phase"] == "Succeeded", (end, events)
    assert events.index("RestoreVerified") < events.index("PagesTransferred"), events
    _counts_on(w, name, "node-2", before)
    assert _of_pod(w, "node-1", uid) == []


@pytest.mark.timeout(300)
def test_a_target_agent_killed_while_the_pages_arrive_leaves_them_to_its_watchdog(
        world: CriuWorld) -> None:
    """(b) The target's agent SIGKILLed while the target runs and its pages are held: its
    lazy-pages daemon fetches on, watched by the restore's watchdog (which holds the
    tasks' faults meanwhile); once every page arrived its verdict lets the next agent
    mark the pod ``pages-received``, and the migration completes: the counter counts on
    on node-2 with no repeat, no gap and every page intact."""
    w = world
    name, pod, before = _counter(w, "tgb")
    uid = pod["metadata"]["uid"]
    with contextlib.ExitStack() as holding:
        with w.paused("node-2"):
            operation = _migrate(w, name)
            relay = holding.enter_context(_relayed(w, name, operation))
        _held(w, name, operation, relay)
        w.kill("agent-node-2")  # (b)
        w.start_agent("node-2")
        relay.release()
        end = _finished(w, operation)
    events = _types(w, operation)
    assert end["phase"] == "Succeeded", (end, events)
    assert events.index("RestoreVerified") < events.index("PagesTransferred"), events
    _counts_on(w, name, "node-2", before)
    assert _of_pod(w, "node-1", uid) == []
