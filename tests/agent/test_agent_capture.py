"""The node agent's capture side on the simulator, against the OCI layout and a real registry.

Pins the data-plane protocol from the agent's end: a capture request produces an
artifact whose manifest provenance binds it to the request (gate 1), with ``Capturing``
then ``Pushed`` reported on the pod; a request for another pod UID or node is refused
with a reason (gate 4); the same request seen twice captures once; a failed, timed-out
or withdrawn capture is reported and never leaves the workload stopped (gate 5).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.engine.observation import Interests, TagView
from controlplane.machines.contract import protocol
from drivers.agent.dumper import DumpRequest, Workload
from drivers.agent.errors import DumpFailed
from drivers.agent.pods import PodPatcher
from drivers.agent.requests import CAPTURE_NODE
from drivers.agent.sim import FROZEN, SimDumper
from drivers.registry import RegistryObserver
from drivers.registry.errors import RegistryServerError
from drivers.registry.port import Registry
from tests.agent.world import World, open_world, sim_dumper

NS = "default"


async def test_capture_request_produces_an_artifact_with_matching_provenance(
        world: World) -> None:
    world.cluster.create_pod(NS, "app", node="node-1", marker="counter=41")
    await world.running(NS, "app")
    uid = world.uid(NS, "app")
    artifact = world.request_capture(NS, "app", "ck-1")
    assert await world.report(NS, "app", "Pushed", "Failed") == "Pushed"
    notes = world.annotations(NS, "app")
    assert notes[protocol.REPORT_CHECKPOINT_ID] == "ck-1"
    seen = await RegistryObserver(world.backend.registry).observe(
        Interests(tags=frozenset({artifact})))
    tag = seen.tags[artifact]
    assert isinstance(tag, TagView)
    assert tag.digest == notes[protocol.REPORT_DIGEST]
    assert protocol.provenance_problem(tag, checkpoint_id="ck-1", source_uid=uid) is None
    assert tag.annotations[protocol.MANIFEST_NODE] == "node-1"
    assert tag.annotations[protocol.MANIFEST_FORMAT] == "sim-marker/v1"
    assert world.states_seen(NS, "app") == ["Capturing", "Pushed"]
    assert FROZEN not in notes  # not quiesced: the workload runs on


async def test_quiesced_capture_holds_the_workload_until_the_request_is_withdrawn(
        layout_world: World) -> None:
    w = layout_world
    w.cluster.create_pod(NS, "app", node="node-1", marker="m")
    await w.running(NS, "app")
    w.request_capture(NS, "app", "ck-q", quiesce=True)
    await w.report(NS, "app", "Pushed")
    assert w.annotations(NS, "app")[FROZEN] == "ck-q"
    w.withdraw(NS, "app")  # what the machine's Release (wake in place) does
    await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                             what="workload released")


@pytest.mark.parametrize(("uid", "extra", "why"), [
    ("not-the-pods-uid", {}, "uid"),
    (None, {CAPTURE_NODE: "node-2"}, "node"),
    (None, {protocol.PROTOCOL: "v9"}, "protocol version"),
    (None, {protocol.CAPTURE_MODE: '{"checkpoint":"ck-x","mode":"precopy"}'},
     "mode 'precopy' on node node-1: the sim dumper migrates by stop-and-copy only"),
    (None, {protocol.CAPTURE_MODE: '{"checkpoint":"ck-x","mode":"teleport"}'},
     "migration mode 'teleport' is not one this agent speaks"),
], ids=["wrong-uid", "wrong-node", "unknown-version", "mode-the-dumper-cannot-do",
        "unknown-mode"])
async def test_request_not_for_this_pod_is_refused_with_a_reason(
        layout_world: World, uid: str | None, extra: dict[str, str], why: str) -> None:
    w = layout_world
    w.cluster.create_pod(NS, "app", node="node-1", marker="m")
    await w.running(NS, "app")
    artifact = w.request_capture(NS, "app", "ck-x", uid=uid, extra=extra)
    await w.report(NS, "app", "Failed")
    reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
    assert reason.startswith("Refused: ")
    assert why in reason
    assert w.dumpers["node-1"].dumps == 0
    assert FROZEN not in w.annotations(NS, "app")
    assert await w.backend.registry.resolve(w.repo, artifact.rsplit(":", 1)[1]) is None


async def test_the_same_request_seen_again_captures_once(tmp_path: Path) -> None:
    """Reissued or re-observed while in flight and after it finished: one dump."""
    gate = asyncio.Event()
    started = asyncio.Event()

    async def hold(request: DumpRequest) -> None:
        started.set()
        await gate.wait()

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=hold)}) as w:
        w.cluster.create_pod(NS, "app", node="node-1", marker="m")
        w.cluster.create_pod(NS, "other", node="node-1", marker="o")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-1")
        await started.wait()
        for n in range(3):  # the machine reissues the same request; other writes happen
            w.request_capture(NS, "app", "ck-1", extra={"touch": str(n)})
        gate.set()
        await w.report(NS, "app", "Pushed")
        w.request_capture(NS, "app", "ck-1", extra={"touch": "after"})
        # The watch is ordered: once a later request elsewhere is served, the reissue was seen.
        w.request_capture(NS, "other", "ck-2")
        await w.report(NS, "other", "Pushed")
        assert w.dumpers["node-1"].dumps == 2  # ck-1 once, ck-2 once
        assert w.annotations(NS, "app")[protocol.REPORT_STATE] == "Pushed"


async def test_dumper_failure_is_reported_and_the_workload_unstuck(tmp_path: Path) -> None:
    async def fail(request: DumpRequest) -> None:
        raise DumpFailed("criu: dump failed: no space left on device")

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=fail)}) as w:
        w.cluster.create_pod(NS, "app", node="node-1", marker="m")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-f", quiesce=True)
        await w.report(NS, "app", "Failed")
        notes = w.annotations(NS, "app")
        assert notes[protocol.REPORT_REASON] == ("DumpFailed: criu: dump failed: no space "
                                                 "left on device")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="workload released after the failure")
        assert w.states_seen(NS, "app") == ["Capturing", "Failed"]


async def test_capture_past_its_deadline_fails_and_releases_the_workload(
        tmp_path: Path) -> None:
    async def hang(request: DumpRequest) -> None:
        await asyncio.Event().wait()

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=hang)},
                          capture_timeout=0.3) as w:
        w.cluster.create_pod(NS, "app", node="node-1", marker="m")
        await w.running(NS, "app")
        w.request_capture(NS, "app", "ck-t")
        await w.report(NS, "app", "Failed")
        assert w.annotations(NS, "app")[protocol.REPORT_REASON].startswith("Timeout: ")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="workload released after the deadline")


async def test_withdrawn_request_aborts_the_capture_and_resumes_the_workload(
        tmp_path: Path) -> None:
    started = asyncio.Event()

    async def hang(request: DumpRequest) -> None:
        started.set()
        await asyncio.Event().wait()

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=hang)}) as w:
        w.cluster.create_pod(NS, "app", node="node-1", marker="m")
        await w.running(NS, "app")
        artifact = w.request_capture(NS, "app", "ck-w", quiesce=True)
        await started.wait()
        assert w.annotations(NS, "app")[FROZEN] == "ck-w"
        w.withdraw(NS, "app")
        await w.report(NS, "app", "Failed")
        assert w.annotations(NS, "app")[protocol.REPORT_REASON].startswith("Withdrawn: ")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="workload released after the withdrawal")
        assert await w.backend.registry.resolve(w.repo, artifact.rsplit(":", 1)[1]) is None


class FailingPushes:
    """A registry whose manifest pushes fail (blobs go through)."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        raise RegistryServerError("PUT manifest: 503 UNAVAILABLE: read-only mode", status=503)


