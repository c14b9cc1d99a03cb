"""What the real-CRIU fault tests (``test_stream_faults``, ``test_runtime_faults``) judge a
migration by: a counter ticking on node-1, the operation's history, a watch for a moment
with the workload on both nodes, and where it runs at the end — the same process counting
on in place, or restored on node-2 — from its checkpoint with no count repeated."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from typing import Any

from drivers.podman.workload import Tick, ticked_since
from tests.criu.world import CriuWorld, resumed, wait_running_on
from tests.e2e.world import Obj
from tests.support.cpctl import in_process
from tests.support.waiting import wait_for

MIB = 8


def ticking(w: CriuWorld, name: str, mib: int = MIB) -> tuple[Obj, list[Tick]]:
    """A counter of ``mib`` MiB on node-1, once it ticked 5 times; its pod and ticks."""
    pod = w.make_counter(name, "node-1", mib=mib)
    ticks = wait_for(lambda: t if len(t := w.ticks(pod)) >= 5 else None,
                     f"{name} to tick 5 times", every=0.25)
    return pod, ticks


def history_of(w: CriuWorld, operation: str) -> list[dict[str, Any]]:
    """``cpctl history -o json``, read in this process (as :meth:`World.get`)."""
    done = in_process(w.db, "history", operation, "-o", "json")
    assert done.returncode == 0, done.stderr
    events: list[dict[str, Any]] = json.loads(done.stdout)
    return events


class TwoCopies:
    """Samples both nodes' runtimes while a migration runs: every moment a container of
    the workload ran on node-1 and on node-2 at once (what must never happen)."""

    def __init__(self, w: CriuWorld, name: str) -> None:
        self.w, self.name = w, name
        self.both: list[tuple[list[str], list[str]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="two-copies")

    def _running(self, node: str) -> list[str]:
        """The workload's running containers on ``node``: one ``podman ps`` (it lists the
        running ones), not a ps and an inspect per sample."""
        listed = subprocess.run([*self.w.node(node).base_args(), "ps", "--format",
                                 "{{.Names}}"], capture_output=True, text=True, timeout=60,
                                check=True, stdin=subprocess.DEVNULL)
        return [n for n in listed.stdout.split() if self.name in n]

    def _watch(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a node root changing under podman
                source, target = self._running("node-1"), self._running("node-2")
                self.samples += 1
                if source and target:
                    self.both.append((source, target))
            self._stop.wait(0.1)  # each sample execs podman once per node: not a busy loop

    def __enter__(self) -> TwoCopies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.samples > 0, "the runtimes were never read: the watch proved nothing"


def counts_on_in_place(w: CriuWorld, name: str, source: Obj, before: list[Tick]) -> None:
    """The same source pod, thawed: its log counts on from the checkpoint, no repeat;
    nothing of it on node-2."""
    still = w.kube.pod(w.namespace, name)
    assert still is not None
    assert still["metadata"]["uid"] == source["metadata"]["uid"]
    ended = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(still), ended) else None,
                     f"{name} to count on in place", every=0.25)
    resumed(ticks, before, quiesced=True)
    assert [c for c in w.containers("node-2") if name in c] == []


def moved(w: CriuWorld, name: str, source: Obj, before: list[Tick]) -> None:
    """The restored pod on node-2 counts on from the checkpoint; the source is gone."""
    ended = time.time()
    pod = wait_running_on(w, name, "node-2")
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(pod), ended) else None,
                     f"{name} on node-2 to count on", every=0.25)
    resumed(ticks, before, quiesced=True)
    uid = source["metadata"]["uid"]
    assert [c for c in w.containers("node-1") if c.endswith(uid)] == []
