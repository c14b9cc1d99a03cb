"""A real process's memory survives migrate, suspend/resume and drain (real CRIU, runc).

The counter (:mod:`drivers.podman.workload`) holds its count and 8 MiB of patterned
pages only in memory. Each test proves the restored process is the checkpointed one: its
log starts with the very ticks the source printed before the operation (the archive
carries the log), then counts on with no repeat and no gap, every page intact — a cold
start would count from 1 again with new times. One world (envtest, registry, runtime
nodes, agents, worker) serves the module.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.machines.contract import protocol
from drivers.podman import container_name
from drivers.podman.workload import Tick, memory_marker, ticked_since
from drivers.registry.artifact import SEALED_FOR
from tests.criu.pipe_limit import pipe_limit_raised
from tests.criu.world import CriuWorld, open_criu_world, resumed, wait_running_on
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

MIB = 8


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriuWorld]:
    with open_criu_world(tmp_path_factory.mktemp("criu")) as w:
        yield w


def _ticking(w: CriuWorld, name: str, node: str, at_least: int = 5) -> list[Tick]:
    pod = w.make_counter(name, node, mib=MIB)
    return wait_for(lambda: t if len(t := w.ticks(pod)) >= at_least else None,
                    f"{name} to tick {at_least} times", every=0.25)


def _resumed(w: CriuWorld, name: str, node: str, before: list[Tick],
             since: float) -> list[Tick]:
    """The restored pod's ticks, once it has ticked after ``since`` (when the operation
    ended): its archived log alone may already be longer than ``before``. Migrations,
    suspensions and a drain's migrations all capture quiesced (their machines say so):
    no count repeats."""
    moved = wait_running_on(w, name, node)
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(moved), since) else None,
                     f"{name} on {node} to count on", every=0.25)
    resumed(ticks, before, quiesced=True)
    return ticks


def _pod_containers(w: CriuWorld, node: str, uid: str) -> list[str]:
    return [c for c in w.containers(node) if c.endswith(uid)]


def _manifest_exists(w: CriuWorld, digest: str) -> bool:
    request = urllib.request.Request(
        f"http://{w.registry}/v2/checkpoints/manifests/{digest}", method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=10):
            return True
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response and its socket
        if exc.code == 404:
            return False
        raise


def test_migrated_process_continues_from_its_checkpoint(world: CriuWorld) -> None:
    w = world
    name = w.name("mig")
    before = _ticking(w, name, "node-1")
    source = w.kube.pod(w.namespace, name)
    assert source is not None
    out = w.ok("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"migrate {w.namespace}/{name}: Succeeded" in out, out
    _resumed(w, name, "node-2", before, time.time())
    moved = wait_running_on(w, name, "node-2")
    assert moved["metadata"]["uid"] != source["metadata"]["uid"]
    assert _pod_containers(w, "node-1", source["metadata"]["uid"]) == []  # the source is gone
    digest = moved["metadata"]["annotations"][protocol.RESTORED_FROM_DIGEST]
    assert not _manifest_exists(w, digest)  # the artifact was collected


def test_suspended_process_resumes_where_it_stopped(world: CriuWorld) -> None:
    w = world
    name = w.name("sus")
    before = _ticking(w, name, "node-1")
    source = w.kube.pod(w.namespace, name)
    assert source is not None
    out = w.ok("suspend", f"{w.namespace}/{name}", "--repository", w.repository, "--wait",
               "--wait-seconds", "180")
    assert f"suspend {w.namespace}/{name}: Suspended" in out, out
    wait_for(lambda: w.kube.pod(w.namespace, name) is None or None, f"{name} deleted")
    assert _pod_containers(w, "node-1", source["metadata"]["uid"]) == []
    out = w.ok("resume", f"{w.namespace}/{name}", "--node", "node-3", "--repository",
               w.repository, "--wait", "--wait-seconds", "180")
    assert f"resume {w.namespace}/{name}: Resumed" in out, out
    _resumed(w, name, "node-3", before, time.time())


def test_drain_moves_three_real_processes_with_their_memory(world: CriuWorld) -> None:
    w = world
    names = [w.name(f"drn{i}") for i in range(3)]
    befores = {n: _ticking(w, n, "node-3") for n in names}
    out = w.ok("drain", "node-3", "--to", "node-1", "--repository", w.repository, "--wait",
               "--wait-seconds", "300")
    assert "drain node-3: Succeeded" in out, out
    ended = time.time()
    for name in names:
        _resumed(w, name, "node-1", befores[name], ended)
    assert w.containers("node-3") == []


def _operation(out: str) -> str:
    return out.split()[0]


def _history(w: CriuWorld, operation: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(w.ok("history", operation, "-o", "json",
                                                   cluster=False))
    return events


def test_a_push_cut_mid_way_fails_the_suspend_and_the_process_runs_on(
        world: CriuWorld) -> None:
    w = world
    assert w.relay is not None
    name = w.name("cut")
    before = _ticking(w, name, "node-2")
    source = w.kube.pod(w.namespace, name)
    assert source is not None
    w.relay.cutting = True
    try:
        done = w.cpctl("suspend", f"{w.namespace}/{name}", "--repository",
                       w.relayed_repository, "--wait", "--wait-seconds", "180", cluster=True)
    finally:
        w.relay.cutting = False
    assert w.relay.cuts > 0, "the push was never cut: the test proved nothing"
    operation = _operation(done.stdout)
    assert w.phase_of(operation) == "Failed", done.stdout
    [failed] = [e for e in _history(w, operation) if e["type"] == "CaptureFailed"]
    # The reason names the registry and the upload it lost: a push cut mid-way.
    assert "RegistryUnreachable" in failed["data"]["message"], failed
    assert "/blobs/uploads/" in failed["data"]["message"], failed
    still = w.kube.pod(w.namespace, name)
    assert still is not None
    assert still["metadata"]["uid"] == source["metadata"]["uid"]
    # The quiesced container was resumed in place: the same log counts on, no gap, no repeat.
    ended = time.time()
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(still), ended) else None,
                     f"{name} to count on after the failed suspend", every=0.25)
    resumed(ticks, before, quiesced=True)


def test_a_container_missing_from_the_runtime_fails_the_checkpoint_naming_it(
        world: CriuWorld) -> None:
    w = world
    name = w.name("gone")
    _ticking(w, name, "node-2")
    pod = w.kube.pod(w.namespace, name)
    assert pod is not None
    m = pod["metadata"]
    asyncio.run(w.node("node-2").remove(container_name(m["namespace"], m["name"], m["uid"],
                                                       "main")))
    done = w.cpctl("checkpoint", f"{w.namespace}/{name}", "--repository", w.repository,
                   "--wait", "--wait-seconds", "120", cluster=True)
    assert done.stdout, done.stderr
    operation = _operation(done.stdout)
    assert w.phase_of(operation) == "Failed", done.stdout
    [failed] = [e for e in _history(w, operation) if e["type"] == "CaptureFailed"]
    assert "container main of pod" in failed["data"]["message"], failed
    assert "is not there" in failed["data"]["message"], failed


SEED = 0x5B  # odd: this test's counters hold a marker no other counter's memory does


def _registry_get(w: CriuWorld, path: str) -> Any:
    request = urllib.request.Request(
        f"http://{w.registry}/v2/{path}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def _at_rest(w: CriuWorld) -> list[Path]:
    """Every file the issue names as "at rest": the registry's storage, the agents' work
    directories, the node roots' container storage, every log of the world."""
    roots = [w.tmp / "registry", w.tmp / "work", w.runtime_root]
    files = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return files + [p for p in w.tmp.iterdir() if p.is_file()]