class HeldRelease(SimDumper):
    """The sim dumper, its release held until the test lets it go (CRIU's restore in
    place takes that long)."""

    def __init__(self, patcher: PodPatcher) -> None:
        super().__init__(patcher, before_dump=_fail_dump)
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        self.finished = asyncio.Event()

    async def release(self, workload: Workload) -> None:
        self.entered.set()
        await self.go.wait()
        await super().release(workload)
        self.finished.set()


async def _fail_dump(request: DumpRequest) -> None:
    raise DumpFailed("criu: dump failed")


async def test_the_withdrawal_a_failure_report_causes_never_cancels_the_release(
        tmp_path: Path) -> None:
    """The control plane withdraws the request as soon as it reads Failed; the release
    that was already under way must still finish, or a quiesced workload stays stopped."""
    async with open_world(tmp_path, dumpers={"node-1": HeldRelease}) as w:
        dumper = w.dumpers["node-1"]
        assert isinstance(dumper, HeldRelease)
        for name in ("app", "later"):
            w.cluster.create_pod(NS, name, node="node-1", marker=name)
            await w.running(NS, name)
        w.request_capture(NS, "app", "ck-w", quiesce=True)
        await w.report(NS, "app", "Failed")
        await dumper.entered.wait()  # the release is under way, held
        w.withdraw(NS, "app")  # what the control plane does on reading Failed
        # The agent must have reacted to the withdrawal before the release goes on, and the
        # right reaction shows nothing. Its node's watch is ordered: once it has answered a
        # later change on the node (it refuses a request naming another pod's UID), it has
        # seen the withdrawal.
        w.request_capture(NS, "later", "ck-later", uid="not-the-pods-uid")
        await w.report(NS, "later", "Failed")
        assert w.annotations(NS, "later")[protocol.REPORT_REASON].startswith("Refused: ")
        dumper.go.set()
        async with asyncio.timeout(10):  # cancelled, it would never finish
            await dumper.finished.wait()
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the workload released")


