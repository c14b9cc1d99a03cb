"""A simulated watch that ends at its timeout never skips an event its client was not sent.

Invariant pinned: when a watch stream ends with a ``BOOKMARK`` at version V, every change
of the watched objects up to V was delivered on that stream before the bookmark — as on a
real API server, where the closing bookmark follows the events before it in order. The
client resumes from V, so an event still queued behind the bookmark would be lost for
good (the scale benchmark's node agents missed restore and capture requests that way
until their next resync, ~5 minutes later).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from drivers.sim import SimCluster, selectors

PODS = "/api/v1/namespaces/default/pods"


async def _read_to_end(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            session.get(url) as response:
        assert response.status == 200
        return [json.loads(line) async for line in response.content if line.strip()]


async def test_a_watch_ending_at_its_timeout_sends_what_was_queued_before_its_bookmark(
        sim: SimCluster) -> None:
    """The server falls behind (two pods created while it writes the first event) and the
    watch's timeout passes: the two queued events still go out before the bookmark."""
    now = [0.0]
    sim.hub.clock = lambda: now[0]
    start = sim.store.rv
    sim.create_pod("default", "first")

    def fall_behind() -> str | None:  # asked after every event sent
        if now[0] == 0.0:
            sim.create_pod("default", "second")
            sim.create_pod("default", "third")
            now[0] = 61.0  # past the watch's 60 s deadline, with two events queued
        return None

    sim.hub.interrupt = fall_behind
    events = await _read_to_end(f"{sim.url}{PODS}?watch=1&resourceVersion={start}"
                                "&timeoutSeconds=60&allowWatchBookmarks=true")

    assert events[-1]["type"] == "BOOKMARK"
    resume = int(events[-1]["object"]["metadata"]["resourceVersion"])
    delivered = {(e["object"]["metadata"]["name"], int(e["object"]["metadata"]["resourceVersion"]))
                 for e in events[:-1]}
    owed = {(str(c.obj["metadata"]["name"]), c.rv) for c in sim.store.changes_since(start)
            if c.resource == "pods" and c.rv <= resume}
    assert {"first", "second", "third"} <= {name for name, _ in owed}
    assert owed <= delivered, f"resuming from {resume} skips {sorted(owed - delivered)}"


def _drain(queue: Any) -> list[tuple[str, str]]:
    out = []
    while not queue.empty():
        item = queue.get_nowait()
        out.append((item["type"], item["object"]["metadata"]["name"]))
    return out


async def test_a_node_scoped_watch_sees_exactly_the_pods_on_its_node(sim: SimCluster) -> None:
    """The fan-out offers a ``spec.nodeName=X`` watch only the changes of pods on X (or
    that were on X): the same events as offering it every change and filtering."""
    pods = sim.store.resource("pods")
    scoped = {node: sim.hub.open(pods, None, selectors.parse(None, f"spec.nodeName={node}"),
                                 resource_version=str(sim.store.rv), bookmarks=False)
              for node in ("node-1", "node-2")}
    everything = sim.hub.open(pods, None, selectors.parse(None, None),
                              resource_version=str(sim.store.rv), bookmarks=False)
    sim.create_pod("default", "on-one", node="node-1")
    sim.create_pod("default", "on-two", node="node-2")
    sim.settle()
    sim.store.delete("pods", "default", "on-one")
    sim.settle()
    got = {node: _drain(w.queue) for node, w in scoped.items()}
    assert {name for _type, name in got["node-1"]} == {"on-one"}
    assert {name for _type, name in got["node-2"]} == {"on-two"}
    assert got["node-1"][0][0] == "ADDED"  # bound by the scheduler: started matching
    assert got["node-1"][-1][0] == "DELETED"
    assert {name for _type, name in _drain(everything.queue)} == {"on-one", "on-two"}
    for watch in (*scoped.values(), everything):
        sim.hub.close(watch)
    assert sim.hub.watches == set()