def _holding(files: list[Path], needle: bytes) -> list[Path]:
    found = []
    for path in files:
        try:
            with path.open("rb") as f:
                tail = b""
                while chunk := f.read(8 << 20):
                    if needle in tail + chunk:
                        found.append(path)
                        break
                    tail = chunk[-len(needle):]
        except OSError:  # a socket, a file removed while scanning
            continue
    return found


def test_sealed_checkpoints_leave_no_plain_text_at_rest(world: CriuWorld) -> None:
    """A sealed class's migration and suspend/resume: the workload's memory-only marker
    is nowhere on disk afterwards (registry, agents, nodes, logs), nor any private key in
    a log — and a plain checkpoint of the same process does put it in the registry, so
    the scan would have seen it."""
    w = world
    marker = memory_marker(SEED)
    moved, slept = w.name("seal-mig"), w.name("seal-sus")
    before = {n: _ticking_seeded(w, n, "node-1") for n in (moved, slept)}
    out = w.ok("migrate", f"{w.namespace}/{moved}", "--to", "node-2", *w.sealed(), "--wait",
               "--wait-seconds", "180")
    assert f"migrate {w.namespace}/{moved}: Succeeded" in out, out
    _resumed(w, moved, "node-2", before[moved], time.time())
    out = w.ok("suspend", f"{w.namespace}/{slept}", *w.sealed(), "--wait",
               "--wait-seconds", "180")
    assert f"suspend {w.namespace}/{slept}: Suspended" in out, out
    tags = _registry_get(w, "checkpoints/tags/list")["tags"]
    [tag] = [t for t in tags if slept in t]
    manifest = _registry_get(w, f"checkpoints/manifests/{tag}")
    assert all(layer["mediaType"].endswith("+encrypted") for layer in manifest["layers"])
    assert manifest["annotations"][SEALED_FOR], manifest["annotations"]
    # node-2: the drain test above leaves node-3 cordoned.
    out = w.ok("resume", f"{w.namespace}/{slept}", "--node", "node-2", *w.sealed(), "--wait",
               "--wait-seconds", "180")
    assert f"resume {w.namespace}/{slept}: Resumed" in out, out
    _resumed(w, slept, "node-2", before[slept], time.time())

    assert _holding(_at_rest(w), marker) == []
    private = {k: (w.keys / f"{k}.pem").read_text().splitlines()[1].encode()
               for k in ("signing", "recipient")}
    logs = [p for p in w.tmp.iterdir() if p.is_file()]
    for name, line in private.items():
        assert _holding(logs, line) == [], f"the {name} key is in a log"

    out = w.ok("checkpoint", f"{w.namespace}/{slept}", "--repository", w.repository,
               "--wait", "--wait-seconds", "180")
    assert "Succeeded" in out, out
    assert _holding(list((w.tmp / "registry").rglob("*")), marker), \
        "a plain checkpoint of the same process holds no marker: the scan proves nothing"