async def test_registry_failure_during_the_push_is_reported_and_unsticks(
        layout_world: World) -> None:
    w = layout_world
    w.agents["node-1"].registry = FailingPushes(w.backend.registry)  # type: ignore[assignment]
    w.cluster.create_pod(NS, "app", node="node-1", marker="m")
    await w.running(NS, "app")
    w.request_capture(NS, "app", "ck-r", quiesce=True)
    await w.report(NS, "app", "Failed")
    reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
    assert reason.startswith("RegistryServerError: ")
    assert "read-only" in reason
    await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                             what="workload released after the push failed")


async def test_captures_beyond_the_node_limit_queue_and_say_so(tmp_path: Path) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def hold(request: DumpRequest) -> None:
        started.set()
        await gate.wait()

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=hold)},
                          parallel=1) as w:
        for name in ("first", "second"):
            w.cluster.create_pod(NS, name, node="node-1", marker=name)
            await w.running(NS, name)
        w.request_capture(NS, "first", "ck-1")
        await started.wait()
        w.request_capture(NS, "second", "ck-2")
        await w.cluster.wait_for(lambda: w.annotations(NS, "second").get(
            protocol.REPORT_REASON, "").startswith("queued"), what="second queued")
        assert w.dumpers["node-1"].dumps == 1
        gate.set()
        await w.report(NS, "first", "Pushed")
        await w.report(NS, "second", "Pushed")
        assert w.dumpers["node-1"].dumps == 2


async def test_a_new_request_supersedes_the_capture_in_flight(tmp_path: Path) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def hold_first(request: DumpRequest) -> None:
        if request.checkpoint_id == "ck-old":
            started.set()
            await gate.wait()

    async with open_world(tmp_path, dumpers={"node-1": sim_dumper(before_dump=hold_first)}) \
            as w:
        w.cluster.create_pod(NS, "app", node="node-1", marker="m")
        await w.running(NS, "app")
        old = w.request_capture(NS, "app", "ck-old")
        await started.wait()
        w.request_capture(NS, "app", "ck-new")
        await w.cluster.wait_for(lambda: w.annotations(NS, "app").get(
            protocol.REPORT_CHECKPOINT_ID) == "ck-new" and w.annotations(NS, "app").get(
            protocol.REPORT_STATE) == "Pushed", what="the new checkpoint pushed")
        reports = [(state, reason) for pod, state, reason in w.agents["node-1"].stats.reports]
        assert ("Failed", "Superseded: the pod now asks for checkpoint ck-new") in reports
        assert await w.backend.registry.resolve(w.repo, old.rsplit(":", 1)[1]) is None
        assert FROZEN not in w.annotations(NS, "app")
