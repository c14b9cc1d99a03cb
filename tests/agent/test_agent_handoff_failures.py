"""What each failure of a handed-off capture does, on the simulator, over loopback.

Pins: a push that fails while the handoff succeeds leaves the target restored, reports
``Failed`` (the registry copy is what gate 1 needs), closes the offer and releases the
workload; a push that fails first withdraws the offer with the registry's reason, which
the target reports; a request withdrawn before the target fetched withdraws the offer
with that reason and releases the workload (``Pushed`` stands after the push, ``Failed:
Withdrawn`` during it); the capture deadline withdraws an unfetched offer, ``Pushed``
standing; an agent without ``--handoff-key`` refuses
a capture asking for a handoff before anything is frozen, and a ``restore-handoff`` pod
naming the flag; a ``restore-handoff`` naming another source UID fetches nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.machines.contract import protocol
from drivers.agent.sim import FROZEN
from drivers.registry.errors import RegistryServerError
from drivers.registry.port import Registry
from drivers.sim import MARKER
from tests.agent.handoff_world import (
    NS,
    capture_with_handoff,
    handoff_world,
    restore_pod,
    restored,
    source,
)

READ_ONLY = "PUT manifest: 503 UNAVAILABLE: read-only mode"


class FailingPushes:
    """A registry whose manifest pushes fail (blobs go through), once ``go`` is set."""

    def __init__(self, inner: Registry, go: asyncio.Event | None = None) -> None:
        self.inner = inner
        self.go = go

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        if self.go is not None:
            await self.go.wait()
        raise RegistryServerError(READ_ONLY, status=503)


async def test_a_failed_push_after_the_handoff_holds_the_workload_until_withdrawn(
        tmp_path: Path) -> None:
    """The target restored from the stream; the push then fails: the capture is
    ``Failed`` with the registry's reason, the delivered offer is closed (a second fetch
    is refused), and the quiesced source stays held — the target runs it — until the
    request is withdrawn (the control plane removes the target first): never two copies."""
    async with handoff_world(tmp_path) as w:
        go = asyncio.Event()
        w.agents["node-1"].registry = FailingPushes(  # type: ignore[assignment]
            w.backend.registry, go)
        await source(w, marker="state")
        capture_with_handoff(w, "ck-p")
        restore_pod(w, "app-r", "ck-p")
        notes = await restored(w, "app-r")
        assert notes.get(protocol.RESTORE_FAILURE) is None
        assert notes[MARKER] == "state"
        assert w.annotations(NS, "app")[FROZEN] == "ck-p"  # still held while pushing

        go.set()
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
        assert reason.startswith(f"RegistryServerError: {READ_ONLY} (handed to another "
                                 "node, which may run it: the workload stays stopped"), reason
        await w.agents["node-1"].idle()
        assert w.annotations(NS, "app")[FROZEN] == "ck-p"  # held: the target runs it
        assert protocol.INSTANCE_ID in w.annotations(NS, "app-r")  # the target keeps it
        restore_pod(w, "app-r2", "ck-p")
        failure = (await restored(w, "app-r2"))[protocol.RESTORE_FAILURE]
        assert "withdrawn by the source agent: delivered" in failure

        w.withdraw(NS, "app")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the source released once the request is withdrawn")


async def test_a_push_failing_before_the_target_fetched_withdraws_the_offer_with_its_reason(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        w.agents["node-1"].registry = FailingPushes(  # type: ignore[assignment]
            w.backend.registry)
        await source(w)
        capture_with_handoff(w, "ck-f")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the source released after the failed push")
        restore_pod(w, "app-r", "ck-f")
        notes = await restored(w, "app-r")
        failure = notes[protocol.RESTORE_FAILURE]
        assert failure.startswith("HandoffRefused: ")
        assert f"withdrawn by the source agent: RegistryServerError: {READ_ONLY}" in failure
        assert MARKER not in notes


async def test_a_request_withdrawn_before_the_target_fetched_withdraws_the_offer(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        capture_with_handoff(w, "ck-w")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
        w.withdraw(NS, "app")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the source released after the withdrawal")
        await w.agents["node-1"].idle()
        assert w.annotations(NS, "app")[protocol.REPORT_STATE] == "Pushed"  # it stands
        restore_pod(w, "app-r", "ck-w")
        notes = await restored(w, "app-r")
        failure = notes[protocol.RESTORE_FAILURE]
        assert failure.startswith("HandoffRefused: ")
        assert ("withdrawn by the source agent: Withdrawn: the capture request was removed "
                "before node-2 fetched the checkpoint") in failure
        assert MARKER not in notes


class HeldPushes:
    """A registry whose manifest pushes wait until the test lets them go."""

    def __init__(self, inner: Registry) -> None:
        self.inner = inner
        self.entered = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def push_manifest(self, repository: str, body: bytes, *, media_type: str,
                            tag: str | None = None) -> str:
        self.entered.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("unreachable")


async def test_a_request_withdrawn_during_the_push_fails_the_capture_and_the_offer(
        tmp_path: Path) -> None:
    """Before ``Pushed``, a withdrawal is what it always was (``Failed: Withdrawn``, the
    workload released), and the offer goes with the same reason."""
    async with handoff_world(tmp_path) as w:
        held = HeldPushes(w.backend.registry)
        w.agents["node-1"].registry = held  # type: ignore[assignment]
        await source(w)
        capture_with_handoff(w, "ck-h")
        await held.entered.wait()
        await w.cluster.wait_for(lambda: protocol.REPORT_HANDOFF in w.annotations(NS, "app"),
                                 what="the offer announced while the push runs")
        w.withdraw(NS, "app")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        assert w.annotations(NS, "app")[protocol.REPORT_REASON].startswith("Withdrawn: ")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the source released after the withdrawal")
        restore_pod(w, "app-r", "ck-h")
        failure = (await restored(w, "app-r"))[protocol.RESTORE_FAILURE]
        assert "withdrawn by the source agent: Withdrawn: the request was removed before " \
               "the capture finished" in failure


async def test_without_a_handoff_key_both_sides_refuse_naming_the_flag(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path, handoff={}) as w:
        await source(w)
        artifact = capture_with_handoff(w, "ck-n")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
        assert reason.startswith("Refused: this agent has no --handoff-key")
        assert "nothing was frozen" in reason
        assert w.dumpers["node-1"].dumps == 0
        assert FROZEN not in w.annotations(NS, "app")
        assert await w.backend.registry.resolve(w.repo, artifact.rsplit(":", 1)[1]) is None

        restore_pod(w, "app-r", "ck-n")
        failure = (await restored(w, "app-r"))[protocol.RESTORE_FAILURE]
        assert failure.startswith("Refused: this agent has no --handoff-key")


@pytest.mark.parametrize("value", ["not json", '{"checkpoint":"ck-m"}',
                                   '{"checkpoint":"ck-m","target":"no/such node"}'],
                         ids=["not-json", "no-target", "unsafe-target"])
async def test_a_malformed_handoff_request_is_refused_before_anything_is_frozen(
        tmp_path: Path, value: str) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        w.request_capture(NS, "app", "ck-m", quiesce=True,
                          extra={protocol.CAPTURE_HANDOFF: value})
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
        assert reason.startswith("Refused: ")
        assert reason.endswith("nothing was frozen")
        assert w.dumpers["node-1"].dumps == 0


async def test_a_restore_naming_another_source_uid_fetches_nothing(tmp_path: Path) -> None:
    """Refused before any fetch: the offer is still there for the right pod."""
    async with handoff_world(tmp_path) as w:
        await source(w, marker="mine")
        capture_with_handoff(w, "ck-u")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
        restore_pod(w, "wrong", "ck-u", uid="uid-of-a-pod-long-gone")
        notes = await restored(w, "wrong")
        failure = notes[protocol.RESTORE_FAILURE]
        assert failure.startswith("Refused: the source pod default/app is uid ")
        assert "nothing was fetched" in failure
        assert MARKER not in notes
        restore_pod(w, "right", "ck-u")  # still offered: the refused one took nothing
        assert (await restored(w, "right"))[MARKER] == "mine"


async def test_a_pod_asking_for_both_restores_is_refused_as_ambiguous(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w)
        restore_pod(w, "both", "ck-b", extra={
            protocol.RESTORE_ARTIFACT: f"{w.repo}@sha256:{'1' * 64}"})
        failure = (await restored(w, "both"))[protocol.RESTORE_FAILURE]
        assert failure.startswith("Refused: ")
        assert "ambiguous" in failure


async def test_a_source_pod_that_never_offers_fails_the_restore_at_its_deadline(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path, restore_timeout=0.5) as w:
        await source(w)  # no capture is ever asked
        restore_pod(w, "app-r", "ck-never")
        failure = (await restored(w, "app-r"))[protocol.RESTORE_FAILURE]
        assert protocol.REPORT_HANDOFF in failure
        assert "ck-never" in failure


async def test_an_offer_not_fetched_by_the_capture_deadline_is_withdrawn_pushed_stands(
        tmp_path: Path) -> None:
    """The deadline ends the offer, not the capture: ``Pushed`` stays, and a quiesced
    workload stays held until the request is withdrawn."""
    async with handoff_world(tmp_path, capture_timeout=2) as w:
        await source(w)
        capture_with_handoff(w, "ck-d")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
        await w.agents["node-1"].idle()  # the job ends at its deadline
        assert w.annotations(NS, "app")[protocol.REPORT_STATE] == "Pushed"
        assert w.annotations(NS, "app")[FROZEN] == "ck-d"
        restore_pod(w, "app-r", "ck-d")
        failure = (await restored(w, "app-r"))[protocol.RESTORE_FAILURE]
        assert "withdrawn by the source agent: Timeout: the capture deadline (2s) passed " \
               "before node-2 fetched the checkpoint" in failure


async def test_a_handed_off_capture_an_earlier_agent_left_unfinished_is_held_not_redone(
        tmp_path: Path) -> None:
    """An agent killed after it offered a quiesced capture (the pod says ``Capturing`` and
    carries its ``report-handoff``): the agent that starts next cannot know whether the
    target took the stream and runs it. It neither captures again nor wakes the workload:
    ``Failed: AgentRestarted``, held until the request is withdrawn."""
    async with handoff_world(tmp_path) as w:
        await source(w)
        offer = protocol.HandoffReport("ck-o", "127.0.0.1:1", {"main": "sha256:" + "0" * 64})
        w.annotate(NS, "app", {  # what the killed agent left, the request as the first sight
            FROZEN: "ck-o", protocol.REPORT_CHECKPOINT_ID: "ck-o",
            protocol.REPORT_STATE: "Capturing", **offer.annotation()})
        capture_with_handoff(w, "ck-o")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Failed"
        reason = w.annotations(NS, "app")[protocol.REPORT_REASON]
        assert reason.startswith("AgentRestarted: the agent on node-1 restarted while "
                                 "checkpoint ck-o was handed to another node"), reason
        await w.agents["node-1"].idle()
        assert w.agents["node-1"].stats.captures == 0  # nothing dumped again
        assert w.annotations(NS, "app")[FROZEN] == "ck-o"  # held
        w.withdraw(NS, "app")
        await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                                 what="the source released once the request is withdrawn")