def _ticking_seeded(w: CriuWorld, name: str, node: str) -> list[Tick]:
    pod = w.make_counter(name, node, mib=MIB, seed=SEED)
    return wait_for(lambda: t if len(t := w.ticks(pod)) >= 5 else None,
                    f"{name} to tick 5 times", every=0.25)


def test_a_streamed_migration_restores_before_the_source_goes_with_no_repeat(
        world: CriuWorld) -> None:
    """``transfer: stream``: the target's agent restores from the source agent's stream
    while the registry copy is pushed beside it; the source, quiesced, is deleted only
    after the target runs verified and the registry holds what it restored."""
    w = world
    name = w.name("strm")
    before = _ticking(w, name, "node-1")
    source = w.kube.pod(w.namespace, name)
    assert source is not None
    done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-2", *w.streamed(),
                   "--wait", "--wait-seconds", "180", cluster=True)
    operation = _operation(done.stdout)
    assert w.phase_of(operation) == "Succeeded", done.stdout + done.stderr
    events = [e["type"] for e in _history(w, operation)]
    assert events.index("RestoreVerified") < events.index("SourceDeleted"), events
    assert events.index("ArtifactVerified") < events.index("SourceDeleted"), events
    ended = time.time()
    moved = wait_running_on(w, name, "node-2")
    notes = moved["metadata"]["annotations"]
    assert json.loads(notes[protocol.RESTORED_FROM_HANDOFF])["checkpoint"] == operation
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(moved), ended) else None,
                     f"{name} on node-2 to count on", every=0.25)
    resumed(ticks, before, quiesced=True)  # no count repeated, none skipped, pages intact
    assert _pod_containers(w, "node-1", source["metadata"]["uid"]) == []  # the source is gone


LAZY_MIB = 64  # rewriting 4 MiB/s: memory that changes while the pages travel


def test_a_lazy_migration_runs_the_target_first_and_deletes_the_source_after_every_page(
        world: CriuWorld) -> None:
    """``--mode lazy`` through the product: the source dumps all but memory and serves its
    pages, the target runs at once and fetches them; the source pod is deleted only after
    the history records every page transferred. Nothing is pushed. The restored counter
    counts on with no repeat, no gap and every page intact (64 MiB, 4 MiB/s rewritten)."""
    w = world
    name = w.name("lazy")
    with pipe_limit_raised():  # CRIU's page server grows a 4 MiB pipe
        pod = w.make_counter(name, "node-1", mib=LAZY_MIB, dirty_mib_per_s=4)
        before = wait_for(lambda: t if len(t := w.ticks(pod)) >= 5 else None,
                          f"{name} to tick 5 times", every=0.25)
        source = w.kube.pod(w.namespace, name)
        assert source is not None
        done = w.cpctl("migrate", f"{w.namespace}/{name}", "--to", "node-2", "--repository",
                       w.repository, "--mode", "lazy", "--wait", "--wait-seconds", "180",
                       cluster=True)
        operation = _operation(done.stdout)
        assert w.phase_of(operation) == "Succeeded", done.stdout + done.stderr
    history = _history(w, operation)
    events = [e["type"] for e in history]
    assert events.index("RestoreVerified") < events.index("PagesTransferred") \
        < events.index("SourceDeleted"), events
    assert "ArtifactVerified" not in events, events  # nothing was pushed
    [pages] = [e["data"] for e in history if e["type"] == "PagesTransferred"]
    assert pages["pages"] > 0, pages
    ended = time.time()
    moved = wait_running_on(w, name, "node-2")
    notes = moved["metadata"]["annotations"]
    assert json.loads(notes[protocol.RESTORED_FROM_HANDOFF])["checkpoint"] == operation
    ticks = wait_for(lambda: t if ticked_since(t := w.ticks(moved), ended) else None,
                     f"{name} on node-2 to count on", every=0.25)
    found = resumed(ticks, before, quiesced=True)  # no repeat, no gap, every page intact
    print(f"lazy migration of {LAZY_MIB} MiB (4 MiB/s rewritten): downtime {found.downtime:.2f}s, "
          f"{pages['pages']} pages, source frozen -> last page {pages.get('seconds')}s")
    assert _pod_containers(w, "node-1", source["metadata"]["uid"]) == []  # the source is gone
