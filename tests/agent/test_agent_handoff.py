"""A capture handed straight to the target node's agent, on the simulator, over loopback.

Pins the agents' side of the handoff (docs/protocol.md, "Handoff"): a quiesced capture
asking for a handoff to node-2 offers its archives to node-2's agent and announces it in
``report-handoff`` before ``Pushed``; a pod created on node-2 with ``restore-handoff``
gets the workload's state (the sim marker) from that stream, marked
``restored-from-handoff`` with the digests it verified, which equal the pushed
manifest's ``archive-digests``; the target waits for an offer that is not there yet, and
takes one made long before; the source stays frozen until the request is withdrawn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.engine.observation import Interests, TagView
from controlplane.machines.contract import protocol
from drivers.agent.sim import FROZEN
from drivers.registry import RegistryObserver
from drivers.sim import MARKER
from tests.agent.handoff_world import (
    NS,
    capture_with_handoff,
    first_change,
    handoff_world,
    restore_pod,
    restored,
    source,
)
from tests.agent.world import World


@pytest.fixture(params=["layout", "distribution"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async with handoff_world(tmp_path, registry=request.param) as w:
        yield w


async def pushed(w: World, artifact: str) -> TagView:
    seen = await RegistryObserver(w.backend.registry).observe(
        Interests(tags=frozenset({artifact})))
    tag = seen.tags[artifact]
    assert isinstance(tag, TagView)
    return tag


async def test_the_state_arrives_by_handoff_and_the_registry_holds_the_same_archives(
        world: World) -> None:
    w = world
    uid = await source(w, marker="counter=41")
    artifact = capture_with_handoff(w, "ck-1")
    restore_pod(w, "app-r", "ck-1")

    notes = await restored(w, "app-r")
    assert notes.get(protocol.RESTORE_FAILURE) is None
    assert notes[MARKER] == "counter=41"
    assert notes[protocol.INSTANCE_ID].startswith(w.uid(NS, "app-r") + ".")
    assert protocol.RESTORED_FROM_DIGEST not in notes  # not restored from the registry
    restored_from = protocol.handoff_restored(notes)
    assert restored_from is not None
    checkpoint, received = restored_from
    assert checkpoint == "ck-1"
    assert set(received) == {"main"}

    assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
    source_notes = w.annotations(NS, "app")
    offered = protocol.handoff_report(source_notes, "ck-1")
    assert offered is not None
    assert dict(offered.archives) == received
    assert offered.address.startswith("127.0.0.1:")
    # Announced before the push ended.
    assert 0 <= first_change(w, "app", protocol.REPORT_HANDOFF) < first_change(
        w, "app", protocol.REPORT_STATE, "Pushed")

    tag = await pushed(w, artifact)
    assert tag.digest == source_notes[protocol.REPORT_DIGEST]
    assert protocol.provenance_problem(tag, checkpoint_id="ck-1", source_uid=uid) is None
    assert protocol.archive_digests(tag.annotations) == received

    # Quiesced: frozen until the control plane withdraws the request.
    assert source_notes[FROZEN] == "ck-1"
    w.withdraw(NS, "app")
    await w.cluster.wait_for(lambda: FROZEN not in w.annotations(NS, "app"),
                             what="the source released after the withdrawal")
    assert w.annotations(NS, "app")[protocol.REPORT_STATE] == "Pushed"


async def test_a_restore_pod_created_before_the_capture_waits_for_the_offer(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w, marker="early")
        restore_pod(w, "app-r", "ck-2")
        # The node's watch is ordered: once node-2's agent answered a later pod (a restore
        # of an absent artifact fails at once), it has seen app-r and waits for its offer.
        w.cluster.create_pod(NS, "later", node="node-2", annotations=protocol.restore_request(
            artifact=f"{w.repo}@sha256:{'0' * 64}", restore_key="m/later", checkpoint_id=None,
            loader="{}"))
        assert "NotFound" in (await restored(w, "later"))[protocol.RESTORE_FAILURE]
        assert protocol.RESTORE_FAILURE not in w.annotations(NS, "app-r")

        capture_with_handoff(w, "ck-2")
        notes = await restored(w, "app-r")
        assert notes.get(protocol.RESTORE_FAILURE) is None
        assert notes[MARKER] == "early"
        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"


async def test_a_restore_pod_created_after_the_push_takes_the_offer_still_open(
        tmp_path: Path) -> None:
    async with handoff_world(tmp_path) as w:
        await source(w, marker="late")
        capture_with_handoff(w, "ck-3")
        assert await w.report(NS, "app", "Pushed", "Failed") == "Pushed"
        restore_pod(w, "app-r", "ck-3")
        notes = await restored(w, "app-r")
        assert notes.get(protocol.RESTORE_FAILURE) is None
        assert notes[MARKER] == "late"
        assert w.annotations(NS, "app")[FROZEN] == "ck-3"


async def test_a_delivered_offer_is_closed_and_a_second_fetch_is_refused(
        tmp_path: Path) -> None:
    """One delivery per offer: a second restore pod for the same checkpoint is told why."""
    async with handoff_world(tmp_path) as w:
        await source(w)
        capture_with_handoff(w, "ck-4")
        restore_pod(w, "r1", "ck-4")
        assert (await restored(w, "r1")).get(protocol.RESTORE_FAILURE) is None
        await w.agents["node-1"].idle()  # the capture job ends once delivered
        restore_pod(w, "r2", "ck-4")
        failure = (await restored(w, "r2"))[protocol.RESTORE_FAILURE]
        assert failure.startswith("HandoffRefused: ")
        assert "withdrawn by the source agent: delivered" in failure
